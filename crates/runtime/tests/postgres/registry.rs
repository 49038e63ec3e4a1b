//! Session-registry input the contract suite does not reach: values
//! PostgreSQL's `text` cannot hold, and limits at the ends of their range.

use std::time::Duration;

use agentrt_runtime::store::{HistoryQuery, ListQuery, Store, StoreError};
use agentrt_runtime::types::{NewSession, SessionUpdate};
use agentrt_testkit::pg;

#[tokio::test]
async fn nul_in_session_fields_is_refused_clearly() {
    let Some(db) = pg::database().await else {
        return;
    };
    let store = super::store(&db, "a", Duration::from_secs(10)).await;
    let bad = NewSession {
        owner: "alice".to_owned(),
        title: "a\0b".to_owned(),
        ..NewSession::default()
    };
    match store.create_session(bad).await {
        Err(StoreError::Backend(why)) => assert!(why.contains("NUL"), "{why}"),
        other => panic!("expected a clear refusal, got {other:?}"),
    }
    let s = super::session(&store).await;
    let update = SessionUpdate {
        metadata: Some([("k".to_owned(), "\0".to_owned())].into()),
        ..SessionUpdate::default()
    };
    assert!(matches!(
        store.update_session(&s.id, update).await,
        Err(StoreError::Backend(_))
    ));
    assert_eq!(store.get_session(&s.id).await.expect("get"), Some(s));
    assert_eq!(store.count_sessions().await.expect("count"), 1);
}

#[tokio::test]
async fn unbounded_limits_read_everything_once() {
    let Some(db) = pg::database().await else {
        return;
    };
    let store = super::store(&db, "a", Duration::from_secs(10)).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(super::session(&store).await.id);
    }
    let all = ListQuery {
        limit: usize::MAX,
        ..ListQuery::default()
    };
    let page = store.list_sessions("alice", &all).await.expect("list");
    assert_eq!((page.sessions.len(), page.next), (3, None));
    let history = HistoryQuery::unbounded(u64::MAX - 1, usize::MAX, true);
    let none = store
        .history_page(&ids[0], &history)
        .await
        .expect("history");
    assert!(none.messages.is_empty() && !none.more);
    assert!(
        store
            .history(&ids[0], 0, usize::MAX, false)
            .await
            .expect("history")
            .is_empty()
    );
}
