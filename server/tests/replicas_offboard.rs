//! `RuntimeAdmin.DeleteSessions` on two replicas of one PostgreSQL
//! database: a user's live turn on replica B is stopped where it runs when
//! the call arrives at replica A, and afterwards no row of that user is
//! left in any table, while another user's sessions stay.

use std::sync::Arc;

#[path = "support/replicas.rs"]
mod support;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_server::config::ApiKeyConfig;
use agentrt_testkit::gate::GateProvider;
use futures::StreamExt as _;
use support::*;

const OLIVIA: &str = "key-olivia-1";
const BRUNO: &str = "key-bruno-1";
const OPS: &str = "key-ops-001";

fn keyed(c: &mut agentrt_server::Config) {
    c.auth.api_keys = vec![
        ApiKeyConfig::inline(OLIVIA, "olivia", false),
        ApiKeyConfig::inline(BRUNO, "bruno", false),
        ApiKeyConfig::inline(OPS, "ops", true),
    ];
    c.default_model = "gate/g".into();
}

async fn client(r: &Replica, token: &str) -> Client {
    Client::builder(r.server.url())
        .token(token)
        .connect()
        .await
        .unwrap()
}

/// A finished turn of `client` in `session` (the gate released once).
async fn one_turn(client: &Client, gate: &GateProvider, session: &str) {
    let turn = client.chat(session, "a question").await.unwrap();
    gate.release(1);
    let done = tokio::time::timeout(WAIT, turn.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.outcome, Some(proto::TurnOutcome::Success));
}

async fn count(db: &tokio_postgres::Client, sql: &str, ids: &[String]) -> i64 {
    db.query_one(sql, &[&ids]).await.unwrap().get(0)
}

#[tokio::test]
async fn delete_sessions_stops_a_turn_on_another_replica_and_leaves_no_row_of_the_user() {
    let Some(db) = agentrt_testkit::pg::database().await else {
        return;
    };
    let gate = Arc::new(GateProvider::default());
    let a = replica_with(&db.url, true, &gate_models(&gate), keyed).await;
    let b = replica_with(&db.url, true, &gate_models(&gate), keyed).await;
    let (olivia_a, olivia_b) = (client(&a, OLIVIA).await, client(&b, OLIVIA).await);
    let bruno = client(&a, BRUNO).await;
    let ops = client(&a, OPS).await;

    // Bruno first: the gate's permits are shared by every waiting turn.
    let kept = bruno
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    one_turn(&bruno, &gate, &kept).await;
    let mut olivias = Vec::new();
    for _ in 0..3 {
        let id = olivia_a
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .session_id;
        olivias.push(id);
    }
    one_turn(&olivia_a, &gate, &olivias[0]).await;
    let blob = olivia_a
        .upload_blob(&olivias[1], "text/plain", "notes.txt", b"olivia's notes")
        .await
        .unwrap();
    // Her live turn runs on B.
    let mut live = olivia_b.chat(&olivias[2], "olivia waits").await.unwrap();
    loop {
        let event = tokio::time::timeout(WAIT, live.next()).await.unwrap();
        if matches!(
            event.expect("the turn streams").unwrap().kind,
            ChatEvent::Text(_)
        ) {
            break;
        }
    }

    let done = ops.delete_sessions("olivia", "").await.unwrap();
    assert_eq!((done.deleted, done.remaining), (3, 0), "{done:?}");
    assert_eq!(done.replica_ids.len(), 2, "both replicas acted: {done:?}");
    // Its TurnFinished, then the stream ends (the client reports a
    // cancelled turn as an error after it).
    let mut finished = None;
    while let Some(Ok(event)) = tokio::time::timeout(WAIT, live.next()).await.unwrap() {
        if let ChatEvent::TurnFinished { .. } = event.kind {
            finished = Some(event.kind);
        }
    }
    match finished {
        Some(ChatEvent::TurnFinished { cancel_reason, .. }) => {
            assert_eq!(cancel_reason, proto::CancelReason::SessionDeleted);
        }
        other => panic!("the live turn on B did not end as deleted: {other:?}"),
    }

    for on in [&olivia_a, &olivia_b] {
        let listed = on.list_sessions(Default::default()).await.unwrap();
        assert!(listed.sessions.is_empty(), "{listed:?}");
        for id in &olivias {
            let err = on.history(id).await.unwrap_err();
            assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
        }
    }
    let err = olivia_a
        .get_blob(&olivias[1], &blob.blob_id)
        .await
        .expect_err("gone");
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
    assert_eq!(bruno.history(&kept).await.unwrap().len(), 2);

    let (pg, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let conn = tokio::spawn(connection);
    let by_owner = [
        "SELECT count(*) FROM sessions WHERE owner = 'olivia' OR id = ANY($1)",
        "SELECT count(*) FROM turn_minutes WHERE owner = 'olivia' AND cardinality($1::text[]) >= 0",
        "SELECT count(*) FROM daily_spent WHERE owner = 'olivia' AND cardinality($1::text[]) >= 0",
        "SELECT count(*) FROM messages WHERE session_id = ANY($1)",
        "SELECT count(*) FROM turns WHERE session_id = ANY($1)",
        "SELECT count(*) FROM inbox WHERE session_id = ANY($1)",
    ];
    for sql in by_owner {
        assert_eq!(count(&pg, sql, &olivias).await, 0, "{sql}");
    }
    let bruno_rows = [
        "SELECT count(*) FROM sessions WHERE owner = 'bruno' AND id = ANY($1)",
        "SELECT count(*) FROM messages WHERE session_id = ANY($1)",
        "SELECT count(*) FROM daily_spent WHERE owner = 'bruno' AND cardinality($1::text[]) >= 0",
    ];
    for sql in bruno_rows {
        assert!(
            count(&pg, sql, std::slice::from_ref(&kept)).await > 0,
            "{sql}"
        );
    }
    drop(pg);
    let _ = conn.await;
    let blobs = a._dir.path().join("blobs");
    let mut stack = vec![blobs];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            assert!(path.is_dir(), "a blob file remains: {}", path.display());
            stack.push(path);
        }
    }
    a.server.stop().await;
    b.server.stop().await;
}
