//! Offboarding (`DeleteSessions`) on every store: an agent's sessions
//! across owners, page by page, and forgetting an owner.

use std::collections::BTreeSet;
use std::time::SystemTime;

use agentrt_runtime::quota::{DailySpent, day_window};
use agentrt_runtime::store::Store;
use agentrt_runtime::types::{TurnRecord, TurnStatus, Usage};

use super::{begin, create, running_turn};

/// `sessions_of_agent` pages through every owner's sessions of the agent
/// (archived ones too) exactly once, in id order, and no other agent's.
pub async fn sessions_of_agent_pages_every_owners_sessions(store: &dyn Store) {
    let mut wanted = BTreeSet::new();
    for owner in ["alice", "bob", "carol"] {
        for _ in 0..3 {
            wanted.insert(create(store, owner, "helper").await.id);
        }
        create(store, owner, "coder").await;
    }
    let archived = wanted.iter().next().cloned().expect("a session");
    let update = agentrt_runtime::types::SessionUpdate {
        archived: Some(true),
        ..Default::default()
    };
    store
        .update_session(&archived, update)
        .await
        .expect("archive");
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..100 {
        let page = store
            .sessions_of_agent("helper", after.as_deref(), 2)
            .await
            .expect("sessions_of_agent");
        assert!(page.sessions.len() <= 2, "a page holds at most its limit");
        assert!(page.sessions.iter().all(|s| s.agent_id == "helper"));
        seen.extend(page.sessions.into_iter().map(|s| s.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.sort();
    assert_eq!(seen, sorted, "id order");
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), wanted);
    let none = store
        .sessions_of_agent("nobody", None, 10)
        .await
        .expect("sessions_of_agent");
    assert!(none.sessions.is_empty());
}

/// Once an owner's sessions are deleted, `forget_owner` leaves no daily
/// spending of theirs; another owner's stays.
pub async fn forget_owner_drops_only_that_owners_spending(store: &dyn Store) {
    let now = SystemTime::now();
    let today = day_window(now).0;
    for owner in ["alice", "bob"] {
        let s = create(store, owner, "agent").await;
        let seq = begin(store, &s.id, "t1").await.seq;
        let ended = TurnRecord {
            status: TurnStatus::Success,
            finished_at: Some(now),
            usage: Usage {
                input_tokens: 7,
                output_tokens: 1,
                ..Usage::default()
            },
            user_message_seq: seq,
            ..running_turn(&s.id, &s.incarnation, "t1")
        };
        store.finish_turn(ended).await.expect("finish_turn");
        if owner == "alice" {
            assert!(store.delete_session(&s.id, None).await.expect("delete"));
        }
    }
    store.forget_owner("alice").await.expect("forget_owner");
    assert_eq!(
        store
            .daily_spent("alice", today)
            .await
            .expect("daily_spent"),
        DailySpent::default()
    );
    assert_eq!(
        store
            .daily_spent("bob", today)
            .await
            .expect("daily_spent")
            .tokens,
        8
    );
    store
        .forget_owner("nobody")
        .await
        .expect("forgetting no one");
}
