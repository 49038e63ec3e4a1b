//! Steering messages (`OnBusy::Steer`) at the turn's step boundaries: each
//! handed to the turn since the last boundary is stored as a user message
//! (in seq order, after the step's tool results) and so sent with the next
//! model request; its Chat follows the turn from its `Steered` event. At
//! the turn's end, those it did not take are queued as later turns.

use super::emitter::Emitter;
use super::{Turn, TurnEnd};
use crate::events::EventKind;
use crate::runtime::Runtime;
use crate::runtime::busy::{Steer, Steered};
use crate::types::{NewMessage, Role};

impl Turn {
    /// Stores the steering messages handed to the turn since its last
    /// step boundary; a failed write ends the turn.
    pub(super) async fn steered(&mut self, emitter: &mut Emitter) -> Result<(), TurnEnd> {
        for Steer { busy, reply } in self.live.take_steers(false) {
            let content = busy.into_input().content;
            let message = NewMessage::new(&self.record.turn_id, Role::User, content);
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
    /// it did not take are queued, to run as later turns.
    pub(super) async fn requeue_steers(&mut self) {
        let steers = self.live.take_steers(true);
        if steers.is_empty() {
            return;
        }
        let runtime = Runtime {
            inner: std::sync::Arc::clone(&self.inner),
        };
        runtime.requeue_steers(&self.session, steers).await;
    }
}
