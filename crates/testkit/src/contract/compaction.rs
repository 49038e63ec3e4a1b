//! Contract checks for compaction records and titles.

use super::{create_new, new_session, text_message};
use agentrt_runtime::store::{Store, StoreError};
use agentrt_runtime::types::{NewMessage, Role, flatten_text};

fn summary(text: &str) -> NewMessage {
    text_message("compaction", Role::Summary, text)
}

async fn visible(store: &dyn Store, session_id: &str) -> Vec<u64> {
    let page = store.history(session_id, 0, 100, false).await.unwrap();
    page.iter().map(|m| m.seq).collect()
}

async fn flags(store: &dyn Store, session_id: &str) -> Vec<(u64, bool)> {
    let page = store.history(session_id, 0, 100, true).await.unwrap();
    page.iter().map(|m| (m.seq, m.compacted)).collect()
}

/// A compaction appends the summary and marks what it covers — messages up
/// to `through_seq` and earlier summaries — without rewriting them.
pub async fn compaction_marks_covered_messages(store: &dyn Store) {
    let session = create_new(store, new_session("alice", "agent")).await;
    let id = session.id.as_str();
    for (i, role) in [
        Role::User,
        Role::Assistant,
        Role::User,
        Role::Assistant,
        Role::User,
    ]
    .into_iter()
    .enumerate()
    {
        store
            .append_message(
                id,
                &session.incarnation,
                text_message("t", role, &format!("m{}", i + 1)),
            )
            .await
            .unwrap();
    }
    let first = store
        .store_compaction(id, &session.incarnation, summary("first summary"), 2)
        .await
        .unwrap();
    assert_eq!(first.seq, 6);
    assert_eq!(first.body.role, Role::Summary);
    assert!(!first.compacted);
    let s = store.get_session(id).await.unwrap().unwrap();
    assert_eq!((s.compacted_through, s.summary_seq), (2, 6));
    assert_eq!(s.message_count, 6);
    assert_eq!(visible(store, id).await, [3, 4, 5, 6]);
    assert_eq!(
        flags(store, id).await,
        [
            (1, true),
            (2, true),
            (3, false),
            (4, false),
            (5, false),
            (6, false)
        ]
    );
    // Reading from the compaction point reads only the tail and the summary.
    let tail = store.history(id, 2, 100, false).await.unwrap();
    assert_eq!(tail.iter().map(|m| m.seq).collect::<Vec<_>>(), [3, 4, 5, 6]);

    let second = store
        .store_compaction(id, &session.incarnation, summary("second summary"), 4)
        .await
        .unwrap();
    assert_eq!(second.seq, 7);
    assert_eq!(visible(store, id).await, [5, 7]);
    let all = store.history(id, 0, 100, true).await.unwrap();
    assert_eq!(all.len(), 7, "originals are kept");
    assert_eq!(flatten_text(&all[0].body.content), "m1");
    assert!(all[5].compacted, "the earlier summary is covered");
    assert!(!all[6].compacted);
}

/// Bad compaction arguments are refused without changing anything.
pub async fn compaction_rejects_bad_ranges(store: &dyn Store) {
    let session = create_new(store, new_session("alice", "agent")).await;
    let id = session.id.as_str();
    for i in 0..3 {
        store
            .append_message(
                id,
                &session.incarnation,
                text_message("t", Role::User, &format!("m{i}")),
            )
            .await
            .unwrap();
    }
    store
        .store_compaction(id, &session.incarnation, summary("s"), 2)
        .await
        .unwrap();
    let before = store.get_session(id).await.unwrap().unwrap();
    for (message, through) in [
        (summary("below"), 1),
        (summary("at its own seq"), 5),
        (text_message("t", Role::Assistant, "not a summary"), 3),
    ] {
        let err = store
            .store_compaction(id, &session.incarnation, message, through)
            .await;
        assert!(
            matches!(err, Err(StoreError::Backend(ref m)) if m.contains("invalid compaction")),
            "{err:?}"
        );
    }
    assert_eq!(store.get_session(id).await.unwrap().unwrap(), before);
    assert!(matches!(
        store.store_compaction("missing", "", summary("s"), 0).await,
        Err(StoreError::SessionNotFound)
    ));
}

/// A title is set only while the session has none, and setting it is not
/// activity.
pub async fn title_is_set_only_once(store: &dyn Store) {
    let session = create_new(store, new_session("alice", "agent")).await;
    let id = session.id.as_str();
    assert!(
        store
            .set_title_if_empty(id, &session.incarnation, "First")
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_title_if_empty(id, &session.incarnation, "Second")
            .await
            .unwrap()
    );
    let s = store.get_session(id).await.unwrap().unwrap();
    assert_eq!(s.title, "First");
    assert_eq!(s.last_active_at, session.last_active_at);
    assert!(matches!(
        store.set_title_if_empty("missing", "", "x").await,
        Err(StoreError::SessionNotFound)
    ));
}
