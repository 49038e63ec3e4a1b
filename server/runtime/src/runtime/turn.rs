//! The body of one turn: call the model, relay its deltas, store what the
//! persistence protocol says, end with exactly one `TurnFinished`.
//!
//! Store writes are never raced against cancellation: once a write starts it
//! completes, so a stop can cut a model stream but never a record.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::mpsc;

use super::{BusyGuard, Inner, LiveTurn, Runner};
use crate::events::{ErrorCode, EventKind, Phase, StepKind, TurnEvent, TurnOutcome};
use crate::hub::TurnHub;
use crate::model::{ModelError, ModelEvent, ModelRequest};
use crate::store::StoreError;
use crate::types::{
    CancelReason, ContentBlock, Message, NewMessage, Role, StopReason, TurnRecord, TurnStatus,
    Usage,
};

/// Messages loaded per store call when assembling the model context.
const CONTEXT_PAGE: usize = 1_000;
/// The text of the NOTICE stored when a turn reaches its deadline.
pub(crate) const TIMEOUT_NOTICE: &str = "the turn reached its time limit";

/// Numbers events, publishes them to the hub and forwards them to the
/// caller while the caller is there.
pub(crate) struct Emitter {
    seq: u64,
    hub: Arc<TurnHub>,
    caller: Option<mpsc::Sender<Arc<TurnEvent>>>,
    heartbeat_interval: Duration,
    last_emit: tokio::time::Instant,
}

impl Emitter {
    pub(crate) fn new(
        hub: Arc<TurnHub>,
        caller: mpsc::Sender<Arc<TurnEvent>>,
        heartbeat_interval: Duration,
    ) -> Self {
        Self {
            seq: 0,
            hub,
            caller: Some(caller),
            heartbeat_interval,
            last_emit: tokio::time::Instant::now(),
        }
    }

    /// When a heartbeat is due if nothing else is emitted.
    fn heartbeat_due(&self) -> tokio::time::Instant {
        self.last_emit + self.heartbeat_interval
    }

    async fn emit(&mut self, kind: EventKind) {
        self.last_emit = tokio::time::Instant::now();
        self.seq += 1;
        let event = Arc::new(TurnEvent {
            seq: self.seq,
            at: SystemTime::now(),
            kind,
        });
        self.hub.publish(Arc::clone(&event));
        if let Some(tx) = &self.caller
            && tx.send(event).await.is_err()
        {
            // The caller went away; its stream's drop has cancelled the
            // turn, which ends at the next cancellation point.
            self.caller = None;
        }
    }
}

/// How the model step ended.
enum StepEnd {
    Finished(StopReason),
    Failed(ModelError),
    Cancelled(CancelReason),
    TimedOut,
    Store(StoreError),
}

/// What the step produced so far; kept outside the step future so a panic
/// inside it still leaves the partial output to store.
#[derive(Default)]
struct StepOutput {
    text: String,
    reasoning: String,
    usage: Option<Usage>,
}

impl StepOutput {
    fn content(&self) -> Vec<ContentBlock> {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentBlock::Thinking {
                thinking: self.reasoning.clone(),
                signature: String::new(),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::text(self.text.clone()));
        }
        content
    }
}

pub(crate) struct Turn {
    pub(crate) inner: Arc<Inner>,
    pub(crate) live: Arc<LiveTurn>,
    pub(crate) runner: Arc<Runner>,
    pub(crate) record: TurnRecord,
    pub(crate) user_message: Message,
    pub(crate) system_prompt: Option<String>,
    pub(crate) guard: Option<BusyGuard>,
    pub(crate) started: Instant,
    pub(crate) deadline: Option<tokio::time::Instant>,
}

/// Resolves at `deadline`, or never.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Turn {
    pub(crate) async fn run(mut self, mut emitter: Emitter) {
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

        let mut output = StepOutput::default();
        emitter
            .emit(EventKind::Step {
                kind: StepKind::Start,
                index: 1,
            })
            .await;
        let step = AssertUnwindSafe(self.model_step(&mut output, &mut emitter))
            .catch_unwind()
            .await;
        let (outcome, error) = match step {
            Ok(end) => self.conclude(end, &mut output, &mut emitter).await,
            Err(panic) => {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(panic = %what, "model step panicked");
                self.store_partial(&output, StopReason::Error, &mut emitter)
                    .await;
                (
                    TurnOutcome::Error,
                    Some((
                        ErrorCode::Internal,
                        "internal error while running the turn".to_owned(),
                    )),
                )
            }
        };
        emitter
            .emit(EventKind::Step {
                kind: StepKind::Finish,
                index: 1,
            })
            .await;
        if let Some((code, message)) = &error {
            emitter
                .emit(EventKind::Error {
                    code: *code,
                    message: message.clone(),
                })
                .await;
        }
        self.finish(outcome, error.map(|(_, m)| m), output.usage, emitter)
            .await;
    }

    async fn model_step(&self, output: &mut StepOutput, emitter: &mut Emitter) -> StepEnd {
        let messages = match self.load_context().await {
            Ok(m) => m,
            Err(e) => return StepEnd::Store(e),
        };
        let request = ModelRequest {
            model: self.runner.provider_model.clone(),
            system_prompt: self.system_prompt.clone(),
            messages,
            thinking: self.runner.key.thinking,
        };
        self.live.set_phase(Phase::Model);
        let cancel = &self.live.cancel;
        let start = self.runner.provider.stream(request);
        tokio::pin!(start);
        let mut stream = loop {
            tokio::select! {
                biased;
                () = cancel.cancelled() => return self.cancelled(),
                () = until(self.deadline) => return StepEnd::TimedOut,
                started = &mut start => match started {
                    Ok(s) => break s,
                    Err(e) => return StepEnd::Failed(e),
                },
                () = tokio::time::sleep_until(emitter.heartbeat_due()) => {
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Model }).await;
                }
            }
        };
        loop {
            let item = tokio::select! {
                biased;
                () = cancel.cancelled() => return self.cancelled(),
                () = until(self.deadline) => return StepEnd::TimedOut,
                item = stream.next() => item,
                () = tokio::time::sleep_until(emitter.heartbeat_due()) => {
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Model }).await;
                    continue;
                }
            };
            match item {
                None => {
                    return StepEnd::Failed(ModelError::Truncated(
                        "the provider stream ended without finishing".to_owned(),
                    ));
                }
                Some(Err(e)) => return StepEnd::Failed(e),
                Some(Ok(ModelEvent::TextDelta(t))) => {
                    output.text.push_str(&t);
                    emitter.emit(EventKind::Text(t)).await;
                }
                Some(Ok(ModelEvent::ReasoningDelta(t))) => {
                    output.reasoning.push_str(&t);
                    emitter.emit(EventKind::Reasoning(t)).await;
                }
                Some(Ok(ModelEvent::Usage(u))) => output.usage = Some(u),
                Some(Ok(ModelEvent::Finished(reason))) => return StepEnd::Finished(reason),
            }
        }
    }

    fn cancelled(&self) -> StepEnd {
        let reason = self.live.cancel_reason().unwrap_or(CancelReason::Stopped);
        // A caller whose own deadline expired hangs up at the moment the
        // turn's deadline passes: that is a timeout, not a disconnect.
        if reason == CancelReason::ClientGone
            && self
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() >= d)
        {
            return StepEnd::TimedOut;
        }
        StepEnd::Cancelled(reason)
    }

    /// The uncompacted history, oldest first (it ends with this turn's user
    /// message).
    async fn load_context(&self) -> Result<Vec<Message>, StoreError> {
        let mut messages = Vec::new();
        let mut after = 0;
        loop {
            let page = self
                .inner
                .store
                .history(&self.record.session_id, after, CONTEXT_PAGE, false)
                .await?;
            let full = page.len() == CONTEXT_PAGE;
            if let Some(last) = page.last() {
                after = last.seq;
            }
            messages.extend(page);
            if !full {
                return Ok(messages);
            }
        }
    }

    /// Stores the step's assistant message as the outcome requires and
    /// decides the turn's outcome.
    async fn conclude(
        &mut self,
        end: StepEnd,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> (TurnOutcome, Option<(ErrorCode, String)>) {
        match end {
            StepEnd::Finished(reason) => {
                if let Some(usage) = output.usage {
                    emitter
                        .emit(EventKind::Usage {
                            usage,
                            model: self.record.model.clone(),
                        })
                        .await;
                }
                if self.store_partial(output, reason, emitter).await {
                    (TurnOutcome::Success, None)
                } else {
                    (
                        TurnOutcome::Error,
                        Some((
                            ErrorCode::Unavailable,
                            "the answer could not be stored".to_owned(),
                        )),
                    )
                }
            }
            StepEnd::Failed(err) => {
                tracing::warn!(error = %err, "model step failed");
                self.store_partial(output, StopReason::Error, emitter).await;
                (
                    TurnOutcome::Error,
                    Some((model_error_code(&err), err.public_message().to_owned())),
                )
            }
            StepEnd::Cancelled(reason) => {
                self.record.cancel_reason = Some(reason);
                self.store_partial(output, reason.stop_reason(), emitter)
                    .await;
                (TurnOutcome::Canceled, None)
            }
            StepEnd::TimedOut => {
                self.store_partial(output, StopReason::Timeout, emitter)
                    .await;
                let notice = NewMessage::new(
                    &self.record.turn_id,
                    Role::Notice,
                    vec![ContentBlock::text(TIMEOUT_NOTICE)],
                );
                self.store(notice, emitter).await;
                (TurnOutcome::TimedOut, None)
            }
            StepEnd::Store(err) => {
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

    /// Stores the assistant message of the step (if it produced anything)
    /// and announces it. `false` when the store failed.
    async fn store_partial(
        &self,
        output: &StepOutput,
        reason: StopReason,
        emitter: &mut Emitter,
    ) -> bool {
        let content = output.content();
        if content.is_empty() {
            return true;
        }
        let mut message = NewMessage::new(&self.record.turn_id, Role::Assistant, content);
        message.model = Some(self.record.model.clone());
        message.usage = output.usage;
        message.stop_reason = Some(reason);
        self.store(message, emitter).await
    }

    /// Appends a message (never raced against cancellation) and announces
    /// it. `false` when the store failed.
    async fn store(&self, message: NewMessage, emitter: &mut Emitter) -> bool {
        self.live.set_phase(Phase::Storing);
        let role = message.role;
        match self
            .inner
            .store
            .append_message(&self.record.session_id, message)
            .await
        {
            Ok(stored) => {
                emitter
                    .emit(EventKind::MessageStored {
                        seq: stored.seq,
                        id: stored.body.id,
                        role,
                    })
                    .await;
                true
            }
            Err(err) => {
                tracing::error!(error = %err, ?role, "storing a message failed");
                false
            }
        }
    }

    async fn finish(
        mut self,
        outcome: TurnOutcome,
        error: Option<String>,
        usage: Option<Usage>,
        mut emitter: Emitter,
    ) {
        self.live.set_phase(Phase::Finishing);
        let usage = usage.unwrap_or_default();
        self.record.status = match outcome {
            TurnOutcome::Success => TurnStatus::Success,
            TurnOutcome::Error => TurnStatus::Error,
            TurnOutcome::Canceled => TurnStatus::Canceled,
            TurnOutcome::TimedOut => TurnStatus::TimedOut,
        };
        self.record.finished_at = Some(SystemTime::now());
        self.record.usage = usage;
        self.record.error = error;
        if let Err(err) = self.inner.store.finish_turn(self.record.clone()).await {
            tracing::error!(error = %err, "storing the turn record failed");
        }
        *super::lock(&self.runner.last_used) = Instant::now();
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
        tracing::info!(outcome = ?outcome, "turn finished");
    }
}

fn model_error_code(err: &ModelError) -> ErrorCode {
    match err {
        ModelError::Unavailable(_)
        | ModelError::Truncated(_)
        | ModelError::Malformed(_)
        | ModelError::Unauthorized(_) => ErrorCode::Unavailable,
        ModelError::RateLimited(_) => ErrorCode::ResourceExhausted,
        ModelError::Rejected(_) => ErrorCode::FailedPrecondition,
    }
}
