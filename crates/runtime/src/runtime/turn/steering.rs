//! Steering messages (`OnBusy::Steer`) at the turn's step boundaries: each
//! handed to the turn since the last boundary is stored as a user message
//! (in seq order, after the step's tool results) and so sent with the next
//! model request; its Chat follows the turn from its `Steered` event. At
//! the turn's end, those it did not take are queued as later turns.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use super::emitter::Emitter;
use super::{Turn, TurnEnd};
use crate::error::RuntimeError;
use crate::events::{ErrorCode, EventKind};
use crate::runtime::queued::{Steer, Steered};
use crate::types::{NewMessage, Queued};

impl Turn {
    /// Stores the steering messages handed to the turn since its last
    /// step boundary; a failed write ends the turn.
    pub(super) async fn steered(&mut self, emitter: &mut Emitter) -> Result<(), TurnEnd> {
        for Steer { busy, reply } in self.live.take_steers(false) {
            // The steering Chat's own provenance, not the turn's.
            let message = NewMessage::from_user(
                &self.record.turn_id,
                busy.input.content,
                busy.input.speaker,
                busy.actor,
            );
            if let Err(end) = self.store(message, emitter).await {
                // Not stored: this Chat and the rest are told the turn
                // ended without them (their replies dropped with the
                // loop).
                drop(reply);
                return Err(end);
            }
            let message_seq = self.context.last().map(|m| m.seq);
            emitter.emit(EventKind::Steered { message_seq }).await;
            let _ = reply.send(Steered::Joined {
                event_seq: emitter.seq(),
            });
        }
        Ok(())
    }

    /// At the turn's end, before it frees the session: steering messages
    /// it did not take are queued in the inbox, to run as later turns, and
    /// their Chats told so.
    pub(super) async fn requeue_steers(&mut self) {
        let steers = self.live.take_steers(true);
        if steers.is_empty() {
            return;
        }
        self.inner.inbox_used.store(true, Ordering::Relaxed);
        let max = self.inner.config.max_queued_per_session;
        for Steer { busy, reply } in steers {
            let queued = Queued {
                id: crate::types::new_id(),
                session_id: self.session.id.clone(),
                incarnation: self.session.incarnation.clone(),
                enqueued_at: SystemTime::now(),
                admin: busy.admin,
                actor: Some(busy.actor),
                input: busy.input,
            };
            let id = queued.id.clone();
            let answer = match self.inner.store.inbox().enqueue(queued, max).await {
                Ok(position) => Steered::Queued { id, position },
                Err(err) => Steered::Failed(
                    ErrorCode::ResourceExhausted,
                    format!(
                        "the turn ended before the message could join it, and queuing it \
                         failed: {}",
                        RuntimeError::from(err)
                    ),
                ),
            };
            let _ = reply.send(answer);
        }
    }
}
