//! A Chat for a session that already runs a turn (`ChatInput::on_busy`):
//!
//! - `Enqueue`: the message is stored in the session's inbox (bounded per
//!   session) and the stream says where it stands (`Queued`), then follows
//!   the message's own turn when the turns before it have ended (module
//!   `inbox` runs it). The turn's id is the queued message's id.
//! - `Interrupt`: the live turn is cancelled (reason `Interrupted`, its
//!   partial output stored, as by StopSession), and once it has ended this
//!   message is admitted — ahead of the inbox, which waits meanwhile.
//! - `Steer`: the message is handed to the live turn, which stores it as a
//!   user message at its next step boundary (after the current step's tool
//!   results) and sends it with its next model request; the stream says
//!   so (`Steered`) and follows the live turn to its end. A turn that ends
//!   before a boundary queues the message instead (`Steered` without a
//!   seq, then `Queued`), and it runs as a later turn.
//!
//! A session busy on another replica (a shared store) is interrupted or
//! steered there ([`RuntimeError::Elsewhere`]: the adapter forwards the
//! Chat); a message for it is queued from anywhere, the store's inbox being
//! shared.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::oneshot;

use super::control::STOP_WAIT;
use super::queued::{Busy, Steer, Steered, chat_input};
use super::slots::WaitEnded;
use super::stream::{Found, Pending};
use super::{OnBusy, Runtime, TurnStream, validate};
use crate::error::RuntimeError;
use crate::events::{EventKind, TurnEvent};
use crate::types::{CancelReason, Principal, Queued, Session};

/// How often an interrupting Chat takes the session over when a turn
/// admitted meanwhile (a caller quicker than it) holds it again.
const INTERRUPT_ATTEMPTS: usize = 3;

/// An event of a stream's own (seq 0, outside any turn's numbering).
pub(crate) fn own_event(kind: EventKind) -> Arc<TurnEvent> {
    Arc::new(TurnEvent {
        seq: 0,
        at: SystemTime::now(),
        kind,
    })
}

impl Runtime {
    /// What a Chat whose session is busy (`busy_err`) does, by `on_busy`.
    pub(super) async fn when_busy(
        &self,
        who: &Principal,
        session: Session,
        on_busy: OnBusy,
        busy: Busy,
        busy_err: RuntimeError,
    ) -> Result<TurnStream, RuntimeError> {
        match on_busy {
            OnBusy::Reject => Err(busy_err),
            OnBusy::Enqueue => self.enqueue(&session, busy).await,
            OnBusy::Interrupt => self.interrupt(who, session, busy).await,
            OnBusy::Steer => self.steer(session, busy).await,
        }
    }

    /// With `OnBusy::Enqueue` on a session whose inbox still holds messages
    /// (the session may be idle for a moment between two of them), the
    /// message queues behind them rather than overtaking them.
    pub(super) async fn behind_inbox(
        &self,
        session: &Session,
        busy: &Busy,
    ) -> Result<Option<TurnStream>, RuntimeError> {
        let queued = self.inner.store.inbox().queued(&session.id).await?;
        if queued.is_empty() {
            return Ok(None);
        }
        self.enqueue(session, busy.clone()).await.map(Some)
    }

    /// Queues `busy`'s message in the session's inbox; a request id already
    /// queued there is the same message (a retry), not a second one.
    async fn enqueue(&self, session: &Session, busy: Busy) -> Result<TurnStream, RuntimeError> {
        let inbox = self.inner.store.inbox();
        if let Some(rid) = &busy.input.request_id {
            let queued = inbox.queued(&session.id).await?;
            if let Some((i, q)) = queued
                .iter()
                .enumerate()
                .find(|(_, q)| q.input.request_id.as_ref() == Some(rid))
            {
                return Ok(self.queued_stream(session, &q.id, i as u64 + 1, Vec::new()));
            }
        }
        // A restricted principal's bound is tighter (`[quotas.restricted]`).
        let mut max = self.inner.config.max_queued_per_session;
        if busy.input.restricted
            && let Some(tight) = self.inner.config.quotas.restricted_queued
        {
            max = max.min(tight);
        }
        let queued = Queued {
            id: crate::types::new_id(),
            session_id: session.id.clone(),
            incarnation: session.incarnation.clone(),
            enqueued_at: SystemTime::now(),
            admin: busy.admin,
            actor: Some(busy.actor),
            input: busy.input,
        };
        let id = queued.id.clone();
        self.inner
            .inbox_used
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let position = inbox.enqueue(queued, max).await?;
        let stream = self.queued_stream(session, &id, position, Vec::new());
        // The turn may have ended while this was queued: nobody else would
        // look at the inbox until the next sweep.
        super::inbox::kick(&self.inner, &session.id);
        Ok(stream)
    }

    /// The stream of queued message `id`: `before` and `Queued` first,
    /// then its turn.
    fn queued_stream(
        &self,
        session: &Session,
        id: &str,
        position: u64,
        mut before: Vec<Arc<TurnEvent>>,
    ) -> TurnStream {
        before.push(own_event(EventKind::Queued { position }));
        let wait = super::inbox::wait_for_queued(&self.inner, session, id);
        TurnStream::pending(session.id.clone(), id.to_owned(), before, wait)
    }

    /// Cancels the live turn (reason `Interrupted`), waits for its end and
    /// admits `busy`'s message, the inbox waiting meanwhile.
    async fn interrupt(
        &self,
        who: &Principal,
        session: Session,
        busy: Busy,
    ) -> Result<TurnStream, RuntimeError> {
        let _reserved = self.inner.slots.reserve_interrupt(&session.id);
        let mut last = None;
        for _ in 0..INTERRUPT_ATTEMPTS {
            // A paused turn is interrupted like a live one.
            self.wake_paused(&session).await?;
            if self.live_of(&session).is_none()
                && let Some(lease) = self.lease_elsewhere(&session.id).await?
            {
                return Err(RuntimeError::Elsewhere(lease));
            }
            match self
                .cancel_live(&session, CancelReason::Interrupted, STOP_WAIT)
                .await
            {
                super::Cancelled::StillEnding => {
                    return Err(RuntimeError::Unavailable(
                        "the live turn was told to stop but has not ended within 5 s; retry",
                    ));
                }
                super::Cancelled::Ended | super::Cancelled::NothingLive => {}
            }
            let mut input = chat_input(session.id.clone(), busy.input.clone());
            input.transport_deadline = busy.transport_deadline;
            input.on_disconnect = busy.on_disconnect;
            let checked = validate::chat_input(&input, &self.inner.config)?;
            match self.admit(who, session.clone(), input, checked, None).await {
                Err(err @ RuntimeError::SessionBusy { .. }) => last = Some(err),
                admitted => return admitted,
            }
        }
        Err(last.unwrap_or(RuntimeError::Unavailable("the session stayed busy; retry")))
    }

    /// Hands `busy`'s message to the live turn for its next step boundary;
    /// with no live turn (it ended meanwhile) the message is admitted as a
    /// turn of its own.
    async fn steer(&self, session: Session, busy: Busy) -> Result<TurnStream, RuntimeError> {
        // A paused turn takes the message once its calls are answered.
        self.wake_paused(&session).await?;
        let Some(live) = self.live_of(&session) else {
            if let Some(lease) = self.lease_elsewhere(&session.id).await? {
                return Err(RuntimeError::Elsewhere(lease));
            }
            // Ended meanwhile (or a compaction held the session): its own
            // turn, or queued behind the one admitted first.
            return self.enqueue(&session, busy).await;
        };
        let (reply, replied) = oneshot::channel();
        let max = usize::try_from(self.inner.config.max_queued_per_session).unwrap_or(usize::MAX);
        if let Err(refused) = live.steer(Box::new(Steer { busy, reply }), max) {
            // The turn is finishing: the message runs after it.
            return self.enqueue(&session, refused.busy).await;
        }
        let turn_id = live.turn_id.clone();
        let inner = Arc::downgrade(&self.inner);
        let waited = session.clone();
        let wait = Pending(Box::pin(async move {
            match replied.await {
                Ok(Steered::Joined { event_seq }) => Found::Live(live, event_seq.saturating_sub(1)),
                Ok(Steered::Queued { id, position }) => {
                    let Some(inner) = inner.upgrade() else {
                        return Found::Ended(WaitEnded::NotRun(
                            crate::events::ErrorCode::Unavailable,
                            "the server is shutting down".to_owned(),
                        ));
                    };
                    Found::Then(
                        Some(id.clone()),
                        vec![
                            own_event(EventKind::Steered { message_seq: None }),
                            own_event(EventKind::Queued { position }),
                        ],
                        super::inbox::wait_for_queued(&inner, &waited, &id),
                    )
                }
                Ok(Steered::Failed(code, why)) => Found::Ended(WaitEnded::NotRun(code, why)),
                Err(_) => Found::Ended(WaitEnded::NotRun(
                    crate::events::ErrorCode::Unavailable,
                    "the turn ended without taking the message; send it again".to_owned(),
                )),
            }
        }));
        Ok(TurnStream::pending(session.id, turn_id, Vec::new(), wait))
    }
}
