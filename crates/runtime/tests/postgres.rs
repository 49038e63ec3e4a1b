//! `PostgresStore` beyond the store contract: migrations, the session
//! leases several replicas share, and an unreachable database. Every test
//! runs on a fresh database of the testkit's throwaway PostgreSQL
//! (`agentrt_testkit::pg`) and skips, saying so, when there is none (fails
//! under `CI=true`).
//!
//! Modules: `schema` (migrations), `leases` (admission, expiry, takeover,
//! sweeping, renewal), `registry` (input PostgreSQL refuses or bounds),
//! `outage` (a database that goes away, via `proxy`), `tls` (TLS modes
//! against the testkit's TLS-only server), `measure` (the history query's
//! plan; latencies, printed).

use std::time::{Duration, Instant};

use agentrt_runtime::store::{CreateOutcome, Lease, PgConfig, PgTls, PostgresStore, Store};
use agentrt_runtime::types::{ContentBlock, NewMessage, NewSession, Role, Session, TurnRecord};
use agentrt_testkit::pg::TestDb;

/// The tests, in `tests/postgres/`.
mod postgres {
    mod cluster;
    mod leases;
    mod measure;
    mod outage;
    mod proxy;
    mod registry;
    mod schema;
    mod tls;

    pub(crate) use super::*;
}

/// Settings of a store of replica `replica` on `url`.
fn config(url: &str, replica: &str, lease_ttl: Duration) -> PgConfig {
    PgConfig {
        url: url.to_owned(),
        pool_size: 8,
        replica_id: replica.to_owned(),
        address: format!("http://{replica}.test:50052"),
        lease_ttl,
        connect_timeout: Duration::from_secs(5),
        tls: PgTls::default(),
    }
}

/// A store of replica `replica` on `db`.
async fn store(db: &TestDb, replica: &str, lease_ttl: Duration) -> PostgresStore {
    PostgresStore::connect(config(&db.url, replica, lease_ttl))
        .await
        .expect("connect")
}

/// A new session of owner "alice".
async fn session(store: &dyn Store) -> Session {
    let new = NewSession {
        owner: "alice".to_owned(),
        agent_id: "agent".to_owned(),
        ..NewSession::default()
    };
    match store.create_session(new).await.expect("create") {
        CreateOutcome::Created(s) => s,
        CreateOutcome::Existing(s) => panic!("expected a new session, got {s:?}"),
    }
}

/// A running turn record of `session`.
fn running(session: &Session, turn_id: &str) -> TurnRecord {
    agentrt_testkit::contract::running_turn(&session.id, &session.incarnation, turn_id)
}

/// The user message of turn `turn_id`.
fn user(turn_id: &str) -> NewMessage {
    agentrt_testkit::contract::text_message(turn_id, Role::User, "question")
}

/// An assistant message of `turn_id` calling tools `calls`.
fn calling(turn_id: &str, calls: &[&str]) -> NewMessage {
    let content = calls
        .iter()
        .map(|id| ContentBlock::ToolCall {
            id: (*id).to_owned(),
            name: "search".to_owned(),
            arguments_json: "{}".to_owned(),
        })
        .collect();
    NewMessage::new(turn_id, Role::Assistant, content)
}

/// The result of tool call `call` in `turn_id`.
fn result(turn_id: &str, call: &str) -> NewMessage {
    NewMessage::new(
        turn_id,
        Role::Tool,
        vec![ContentBlock::ToolResult {
            call_id: call.to_owned(),
            name: "search".to_owned(),
            content: "found".to_owned(),
            is_error: false,
            interrupted: None,
            media: Vec::new(),
        }],
    )
}

/// The session's current lease.
async fn lease(store: &dyn Store, session_id: &str) -> Option<Lease> {
    let leases = store.leases().expect("a PostgreSQL store has leases");
    leases.lease(session_id).await.expect("lease")
}

/// Waits until the session's lease has lapsed on the database's clock
/// (polling the condition itself, within 30 s).
async fn wait_lapsed(store: &dyn Store, session_id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while lease(store, session_id).await.is_some() {
        assert!(Instant::now() < deadline, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Seqs of the session's whole history.
async fn seqs(store: &dyn Store, session_id: &str) -> Vec<u64> {
    let history = store
        .history(session_id, 0, usize::MAX, true)
        .await
        .expect("history");
    history.iter().map(|m| m.seq).collect()
}
