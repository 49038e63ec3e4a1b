//! The finishing state: the turn's last durable write (its answer with its
//! final record), the step left open for it, the session freed before
//! `TurnFinished`, the summary, and the context kept for the next turn.

use std::sync::Arc;
use std::time::SystemTime;

use super::emitter::Emitter;
use super::{Turn, cause_of};
use crate::events::{ErrorCode, EventKind, Phase, StepKind, TurnOutcome};
use crate::store::StoreError;
use crate::types::{NewMessage, Role, TurnStatus, Usage};

impl Turn {
    pub(super) async fn finish(
        &mut self,
        outcome: TurnOutcome,
        error: Option<String>,
        emitter: &mut Emitter,
    ) {
        self.live.set_phase(Phase::Finishing);
        let usage = self.usage;
        self.record.status = status_of(outcome);
        self.record.finished_at = Some(SystemTime::now());
        self.record.usage = usage;
        self.record.delegated = self.delegated();
        self.record.cost_nano_usd =
            (self.inner.config.prices).cost_nano_usd(&self.record.model, &usage);
        if let Some(cost) = self.record.cost_nano_usd {
            let (provider, model) = crate::runtime::spans::split_model(&self.record.model);
            crate::telemetry::metrics::turn_cost(provider, model, cost);
        }
        self.record.error = error;
        let last = self.final_message.take();
        let answer = match &last {
            Some(m) if self.session.title.is_empty() => crate::types::flatten_text(&m.content),
            _ => String::new(),
        };
        let outcome = self.store_final(outcome, last, emitter).await;
        if let Some(index) = self.open_step.take() {
            emitter
                .emit(EventKind::Step {
                    kind: StepKind::Finish,
                    index,
                })
                .await;
        }
        self.runner.touch();
        // Steering messages that came too late run as later turns: queued
        // while the session is still this turn's.
        self.requeue_steers().await;
        // Free the session before the caller sees the end, so a caller that
        // starts its next turn on `TurnFinished` is never told it is busy.
        drop(self.guard.take());
        self.inner.turn_ended(&self.record.session_id);
        emitter
            .emit(EventKind::TurnFinished {
                outcome,
                cancel_reason: self.record.cancel_reason,
                usage,
                duration: self.started.elapsed(),
            })
            .await;
        self.finished_summary(outcome, usage);
        if self.auto_title && self.session.title.is_empty() && outcome == TurnOutcome::Success {
            crate::runtime::title::spawn(
                Arc::clone(&self.inner),
                self.record.session_id.clone(),
                self.record.incarnation.clone(),
                answer,
            );
        }
    }

    /// The turn's last write: its answer (when it has one) with its final
    /// record, durable together. A lost lease, or a failed write of the
    /// answer, turns `outcome` into an error the callers are told about;
    /// returns the outcome to report.
    async fn store_final(
        &mut self,
        mut outcome: TurnOutcome,
        last: Option<NewMessage>,
        emitter: &mut Emitter,
    ) -> TurnOutcome {
        let had_last = last.is_some();
        let finished = if self.live.lease_lost() {
            Err(StoreError::LeaseLost {
                turn_id: self.record.turn_id.clone(),
            })
        } else {
            self.inner
                .store
                .finish_turn_with(self.record.clone(), last)
                .await
        };
        match finished {
            Ok(Some(stored)) => {
                let (seq, id) = (stored.seq, stored.body.id.clone());
                Arc::make_mut(&mut self.context).push(stored);
                self.keep_context(seq + 1);
                emitter
                    .emit(EventKind::MessageStored {
                        seq,
                        id,
                        role: Role::Assistant,
                    })
                    .await;
            }
            Ok(None) => {
                let next = self.context.last().map_or(0, |m| m.seq + 1);
                self.keep_context(next);
            }
            Err(StoreError::LeaseLost { .. }) => {
                self.store_failed = true;
                if !self.live.lease_lost() {
                    // Found out by this write: the callers learn it now.
                    tracing::warn!("the store refused the turn's last write: its lease was lost");
                    self.live.lose_lease();
                    let lost = self.lease_lost_outcome();
                    outcome = lost.outcome;
                    if let Some((code, message)) = lost.error {
                        emitter.emit(EventKind::Error { code, message }).await;
                    }
                }
            }
            Err(err) if had_last => {
                tracing::error!(error = %err, "storing the answer and the turn record failed");
                self.store_cause = self.store_cause.or(cause_of(&err));
                let message = self
                    .store_cause
                    .unwrap_or("the answer could not be stored")
                    .to_owned();
                outcome = TurnOutcome::Error;
                self.record.status = status_of(outcome);
                self.record.error = Some(message.clone());
                emitter
                    .emit(EventKind::Error {
                        code: ErrorCode::Unavailable,
                        message,
                    })
                    .await;
                if let Err(err) = self.inner.store.finish_turn(self.record.clone()).await {
                    tracing::error!(error = %err, "storing the turn record failed");
                }
            }
            Err(err) => tracing::error!(error = %err, "storing the turn record failed"),
        }
        outcome
    }

    /// The turn's one summary log line, its outcome on the turn's span and
    /// in `agentrt.turns`.
    fn finished_summary(&self, outcome: TurnOutcome, usage: Usage) {
        crate::runtime::spans::turn_finished(
            &tracing::Span::current(),
            &self.record.session_id,
            &self.record.turn_id,
            &self.record.model,
            outcome,
            self.started.elapsed(),
            usage,
        );
    }

    /// Leaves the context on the runner for the next turn, unless this
    /// turn compacted (the session's compaction state moved) or any of its
    /// writes failed (then the context may not match the store).
    fn keep_context(&mut self, next_seq: u64) {
        if self.compacted || self.store_failed || next_seq == 0 {
            return;
        }
        let messages = Arc::unwrap_or_clone(std::mem::take(&mut self.context));
        self.runner.keep_context(&self.session, next_seq, messages);
    }
}

fn status_of(outcome: TurnOutcome) -> TurnStatus {
    match outcome {
        TurnOutcome::Success => TurnStatus::Success,
        TurnOutcome::Error => TurnStatus::Error,
        TurnOutcome::Canceled => TurnStatus::Canceled,
        TurnOutcome::TimedOut => TurnStatus::TimedOut,
        TurnOutcome::BudgetExceeded => TurnStatus::BudgetExceeded,
    }
}
