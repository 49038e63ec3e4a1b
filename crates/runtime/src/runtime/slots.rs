//! The live-turn slots: which session runs a turn, which one a
//! `CompactSession` or `DeleteSession` call holds, and who waits for a
//! session's next turn.
//!
//! One lock guards all four, because every decision here reads more than
//! one of them — admission may take a slot only when no delete or
//! compaction holds the session, a waiter may wait only when no turn is
//! live and no delete runs — and one lock makes each such decision atomic
//! with no lock order to keep. Every critical section is a few map
//! operations; nothing is awaited while it is held.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::caller_tools::Pending;
use super::lock;
use crate::error::RuntimeError;
use crate::events::Phase;
use crate::hub::TurnHub;
use crate::types::{CancelReason, Session};

/// A turn in flight, as seen by admission, stop and watchers.
#[derive(Debug)]
pub(crate) struct LiveTurn {
    pub(crate) turn_id: String,
    /// The session incarnation the turn runs in: a lookup by session id
    /// sees the turn only for that incarnation.
    pub(crate) incarnation: String,
    pub(crate) request_id: Option<String>,
    /// The session's owner (listed with the turn's lease).
    pub(crate) owner: String,
    pub(crate) started_at: SystemTime,
    pub(crate) hub: Arc<TurnHub>,
    pub(crate) cancel: CancellationToken,
    /// Set (before `cancel` fires) by [`LiveTurn::cancel`]: a check per
    /// relayed event without the token's lock.
    cancelled: AtomicBool,
    cancel_reason: Mutex<Option<CancelReason>>,
    phase: AtomicU8,
    /// Caller-executed tool calls waiting for `SubmitToolResult`.
    pub(crate) pending_tools: Mutex<Pending>,
    /// Cancelled when the turn task has ended (whatever the outcome).
    pub(crate) done: CancellationToken,
    /// Set by [`LiveTurn::lose_lease`]: this replica no longer holds the
    /// session's lease (a shared store), so the turn stores nothing more.
    lease_lost: AtomicBool,
    /// Set once `begin_turn` committed the turn's lease (a shared store):
    /// from then on, and not before, the renewer renews it — a turn between
    /// claiming its slot and committing has no lease to renew yet.
    leased: AtomicBool,
    /// Messages of `OnBusy::Steer` Chats for the turn's next step
    /// boundary; `None` once the turn takes no more (it is finishing).
    steering: Mutex<Option<Vec<super::queued::Steer>>>,
}

impl LiveTurn {
    /// A turn about to be admitted, in phase `Starting`.
    pub(crate) fn new(
        turn_id: String,
        incarnation: String,
        request_id: Option<String>,
        owner: String,
        hub: TurnHub,
    ) -> Self {
        Self {
            turn_id,
            incarnation,
            request_id,
            owner,
            started_at: SystemTime::now(),
            hub: Arc::new(hub),
            cancel: CancellationToken::new(),
            cancelled: AtomicBool::new(false),
            cancel_reason: Mutex::new(None),
            phase: AtomicU8::new(Phase::Starting as u8),
            pending_tools: Mutex::new(Pending::default()),
            done: CancellationToken::new(),
            lease_lost: AtomicBool::new(false),
            leased: AtomicBool::new(false),
            steering: Mutex::new(Some(Vec::new())),
        }
    }

    /// Hands `steer` to the turn for its next step boundary; given back
    /// when the turn takes no more, or already holds `max`.
    pub(crate) fn steer(
        &self,
        steer: Box<super::queued::Steer>,
        max: usize,
    ) -> Result<(), Box<super::queued::Steer>> {
        match lock(&self.steering).as_mut() {
            Some(list) if list.len() < max => {
                list.push(*steer);
                Ok(())
            }
            Some(_) | None => Err(steer),
        }
    }

    /// How many steering messages wait for the turn's next step boundary.
    pub(crate) fn steering(&self) -> usize {
        lock(&self.steering).as_ref().map_or(0, Vec::len)
    }

    /// The steering messages handed to the turn so far (at a step
    /// boundary); `close` also stops taking more (the turn is ending).
    pub(crate) fn take_steers(&self, close: bool) -> Vec<super::queued::Steer> {
        let mut steering = lock(&self.steering);
        if close {
            steering.take().unwrap_or_default()
        } else {
            steering.as_mut().map(std::mem::take).unwrap_or_default()
        }
    }

    /// Records that the turn's lease is committed (see `leased`).
    pub(crate) fn mark_leased(&self) {
        self.leased.store(true, Ordering::Release);
    }

    /// Whether the turn's lease is committed and so must be renewed.
    pub(crate) fn is_leased(&self) -> bool {
        self.leased.load(Ordering::Acquire)
    }

    /// Ends the turn because this replica lost the session's lease: it is
    /// cancelled (its model request closed), stores nothing more, and its
    /// callers are told why. Idempotent (counted once in
    /// `agentrt.turns.interrupted`).
    pub(crate) fn lose_lease(&self) {
        if !self.lease_lost.swap(true, Ordering::AcqRel) {
            crate::telemetry::metrics::turn_interrupted(
                crate::telemetry::metrics::Interruption::LeaseLost,
            );
        }
        self.cancel(CancelReason::Shutdown);
    }

    /// Whether [`LiveTurn::lose_lease`] was called; lock-free.
    pub(crate) fn lease_lost(&self) -> bool {
        self.lease_lost.load(Ordering::Acquire)
    }

    pub(crate) fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    pub(crate) fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// Cancels the turn; the first reason wins.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        {
            let mut slot = lock(&self.cancel_reason);
            if slot.is_none() {
                *slot = Some(reason);
            }
        }
        self.cancelled.store(true, Ordering::Release);
        self.cancel.cancel();
    }

    /// Whether [`LiveTurn::cancel`] was called; lock-free.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    pub(crate) fn cancel_reason(&self) -> Option<CancelReason> {
        *lock(&self.cancel_reason)
    }
}

/// How a `Subscribe(wait_for_turn)` caller is woken.
pub(crate) type Wake = Result<Arc<LiveTurn>, WaitEnded>;

/// Why a waiting watcher's wait ended without a turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitEnded {
    /// The session was deleted.
    SessionDeleted,
    /// The session's next turn was admitted on another replica (a shared
    /// store): its lease says where.
    Elsewhere(crate::store::Lease),
    /// The queued message waited for will not run: it was cleared from the
    /// inbox, or could not be admitted (what, and why, is stored in the
    /// session's history as a notice).
    NotRun(crate::events::ErrorCode, String),
}

/// A `Subscribe(wait_for_turn)` caller, or a queued Chat waiting for the
/// turn of its message.
#[derive(Debug)]
struct Waiter {
    incarnation: String,
    tx: oneshot::Sender<Wake>,
    /// The one turn this waiter waits for (a queued message's, whose turn
    /// id is the message's id); `None`: the session's next turn.
    turn: Option<String>,
}

impl Waiter {
    /// Whether the turn `turn_id` is what this waiter waits for.
    fn wants(&self, turn_id: &str) -> bool {
        self.turn.as_deref().is_none_or(|t| t == turn_id)
    }
}

/// What the slots hold, under their one lock.
#[derive(Debug, Default)]
struct Table {
    /// The live turn of each busy session.
    live: HashMap<String, Arc<LiveTurn>>,
    /// Sessions a `CompactSession` call is compacting (busy for `Chat`).
    compacting: HashSet<String>,
    /// Session ids a `DeleteSession` is deleting, with how many calls are
    /// at it: no turn is admitted and no session of that id created until
    /// they are done.
    deleting: HashMap<String, usize>,
    /// `Subscribe(wait_for_turn)` callers by session id, each with the
    /// incarnation it waits in; told when that incarnation's next turn is
    /// admitted, or that the session was deleted.
    waiters: HashMap<String, Vec<Waiter>>,
    /// Sessions a Chat with `OnBusy::Interrupt` is taking over, with how
    /// many: their inbox waits until it has its turn.
    interrupting: HashMap<String, usize>,
}

/// The live-turn slots of every session (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Slots {
    table: Mutex<Table>,
}

/// The refusal of a session id a turn of an earlier incarnation still holds.
const EARLIER_INCARNATION: RuntimeError = RuntimeError::Unavailable(
    "an earlier session with this id is still shutting down; retry shortly",
);

/// What [`Slots::claim_turn`] got.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The slot: the turn is live from now on until the guard is dropped.
    Claimed(TurnSlot),
    /// A concurrent retry of the same request already holds the slot: the
    /// caller joins that turn.
    Joined(Arc<LiveTurn>),
}

/// What a session id is held by, if anything (see [`Slots::holder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holder {
    /// Nothing: the id is free here.
    Nobody,
    /// A `DeleteSession` call.
    Delete,
    /// A live turn (of whichever incarnation).
    Turn,
}

/// What [`Slots::wait_for_turn`] found.
#[derive(Debug)]
pub(crate) enum Next {
    /// A turn is live: watch it.
    Live(Arc<LiveTurn>),
    /// None is: this fires when the next one is admitted.
    Waiting(oneshot::Receiver<Wake>),
}

impl Slots {
    /// Takes `session`'s slot for `turn`. Refused while a delete or a
    /// compaction holds the session or another turn is live in it — unless
    /// that turn is the same request, which the caller then joins.
    ///
    /// A queued message's turn (`from_inbox`) never joins another, and
    /// waits while an interrupting Chat takes the session over.
    pub(crate) fn claim_turn(
        self: &Arc<Self>,
        session: &Session,
        turn: &Arc<LiveTurn>,
        from_inbox: bool,
    ) -> Result<Claim, RuntimeError> {
        let mut table = lock(&self.table);
        if table.deleting.contains_key(&session.id) {
            return Err(RuntimeError::SessionNotFound);
        }
        if let Some(busy) = table.live.get(&session.id) {
            if busy.incarnation != session.incarnation {
                // A turn of a deleted session with this id is still
                // ending: it is nobody's business here, not even its id.
                return Err(EARLIER_INCARNATION);
            }
            if !from_inbox && busy.request_id.is_some() && busy.request_id == turn.request_id {
                return Ok(Claim::Joined(Arc::clone(busy)));
            }
            return Err(RuntimeError::SessionBusy {
                turn_id: busy.turn_id.clone(),
            });
        }
        if table.compacting.contains(&session.id) {
            return Err(RuntimeError::SessionCompacting);
        }
        if from_inbox && table.interrupting.contains_key(&session.id) {
            return Err(RuntimeError::SessionBusy {
                turn_id: String::new(),
            });
        }
        table.live.insert(session.id.clone(), Arc::clone(turn));
        Ok(Claim::Claimed(TurnSlot {
            slots: Arc::clone(self),
            session_id: session.id.clone(),
            live: Arc::clone(turn),
        }))
    }

    /// Takes `session`'s slot for a `CompactSession` call: refused while a
    /// delete, a turn or another compaction holds it.
    pub(crate) fn claim_compaction(
        &self,
        session: &Session,
    ) -> Result<CompactionSlot<'_>, RuntimeError> {
        let mut table = lock(&self.table);
        if table.deleting.contains_key(&session.id) {
            return Err(RuntimeError::SessionNotFound);
        }
        if let Some(turn) = table.live.get(&session.id) {
            if turn.incarnation != session.incarnation {
                return Err(EARLIER_INCARNATION);
            }
            return Err(RuntimeError::SessionBusy {
                turn_id: turn.turn_id.clone(),
            });
        }
        if !table.compacting.insert(session.id.clone()) {
            return Err(RuntimeError::SessionCompacting);
        }
        Ok(CompactionSlot {
            slots: self,
            session_id: session.id.clone(),
        })
    }

    /// Holds session id `session_id` for a `DeleteSession` call until the
    /// guard is dropped: a turn is either admitted before this (and is
    /// stopped by the delete) or sees the reservation and is refused.
    pub(crate) fn reserve_delete(&self, session_id: &str) -> DeleteSlot<'_> {
        *lock(&self.table)
            .deleting
            .entry(session_id.to_owned())
            .or_default() += 1;
        DeleteSlot {
            slots: self,
            session_id: session_id.to_owned(),
        }
    }

    /// Holds session `session_id` for a Chat interrupting its live turn
    /// until the guard is dropped: the session's queued messages wait
    /// (see [`Slots::claim_turn`]).
    pub(crate) fn reserve_interrupt(self: &Arc<Self>, session_id: &str) -> InterruptSlot {
        *lock(&self.table)
            .interrupting
            .entry(session_id.to_owned())
            .or_default() += 1;
        InterruptSlot {
            slots: Arc::clone(self),
            session_id: session_id.to_owned(),
        }
    }

    /// What holds session id `id`; a delete wins over a turn.
    pub(crate) fn holder(&self, id: &str) -> Holder {
        let table = lock(&self.table);
        if table.deleting.contains_key(id) {
            Holder::Delete
        } else if table.live.contains_key(id) {
            Holder::Turn
        } else {
            Holder::Nobody
        }
    }

    /// The live turn of `session` — of this incarnation only.
    pub(crate) fn live_of(&self, session: &Session) -> Option<Arc<LiveTurn>> {
        lock(&self.table)
            .live
            .get(&session.id)
            .filter(|t| t.incarnation == session.incarnation)
            .cloned()
    }

    /// The live turn of `session` or, when none is, a wait for its next one
    /// (at most `max_waiters` per session). Admission publishes a turn
    /// before it wakes the waiters, both under this lock, so a turn
    /// admitted meanwhile is either found here or wakes this waiter.
    pub(crate) fn wait_for_turn(
        &self,
        session: &Session,
        max_waiters: usize,
    ) -> Result<Next, RuntimeError> {
        self.wait(session, None, max_waiters)
    }

    /// The turn `turn_id` of `session` (a queued message's) when it is
    /// live, or a wait for it: woken when it is admitted here, ended when
    /// another replica admitted it, when it will not run, or when the
    /// session is deleted. At most `max_waiters` Chats wait for queued
    /// messages of one session (retries of one request id each add one).
    pub(crate) fn wait_for_queued(
        &self,
        session: &Session,
        turn_id: &str,
        max_waiters: usize,
    ) -> Result<Next, RuntimeError> {
        self.wait(session, Some(turn_id), max_waiters)
    }

    /// A wait for `session`'s next turn (`turn`: that one only), or the
    /// turn when it is live.
    fn wait(
        &self,
        session: &Session,
        turn: Option<&str>,
        max_waiters: usize,
    ) -> Result<Next, RuntimeError> {
        let mut table = lock(&self.table);
        if let Some(live) = table.live.get(&session.id).filter(|t| {
            t.incarnation == session.incarnation && turn.is_none_or(|id| t.turn_id == id)
        }) {
            return Ok(Next::Live(Arc::clone(live)));
        }
        // A delete ends the waiters after it reserved the id: one that
        // started meanwhile must not wait on a deleted session.
        if table.deleting.contains_key(&session.id) {
            return Err(RuntimeError::SessionNotFound);
        }
        let list = table.waiters.entry(session.id.clone()).or_default();
        list.retain(|w| !w.tx.is_closed());
        let kind = |w: &&Waiter| w.turn.is_some() == turn.is_some();
        if list.iter().filter(kind).count() >= max_waiters {
            return Err(RuntimeError::ResourceExhausted(if turn.is_some() {
                "too many callers are waiting for this session's queued messages"
            } else {
                "too many callers are waiting for this session's next turn"
            }));
        }
        let (tx, rx) = oneshot::channel();
        list.push(Waiter {
            incarnation: session.incarnation.clone(),
            tx,
            turn: turn.map(str::to_owned),
        });
        Ok(Next::Waiting(rx))
    }

    /// Ends the wait for queued message `turn_id` of session `session_id`:
    /// it will not run, for `why`.
    pub(crate) fn end_queued_waiter(&self, session_id: &str, turn_id: &str, why: &WaitEnded) {
        self.end_picked(session_id, why, |w| w.turn.as_deref() == Some(turn_id));
    }

    /// Wakes the watchers waiting for `session`'s next turn with `live`.
    /// Waiters of an earlier incarnation (none should be left: delete ends
    /// them) are dropped, never handed the turn.
    /// Waiters for another queued message's turn keep waiting.
    pub(crate) fn wake_waiters(&self, session: &Session, live: &Arc<LiveTurn>) {
        let woken = self.take_waiters(&session.id, |w| w.wants(&live.turn_id));
        for waiter in woken {
            if waiter.incarnation == session.incarnation {
                let _ = waiter.tx.send(Ok(Arc::clone(live)));
            }
        }
    }

    /// Ends every watcher waiting for a turn of session `session_id` — for
    /// a turn admitted elsewhere, only those waiting for that turn.
    pub(crate) fn end_waiters(&self, session_id: &str, why: &WaitEnded) {
        match why {
            WaitEnded::Elsewhere(lease) => {
                self.end_picked(session_id, why, |w| w.wants(&lease.turn_id));
            }
            WaitEnded::SessionDeleted | WaitEnded::NotRun(..) => {
                self.end_picked(session_id, why, |_| true);
            }
        }
    }

    /// Ends the waits of session `session_id` that `pick` selects, for
    /// `why`.
    fn end_picked(&self, session_id: &str, why: &WaitEnded, pick: impl Fn(&Waiter) -> bool) {
        for waiter in self.take_waiters(session_id, pick) {
            let _ = waiter.tx.send(Err(why.clone()));
        }
    }

    /// Ends the waits of every queued message of session `session_id`:
    /// none will run, for `why`.
    pub(crate) fn end_queued_waiters(&self, session_id: &str, why: &WaitEnded) {
        self.end_picked(session_id, why, |w| w.turn.is_some());
    }

    /// Takes the waiters of session `session_id` that `pick` selects.
    fn take_waiters(&self, session_id: &str, pick: impl Fn(&Waiter) -> bool) -> Vec<Waiter> {
        let mut table = lock(&self.table);
        let Some(list) = table.waiters.remove(session_id) else {
            return Vec::new();
        };
        let (taken, kept): (Vec<_>, Vec<_>) = list.into_iter().partition(pick);
        if !kept.is_empty() {
            table.waiters.insert(session_id.to_owned(), kept);
        }
        taken
    }

    /// The sessions someone waits on for a next turn (open waits only).
    pub(crate) fn waited_sessions(&self) -> Vec<String> {
        let mut table = lock(&self.table);
        table.waiters.retain(|_, list| {
            list.retain(|w| !w.tx.is_closed());
            !list.is_empty()
        });
        table.waiters.keys().cloned().collect()
    }

    /// Ends every waiting watcher (shutdown: no next turn will come).
    pub(crate) fn clear_waiters(&self) {
        let waiting = std::mem::take(&mut lock(&self.table).waiters);
        drop(waiting);
    }

    /// Number of live turns.
    pub(crate) fn live_count(&self) -> usize {
        lock(&self.table).live.len()
    }

    /// The live turns, e.g. to cancel them all.
    pub(crate) fn live_turns(&self) -> Vec<Arc<LiveTurn>> {
        lock(&self.table).live.values().cloned().collect()
    }

    /// Each live turn with its session id (the key of its lease).
    pub(crate) fn live_with_sessions(&self) -> Vec<(String, Arc<LiveTurn>)> {
        lock(&self.table)
            .live
            .iter()
            .map(|(id, t)| (id.clone(), Arc::clone(t)))
            .collect()
    }

    /// Live turns whose session lease this replica holds and renews.
    pub(crate) fn leased_count(&self) -> usize {
        lock(&self.table)
            .live
            .values()
            .filter(|t| t.is_leased() && !t.lease_lost())
            .count()
    }

    /// The session ids with a live turn.
    pub(crate) fn busy_sessions(&self) -> HashSet<String> {
        lock(&self.table).live.keys().cloned().collect()
    }

    /// (live turns, watchers attached to them, watchers waiting for one).
    pub(crate) fn counts(&self) -> (usize, usize, usize) {
        let (live, waiting) = {
            let table = lock(&self.table);
            let waiting = table.waiters.values().map(Vec::len).sum();
            (table.live.values().cloned().collect::<Vec<_>>(), waiting)
        };
        let watching = live.iter().map(|t| t.hub.watcher_count()).sum();
        (live.len(), watching, waiting)
    }
}

/// A session's slot held by its live turn; freed when dropped — on every
/// path out of a turn, panics included.
#[derive(Debug)]
pub(crate) struct TurnSlot {
    slots: Arc<Slots>,
    session_id: String,
    live: Arc<LiveTurn>,
}

impl Drop for TurnSlot {
    fn drop(&mut self) {
        {
            let mut table = lock(&self.slots.table);
            if table
                .live
                .get(&self.session_id)
                .is_some_and(|l| Arc::ptr_eq(l, &self.live))
            {
                table.live.remove(&self.session_id);
            }
        }
        self.live.done.cancel();
    }
}

/// A session held by an interrupting Chat (see
/// [`Slots::reserve_interrupt`]); given back when dropped.
#[derive(Debug)]
pub(crate) struct InterruptSlot {
    slots: Arc<Slots>,
    session_id: String,
}

impl Drop for InterruptSlot {
    fn drop(&mut self) {
        let mut table = lock(&self.slots.table);
        if let Some(n) = table.interrupting.get_mut(&self.session_id) {
            *n -= 1;
            if *n == 0 {
                table.interrupting.remove(&self.session_id);
            }
        }
    }
}

/// A session's slot held by a `CompactSession` call; freed when dropped.
#[derive(Debug)]
pub(crate) struct CompactionSlot<'a> {
    slots: &'a Slots,
    session_id: String,
}

impl Drop for CompactionSlot<'_> {
    fn drop(&mut self) {
        lock(&self.slots.table).compacting.remove(&self.session_id);
    }
}

/// A session id held by a `DeleteSession` call; given back when dropped.
#[derive(Debug)]
pub(crate) struct DeleteSlot<'a> {
    slots: &'a Slots,
    session_id: String,
}

impl Drop for DeleteSlot<'_> {
    fn drop(&mut self) {
        let mut table = lock(&self.slots.table);
        if let Some(n) = table.deleting.get_mut(&self.session_id) {
            *n -= 1;
            if *n == 0 {
                table.deleting.remove(&self.session_id);
            }
        }
    }
}

#[cfg(test)]
mod tests;
