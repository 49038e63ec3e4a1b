//! Records for the stores' own unit tests, which reach past the [`Store`]
//! trait into a store's internals (raw sled trees, memory entries) and so
//! cannot use `agentrt-testkit` (its `Store` is another compilation of
//! this crate). Tests through the public API use the testkit's store
//! contract suite instead (`crates/runtime/tests/store_contract.rs`).

use std::time::SystemTime;

use super::{CreateOutcome, Store};
use crate::types::{
    ContentBlock, Message, NewMessage, NewSession, Role, ThinkingLevel, TurnRecord, TurnStatus,
    Usage,
};

/// A text message of `turn_id`.
pub(crate) fn text_message(turn_id: &str, role: Role, body: &str) -> NewMessage {
    NewMessage::new(turn_id, role, vec![ContentBlock::text(body)])
}

/// A running turn record with every field set (`user_message_seq` is junk
/// that `begin_turn` must overwrite).
pub(crate) fn running_turn(session_id: &str, incarnation: &str, turn_id: &str) -> TurnRecord {
    TurnRecord {
        incarnation: incarnation.to_owned(),
        steps: 0,
        cost_nano_usd: None,
        from_inbox: None,
        pause: None,
        delegated: crate::types::Spent::default(),
        turn_id: turn_id.to_owned(),
        session_id: session_id.to_owned(),
        status: TurnStatus::Running,
        started_at: SystemTime::now(),
        finished_at: None,
        model: "echo/echo".to_owned(),
        thinking: Some(ThinkingLevel::Low),
        system_overridden: true,
        usage: Usage::default(),
        user_message_seq: 999,
        error: None,
        cancel_reason: None,
        request_id: Some(format!("req-{turn_id}")),
    }
}

/// The incarnation of session `id` (empty when it does not exist).
pub(crate) async fn incarnation(store: &dyn Store, id: &str) -> String {
    store
        .get_session(id)
        .await
        .expect("get_session")
        .map(|s| s.incarnation)
        .unwrap_or_default()
}

/// Creates a session of owner "seed" with `count` text messages; its id.
pub(crate) async fn seed_history(store: &dyn Store, count: usize) -> String {
    let new = NewSession {
        owner: "seed".to_owned(),
        agent_id: "agent".to_owned(),
        ..NewSession::default()
    };
    let id = match store.create_session(new).await.expect("create_session") {
        CreateOutcome::Created(session) => session.id,
        CreateOutcome::Existing(session) => panic!("expected a new session, got {session:?}"),
    };
    for i in 0..count {
        let message = text_message("t", Role::Assistant, &format!("message {i}"));
        store
            .append_message(&id, &incarnation(store, &id).await, message)
            .await
            .expect("append_message");
    }
    id
}

/// `history` hides the `compacted` seqs unless asked. There is no trait
/// method to mark single messages, so the store's test marks them before
/// calling this.
pub(crate) async fn check_compacted_filter(store: &dyn Store, session_id: &str, compacted: &[u64]) {
    let all: Vec<Message> = store
        .history(session_id, 0, usize::MAX, true)
        .await
        .expect("history");
    let flagged = all.iter().filter(|m| m.compacted).map(|m| m.seq);
    assert!(flagged.eq(compacted.iter().copied()));
    let visible = store
        .history(session_id, 0, usize::MAX, false)
        .await
        .expect("history");
    let expected: Vec<&Message> = all.iter().filter(|m| !m.compacted).collect();
    assert_eq!(visible.iter().collect::<Vec<_>>(), expected);
    let limited = store
        .history(session_id, 0, 2, false)
        .await
        .expect("history");
    assert_eq!(
        limited.len(),
        2.min(expected.len()),
        "the limit counts visible messages"
    );
}
