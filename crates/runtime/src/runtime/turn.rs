//! One turn, from its first event to its one `TurnFinished`: the driver
//! (here) runs the context's pre-start, the pre-turn compaction hook, then
//! the agent loop — model step, tool phase, model step … — and stores what
//! the persistence protocol says.
//!
//! - [`emitter`]: the [`Emitter`] every event goes through.
//! - [`prestart`]: the context load and first model request, started during
//!   admission.
//! - [`compaction`]: compacting an over-budget context before the first step.
//! - [`step`]: one model step and what its end means.
//! - [`tools`]: the tool phase after a step that called tools.
//! - [`finish`]: the last write and the end of the turn.
//!
//! Store writes are never raced against cancellation: once a write starts it
//! completes, so a stop can cut a model stream but never a record.

use crate::runtime::media::{self, NotShown};
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

mod budget;
mod compaction;
mod emitter;
mod finish;
mod hooks;
mod pause;
pub(crate) mod prestart;
mod steering;
mod step;
mod step_end;
mod tools;

use super::context::Context;
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

/// How a turn ended: its outcome and, for an error, what its callers are
/// told (an `Error` event before `TurnFinished`).
#[derive(Debug)]
pub(super) struct TurnEnd {
    pub(super) outcome: TurnOutcome,
    pub(super) error: Option<(ErrorCode, String)>,
    /// Not ended: suspended in its paused record (a drain while it waited
    /// for its caller); it resumes when its calls are answered.
    pub(super) suspended: bool,
}

impl TurnEnd {
    /// Ended as `outcome`, with nothing to tell beyond it.
    pub(super) const fn of(outcome: TurnOutcome) -> Self {
        Self {
            outcome,
            error: None,
            suspended: false,
        }
    }

    /// Ended in error, telling the callers `code` and `message`.
    pub(super) fn failed(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            outcome: TurnOutcome::Error,
            error: Some((code, message.into())),
            suspended: false,
        }
    }

    /// Suspended, paused in the store (see [`TurnEnd::suspended`]).
    pub(super) fn suspended() -> Self {
        Self {
            suspended: true,
            ..Self::failed(ErrorCode::Unavailable, SUSPENDED_MESSAGE)
        }
    }
}

/// What the callers of a turn suspended by a drain are told.
const SUSPENDED_MESSAGE: &str = "the server is shutting down while the turn waits for tool \
     results or approvals: the turn is paused, and resumes (on this server once restarted, or \
     another replica) when they are submitted";

/// What a resumed turn starts from: the paused step's calls still open,
/// their waits (registered before the turn started, so an answer can be
/// handed over at once), and the context loaded from history.
pub(crate) struct Resume {
    /// The step whose calls the turn waits for.
    pub(crate) index: u32,
    /// The open calls, in call order.
    pub(crate) open: Vec<crate::types::PausedCall>,
    /// Their waits, by call id.
    pub(crate) waits: std::collections::HashMap<
        String,
        (
            crate::types::Wait,
            tokio::sync::oneshot::Receiver<super::caller_tools::Answer>,
        ),
    >,
    /// The model's context, as history has it.
    pub(crate) context: Vec<Message>,
    /// The seq of the last event before the pause.
    pub(crate) event_seq: u64,
    /// When the pause ends unanswered.
    pub(crate) until: tokio::time::Instant,
}

pub(crate) struct Turn {
    inner: Arc<Inner>,
    live: Arc<LiveTurn>,
    runner: Arc<Runner>,
    record: TurnRecord,
    user_message: Message,
    system_prompt: Option<String>,
    guard: Option<TurnSlot>,
    started: Instant,
    deadline: Option<tokio::time::Instant>,
    /// Tools offered to the model (the runner's server tools and the
    /// caller's).
    tools: Vec<crate::model::ToolSpec>,
    max_steps: u32,
    /// The call's `max_output_tokens`, sent with every model step.
    max_output_tokens: Option<u32>,
    /// Usage summed over the turn's steps.
    usage: Usage,
    /// The final answer, stored together with the turn record.
    final_message: Option<NewMessage>,
    /// The step whose FINISH follows the final answer's `message_stored`.
    open_step: Option<u32>,
    /// The context load and first model request started during admission.
    prestart: Option<Prestart>,
    /// The session as admission re-read it under the slot.
    session: crate::types::Session,
    /// What the model is sent: loaded once (by the prestart task, or
    /// compacted first), then every message the turn stores is appended.
    context: Arc<Vec<Message>>,
    /// The context was compacted (or truncated) during this turn.
    compacted: bool,
    /// A `notice` told the caller of media the model was not shown (once
    /// per turn).
    media_notice_sent: std::sync::atomic::AtomicBool,
    /// A store write of this turn failed.
    store_failed: bool,
    /// Why a store write of this turn failed, when that is worth telling
    /// the callers (the disk is full, the store failed for good).
    store_cause: Option<&'static str>,
    /// The first model step's span, made at admission (its request starts
    /// there).
    first_chat: Option<tracing::Span>,
    /// Counts the turn in `agentrt.turns.live` while it exists.
    _live_metric: crate::telemetry::metrics::LiveGuard,
    /// Counts the turn against its owner's `live_turns` quota while it
    /// exists (on a store only this process writes).
    _quota: Option<crate::quota::LiveTurnGuard>,
    /// Server tools whose calls in this turn wait for an approval (the
    /// call's; the configuration's apply too; `*`: all).
    require_approval: Vec<String>,
    /// Set while the tool phase waits for the caller: when that wait ends
    /// unanswered.
    pause_until: Option<tokio::time::Instant>,
    /// A resumed turn's start, until its tool phase takes it.
    resume: Option<Resume>,
    /// The owner's budget for the day, with what it spent before this
    /// turn began.
    daily: Option<DailyBudget>,
    /// Whether the turn may title its session.
    auto_title: bool,
    /// What the turn's delegate sessions used and cost, summed (each
    /// delegate call adds its child turn's when it ends).
    delegated: Arc<std::sync::Mutex<crate::types::Spent>>,
}

/// An owner's budget for the day and what its turns spent before a turn
/// began.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DailyBudget {
    pub(crate) limits: crate::quota::QuotaLimits,
    pub(crate) spent: crate::quota::DailySpent,
}

/// What admission hands a turn, fixed for its whole run.
pub(crate) struct TurnPlan {
    pub(crate) runner: Arc<Runner>,
    /// The turn's record as `begin_turn` stored it.
    pub(crate) record: TurnRecord,
    pub(crate) user_message: Message,
    pub(crate) system_prompt: Option<String>,
    /// The session as admission re-read it under the slot.
    pub(crate) session: crate::types::Session,
    pub(crate) tools: Vec<crate::model::ToolSpec>,
    pub(crate) max_steps: u32,
    pub(crate) max_output_tokens: Option<u32>,
    /// When the turn was admitted, and when it must end.
    pub(crate) started: Instant,
    pub(crate) deadline: Option<tokio::time::Instant>,
    /// Server tools whose calls wait for an approval.
    pub(crate) require_approval: Vec<String>,
    /// The owner's budget for the day, when one is set.
    pub(crate) daily: Option<DailyBudget>,
    /// Whether the turn may title its session (its agent's `auto_title`;
    /// default yes).
    pub(crate) auto_title: bool,
}

/// What a turn holds while it runs, besides its plan: the session's slot,
/// the context load and first request started at admission (with that
/// request's span) — or, for a resumed turn, what it resumes from — and
/// its owner's live-turn count.
pub(crate) struct TurnHolds {
    pub(crate) slot: TurnSlot,
    pub(crate) start: Start,
    pub(crate) quota: Option<crate::quota::LiveTurnGuard>,
}

/// How a turn starts.
pub(crate) enum Start {
    /// Admitted: the context load and first request started at admission,
    /// with that request's span.
    Admitted(Prestart, tracing::Span),
    /// Resumed from its pause.
    Resumed(Resume),
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Turn {
    /// The turn admission planned, ready to run.
    pub(crate) fn new(
        inner: Arc<Inner>,
        live: Arc<LiveTurn>,
        plan: TurnPlan,
        holds: TurnHolds,
    ) -> Self {
        let (prestart, first_chat, resume) = match holds.start {
            Start::Admitted(prestart, span) => (Some(prestart), Some(span), None),
            Start::Resumed(resume) => (None, None, Some(resume)),
        };
        Self {
            pause_until: resume.as_ref().map(|r| r.until),
            resume,
            require_approval: plan.require_approval,
            daily: plan.daily,
            auto_title: plan.auto_title,
            // A resumed turn goes on from what its delegates used before.
            delegated: Arc::new(std::sync::Mutex::new(plan.record.delegated)),
            inner,
            live,
            runner: plan.runner,
            record: plan.record,
            user_message: plan.user_message,
            system_prompt: plan.system_prompt,
            guard: Some(holds.slot),
            started: plan.started,
            deadline: plan.deadline,
            tools: plan.tools,
            max_steps: plan.max_steps,
            max_output_tokens: plan.max_output_tokens,
            usage: Usage::default(),
            final_message: None,
            open_step: None,
            prestart,
            session: plan.session,
            context: Arc::default(),
            compacted: false,
            media_notice_sent: std::sync::atomic::AtomicBool::new(false),
            store_failed: false,
            store_cause: None,
            first_chat,
            _live_metric: crate::telemetry::metrics::LiveGuard::turn(),
            _quota: holds.quota,
        }
    }

    /// Runs the turn to its end. A panic anywhere in it — the context
    /// load, compaction, a model step, the tool phase, the final writes —
    /// is contained here: the turn still ends with exactly one
    /// `TurnFinished` (ERROR, `INTERNAL`), its record closed, its open tool
    /// calls answered, its session freed and its watchers released.
    pub(crate) async fn run(mut self, mut emitter: Emitter) {
        if let Some(resume) = &self.resume {
            emitter.continue_after(resume.event_seq);
        }
        let body = AssertUnwindSafe(self.body(&mut emitter))
            .catch_unwind()
            .await;
        let end = match body {
            Ok(ended) => ended,
            Err(panic) => {
                tracing::error!(panic = %panic_text(&*panic), "a turn panicked");
                self.panicked().await
            }
        };
        // However the body ended, a turn whose replica lost the session's
        // lease stored nothing since and is reported as that.
        let TurnEnd {
            outcome,
            error,
            suspended,
        } = if self.live.lease_lost() {
            self.lease_lost_outcome()
        } else {
            end
        };
        if suspended {
            self.suspend(&mut emitter).await;
            return;
        }
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
    async fn panicked(&mut self) -> TurnEnd {
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
        TurnEnd::failed(ErrorCode::Internal, INTERNAL_MESSAGE)
    }

    /// The outcome of a turn whose replica lost the session's lease
    /// (`LiveTurn::lose_lease`, or a write the store refused with
    /// `LeaseLost`): nothing more is stored — no answer, no record — and
    /// the callers get UNAVAILABLE.
    fn lease_lost_outcome(&mut self) -> TurnEnd {
        self.final_message = None;
        self.record.cancel_reason = None;
        self.store_failed = true;
        TurnEnd::failed(
            ErrorCode::Unavailable,
            crate::runtime::leases::LEASE_LOST_MESSAGE,
        )
    }

    /// The turn's states, from `Loading` (or `Resuming`) to `Finishing`,
    /// one at a time.
    async fn body(&mut self, emitter: &mut Emitter) -> TurnEnd {
        self.announce(emitter).await;
        let mut state = match &mut self.resume {
            Some(resume) => {
                self.context = Arc::new(std::mem::take(&mut resume.context));
                State::Resuming {
                    index: resume.index,
                }
            }
            None => State::Loading,
        };
        loop {
            state = match state {
                State::Loading => self.load(emitter).await,
                State::Resuming { index } => {
                    let ended = self.resumed_tool_step(index, emitter).await;
                    self.after_tools(index, ended, emitter).await
                }
                State::Compacting { context, tokens } => {
                    self.compact(context, tokens, emitter).await
                }
                State::Stepping { index, first } => self.step(index, first, emitter).await,
                State::Tools { index, output } => self.tools(index, output, emitter).await,
                State::Finishing(end) => return end,
            };
        }
    }

    /// `TurnStarted`, then the user message admission stored (a resumed
    /// turn's was announced before its pause).
    async fn announce(&self, emitter: &mut Emitter) {
        emitter
            .emit(EventKind::TurnStarted {
                model: self.record.model.clone(),
                thinking: self.record.thinking,
                user_message_seq: self.user_message.seq,
                system_overridden: self.record.system_overridden,
            })
            .await;
        if self.resume.is_some() {
            return;
        }
        emitter
            .emit(EventKind::MessageStored {
                seq: self.user_message.seq,
                id: self.user_message.body.id.clone(),
                role: Role::User,
            })
            .await;
    }

    /// Waits for the context admission started loading: the first step
    /// (with the request admission started), or compaction first.
    async fn load(&mut self, emitter: &mut Emitter) -> State {
        let loaded = match self.prestart.take() {
            Some(prestart) => prestart.loaded().await,
            None => Err(StoreError::Backend("the turn has no context".to_owned())),
        };
        match loaded {
            Ok((Loaded::Sent(messages, not_shown), first)) => {
                self.context = messages;
                self.not_shown(&not_shown, emitter).await;
                State::Stepping { index: 1, first }
            }
            Ok((Loaded::NeedsCompaction { context, tokens }, _)) => State::Compacting {
                context: *context,
                tokens,
            },
            Err(err) => {
                tracing::error!(error = %err, "loading the conversation failed");
                State::Finishing(TurnEnd::failed(
                    ErrorCode::Unavailable,
                    "the conversation could not be loaded",
                ))
            }
        }
    }

    /// Tells the caller, once per turn, of media its model was not shown.
    async fn not_shown(&self, not_shown: &NotShown, emitter: &mut Emitter) {
        use std::sync::atomic::Ordering;
        if self.media_notice_sent.load(Ordering::Relaxed) {
            return;
        }
        if let Some(notice) = not_shown.notice(&self.runner.key.model) {
            self.media_notice_sent.store(true, Ordering::Relaxed);
            emitter.emit(notice).await;
        }
    }

    /// The context as this turn's model is shown it (its media resolved,
    /// see [`media::for_model`]); a notice of what it was not shown.
    async fn shown_context(&self, emitter: &mut Emitter) -> Arc<Vec<Message>> {
        let support = self
            .runner
            .model
            .provider
            .media_support(&self.runner.model.provider_model);
        let (shown, not_shown) = media::for_model(
            &self.inner,
            &self.session.owner,
            support,
            Arc::clone(&self.context),
        )
        .await;
        self.not_shown(&not_shown, emitter).await;
        shown
    }

    /// Compacts an over-budget context, then the first step.
    async fn compact(&mut self, context: Context, tokens: u64, emitter: &mut Emitter) -> State {
        self.compacted = true;
        let span = tracing::info_span!(
            "compaction",
            otel.name = "agentrt.compaction",
            tokens_before = tokens,
        );
        let compacted =
            tracing::Instrument::instrument(self.compact_context(context, tokens, emitter), span)
                .await;
        self.context = Arc::new(compacted);
        State::Stepping {
            index: 1,
            first: None,
        }
    }

    /// Model step `index` (`first`: the request admission started): its
    /// tool calls go to the tool phase; any other end concludes the turn.
    async fn step(&mut self, index: u32, first: Option<FirstStep>, emitter: &mut Emitter) -> State {
        self.record.steps = index;
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
            self.model_step(first, &mut output, emitter),
            span.clone(),
        ))
        .catch_unwind()
        .await;
        self.close_chat(&span, step.as_ref().ok(), &output, step_started);
        if let Some(usage) = &output.usage {
            self.usage.add(usage);
        }
        let end = match step {
            Ok(StepEnd::Finished(_)) if !output.tool_calls.is_empty() => {
                return State::Tools { index, output };
            }
            Ok(end) => {
                // Calls without results must never reach history.
                output.tool_calls.clear();
                self.conclude(end, &mut output, emitter).await
            }
            Err(panic) => {
                tracing::error!(panic = %panic_text(&*panic), "model step panicked");
                output.tool_calls.clear();
                // The panic is what the callers are told, whatever the write.
                self.store_partial(&output, StopReason::Error, emitter)
                    .await
                    .ok();
                TurnEnd::failed(ErrorCode::Internal, INTERNAL_MESSAGE)
            }
        };
        if self.final_message.is_some() {
            // Closed in `finish`, after the answer is stored.
            self.open_step = Some(index);
        } else {
            self.close_step(index, emitter).await;
        }
        State::Finishing(end)
    }

    /// The tool phase of step `index`; then the next step, unless it ended
    /// the turn or the turn reached `max_steps`.
    async fn tools(&mut self, index: u32, mut output: StepOutput, emitter: &mut Emitter) -> State {
        let ended = self.tool_step(index, &mut output, emitter).await;
        self.after_tools(index, ended, emitter).await
    }

    /// After the tool phase of step `index`: the next step, unless the
    /// phase ended the turn or the turn reached `max_steps` (a suspended
    /// turn's step stays open).
    async fn after_tools(
        &mut self,
        index: u32,
        ended: Result<(), TurnEnd>,
        emitter: &mut Emitter,
    ) -> State {
        let ended = match ended {
            Err(end) if end.suspended => return State::Finishing(end),
            other => other,
        };
        self.close_step(index, emitter).await;
        match ended {
            Err(end) => State::Finishing(end),
            Ok(()) if index >= self.max_steps => State::Finishing(TurnEnd::failed(
                ErrorCode::ResourceExhausted,
                format!(
                    "the agent loop reached max_steps ({}) without a final answer",
                    self.max_steps
                ),
            )),
            Ok(()) => match self.budget_end(index, emitter).await {
                Some(end) => State::Finishing(end),
                None => match self.steered(emitter).await {
                    Err(end) => State::Finishing(end),
                    Ok(()) => State::Stepping {
                        index: index + 1,
                        first: None,
                    },
                },
            },
        }
    }

    async fn close_step(&self, index: u32, emitter: &mut Emitter) {
        emitter
            .emit(EventKind::Step {
                kind: StepKind::Finish,
                index,
            })
            .await;
    }

    /// The one write wrapper: appends a message (never raced against
    /// cancellation) and announces it. A write the turn cannot make — its
    /// lease is lost, or the store failed it — is the turn's end, returned
    /// as the `Err` for the finishing state.
    async fn store(&mut self, message: NewMessage, emitter: &mut Emitter) -> Result<(), TurnEnd> {
        if self.live.lease_lost() {
            // Another replica may own the session now: nothing more.
            self.store_failed = true;
            return Err(self.lease_lost_outcome());
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
                Ok(())
            }
            Err(err) => {
                tracing::error!(error = %err, role = ?role, "storing a message failed");
                self.store_failed = true;
                if matches!(err, StoreError::LeaseLost { .. }) {
                    self.live.lose_lease();
                    return Err(self.lease_lost_outcome());
                }
                self.store_cause = self.store_cause.or(cause_of(&err));
                Err(store_failed(self.store_cause))
            }
        }
    }
}

/// Where a turn is: the body moves from one state to the next until
/// `Finishing`, which carries how it ended (the finishing itself —
/// the last write, `TurnFinished` — is [`Turn::finish`]).
enum State {
    /// Waiting for the context admission started loading.
    Loading,
    /// The loaded context is over the budget and is compacted first.
    Compacting { context: Context, tokens: u64 },
    /// Model step `index`; `first` is the request admission started.
    Stepping {
        index: u32,
        first: Option<FirstStep>,
    },
    /// Step `index` called tools: run them and store their results.
    Tools { index: u32, output: StepOutput },
    /// A resumed turn: the calls of step `index` it waits for.
    Resuming { index: u32 },
    /// The turn ended so.
    Finishing(TurnEnd),
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
        | StoreError::NotQueued { .. }
        | StoreError::Paused { .. }
        | StoreError::NotPaused { .. }
        | StoreError::LeaseLost { .. } => None,
    }
}

/// The outcome of a turn whose write failed; `cause` says why, if known.
fn store_failed(cause: Option<&str>) -> TurnEnd {
    let message = cause.unwrap_or("the turn's output could not be stored");
    TurnEnd::failed(ErrorCode::Unavailable, message)
}

#[cfg(test)]
mod tests;
