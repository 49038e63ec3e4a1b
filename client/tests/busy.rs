//! A chat on a session with a live turn: refused as `Error::Busy` naming
//! the session and the live turn (decoded from the SESSION_BUSY ErrorInfo
//! of the real server), or — with `WhenBusy::Wait` — sent once that turn has
//! ended. The turns run on the gate provider; the test waits on events and
//! the client's notices, never on time.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{
    ChatEvent, ChatOptions, Client, Error, OnDisconnect, ResumeNotice, ResumePolicy, WhenBusy,
    proto,
};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::gate::{AFTER, BEFORE, GateProvider};
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use tokio::sync::mpsc;

#[tokio::test]
async fn busy_is_typed_and_when_busy_wait_sends_the_chat_after_the_live_turn() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    let gate = Arc::new(GateProvider::default());
    let server =
        InProcessServer::start(ServerBuilder::new(config).model_provider("gate", gate.clone()))
            .await;
    let (tx, mut notices) = mpsc::channel(64);
    let client = Client::builder(server.url())
        .resume_policy(
            ResumePolicy::new()
                .backoff(Duration::from_millis(1), Duration::from_millis(10))
                .on_event(move |n| {
                    let _ = tx.try_send(n.clone());
                }),
        )
        .connect()
        .await
        .unwrap();
    let session = client
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    let gated = || {
        ChatOptions::new("hi")
            .model("gate/m")
            .on_disconnect(OnDisconnect::Continue)
    };
    let mut first = client.chat(&session, gated()).await.unwrap();
    let turn_id = loop {
        let event = first.next().await.unwrap().unwrap();
        if event.kind == ChatEvent::Text(BEFORE.into()) {
            break event.turn_id;
        }
    };

    let err = client.chat(&session, "second").await.unwrap_err();
    let Error::Busy {
        session_id,
        turn_id: live,
        ..
    } = &err
    else {
        panic!("expected Busy, got {err:?}");
    };
    assert_eq!((session_id, live), (&session, &turn_id));
    assert!(err.to_string().contains(&turn_id), "{err}");

    // Waiting: the chat is admitted once the first turn is over.
    let waiting = {
        let client = client.clone();
        let session = session.clone();
        tokio::spawn(async move {
            client
                .chat(&session, gated().when_busy(WhenBusy::Wait))
                .await
                .map(|events| events.finish())
        })
    };
    let notice = loop {
        let n = notices.recv().await.unwrap();
        if matches!(n, ResumeNotice::WaitingForTurn { .. }) {
            break n;
        }
    };
    assert_eq!(
        notice,
        ResumeNotice::WaitingForTurn {
            turn_id: turn_id.clone()
        }
    );
    gate.release(2);
    let first = first.finish().await.unwrap();
    assert_eq!(first.outcome, Some(proto::TurnOutcome::Success));
    let second = waiting
        .await
        .unwrap()
        .expect("admitted after the wait")
        .await
        .unwrap();
    assert_eq!(second.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(second.text, format!("{BEFORE}{AFTER}"));
    assert_ne!(second.events[0].turn_id, turn_id, "a turn of its own");
    assert_eq!(client.history(&session).await.unwrap().len(), 4);
    server.stop().await;
}
