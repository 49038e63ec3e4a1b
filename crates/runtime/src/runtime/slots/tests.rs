//! The waits of queued messages, the interrupt reservation and the
//! steering messages of a live turn.

use std::sync::Arc;
use std::time::SystemTime;

use super::{Claim, LiveTurn, Next, Slots, WaitEnded};
use crate::error::RuntimeError;
use crate::hub::{ReplayLimits, TurnHub};
use crate::types::Session;

fn session() -> Session {
    Session {
        id: "s".into(),
        owner: "o".into(),
        agent_id: String::new(),
        project_id: String::new(),
        title: String::new(),
        model: String::new(),
        system_prompt: String::new(),
        metadata: Default::default(),
        created_at: SystemTime::UNIX_EPOCH,
        last_active_at: SystemTime::UNIX_EPOCH,
        archived: false,
        last_turn: None,
        message_count: 0,
        next_seq: 1,
        compacted_through: 0,
        summary_seq: 0,
        incarnation: "i1".into(),
        budget: Default::default(),
        spent: Default::default(),
        agent: Default::default(),
    }
}

fn turn(id: &str) -> Arc<LiveTurn> {
    Arc::new(LiveTurn::new(
        id.into(),
        "i1".into(),
        None,
        "alice".into(),
        TurnHub::new(ReplayLimits::default()),
    ))
}

#[test]
fn a_queued_messages_wait_is_woken_by_its_own_turn_only() {
    let slots = Arc::new(Slots::default());
    let s = session();
    let Ok(Next::Waiting(mut second)) = slots.wait_for_queued(&s, "q2", 8) else {
        panic!("waits")
    };
    let Ok(Next::Waiting(mut next)) = slots.wait_for_turn(&s, 8) else {
        panic!("waits")
    };
    // Another queued message's turn: the session's next-turn waiter wakes,
    // q2's does not.
    let q1 = turn("q1");
    let Ok(Claim::Claimed(slot)) = slots.claim_turn(&s, &q1, true) else {
        panic!("claimed")
    };
    slots.wake_waiters(&s, &q1);
    assert!(matches!(next.try_recv(), Ok(Ok(t)) if t.turn_id == "q1"));
    assert!(second.try_recv().is_err());
    drop(slot);
    let q2 = turn("q2");
    let Ok(Claim::Claimed(_slot)) = slots.claim_turn(&s, &q2, true) else {
        panic!("claimed")
    };
    slots.wake_waiters(&s, &q2);
    assert!(matches!(second.try_recv(), Ok(Ok(t)) if t.turn_id == "q2"));
    // Live now: a new wait finds it at once.
    assert!(matches!(
        slots.wait_for_queued(&s, "q2", 8),
        Ok(Next::Live(t)) if t.turn_id == "q2"
    ));
}

#[test]
fn a_not_run_ends_only_the_waits_it_concerns() {
    let slots = Arc::new(Slots::default());
    let s = session();
    let Ok(Next::Waiting(mut a)) = slots.wait_for_queued(&s, "qa", 8) else {
        panic!("waits")
    };
    let Ok(Next::Waiting(mut b)) = slots.wait_for_queued(&s, "qb", 8) else {
        panic!("waits")
    };
    let Ok(Next::Waiting(mut watcher)) = slots.wait_for_turn(&s, 8) else {
        panic!("waits")
    };
    let why = WaitEnded::NotRun(crate::events::ErrorCode::Cancelled, "gone".into());
    slots.end_queued_waiter("s", "qa", &why);
    assert!(matches!(a.try_recv(), Ok(Err(WaitEnded::NotRun(..)))));
    assert!(b.try_recv().is_err());
    slots.end_queued_waiters("s", &why);
    assert!(matches!(b.try_recv(), Ok(Err(WaitEnded::NotRun(..)))));
    // A Subscribe waiting for the next turn waits on.
    assert!(watcher.try_recv().is_err());
    // Bounded.
    let held = slots.wait_for_queued(&s, "qc", 1);
    assert!(matches!(held, Ok(Next::Waiting(_))));
    assert!(matches!(
        slots.wait_for_queued(&s, "qc", 1),
        Err(RuntimeError::ResourceExhausted(_))
    ));
}

#[test]
fn an_interrupt_holds_the_inbox_back_but_not_the_interrupting_chat() {
    let slots = Arc::new(Slots::default());
    let s = session();
    let reserved = slots.reserve_interrupt("s");
    let queued = slots.claim_turn(&s, &turn("q1"), true);
    assert!(matches!(queued, Err(RuntimeError::SessionBusy { .. })));
    let mine = turn("t1");
    let Ok(Claim::Claimed(slot)) = slots.claim_turn(&s, &mine, false) else {
        panic!("the interrupting Chat takes the session")
    };
    drop(slot);
    drop(reserved);
    assert!(matches!(
        slots.claim_turn(&s, &turn("q1"), true),
        Ok(Claim::Claimed(_))
    ));
}

#[test]
fn steering_messages_are_bounded_taken_at_a_boundary_and_refused_once_closed() {
    use crate::runtime::queued::{Busy, Steer};
    let live = turn("t");
    let steer = || {
        let (reply, _) = tokio::sync::oneshot::channel();
        let who = crate::types::Principal::new("o", false, crate::types::ActorKind::ApiKey);
        Box::new(Steer {
            busy: Busy::of(&who, &crate::runtime::ChatInput::default()),
            reply,
        })
    };
    assert!(live.steer(steer(), 2).is_ok());
    assert!(live.steer(steer(), 2).is_ok());
    assert!(live.steer(steer(), 2).is_err(), "bounded");
    assert_eq!(live.steering(), 2);
    assert_eq!(live.take_steers(false).len(), 2);
    assert!(live.steer(steer(), 2).is_ok());
    assert_eq!(live.take_steers(true).len(), 1);
    assert!(live.steer(steer(), 2).is_err(), "closed");
    assert!(live.take_steers(false).is_empty());
}
