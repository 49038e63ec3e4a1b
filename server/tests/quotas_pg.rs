//! Quotas per principal on PostgreSQL, through gRPC: counted in the
//! database in the transaction of the write, so two replicas on one
//! database together never pass a user's sessions or live-turn limit, and
//! the turns-per-minute and stored-bytes quotas refuse with nothing stored.

use std::sync::Arc;
use std::time::Duration;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::proto;
use agentrt_client::proto::agent_runtime_client::AgentRuntimeClient;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_server::Config;
use agentrt_testkit::gate::GateProvider;
use support::*;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt as _;

const KEY: &str = "quota-pg-user-key";

fn authed<T>(message: T) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    req
}

/// `alice` (API key) with `quotas`.
fn with_quotas(quotas: &'static str) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        let parsed = Config::parse_toml(&format!(
            "[[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n[quotas]\n{quotas}\n"
        ))
        .unwrap();
        c.auth = parsed.auth;
        c.quotas = parsed.quotas;
    }
}

async fn quota_replica(url: &str, gate: &Arc<GateProvider>, quotas: &'static str) -> Replica {
    replica_with(url, false, &gate_models(gate), with_quotas(quotas)).await
}

async fn create(r: &Replica) -> Result<String, Status> {
    SessionServiceClient::new(channel(r.server.url()).await)
        .create_session(authed(proto::CreateSessionRequest::default()))
        .await
        .map(|r| r.into_inner().session_id)
}

async fn count_sessions(r: &Replica) -> usize {
    SessionServiceClient::new(channel(r.server.url()).await)
        .list_sessions(authed(proto::ListSessionsRequest {
            page_size: 500,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .sessions
        .len()
}

async fn history(r: &Replica, session_id: &str) -> Vec<proto::Message> {
    SessionServiceClient::new(channel(r.server.url()).await)
        .get_history(authed(proto::GetHistoryRequest {
            session_id: session_id.to_owned(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .messages
}

async fn start(r: &Replica, session: &str, model: &str, text: &str) -> Result<Events, Status> {
    let mut req = chat(session, model, "");
    req.content = vec![proto::ContentBlock {
        block: Some(proto::content_block::Block::Text(proto::TextBlock {
            text: text.to_owned(),
        })),
    }];
    AgentRuntimeClient::new(channel(r.server.url()).await)
        .chat(authed(req))
        .await
        .map(|r| r.into_inner())
}

fn assert_quota(status: &Status, quota: &str, limit: i64) -> Option<Duration> {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let details = status.get_error_details();
    let failure = details
        .quota_failure()
        .unwrap_or_else(|| panic!("no QuotaFailure in {status:?}"));
    let v = &failure.violations[0];
    assert_eq!((v.subject.as_str(), v.quota_id.as_str()), (quota, quota));
    assert_eq!(v.quota_value, limit);
    details.retry_info().and_then(|r| r.retry_delay)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_together_stay_within_the_sessions_quota() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = quota_replica(&db.url, &gate, "sessions = 3").await;
    let b = quota_replica(&db.url, &gate, "sessions = 3").await;
    let (a_url, b_url) = (a.server.url(), b.server.url());
    let creates: Vec<_> = (0..12)
        .map(|i| {
            let url = if i % 2 == 0 {
                a_url.clone()
            } else {
                b_url.clone()
            };
            tokio::spawn(async move {
                SessionServiceClient::new(channel(url).await)
                    .create_session(authed(proto::CreateSessionRequest::default()))
                    .await
            })
        })
        .collect();
    let mut created = 0;
    for create in creates {
        match create.await.unwrap() {
            Ok(_) => created += 1,
            Err(status) => assert_eq!(assert_quota(&status, "sessions", 3), None),
        }
    }
    assert_eq!(created, 3, "exactly the quota, across both replicas");
    assert_eq!(count_sessions(&a).await, 3);
    assert_eq!(count_sessions(&b).await, 3);
    a.server.stop().await;
    b.server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_together_stay_within_the_live_turns_quota() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = quota_replica(&db.url, &gate, "live_turns = 1").await;
    let b = quota_replica(&db.url, &gate, "live_turns = 1").await;
    let sessions = [create(&a).await.unwrap(), create(&b).await.unwrap()];
    // Both at once, one on each replica: exactly one is admitted.
    let (on_a, on_b) = tokio::join!(
        start(&a, &sessions[0], "gate/x", "one"),
        start(&b, &sessions[1], "gate/x", "two")
    );
    let (mut live, refused, idle) = match (on_a, on_b) {
        (Ok(live), Err(refused)) => (live, refused, &sessions[1]),
        (Err(refused), Ok(live)) => (live, refused, &sessions[0]),
        (one, two) => panic!(
            "exactly one admitted: {:?} / {:?}",
            one.is_ok(),
            two.is_ok()
        ),
    };
    let delay = assert_quota(&refused, "live_turns", 1);
    assert!(delay.is_some_and(|d| d > Duration::ZERO));
    assert!(history(&a, idle).await.is_empty(), "nothing stored");
    until(&mut live, is_text).await;
    // Still refused on either replica while the turn is live.
    for r in [&a, &b] {
        let again = start(r, idle, "gate/x", "again").await.unwrap_err();
        assert_quota(&again, "live_turns", 1);
    }
    gate.release(1);
    let (events, _) = drain(&mut live).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    gate.release(1);
    let mut next = start(&b, idle, "gate/x", "now").await.unwrap();
    let (events, _) = drain(&mut next).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    a.server.stop().await;
    b.server.stop().await;
}

#[tokio::test]
async fn turns_per_minute_and_stored_bytes_quotas_on_postgres() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    const LIMIT: usize = 2;
    let a = quota_replica(&db.url, &gate, "turns_per_minute = 2\nstored_bytes = 3000").await;
    let session = create(&a).await.unwrap();
    // A minute may turn over during the test: then the refusal comes after
    // up to twice the limit.
    let mut admitted = 0;
    let refused = loop {
        assert!(admitted <= 2 * LIMIT, "never refused");
        match start(&a, &session, "builtin/echo", "hi").await {
            Ok(mut turn) => {
                let (events, _) = drain(&mut turn).await;
                assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
                admitted += 1;
            }
            Err(status) => break status,
        }
    };
    assert!(admitted >= LIMIT);
    let delay = assert_quota(&refused, "turns_per_minute", LIMIT as i64).expect("RetryInfo");
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(60),
        "{delay:?}"
    );
    let users = history(&a, &session)
        .await
        .iter()
        .filter(|m| m.role() == proto::Role::User)
        .count();
    assert_eq!(users, admitted, "the refused turn stored nothing");

    // stored_bytes, in another replica's config without the minute limit
    // (the bytes of the turns above go with their session).
    SessionServiceClient::new(channel(a.server.url()).await)
        .delete_session(authed(proto::DeleteSessionRequest {
            session_id: session,
        }))
        .await
        .unwrap();
    a.server.stop().await;
    let b = quota_replica(&db.url, &gate, "stored_bytes = 3000").await;
    let big = "x".repeat(1_800);
    let fresh = create(&b).await.unwrap();
    let mut first = start(&b, &fresh, "builtin/echo", &big).await.unwrap();
    let (events, _) = drain(&mut first).await;
    assert_eq!(outcome(&events), Some(proto::TurnOutcome::Success));
    let before = history(&b, &fresh).await.len();
    let refused = start(&b, &fresh, "builtin/echo", &big).await.unwrap_err();
    assert_eq!(assert_quota(&refused, "stored_bytes", 3000), None);
    assert_eq!(history(&b, &fresh).await.len(), before, "nothing stored");
    SessionServiceClient::new(channel(b.server.url()).await)
        .delete_session(authed(proto::DeleteSessionRequest { session_id: fresh }))
        .await
        .unwrap();
    let other = create(&b).await.unwrap();
    let mut again = start(&b, &other, "builtin/echo", &big).await.unwrap();
    let (events, _) = drain(&mut again).await;
    assert_eq!(
        outcome(&events),
        Some(proto::TurnOutcome::Success),
        "deleting gave the bytes back"
    );
    b.server.stop().await;
}
