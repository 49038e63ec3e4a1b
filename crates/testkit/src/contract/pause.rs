//! Paused turns and the owners' spending per day, on every store.

use std::time::{Duration, SystemTime};

use agentrt_runtime::quota::{DailySpent, day_window};
use agentrt_runtime::store::{Store, StoreError};
use agentrt_runtime::types::{
    ContentBlock, NewMessage, Pause, PausedCall, QueuedInput, Role, TurnRecord, TurnStatus, Usage,
    Wait,
};

use super::{begin, create, get, running_turn, text_message, turn};

/// A turn whose record carries a pause is left PAUSED (not interrupted) by
/// recovery; while it is, no other turn begins in its session
/// (`StoreError::Paused`); `resume_turn` makes it running again (and is
/// refused once it is not paused), and its end frees the session.
pub async fn a_paused_turn_keeps_its_session_until_resumed(store: &dyn Store) {
    let s = create(store, "alice", "agent").await;
    let seq = begin(store, &s.id, "t1").await.seq;
    // The call the turn waits for, stored (without a result).
    let call = NewMessage::new(
        "t1",
        Role::Assistant,
        vec![ContentBlock::ToolCall {
            id: "call_1".into(),
            name: "lookup".into(),
            arguments_json: "{}".into(),
        }],
    );
    store
        .append_message(&s.id, &s.incarnation, call)
        .await
        .expect("append the call");
    let now = SystemTime::now();
    let waiting = TurnRecord {
        user_message_seq: seq,
        pause: Some(Pause {
            step: 1,
            calls: vec![PausedCall {
                call_id: "call_1".into(),
                name: "lookup".into(),
                arguments_json: "{}".into(),
                wait: Wait::Result,
            }],
            event_seq: 7,
            until: now,
            deadline: now,
            input: QueuedInput::default(),
        }),
        ..running_turn(&s.id, &s.incarnation, "t1")
    };
    store
        .update_turn(waiting.clone())
        .await
        .expect("update_turn");
    assert_eq!(turn(store, &s.id, "t1").await, Some(waiting.clone()));

    let recovered = store.recover_interrupted().await.expect("recover");
    let paused = recovered
        .iter()
        .find(|t| t.turn_id == "t1")
        .expect("the turn was recovered");
    assert_eq!(paused.status, TurnStatus::Paused);
    assert_eq!(paused.finished_at, None);
    let session = get(store, &s.id).await;
    assert_eq!(session.paused_turn(), Some("t1"));
    // Past its bound from `now` on, not before.
    let expired = |at| async move {
        store
            .expired_pauses(at, 10)
            .await
            .expect("expired_pauses")
            .into_iter()
            .map(|t| t.turn_id)
            .collect::<Vec<_>>()
    };
    assert!(expired(now - Duration::from_secs(1)).await.is_empty());
    assert_eq!(expired(now + Duration::from_secs(1)).await, ["t1"]);

    let refused = store
        .begin_turn(
            running_turn(&s.id, &s.incarnation, "t2"),
            text_message("t2", Role::User, "hello?"),
        )
        .await;
    assert!(
        matches!(&refused, Err(StoreError::Paused { turn_id }) if turn_id == "t1"),
        "{refused:?}"
    );

    let resumed = store
        .resume_turn(&s.id, &s.incarnation, "t1")
        .await
        .expect("resume_turn");
    assert_eq!(resumed.status, TurnStatus::Running);
    assert_eq!(resumed.pause, waiting.pause);
    assert_eq!(get(store, &s.id).await.paused_turn(), None);
    assert!(expired(now + Duration::from_secs(1)).await.is_empty());
    let again = store.resume_turn(&s.id, &s.incarnation, "t1").await;
    assert!(
        matches!(again, Err(StoreError::NotPaused { .. })),
        "{again:?}"
    );
    store
        .finish_turn(TurnRecord {
            status: TurnStatus::Success,
            finished_at: Some(SystemTime::now()),
            pause: None,
            ..resumed
        })
        .await
        .expect("finish_turn");
    begin(store, &s.id, "t2").await;
}

/// What an owner's ended turns used and cost is summed per UTC day across
/// the owner's sessions, once per turn; another owner's is apart.
pub async fn daily_spent_sums_an_owners_ended_turns(store: &dyn Store) {
    let now = SystemTime::now();
    let today = day_window(now).0;
    let ended =
        |s: &agentrt_runtime::types::Session, turn_id: &str, seq, tokens, cost| TurnRecord {
            status: TurnStatus::Success,
            finished_at: Some(now),
            usage: Usage {
                input_tokens: tokens,
                output_tokens: 1,
                ..Usage::default()
            },
            cost_nano_usd: cost,
            user_message_seq: seq,
            ..running_turn(&s.id, &s.incarnation, turn_id)
        };
    let a = create(store, "alice", "agent").await;
    let b = create(store, "alice", "agent").await;
    let c = create(store, "bob", "agent").await;
    let seq = begin(store, &a.id, "a1").await.seq;
    let first = ended(&a, "a1", seq, 10, Some(500));
    for _ in 0..2 {
        store.finish_turn(first.clone()).await.expect("finish_turn");
    }
    let seq = begin(store, &b.id, "b1").await.seq;
    store
        .finish_turn_with(
            ended(&b, "b1", seq, 20, None),
            Some(text_message("b1", Role::Assistant, "answer")),
        )
        .await
        .expect("finish_turn_with");
    let seq = begin(store, &c.id, "c1").await.seq;
    store
        .finish_turn(ended(&c, "c1", seq, 100, Some(9)))
        .await
        .expect("finish_turn");
    let spent = |owner: &'static str, day| async move {
        store.daily_spent(owner, day).await.expect("daily_spent")
    };
    assert_eq!(
        spent("alice", today).await,
        DailySpent {
            tokens: 32,
            cost_nano_usd: 500
        }
    );
    assert_eq!(
        spent("bob", today).await,
        DailySpent {
            tokens: 101,
            cost_nano_usd: 9
        }
    );
    assert_eq!(spent("alice", today - 1).await, DailySpent::default());
    assert_eq!(spent("carol", today).await, DailySpent::default());
}
