//! Quotas per principal (`[quotas]`) through gRPC on the embedded (sled)
//! store: each refusal is RESOURCE_EXHAUSTED with a `QuotaFailure` naming
//! the quota and its limit, a `RetryInfo` where waiting helps, and nothing
//! stored; admins are exempt; the Rust client reads the delay.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::proto;
use agentrt_client::proto::agent_runtime_client::AgentRuntimeClient;
use agentrt_client::proto::chat_event::Kind;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_runtime::model::ModelProvider;
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::gate::GateProvider;
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt as _;

const KEY: &str = "quota-test-user-key";
const ADMIN_KEY: &str = "quota-test-admin-key";
const WAIT: Duration = Duration::from_secs(20);

struct Server {
    server: InProcessServer,
    gate: Arc<GateProvider>,
    _dir: tempfile::TempDir,
}

/// A server whose user `alice` has the `[quotas]` given; `root` is an admin.
async fn server(quotas: &str) -> Server {
    server_with("builtin/echo", quotas).await
}

/// [`server`] with another default model.
async fn server_with(default_model: &str, quotas: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse_toml(&format!(
        "default_model = \"{default_model}\"\n\
         [[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n\
         [[auth.api_keys]]\nkey = \"{ADMIN_KEY}\"\nuser = \"root\"\nadmin = true\n\
         [quotas]\n{quotas}\n"
    ))
    .unwrap();
    config.data_dir = dir.path().to_path_buf();
    let gate = Arc::new(GateProvider::default());
    let builder = ServerBuilder::new(config)
        .model_provider("gate", Arc::clone(&gate) as Arc<dyn ModelProvider>);
    Server {
        server: InProcessServer::start(builder).await,
        gate,
        _dir: dir,
    }
}

fn authed<T>(message: T, key: &str) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req
}

async fn channel(s: &Server) -> Channel {
    tonic::transport::Endpoint::from_shared(s.server.url())
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn create(s: &Server, key: &str) -> Result<String, Status> {
    SessionServiceClient::new(channel(s).await)
        .create_session(authed(proto::CreateSessionRequest::default(), key))
        .await
        .map(|r| r.into_inner().session_id)
}

async fn count_sessions(s: &Server, key: &str) -> usize {
    SessionServiceClient::new(channel(s).await)
        .list_sessions(authed(
            proto::ListSessionsRequest {
                page_size: 500,
                ..Default::default()
            },
            key,
        ))
        .await
        .unwrap()
        .into_inner()
        .sessions
        .len()
}

async fn history(s: &Server, session_id: &str) -> Vec<proto::Message> {
    SessionServiceClient::new(channel(s).await)
        .get_history(authed(
            proto::GetHistoryRequest {
                session_id: session_id.to_owned(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner()
        .messages
}

fn chat(session_id: &str, model: &str, text: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: session_id.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: text.to_owned(),
            })),
        }],
        model: model.to_owned(),
        ..Default::default()
    }
}

type Events = tonic::Streaming<proto::ChatEvent>;

async fn start_chat(s: &Server, req: proto::ChatRequest) -> Result<Events, Status> {
    AgentRuntimeClient::new(channel(s).await)
        .chat(authed(req, KEY))
        .await
        .map(|r| r.into_inner())
}

/// Reads `events` until a text delta (the gate turn is live) or the end.
async fn until_text(events: &mut Events) {
    tokio::time::timeout(WAIT, async {
        while let Some(event) = events.next().await {
            if matches!(event.unwrap().kind, Some(Kind::Text(_))) {
                return;
            }
        }
        panic!("the turn ended before its first text");
    })
    .await
    .expect("a text event within the wait");
}

/// Reads `events` to the end; whether the turn succeeded.
async fn finish(mut events: Events) -> bool {
    tokio::time::timeout(WAIT, async {
        let mut ok = false;
        while let Some(event) = events.next().await {
            if let Some(Kind::TurnFinished(f)) = event.unwrap().kind {
                ok = f.outcome() == proto::TurnOutcome::Success;
            }
        }
        ok
    })
    .await
    .expect("the turn ends within the wait")
}

/// The status is RESOURCE_EXHAUSTED with a QuotaFailure for `quota` at
/// `limit`; its RetryInfo delay, if any.
fn assert_quota(status: &Status, quota: &str, limit: i64) -> Option<Duration> {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let details = status.get_error_details();
    let failure = details
        .quota_failure()
        .unwrap_or_else(|| panic!("no QuotaFailure in {status:?}"));
    assert_eq!(failure.violations.len(), 1);
    let v = &failure.violations[0];
    assert_eq!((v.subject.as_str(), v.quota_id.as_str()), (quota, quota));
    assert_eq!(v.quota_value, limit);
    assert!(status.message().contains(quota), "{}", status.message());
    details.retry_info().and_then(|r| r.retry_delay)
}

#[tokio::test]
async fn sessions_quota_refuses_the_next_session_and_stores_nothing() {
    let s = server("sessions = 2").await;
    let first = create(&s, KEY).await.unwrap();
    create(&s, KEY).await.unwrap();
    let refused = create(&s, KEY).await.unwrap_err();
    assert_eq!(assert_quota(&refused, "sessions", 2), None);
    assert_eq!(count_sessions(&s, KEY).await, 2, "nothing stored");
    // A session that already exists is no new session.
    let again = SessionServiceClient::new(channel(&s).await)
        .create_session(authed(
            proto::CreateSessionRequest {
                session_id: first.clone(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap();
    assert_eq!(again.into_inner().session_id, first);
    // Admins are exempt.
    for _ in 0..3 {
        create(&s, ADMIN_KEY).await.unwrap();
    }
    // Deleting makes room.
    SessionServiceClient::new(channel(&s).await)
        .delete_session(authed(
            proto::DeleteSessionRequest { session_id: first },
            KEY,
        ))
        .await
        .unwrap();
    create(&s, KEY).await.unwrap();
    s.server.stop().await;
}

#[tokio::test]
async fn sessions_quota_holds_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = |dir: &std::path::Path| {
        let mut c = Config::parse_toml(&format!(
            "[[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n[quotas]\nsessions = 1\n"
        ))
        .unwrap();
        c.data_dir = dir.to_path_buf();
        c
    };
    let first = InProcessServer::start(ServerBuilder::new(config(dir.path()))).await;
    SessionServiceClient::connect(first.url())
        .await
        .unwrap()
        .create_session(authed(proto::CreateSessionRequest::default(), KEY))
        .await
        .unwrap();
    first.stop().await;
    let second = InProcessServer::start(ServerBuilder::new(config(dir.path()))).await;
    let refused = SessionServiceClient::connect(second.url())
        .await
        .unwrap()
        .create_session(authed(proto::CreateSessionRequest::default(), KEY))
        .await
        .unwrap_err();
    assert_quota(&refused, "sessions", 1);
    second.stop().await;
}

#[tokio::test]
async fn live_turns_quota_refuses_a_second_turn_with_a_retry_hint() {
    let s = server("live_turns = 1").await;
    let (a, b) = (
        create(&s, KEY).await.unwrap(),
        create(&s, KEY).await.unwrap(),
    );
    let mut live = start_chat(&s, chat(&a, "gate/x", "hold")).await.unwrap();
    until_text(&mut live).await;
    let refused = start_chat(&s, chat(&b, "builtin/echo", "second"))
        .await
        .unwrap_err();
    let delay = assert_quota(&refused, "live_turns", 1);
    assert!(delay.is_some_and(|d| d > Duration::ZERO && d <= Duration::from_secs(5)));
    // The Rust client reads the delay.
    let err = agentrt_client::Error::from_status(refused, &b, &s.server.url());
    let agentrt_client::Error::ResourceExhausted { retry_after, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*retry_after, delay);
    assert!(history(&s, &b).await.is_empty(), "nothing stored");
    s.gate.release(1);
    assert!(finish(live).await);
    let next = start_chat(&s, chat(&b, "builtin/echo", "now"))
        .await
        .unwrap();
    assert!(finish(next).await, "room again once the first turn ended");
    s.server.stop().await;
}

#[tokio::test]
async fn turns_per_minute_quota_says_when_the_window_frees() {
    const LIMIT: usize = 3;
    let s = server(&format!("turns_per_minute = {LIMIT}")).await;
    let session = create(&s, KEY).await.unwrap();
    // A minute may turn over during the test: then the refusal comes
    // after up to twice the limit.
    let mut admitted = 0;
    let refused = loop {
        assert!(admitted <= 2 * LIMIT, "never refused");
        match start_chat(&s, chat(&session, "builtin/echo", "hi")).await {
            Ok(turn) => {
                assert!(finish(turn).await);
                admitted += 1;
            }
            Err(status) => break status,
        }
    };
    assert!(admitted >= LIMIT, "refused after {admitted} turns");
    let delay = assert_quota(&refused, "turns_per_minute", LIMIT as i64).expect("a RetryInfo");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(60),
        "{delay:?}"
    );
    let users = history(&s, &session)
        .await
        .iter()
        .filter(|m| m.role() == proto::Role::User)
        .count();
    assert_eq!(users, admitted, "the refused turn stored nothing");
    s.server.stop().await;
}

#[tokio::test]
async fn stored_bytes_quota_refuses_a_message_past_it() {
    let s = server("stored_bytes = 3000").await;
    let session = create(&s, KEY).await.unwrap();
    let text = "x".repeat(1_800);
    let first = start_chat(&s, chat(&session, "builtin/echo", &text))
        .await
        .unwrap();
    assert!(finish(first).await);
    let before = history(&s, &session).await.len();
    let refused = start_chat(&s, chat(&session, "builtin/echo", &text))
        .await
        .unwrap_err();
    assert_eq!(assert_quota(&refused, "stored_bytes", 3000), None);
    assert_eq!(history(&s, &session).await.len(), before, "nothing stored");
    // A short message still fits.
    let small = start_chat(&s, chat(&session, "builtin/echo", "ok"))
        .await
        .unwrap();
    assert!(finish(small).await);
    // Deleting the session gives its bytes back.
    SessionServiceClient::new(channel(&s).await)
        .delete_session(authed(
            proto::DeleteSessionRequest {
                session_id: session,
            },
            KEY,
        ))
        .await
        .unwrap();
    let fresh = create(&s, KEY).await.unwrap();
    let again = start_chat(&s, chat(&fresh, "builtin/echo", &text))
        .await
        .unwrap();
    assert!(finish(again).await);
    s.server.stop().await;
}

fn a2a_authed<T>(message: T) -> Request<T> {
    let mut req = authed(message, KEY);
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().unwrap());
    req
}

fn a2a_send(text: &str, immediately: bool) -> Request<a2a::SendMessageRequest> {
    a2a_authed(a2a::SendMessageRequest {
        message: Some(a2a::Message {
            message_id: format!("m-{text}"),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text(text.to_owned())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        configuration: Some(a2a::SendMessageConfiguration {
            return_immediately: immediately,
            ..Default::default()
        }),
        ..Default::default()
    })
}

#[tokio::test]
async fn detached_a2a_tasks_quota_refuses_a_new_task() {
    // A2A turns take the default model: the gate, so a task stays working.
    let s = server_with("gate/x", "detached_tasks = 1").await;
    let mut a2a = A2aServiceClient::new(channel(&s).await);
    let sent = a2a
        .send_message(a2a_send("first", true))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("a task");
    };
    assert_eq!(
        task.status.as_ref().unwrap().state,
        a2a::TaskState::Working as i32
    );
    // Its caller has gone (return_immediately): the task is detached.
    let refused = a2a
        .send_message(a2a_send("second", true))
        .await
        .unwrap_err();
    assert_eq!(assert_quota(&refused, "detached_tasks", 1), None);
    assert_eq!(count_sessions(&s, KEY).await, 1, "no context was made");
    // Once the first task ends there is room again.
    let mut follow = a2a
        .subscribe_to_task(a2a_authed(a2a::SubscribeToTaskRequest {
            id: task.id.clone(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    s.gate.release(1);
    tokio::time::timeout(WAIT, async {
        while let Some(item) = follow.next().await {
            item.unwrap();
        }
    })
    .await
    .expect("the task ends");
    let third = a2a.send_message(a2a_send("third", true)).await;
    assert!(third.is_ok(), "{third:?}");
    s.gate.release(1);
    s.server.stop().await;
}
