//! A resuming chat (`on_disconnect = CONTINUE` with a request id) survives a
//! dropped connection: a loopback TCP proxy between the client and the
//! in-process server cuts the connection mid-turn, and the stream still
//! yields every event exactly once, in order, ending with `turn_finished` —
//! re-attached with Subscribe while the turn is live, or by the idempotent
//! Chat retry (a replay) once it finished while the client was away.
//!
//! The turn runs on the gate provider, so it stays live exactly as long as
//! the test needs; the test waits on the client's resume notices and the
//! gate, never on time.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{
    ChatEvent, ChatOptions, Client, Event, EventStream, OnDisconnect, ResumeNotice, ResumePolicy,
    proto,
};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::gate::{AFTER, BEFORE, GateProvider};
use agentrt_testkit::server::InProcessServer;
use agentrt_testkit::tcp_proxy::TcpProxy;
use futures::StreamExt as _;
use tokio::sync::mpsc;

struct Setup {
    server: InProcessServer,
    proxy: TcpProxy,
    gate: Arc<GateProvider>,
    /// Through the proxy, resuming, with its notices on `notices`.
    client: Client,
    notices: mpsc::Receiver<ResumeNotice>,
    /// Straight to the server.
    direct: Client,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
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
    let proxy = TcpProxy::start(&server.addr().to_string()).await;
    let (tx, notices) = mpsc::channel(1024);
    let policy = ResumePolicy::new()
        .attempts(500)
        .backoff(Duration::from_millis(2), Duration::from_millis(20))
        .on_event(move |notice| {
            let _ = tx.try_send(notice.clone());
        });
    let client = Client::builder(format!("http://{}", proxy.addr()))
        .resume_policy(policy)
        .connect()
        .await
        .unwrap();
    let direct = Client::connect(server.url()).await.unwrap();
    Setup {
        server,
        proxy,
        gate,
        client,
        notices,
        direct,
        _dir: dir,
    }
}

/// Waits for the first notice `wanted` accepts.
async fn wait_notice(
    notices: &mut mpsc::Receiver<ResumeNotice>,
    wanted: impl Fn(&ResumeNotice) -> bool,
) -> ResumeNotice {
    loop {
        let notice = notices.recv().await.expect("the client is alive");
        if wanted(&notice) {
            return notice;
        }
    }
}

/// Reads until the gate's first text, then hands the rest of the stream to
/// a task that collects it.
async fn start_turn(setup: &Setup) -> (String, Vec<Event>, tokio::task::JoinHandle<Vec<Event>>) {
    let session = setup
        .client
        .create_session(Default::default())
        .await
        .unwrap();
    let options = ChatOptions::new("hello")
        .model("gate/any")
        .on_disconnect(OnDisconnect::Continue);
    let mut events: EventStream = setup
        .client
        .chat(&session.session_id, options)
        .await
        .unwrap();
    let mut before = Vec::new();
    loop {
        let event = events.next().await.expect("an event").expect("no error");
        let gated = event.kind == ChatEvent::Text(BEFORE.into());
        before.push(event);
        if gated {
            break;
        }
    }
    let rest = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Some(item) = events.next().await {
            rest.push(item.expect("the resumed stream has no error"));
        }
        rest
    });
    (session.session_id, before, rest)
}

/// Exactly once, in order (seq 1, 2, 3, ... with no gap or repeat), one
/// `turn_started` first and one successful `turn_finished` last, the text
/// whole.
fn assert_whole_turn(events: &[Event]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let expected: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, expected, "{events:#?}");
    assert!(
        matches!(events[0].kind, ChatEvent::TurnStarted(_)),
        "{events:#?}"
    );
    let finished: Vec<&Event> = events
        .iter()
        .filter(|e| matches!(e.kind, ChatEvent::TurnFinished { .. }))
        .collect();
    assert_eq!(finished.len(), 1, "{events:#?}");
    assert!(
        matches!(
            events.last().unwrap().kind,
            ChatEvent::TurnFinished {
                outcome: proto::TurnOutcome::Success,
                ..
            }
        ),
        "{events:#?}"
    );
    let text: String = events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(text, format!("{BEFORE}{AFTER}"));
    let mut stored: Vec<u64> = events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::MessageStored { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect();
    let count = stored.len();
    stored.dedup();
    assert_eq!(stored.len(), count, "a message_stored twice: {events:#?}");
}

#[tokio::test]
async fn a_cut_mid_turn_is_resumed_by_subscribe_and_every_event_arrives_once() {
    let mut setup = setup().await;
    let (session_id, before, rest) = start_turn(&setup).await;

    setup.proxy.cut();
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::Disconnected { .. })
    })
    .await;
    // A reconnect attempt was refused while cut: the client is retrying.
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::AttemptFailed { .. })
    })
    .await;
    setup.proxy.restore();
    let resubscribed = wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::Resubscribed { .. })
    })
    .await;
    let last_seen = before.last().unwrap().seq;
    assert_eq!(
        resubscribed,
        ResumeNotice::Resubscribed {
            after_seq: last_seen
        }
    );
    // Only now may the turn go on: the rest arrives over the new connection.
    setup.gate.release(1);

    let mut all = before;
    all.extend(rest.await.unwrap());
    assert_whole_turn(&all);
    // The turn ran once: the user message and one answer.
    let history = setup.direct.history(&session_id).await.unwrap();
    assert_eq!(history.len(), 2, "{history:#?}");
    setup.server.stop().await;
}

#[tokio::test]
async fn a_turn_that_finished_while_disconnected_is_replayed_by_the_idempotent_retry() {
    let mut setup = setup().await;
    let (session_id, before, rest) = start_turn(&setup).await;

    setup.proxy.cut();
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::AttemptFailed { .. })
    })
    .await;
    // The turn ends while the client cannot reach the server: a direct
    // watcher reads it to its end.
    setup.gate.release(1);
    let watched = setup
        .direct
        .subscribe(&session_id, 0, false)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(watched.status.is_none(), "{:?}", watched.status);
    let status = setup.direct.session_status(&session_id).await.unwrap();
    assert!(!status.live, "{status:?}");
    setup.proxy.restore();

    let mut all = before;
    all.extend(rest.await.unwrap());
    assert_whole_turn(&all);
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::Retried { .. })
    })
    .await;
    let history = setup.direct.history(&session_id).await.unwrap();
    assert_eq!(
        history.len(),
        2,
        "the retry ran nothing again: {history:#?}"
    );
    setup.server.stop().await;
}

#[tokio::test]
async fn a_watch_resumes_from_the_last_seq_it_yielded() {
    let mut setup = setup().await;
    let session = setup
        .direct
        .create_session(Default::default())
        .await
        .unwrap()
        .session_id;
    // The turn belongs to a direct caller; the proxied client only watches.
    let options = ChatOptions::new("hello")
        .model("gate/any")
        .on_disconnect(OnDisconnect::Continue);
    let owner = setup.direct.chat(&session, options).await.unwrap();
    let mut watch = setup.client.watch(&session, 0, false).await.unwrap();
    let mut before = Vec::new();
    loop {
        let event = watch.next().await.expect("an event").expect("no error");
        let gated = event.kind == ChatEvent::Text(BEFORE.into());
        before.push(event);
        if gated {
            break;
        }
    }
    let rest = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Some(item) = watch.next().await {
            rest.push(item.expect("the resumed watch has no error"));
        }
        rest
    });
    setup.proxy.cut();
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::AttemptFailed { .. })
    })
    .await;
    setup.proxy.restore();
    wait_notice(&mut setup.notices, |n| {
        matches!(n, ResumeNotice::Resubscribed { .. })
    })
    .await;
    setup.gate.release(1);
    let mut all = before;
    all.extend(rest.await.unwrap());
    assert_whole_turn(&all);
    assert!(owner.finish().await.unwrap().status.is_none());
    setup.server.stop().await;
}
