//! A turn that waits for its caller: the pause written to its record (so a
//! restart or a dead replica leaves it paused, not interrupted), the bound
//! of that wait, and the suspension of a waiting turn when the server
//! drains — its record left paused, its session busy, no `TurnFinished`.

use std::time::SystemTime;

use super::emitter::Emitter;
use super::{SUSPENDED_MESSAGE, Turn};
use crate::events::{ErrorCode, EventKind, Phase};
use crate::store::StoreError;
use crate::types::{Pause, PausedCall, QueuedInput, QueuedTool, TurnStatus};

impl Turn {
    /// Writes the pause of step `step`, waiting for `calls`, before the
    /// wait starts (`event_seq`: the last event emitted). The wait is
    /// bounded by the turn's deadline and `approval_timeout`. A failed
    /// write leaves the wait as it is, live but not durable.
    pub(super) async fn write_pause(&mut self, step: u32, calls: Vec<PausedCall>, event_seq: u64) {
        let (now, at) = (SystemTime::now(), tokio::time::Instant::now());
        let mut until = at + self.inner.config.approval_timeout;
        if let Some(deadline) = self.deadline {
            until = until.min(deadline);
        }
        if let Some(earlier) = self.pause_until {
            until = until.min(earlier);
        }
        self.pause_until = Some(until);
        let wall = |i: tokio::time::Instant| now + i.saturating_duration_since(at);
        self.record.pause = Some(Pause {
            step,
            calls,
            event_seq,
            until: wall(until),
            deadline: wall(self.deadline.unwrap_or(until)),
            input: self.pause_input(),
        });
        match self.inner.store.update_turn(self.record.clone()).await {
            Ok(()) => {}
            Err(StoreError::LeaseLost { .. }) => self.live.lose_lease(),
            Err(err) => {
                tracing::warn!(error = %err, "storing the turn's pause failed; it waits, but a restart interrupts it");
            }
        }
    }

    /// When the tool phase stops waiting: the deadline, or sooner the
    /// pause's bound while it waits for the caller.
    pub(super) fn wait_bound(&self) -> Option<tokio::time::Instant> {
        let paused = self.pause_until.filter(|_| self.record.pause.is_some());
        match (self.deadline, paused) {
            (Some(deadline), Some(until)) => Some(deadline.min(until)),
            (deadline, None) => deadline,
            (None, until) => until,
        }
    }

    /// What the turn's next steps need of its Chat, for a resume: the
    /// caller's tools, the server tools left out, the system prompt it
    /// replaced, its limits and approvals.
    fn pause_input(&self) -> QueuedInput {
        let server = |name: &str| self.runner.tools.iter().any(|t| t.name == name);
        QueuedInput {
            system_override: self
                .record
                .system_overridden
                .then(|| self.system_prompt.clone())
                .flatten(),
            excluded_tools: self
                .runner
                .tools
                .iter()
                .filter(|t| !self.tools.iter().any(|o| o.name == t.name))
                .map(|t| t.name.clone())
                .collect(),
            extra_tools: self
                .tools
                .iter()
                .filter(|t| !server(&t.name))
                .map(|t| QueuedTool {
                    name: t.name.clone(),
                    description: t.description.clone(),
                    parameters: t.parameters.clone(),
                })
                .collect(),
            max_steps: Some(self.max_steps),
            max_output_tokens: self.max_output_tokens,
            continue_on_disconnect: true,
            require_approval: self.require_approval.clone(),
            restricted: self.runner.key.restricted,
            ..QueuedInput::default()
        }
    }

    /// Leaves the turn paused in the store (the drain came while it waited
    /// for its caller): the record `Paused` with what it spent so far, the
    /// session freed here (busy in the store), and the callers told so —
    /// no `TurnFinished`: the turn has not ended.
    pub(super) async fn suspend(&mut self, emitter: &mut Emitter) {
        self.live.set_phase(Phase::Finishing);
        self.record.status = TurnStatus::Paused;
        self.record.usage = self.usage;
        let suspended = if self.live.lease_lost() {
            Err(StoreError::LeaseLost {
                turn_id: self.record.turn_id.clone(),
            })
        } else {
            self.inner.store.finish_turn(self.record.clone()).await
        };
        let message = match suspended {
            Ok(()) => SUSPENDED_MESSAGE,
            Err(err) => {
                tracing::error!(error = %err, "storing the paused turn failed");
                "the server is shutting down and could not keep the turn paused: its calls \
                 cannot be answered any more"
            }
        };
        drop(self.guard.take());
        emitter
            .emit(EventKind::Error {
                code: ErrorCode::Unavailable,
                message: message.to_owned(),
            })
            .await;
    }
}
