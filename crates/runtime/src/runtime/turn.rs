//! One turn, from its first event to its one `TurnFinished`: the driver
//! (here) runs the context's pre-start, the pre-turn compaction hook, then
//! the agent loop — model step, tool phase, model step … — and stores what
//! the persistence protocol says.
//!
//! - [`emitter`]: the [`Emitter`] every event goes through.
//! - [`prestart`]: the context load and first model request, started during
//!   admission.
//! - [`compact`]: compacting an over-budget context before the first step.
//! - [`step`]: one model step and what its end means.
//! - [`tools`]: the tool phase after a step that called tools.
//!
//! Store writes are never raced against cancellation: once a write starts it
//! completes, so a stop can cut a model stream but never a record.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use futures::FutureExt as _;

use super::Inner;
use super::runners::Runner;
use super::slots::{LiveTurn, TurnSlot};
use crate::events::{ErrorCode, EventKind, Phase, StepKind, TurnOutcome};
use crate::store::StoreError;
use crate::types::{Message, NewMessage, Role, StopReason, TurnRecord, TurnStatus, Usage};

mod compaction;
mod emitter;
pub(crate) mod prestart;
mod step;
mod tools;

pub(crate) use emitter::Emitter;
use prestart::{FirstStep, Loaded, Prestart};
use step::{StepEnd, StepOutput};

/// The text of the NOTICE stored when a turn reaches its deadline.
const TIMEOUT_NOTICE: &str = "the turn reached its time limit";
/// What a caller is told when a bug ended its turn.
const INTERNAL_MESSAGE: &str = "internal error while running the turn";
/// The result stored for a tool call a bug left unanswered.
const PANICKED_TOOL: &str = "an internal error ended the turn before this tool call finished";

/// The message of a caught panic, for the log.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

pub(crate) struct Turn {
    pub(crate) inner: Arc<Inner>,
    pub(crate) live: Arc<LiveTurn>,
    pub(crate) runner: Arc<Runner>,
    pub(crate) record: TurnRecord,
    pub(crate) user_message: Message,
    pub(crate) system_prompt: Option<String>,
    pub(crate) guard: Option<TurnSlot>,
    pub(crate) started: Instant,
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// Tools offered to the model (the runner's server tools and the
    /// caller's).
    pub(crate) tools: Vec<crate::model::ToolSpec>,
    pub(crate) max_steps: u32,
    /// The call's `max_output_tokens`, sent with every model step.
    pub(crate) max_output_tokens: Option<u32>,
    /// Usage summed over the turn's steps.
    pub(crate) usage: Usage,
    /// The final answer, stored together with the turn record.
    pub(crate) final_message: Option<NewMessage>,
    /// The step whose FINISH follows the final answer's `message_stored`.
    pub(crate) open_step: Option<u32>,
    /// The context load and first model request started during admission.
    pub(crate) prestart: Option<Prestart>,
    /// The session as admission re-read it under the slot.
    pub(crate) session: crate::types::Session,
    /// What the model is sent: loaded once (by the prestart task, or
    /// compacted first), then every message the turn stores is appended.
    pub(crate) context: Arc<Vec<Message>>,
    /// The context was compacted (or truncated) during this turn.
    pub(crate) compacted: bool,
    /// A store write of this turn failed.
    pub(crate) store_failed: bool,
    /// Why a store write of this turn failed, when that is worth telling
    /// the callers (the disk is full, the store failed for good).
    pub(crate) store_cause: Option<&'static str>,
    /// The first model step's span, made at admission (its request starts
    /// there).
    pub(crate) first_chat: Option<tracing::Span>,
    /// Counts the turn in `agentrt.turns.live` while it exists.
    pub(crate) _live_metric: crate::telemetry::metrics::LiveGuard,
    /// Counts the turn against its owner's `live_turns` quota while it
    /// exists (on a store only this process writes).
    pub(crate) _quota: Option<crate::quota::LiveTurnGuard>,
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Turn {
    /// Runs the turn to its end. A panic anywhere in it — the context
    /// load, compaction, a model step, the tool phase, the final writes —
    /// is contained here: the turn still ends with exactly one
    /// `TurnFinished` (ERROR, `INTERNAL`), its record closed, its open tool
    /// calls answered, its session freed and its watchers released.
    pub(crate) async fn run(mut self, mut emitter: Emitter) {
        let body = AssertUnwindSafe(self.body(&mut emitter))
            .catch_unwind()
            .await;
        let (outcome, error) = match body {
            Ok(ended) => ended,
            Err(panic) => {
                tracing::error!(panic = %panic_text(&*panic), "a turn panicked");
                self.panicked().await
            }
        };
        // However the body ended, a turn whose replica lost the session's
        // lease stored nothing since and is reported as that.
        let (outcome, error) = if self.live.lease_lost() {
            self.lease_lost_outcome()
        } else {
            (outcome, error)
        };
        if let Some((code, message)) = &error {
            emitter
                .emit(EventKind::Error {
                    code: *code,
                    message: message.clone(),
                })
                .await;
        }
        let finished = AssertUnwindSafe(self.finish(outcome, error.map(|(_, m)| m), &mut emitter))
            .catch_unwind()
            .await;
        if let Err(panic) = finished {
            tracing::error!(panic = %panic_text(&*panic), "finishing a turn panicked");
            self.record.status = TurnStatus::Error;
            self.record.finished_at = Some(SystemTime::now());
            self.record.error = Some(INTERNAL_MESSAGE.to_owned());
            if let Err(err) = self.inner.store.finish_turn(self.record.clone()).await {
                tracing::error!(error = %err, "storing the turn record failed");
            }
            drop(self.guard.take());
            if !emitter.finished {
                emitter
                    .emit(EventKind::TurnFinished {
                        outcome: TurnOutcome::Error,
                        cancel_reason: None,
                        usage: self.usage,
                        duration: self.started.elapsed(),
                    })
                    .await;
            }
        }
    }

    /// After a panic in the turn's body: nothing half-done reaches history
    /// (an answer not yet stored is dropped, tool calls already stored get
    /// an error result each), and the outcome is an internal error.
    async fn panicked(&mut self) -> (TurnOutcome, Option<(ErrorCode, String)>) {
        self.final_message = None;
        self.open_step = None;
        self.store_failed = true;
        if let Err(err) = crate::runtime::recovery::answer_open_calls(
            self.inner.store.as_ref(),
            &self.record,
            PANICKED_TOOL,
        )
        .await
        {
            tracing::error!(error = %err, "answering the open tool calls of a failed turn failed");
        }
        (
            TurnOutcome::Error,
            Some((ErrorCode::Internal, INTERNAL_MESSAGE.to_owned())),
        )
    }

    /// The outcome of a turn whose replica lost the session's lease
    /// (`LiveTurn::lose_lease`, or a write the store refused with
    /// `LeaseLost`): nothing more is stored — no answer, no record — and
    /// the callers get UNAVAILABLE.
    fn lease_lost_outcome(&mut self) -> (TurnOutcome, Option<(ErrorCode, String)>) {
        self.final_message = None;
        self.record.cancel_reason = None;
        self.store_failed = true;
        (
            TurnOutcome::Error,
            Some((
                ErrorCode::Unavailable,
                crate::runtime::leases::LEASE_LOST_MESSAGE.to_owned(),
            )),
        )
    }

    async fn body(&mut self, emitter: &mut Emitter) -> (TurnOutcome, Option<(ErrorCode, String)>) {
        emitter
            .emit(EventKind::TurnStarted {
                model: self.record.model.clone(),
                thinking: self.record.thinking,
                user_message_seq: self.user_message.seq,
                system_overridden: self.record.system_overridden,
            })
            .await;
        emitter
            .emit(EventKind::MessageStored {
                seq: self.user_message.seq,
                id: self.user_message.body.id.clone(),
                role: Role::User,
            })
            .await;

        let loaded = match self.prestart.take() {
            Some(prestart) => prestart.loaded().await,
            None => Err(StoreError::Backend("the turn has no context".to_owned())),
        };
        match loaded {
            Ok((Loaded::Sent(messages), first)) => {
                self.context = messages;
                self.agent_loop(first, emitter).await
            }
            Ok((Loaded::NeedsCompaction { context, tokens }, _)) => {
                self.compacted = true;
                let span = tracing::info_span!(
                    "compaction",
                    otel.name = "agentrt.compaction",
                    tokens_before = tokens,
                );
                let compacted = tracing::Instrument::instrument(
                    self.compact_context(context, tokens, emitter),
                    span,
                )
                .await;
                self.context = Arc::new(compacted);
                self.agent_loop(None, emitter).await
            }
            Err(err) => {
                tracing::error!(error = %err, "loading the conversation failed");
                (
                    TurnOutcome::Error,
                    Some((
                        ErrorCode::Unavailable,
                        "the conversation could not be loaded".to_owned(),
                    )),
                )
            }
        }
    }

    /// Model step → tool calls → results → model step ..., until the model
    /// answers without calling tools, something ends the turn, or
    /// `max_steps` is reached.
    async fn agent_loop(
        &mut self,
        mut first: Option<FirstStep>,
        emitter: &mut Emitter,
    ) -> (TurnOutcome, Option<(ErrorCode, String)>) {
        let mut index = 0;
        loop {
            index += 1;
            emitter
                .emit(EventKind::Step {
                    kind: StepKind::Start,
                    index,
                })
                .await;
            let mut output = StepOutput::default();
            let span = self.first_chat.take().unwrap_or_else(|| {
                crate::runtime::spans::chat(&tracing::Span::current(), &self.record.model)
            });
            let step_started = Instant::now();
            let step = AssertUnwindSafe(tracing::Instrument::instrument(
                self.model_step(first.take(), &mut output, emitter),
                span.clone(),
            ))
            .catch_unwind()
            .await;
            self.close_chat(&span, step.as_ref().ok(), &output, step_started);
            if let Some(usage) = &output.usage {
                self.usage.add(usage);
            }
            let result = match step {
                Ok(StepEnd::Finished(_)) if !output.tool_calls.is_empty() => {
                    self.tool_step(&mut output, emitter).await
                }
                Ok(end) => {
                    // Calls without results must never reach history.
                    output.tool_calls.clear();
                    Some(self.conclude(end, &mut output, emitter).await)
                }
                Err(panic) => {
                    tracing::error!(panic = %panic_text(&*panic), "model step panicked");
                    output.tool_calls.clear();
                    self.store_partial(&output, StopReason::Error, emitter)
                        .await;
                    Some((
                        TurnOutcome::Error,
                        Some((ErrorCode::Internal, INTERNAL_MESSAGE.to_owned())),
                    ))
                }
            };
            if self.final_message.is_some() {
                // Closed in `finish`, after the answer is stored.
                self.open_step = Some(index);
            } else {
                emitter
                    .emit(EventKind::Step {
                        kind: StepKind::Finish,
                        index,
                    })
                    .await;
            }
            match result {
                Some(end) => return end,
                None if index >= self.max_steps => {
                    return (
                        TurnOutcome::Error,
                        Some((
                            ErrorCode::ResourceExhausted,
                            format!(
                                "the agent loop reached max_steps ({}) without a final answer",
                                self.max_steps
                            ),
                        )),
                    );
                }
                None => {}
            }
        }
    }

    /// Appends a message (never raced against cancellation) and announces
    /// it. `false` when the store failed.
    async fn store(&mut self, message: NewMessage, emitter: &mut Emitter) -> bool {
        if self.live.lease_lost() {
            // Another replica may own the session now: nothing more.
            self.store_failed = true;
            return false;
        }
        self.live.set_phase(Phase::Storing);
        let role = message.role;
        match self
            .inner
            .store
            .append_message(&self.record.session_id, &self.record.incarnation, message)
            .await
        {
            Ok(stored) => {
                let (seq, id) = (stored.seq, stored.body.id.clone());
                Arc::make_mut(&mut self.context).push(stored);
                emitter
                    .emit(EventKind::MessageStored { seq, id, role })
                    .await;
                true
            }
            Err(err) => {
                tracing::error!(error = %err, role = ?role, "storing a message failed");
                if matches!(err, StoreError::LeaseLost { .. }) {
                    self.live.lose_lease();
                }
                self.store_cause = self.store_cause.or(cause_of(&err));
                self.store_failed = true;
                false
            }
        }
    }

    async fn finish(
        &mut self,
        mut outcome: TurnOutcome,
        error: Option<String>,
        emitter: &mut Emitter,
    ) {
        self.live.set_phase(Phase::Finishing);
        let usage = self.usage;
        self.record.status = status_of(outcome);
        self.record.finished_at = Some(SystemTime::now());
        self.record.usage = usage;
        self.record.error = error;
        let last = self.final_message.take();
        let had_last = last.is_some();
        let answer = match &last {
            Some(m) if self.session.title.is_empty() => crate::types::flatten_text(&m.content),
            _ => String::new(),
        };
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
                    let (lost, error) = self.lease_lost_outcome();
                    outcome = lost;
                    if let Some((code, message)) = error {
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
        if let Some(index) = self.open_step.take() {
            emitter
                .emit(EventKind::Step {
                    kind: StepKind::Finish,
                    index,
                })
                .await;
        }
        self.runner.touch();
        // Free the session before the caller sees the end, so a caller that
        // starts its next turn on `TurnFinished` is never told it is busy.
        drop(self.guard.take());
        emitter
            .emit(EventKind::TurnFinished {
                outcome,
                cancel_reason: self.record.cancel_reason,
                usage,
                duration: self.started.elapsed(),
            })
            .await;
        self.finished_summary(outcome, usage);
        if self.session.title.is_empty() && outcome == TurnOutcome::Success {
            crate::runtime::title::spawn(
                Arc::clone(&self.inner),
                self.record.session_id.clone(),
                self.record.incarnation.clone(),
                answer,
            );
        }
    }
}

impl Turn {
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

/// What a turn's callers are told when a write failed for `err`, if it
/// says more than "could not be stored".
fn cause_of(err: &StoreError) -> Option<&'static str> {
    match err {
        StoreError::DiskFull(_) => Some(
            "the server's disk is full: the turn's output could not be stored (what was stored \
             before stays); retry once space is freed",
        ),
        StoreError::Failed(_) => Some(
            "the server's store failed a write (its disk is full or failing): the turn's last \
             output may or may not have been stored, and the server needs a restart",
        ),
        StoreError::SessionNotFound
        | StoreError::Corrupt { .. }
        | StoreError::Backend(_)
        | StoreError::Unavailable(_)
        | StoreError::Busy(_)
        | StoreError::QuotaExceeded(_)
        | StoreError::LeaseLost { .. } => None,
    }
}

/// The outcome of a turn whose write failed; `cause` says why, if known.
fn store_failed(cause: Option<&str>) -> (TurnOutcome, Option<(ErrorCode, String)>) {
    let message = cause.unwrap_or("the turn's output could not be stored");
    (
        TurnOutcome::Error,
        Some((ErrorCode::Unavailable, message.to_owned())),
    )
}

fn status_of(outcome: TurnOutcome) -> TurnStatus {
    match outcome {
        TurnOutcome::Success => TurnStatus::Success,
        TurnOutcome::Error => TurnStatus::Error,
        TurnOutcome::Canceled => TurnStatus::Canceled,
        TurnOutcome::TimedOut => TurnStatus::TimedOut,
    }
}

#[cfg(test)]
mod tests;
