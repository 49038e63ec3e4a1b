//! P7 regressions found from outside: a reused session id never lets one
//! user's turn, watcher or write reach the next owner of the id; a caller
//! that stops reading cannot keep its turn alive; `stopped` means stopped;
//! bad durations and panics end turns cleanly; a watcher always gets the
//! end; a grpc-core client's rounded-up deadline still sees `TIMED_OUT`.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, Error, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use futures::StreamExt as _;
use serde_json::json;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, read_until,
    small_window_channel, text_request, with_keys,
};

/// Bound on every wait, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);

const ALICE: &str = "alice-key-123";
const BOB: &str = "bob-key-456";

fn keyed(dir: &std::path::Path) -> agentrt_server::Config {
    with_keys(base_config(dir), &[(ALICE, "alice"), (BOB, "bob")])
}

async fn create(client: &Client, id: &str) {
    client
        .create_session(proto::CreateSessionRequest {
            session_id: id.to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
}

fn code(err: Error) -> Code {
    match err {
        e if e.status().is_some() => e.code().expect("a status"),
        other => panic!("expected a status, got {other}"),
    }
}

/// A Chat on its own connection with the protocol's default 64 KiB windows
/// whose caller never reads: the server cannot send past the window.
async fn stalled_chat(
    url: &str,
    token: &str,
    req: proto::ChatRequest,
) -> tonic::Streaming<proto::ChatEvent> {
    let channel = small_window_channel(url).await;
    let mut request = tonic::Request::new(req);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    proto::agent_runtime_client::AgentRuntimeClient::new(channel)
        .chat(request)
        .await
        .unwrap()
        .into_inner()
}

/// `torrent/N`: N text deltas of 40 KiB each, as fast as they are taken,
/// then waits forever. Two deltas are larger than a 64 KiB HTTP/2 window,
/// so a caller that reads nothing stops the turn once its 256-event buffer
/// is full: the turn publishes at most ~260 events, and the replay (8 MiB,
/// ~200 of these) still holds the latest of them for a late watcher.
#[derive(Debug, Default)]
struct Torrent;

#[async_trait]
impl agentrt_runtime::model::ModelProvider for Torrent {
    async fn stream(
        &self,
        request: agentrt_runtime::model::ModelRequest,
    ) -> Result<agentrt_runtime::model::ModelStream, agentrt_runtime::model::ModelError> {
        let n: usize = request.model.parse().unwrap_or(0);
        let delta = "w".repeat(40 << 10);
        let items = futures::stream::iter(
            (0..n).map(move |_| Ok(agentrt_runtime::model::ModelEvent::TextDelta(delta.clone()))),
        );
        Ok(Box::pin(items.chain(futures::stream::pending())))
    }

    /// Far more than the ~10 MiB a stalled turn publishes: the step must
    /// not be cut at the default output bound first.
    fn max_step_output_bytes(&self, _model: &str) -> usize {
        64 << 20
    }
}

/// A server with the `torrent` provider and alice's and bob's keys.
async fn torrent_server(
    dir: &std::path::Path,
    stalled_reader_timeout: Option<Duration>,
) -> InProcessServer {
    let mut config = keyed(dir);
    if let Some(t) = stalled_reader_timeout {
        config.stalled_reader_timeout = t;
    }
    let builder = ServerBuilder::new(config).model_provider("torrent", Arc::new(Torrent));
    InProcessServer::start(builder).await
}

fn torrent(session: &str) -> proto::ChatRequest {
    let mut req = text_request(session, "flood me");
    req.model = "torrent/100000".into();
    req
}

/// Watches a torrent turn whose caller reads nothing until event 255 was
/// published: the turn cannot publish more than ~260 before its send to
/// that caller blocks (256 buffered, one or two taken by the transport, the
/// first three not text), so from here it is stuck on the caller within a
/// few events — microseconds, against the next RPC's round trip.
async fn past_the_stall(watch: &mut agentrt_client::EventStream) {
    while let Some(item) = watch.next().await {
        let e = item.expect("event");
        if e.seq >= 255 {
            return;
        }
    }
    panic!("the watch ended before event 255");
}

/// Waits (bounded) until `session` has no live turn, by watching it.
async fn wait_until_idle(client: &Client, session: &str) {
    tokio::time::timeout(WAIT, async {
        loop {
            let status = client.session_status(session).await.unwrap();
            if !status.live {
                return;
            }
            // Watch the live turn to its end instead of polling blindly.
            if let Ok(watch) = client.subscribe(session, 0, false).await {
                let _ = watch.finish().await;
            }
        }
    })
    .await
    .expect("the session's turn did not end");
}

#[tokio::test]
async fn a_watcher_of_a_deleted_session_never_sees_the_next_owners_turn() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(keyed(dir.path()), &Providers::default()).await;
    let alice = server.client_with_token(ALICE).await;
    let bob = server.client_with_token(BOB).await;
    create(&alice, "demo").await;
    let mut waiting = alice.subscribe("demo", 0, true).await.unwrap();
    assert!(alice.delete_session("demo").await.unwrap());
    // Deleting the session ends the wait: nothing of a later owner's turn.
    let ended = tokio::time::timeout(WAIT, waiting.next())
        .await
        .expect("the waiting watcher was not ended by the delete");
    match ended {
        Some(Err(e)) => assert_eq!(code(e), Code::NotFound),
        other => panic!("expected NOT_FOUND, got {other:?}"),
    }
    create(&bob, "demo").await;
    let answer = bob.chat("demo", "bob's secret plan").await.unwrap();
    let summary = answer.finish().await.unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert!(
        tokio::time::timeout(WAIT, waiting.next())
            .await
            .unwrap()
            .is_none()
    );
    server.stop().await;
}

#[tokio::test]
async fn a_turn_stuck_behind_a_stalled_caller_is_deleted_and_never_reaches_the_next_owner() {
    let dir = tempfile::tempdir().unwrap();
    let server = torrent_server(dir.path(), None).await;
    let url = server.url();
    let alice = Client::builder(url.clone())
        .token(ALICE)
        .connect()
        .await
        .unwrap();
    let bob = Client::builder(url.clone())
        .token(BOB)
        .connect()
        .await
        .unwrap();
    create(&alice, "demo").await;
    let stalled = stalled_chat(&url, ALICE, torrent("demo")).await;
    let mut watch = alice.subscribe("demo", 0, false).await.unwrap();
    past_the_stall(&mut watch).await;

    let started = std::time::Instant::now();
    assert!(alice.delete_session("demo").await.unwrap());
    let took = started.elapsed();
    // The turn ended (its caller's sends race the cancellation) before
    // the delete returned: nothing of it is left to reach the new session.
    create(&bob, "demo").await;
    let status = bob.session_status("demo").await.unwrap();
    assert!(!status.live, "bob sees alice's turn as live: {status:?}");
    assert!(bob.history("demo").await.unwrap().is_empty());
    let subscribed = bob.subscribe("demo", 0, false).await.unwrap();
    assert!(subscribed.finish().await.unwrap().events.is_empty());
    let mine = bob
        .chat("demo", "hello")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(mine.outcome, Some(proto::TurnOutcome::Success));
    let history = bob.history("demo").await.unwrap();
    assert_eq!(history.len(), 2, "only bob's turn: {history:?}");
    assert!(history.iter().all(|m| !message_text(m).contains("www")));
    assert!(took < Duration::from_secs(4), "delete took {took:?}");
    drop(stalled);
    server.stop().await;
}

#[tokio::test]
async fn stop_answers_stopped_only_once_the_turn_has_ended() {
    let dir = tempfile::tempdir().unwrap();
    let server = torrent_server(dir.path(), None).await;
    let url = server.url();
    let alice = Client::builder(url.clone())
        .token(ALICE)
        .connect()
        .await
        .unwrap();
    create(&alice, "s").await;
    let _stalled = stalled_chat(&url, ALICE, torrent("s")).await;
    let mut watch = alice.subscribe("s", 0, false).await.unwrap();
    past_the_stall(&mut watch).await;
    assert!(alice.stop_session("s").await.unwrap());
    let status = alice.session_status("s").await.unwrap();
    assert!(
        !status.live,
        "stopped=true while the turn is live: {status:?}"
    );
    let session = alice.get_session("s").await.unwrap();
    let last = session.last_turn.expect("last turn");
    assert_eq!(last.outcome(), proto::TurnOutcome::Canceled);
    server.stop().await;
}

#[tokio::test]
async fn a_caller_that_stops_reading_is_treated_as_gone() {
    let dir = tempfile::tempdir().unwrap();
    let server = torrent_server(dir.path(), Some(Duration::from_millis(500))).await;
    let url = server.url();
    let alice = Client::builder(url.clone())
        .token(ALICE)
        .connect()
        .await
        .unwrap();
    create(&alice, "s").await;
    let _stalled = stalled_chat(&url, ALICE, torrent("s")).await;
    let watch = alice.subscribe("s", 0, false).await.unwrap();
    let seen = tokio::time::timeout(WAIT, watch.finish())
        .await
        .expect("the turn of a caller that reads nothing never ended")
        .unwrap();
    let finished = seen.events.iter().find_map(|e| match e.kind {
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            ..
        } => Some((outcome, cancel_reason)),
        _ => None,
    });
    assert_eq!(
        finished,
        Some((
            proto::TurnOutcome::Canceled,
            proto::CancelReason::ClientGone
        ))
    );
    server.stop().await;
}

#[tokio::test]
async fn a_timeout_near_i64_max_is_invalid_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    create(&client, "s").await;
    let mut req = text_request("s", "hi");
    req.timeout = Some(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 0,
    });
    let err = client.chat_with(req).await.unwrap_err();
    let Some(status) = err.status().cloned() else {
        panic!("expected a status");
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("timeout"), "{}", status.message());
    assert!(status.message().contains("maximum"), "{}", status.message());
    let session = client.get_session("s").await.unwrap();
    assert!(session.last_turn.is_none());
    assert!(client.history("s").await.unwrap().is_empty());
    // The session is free and works.
    let ok = client
        .chat("s", "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(ok.outcome, Some(proto::TurnOutcome::Success));
    server.stop().await;
}

/// `boom`: panics when called.
#[derive(Debug)]
struct Boom;

#[async_trait]
impl ToolSource for Boom {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "boom".into(),
            description: "panics".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        panic!("the tool panics on purpose");
    }
}

#[tokio::test]
async fn a_panic_in_the_tool_phase_ends_the_turn_with_one_internal_outcome() {
    let call = json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "local__boom", "arguments": "{}"}
    });
    let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", Arc::new(Boom)))
            .await;
    let url = server.url();
    let client = Client::connect(url).await.unwrap();
    create(&client, "s").await;
    let chat = client.chat("s", "call it").await.unwrap();
    let summary = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    let finals = summary
        .events
        .iter()
        .filter(|e| matches!(e.kind, ChatEvent::TurnFinished { .. }))
        .count();
    assert_eq!(finals, 1, "{:?}", summary.events);
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    let status = summary.status.expect("trailing status");
    assert_eq!(status.code(), Code::Internal);
    assert!(
        summary.events.iter().any(|e| matches!(
            &e.kind,
            ChatEvent::Error { code, .. } if *code == proto::ErrorCode::Internal
        )),
        "{:?}",
        summary.events
    );
    let session = client.get_session("s").await.unwrap();
    assert_eq!(
        session.last_turn.expect("last turn").outcome(),
        proto::TurnOutcome::Error
    );
    // Every tool call in history has exactly one result.
    let history = client.history("s").await.unwrap();
    let results = history
        .iter()
        .flat_map(|m| &m.content)
        .filter(|b| matches!(b.block, Some(proto::content_block::Block::ToolResult(_))))
        .count();
    assert_eq!(results, 1, "{history:?}");
    // The session is free again.
    assert!(!client.session_status("s").await.unwrap().live);
    server.stop().await;
}

#[tokio::test]
async fn a_watcher_asking_for_events_past_the_end_still_gets_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    create(&client, "s").await;
    let mut req = text_request("s", "hi");
    req.model = "gate/x".into();
    let mut chat = client.chat_with(req).await.unwrap();
    read_until(&mut chat, |e| matches!(e.kind, ChatEvent::Text(_))).await;
    let huge = client.subscribe("s", u64::MAX, false).await.unwrap();
    let past = client.subscribe("s", 1_000, false).await.unwrap();
    providers.gate.release(1);
    chat.finish().await.unwrap();
    for watch in [huge, past] {
        let seen = tokio::time::timeout(WAIT, watch.finish())
            .await
            .unwrap()
            .unwrap();
        assert!(seen.status.is_none(), "{:?}", seen.status);
        assert_eq!(seen.outcome, Some(proto::TurnOutcome::Success));
    }
    server.stop().await;
}

#[tokio::test]
async fn a_turn_without_timeout_ends_at_the_server_default() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let mut config = base_config(dir.path());
    config.turn_timeout = Duration::from_millis(800);
    let server = TestServer::start_with(config, &providers).await;
    let client = server.client().await;
    create(&client, "s").await;
    let mut req = text_request("s", "hi");
    req.model = "gate/x".into();
    req.on_disconnect = proto::OnDisconnect::Continue as i32;
    let mut chat = client.chat_with(req).await.unwrap();
    read_until(&mut chat, |e| matches!(e.kind, ChatEvent::Text(_))).await;
    // The caller leaves; the CONTINUE turn runs on, but not forever.
    drop(chat);
    let watch = client.subscribe("s", 0, false).await.unwrap();
    let seen = tokio::time::timeout(WAIT, watch.finish())
        .await
        .expect("a turn with no timeout held its session")
        .unwrap();
    assert_eq!(seen.outcome, Some(proto::TurnOutcome::TimedOut));
    wait_until_idle(&client, "s").await;
    server.stop().await;
}

/// grpc-core clients (Python, C++, ...) send `grpc-timeout` rounded up —
/// about 10.1 s for a 10 s deadline — and give up at their own 10 s.
#[tokio::test]
async fn a_grpc_core_rounded_deadline_still_gets_the_timed_out_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    create(&client, "s").await;
    let mut req = tonic::Request::new({
        let mut r = text_request("s", "hi");
        r.model = "gate/x".into();
        r
    });
    let real_deadline = Duration::from_secs(10);
    req.metadata_mut()
        .insert("grpc-timeout", "10100m".parse().unwrap());
    let started = tokio::time::Instant::now();
    let mut stream = client.runtime_raw().chat(req).await.unwrap().into_inner();
    let mut outcome = None;
    let read = tokio::time::timeout_at(started + real_deadline, async {
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    if let Some(proto::chat_event::Kind::TurnFinished(f)) = event.kind {
                        outcome = Some(f.outcome());
                    }
                }
                Err(status) => return Some(status),
            }
        }
        None
    })
    .await;
    let trailer = read.expect("the client's own deadline passed before the turn ended");
    assert_eq!(outcome, Some(proto::TurnOutcome::TimedOut));
    assert_eq!(trailer.map(|s| s.code()), Some(Code::DeadlineExceeded));
    let history = client.history("s").await.unwrap();
    assert!(
        history
            .iter()
            .any(|m| m.role() == proto::Role::Notice && message_text(m).contains("time limit")),
        "{history:?}"
    );
    server.stop().await;
}
