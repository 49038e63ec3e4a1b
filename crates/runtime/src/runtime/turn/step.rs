//! One model step of a turn: start the request (or take the one admission
//! started), relay its deltas as events, and decide what the step's end
//! means for the turn — the answer, a partial message, a timeout notice.

use std::time::Instant;

use futures::StreamExt as _;

use super::emitter::Emitter;
use super::prestart::FirstStep;
use super::{Turn, TurnEnd, until};
use crate::events::{ErrorCode, EventKind, Phase, TurnOutcome};
use crate::model::{ModelError, ModelEvent, ModelRequest};
use crate::types::{CancelReason, ContentBlock, NewMessage, Role, StopReason, Usage};

pub(crate) use super::step_end::StepEnd;

/// What the step produced so far; kept outside the step future so a panic
/// inside it still leaves the partial output to store.
#[derive(Default)]
pub(super) struct StepOutput {
    pub(super) text: String,
    pub(super) reasoning: String,
    pub(super) signature: String,
    pub(super) usage: Option<Usage>,
    pub(super) tool_calls: Vec<ToolCallRequest>,
}

/// A tool call the model made in a step.
#[derive(Debug, Clone)]
pub(super) struct ToolCallRequest {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments_json: String,
}

impl From<&crate::types::PausedCall> for ToolCallRequest {
    fn from(c: &crate::types::PausedCall) -> Self {
        Self {
            id: c.call_id.clone(),
            name: c.name.clone(),
            arguments_json: c.arguments_json.clone(),
        }
    }
}

impl StepOutput {
    /// Text and reasoning produced so far.
    fn bytes(&self) -> usize {
        self.text.len().saturating_add(self.reasoning.len())
    }

    /// Ends a step that passed `max_bytes` of output as if the model had
    /// stopped at its token limit: stop reason `length`, the text and
    /// reasoning kept as they are (at most one delta over the bound), the
    /// usage estimated, and no tool calls run (the model did not finish
    /// the step that made them).
    fn cut(&mut self, max_bytes: usize) -> StepEnd {
        tracing::warn!(
            bytes = self.bytes(),
            max_bytes,
            "the model step passed the provider's output bound; cut with stop reason length"
        );
        self.tool_calls.clear();
        self.estimate_usage();
        StepEnd::Finished(StopReason::Length)
    }

    /// For a step that did not finish: when the provider reported no output
    /// tokens, a token per 4 bytes of text and reasoning relayed (rounded
    /// up).
    fn estimate_usage(&mut self) {
        let estimate = (self.bytes() as u64).div_ceil(4);
        let usage = self.usage.get_or_insert_with(Usage::default);
        if usage.output_tokens == 0 {
            usage.output_tokens = estimate;
        }
        if *usage == Usage::default() {
            self.usage = None;
        }
    }

    fn content(&self) -> Vec<ContentBlock> {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentBlock::Thinking {
                thinking: self.reasoning.clone(),
                signature: self.signature.clone(),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::text(self.text.clone()));
        }
        content.extend(self.tool_calls.iter().map(|c| ContentBlock::ToolCall {
            id: c.id.clone(),
            name: c.name.clone(),
            arguments_json: c.arguments_json.clone(),
        }));
        content
    }
}

/// How a model step's request starts.
/// What one item of the provider's stream does to the step, once
/// [`StepOutput::absorb`] kept it: a delta to relay, the step's end, or
/// nothing more.
enum Absorbed {
    Relay(EventKind),
    End(StepEnd),
    Kept,
}

impl StepOutput {
    /// Keeps `item` in the step's output (text, reasoning, signature,
    /// usage, tool calls) and says what follows from it.
    fn absorb(&mut self, item: Option<Result<ModelEvent, ModelError>>) -> Absorbed {
        match item {
            None => Absorbed::End(StepEnd::Failed(ModelError::Truncated(
                "the provider stream ended without finishing".to_owned(),
            ))),
            Some(Err(e)) => Absorbed::End(StepEnd::Failed(e)),
            Some(Ok(ModelEvent::TextDelta(t))) => {
                self.text.push_str(&t);
                Absorbed::Relay(EventKind::Text(t))
            }
            Some(Ok(ModelEvent::ReasoningDelta(t))) => {
                self.reasoning.push_str(&t);
                Absorbed::Relay(EventKind::Reasoning(t))
            }
            Some(Ok(ModelEvent::ThinkingSignature(s))) => {
                self.signature = s;
                Absorbed::Kept
            }
            Some(Ok(ModelEvent::Usage(u))) => {
                self.usage = Some(u);
                Absorbed::Kept
            }
            Some(Ok(ModelEvent::ToolCall {
                id,
                name,
                arguments_json,
            })) => {
                self.tool_calls.push(ToolCallRequest {
                    id,
                    name,
                    arguments_json,
                });
                Absorbed::Kept
            }
            Some(Ok(ModelEvent::Finished(reason))) => Absorbed::End(StepEnd::Finished(reason)),
        }
    }
}

type StartFuture<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<crate::model::ModelStream, StepEnd>> + Send + 'a>,
>;

impl Turn {
    /// One model step; `first` is the request admission already started.
    /// A step that does not finish keeps the usage its provider reported,
    /// with the output tokens estimated from what was relayed when the
    /// provider had counted none (see [`ModelEvent::Usage`]).
    pub(super) async fn model_step(
        &self,
        first: Option<FirstStep>,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> StepEnd {
        let end = self.relay_step(first, output, emitter).await;
        if !matches!(end, StepEnd::Finished(_)) {
            output.estimate_usage();
        }
        self.after_step(end, output).await
    }

    /// The model step itself: starts the request and relays its items
    /// until it ends, is stopped, times out, or passes the provider's bound
    /// on a step's output (then it ends with stop reason `length`, the
    /// stream is dropped, and the output so far is the step's).
    async fn relay_step(
        &self,
        first: Option<FirstStep>,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> StepEnd {
        self.live.set_phase(Phase::Model);
        let max_bytes = self
            .runner
            .model
            .provider
            .max_step_output_bytes(&self.runner.model.provider_model);
        let mut stream = match self.open_stream(first, emitter).await {
            Ok(stream) => stream,
            Err(end) => return end,
        };
        let cancel = &self.live.cancel;
        // Per relayed item: no timer registered, no lock taken. The
        // futures below are armed once per step; an item that is ready is
        // taken without polling them, and Stop and the deadline are
        // checked with an atomic load and a clock read instead, so a
        // provider whose items are always ready cannot starve them.
        let cancelled = cancel.cancelled();
        let deadline = until(self.deadline);
        // Fires at the heartbeat due when the step started; re-armed when
        // it finds that events were emitted since.
        let heartbeat = tokio::time::sleep_until(emitter.heartbeat_due());
        tokio::pin!(cancelled, deadline, heartbeat);
        let step_started = Instant::now();
        let mut first_chunk = true;
        loop {
            if self.live.is_cancelled() {
                return self.cancelled();
            }
            if self
                .deadline
                .is_some_and(|d| tokio::time::Instant::now() >= d)
            {
                return StepEnd::TimedOut;
            }
            let item = tokio::select! {
                biased;
                item = stream.next() => item,
                () = &mut cancelled => return self.cancelled(),
                () = &mut deadline => return StepEnd::TimedOut,
                () = &mut heartbeat => {
                    if emitter.heartbeat_due() <= tokio::time::Instant::now() {
                        emitter.emit(EventKind::Heartbeat { phase: Phase::Model, tool: None }).await;
                    }
                    heartbeat.as_mut().reset(emitter.heartbeat_due());
                    continue;
                }
            };
            if first_chunk
                && matches!(
                    &item,
                    Some(Ok(ModelEvent::TextDelta(_)
                        | ModelEvent::ReasoningDelta(_)
                        | ModelEvent::ToolCall { .. }))
                )
            {
                first_chunk = false;
                tracing::Span::current().record(
                    crate::telemetry::semconv::GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
                    step_started.elapsed().as_secs_f64(),
                );
            }
            match output.absorb(item) {
                Absorbed::Relay(event) => {
                    emitter.emit(event).await;
                    if output.bytes() > max_bytes {
                        return output.cut(max_bytes);
                    }
                }
                Absorbed::End(end) => return end,
                Absorbed::Kept => {}
            }
        }
    }

    /// The step's model stream: the first request admission started, or a
    /// new one; waiting for it ends the step on Stop or the deadline, and
    /// keeps the heartbeat going.
    async fn open_stream(
        &self,
        first: Option<FirstStep>,
        emitter: &mut Emitter,
    ) -> Result<crate::model::ModelStream, StepEnd> {
        let start = match first {
            Some(first) => Box::pin(first) as StartFuture<'_>,
            None => {
                let request = ModelRequest {
                    model: self.runner.model.provider_model.clone(),
                    system_prompt: self.system_prompt.clone(),
                    messages: self.shown_context(emitter).await,
                    thinking: self.runner.key.thinking,
                    tools: self.tools.clone(),
                    max_output_tokens: self.max_output_tokens,
                    reservation: None,
                };
                Box::pin(self.gated_stream(request))
            }
        };
        tokio::pin!(start);
        loop {
            tokio::select! {
                biased;
                () = self.live.cancel.cancelled() => return Err(self.cancelled()),
                () = until(self.deadline) => return Err(StepEnd::TimedOut),
                started = &mut start => return started,
                () = tokio::time::sleep_until(emitter.heartbeat_due()) => {
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Model, tool: None }).await;
                }
            }
        }
    }

    pub(super) fn cancelled(&self) -> StepEnd {
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

    /// The step's token usage as a `usage` event, when the provider sent one.
    pub(super) async fn emit_usage(&self, output: &StepOutput, emitter: &mut Emitter) {
        if let Some(usage) = output.usage {
            emitter
                .emit(EventKind::Usage {
                    usage,
                    model: self.record.model.clone(),
                })
                .await;
        }
    }

    /// Stores the step's assistant message as the outcome requires and
    /// decides the turn's outcome.
    pub(super) async fn conclude(
        &mut self,
        end: StepEnd,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> TurnEnd {
        match end {
            StepEnd::Finished(reason) => {
                self.emit_usage(output, emitter).await;
                // Stored with the turn record in one durable write.
                self.final_message = self.assistant_message(output, reason);
                TurnEnd::of(TurnOutcome::Success)
            }
            StepEnd::Failed(err) => {
                tracing::warn!(error = %err, "model step failed");
                // The model's error is what the callers are told.
                self.store_partial(output, StopReason::Error, emitter)
                    .await
                    .ok();
                TurnEnd::failed(model_error_code(&err), err.public_message())
            }
            StepEnd::Cancelled(reason) => {
                self.record.cancel_reason = Some(reason);
                // Stopped either way (a lost lease is reported by `run`).
                self.store_partial(output, reason.stop_reason(), emitter)
                    .await
                    .ok();
                TurnEnd::of(TurnOutcome::Canceled)
            }
            StepEnd::TimedOut => {
                // Timed out either way (a lost lease is reported by `run`).
                self.store_partial(output, StopReason::Timeout, emitter)
                    .await
                    .ok();
                self.store_timeout_notice(emitter).await;
                TurnEnd::of(TurnOutcome::TimedOut)
            }
            StepEnd::Hook(stop) => {
                tracing::warn!(stop = %stop, "an operator hook ended the turn");
                self.store_partial(output, StopReason::Error, emitter)
                    .await
                    .ok();
                let (code, message) = super::step_end::stop_error(&stop);
                TurnEnd::failed(code, message)
            }
        }
    }

    /// Stores the assistant message of the step (if it produced anything)
    /// and announces it; `Err` as [`Turn::store`].
    pub(super) async fn store_partial(
        &mut self,
        output: &StepOutput,
        reason: StopReason,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        match self.assistant_message(output, reason) {
            Some(message) => self.store(message, emitter).await,
            None => Ok(()),
        }
    }

    /// The step's assistant message, unless the step produced nothing.
    fn assistant_message(&self, output: &StepOutput, reason: StopReason) -> Option<NewMessage> {
        let content = output.content();
        if content.is_empty() {
            return None;
        }
        let mut message = NewMessage::new(&self.record.turn_id, Role::Assistant, content);
        message.model = Some(self.record.model.clone());
        message.usage = output.usage;
        message.stop_reason = Some(reason);
        Some(message)
    }

    /// Ends a model step's `chat` span with what the step produced, and
    /// records the step's duration and token usage.
    pub(super) fn close_chat(
        &self,
        span: &tracing::Span,
        end: Option<&StepEnd>,
        output: &StepOutput,
        started: Instant,
    ) {
        let (finish, error) = match end {
            Some(StepEnd::Finished(reason)) => (Some(*reason), None),
            Some(StepEnd::Failed(err)) => (None, Some(model_error_type(err))),
            Some(StepEnd::Cancelled(_)) => (Some(StopReason::Cancelled), None),
            Some(StepEnd::TimedOut) => (Some(StopReason::Timeout), None),
            Some(StepEnd::Hook(_)) => (None, Some("hook")),
            None => (None, Some("panic")),
        };
        // Only what the provider reported for a finished step: the
        // estimate of a cut-short step is not a measurement.
        let usage = match end {
            Some(StepEnd::Finished(_)) => output.usage.map(|u| (u.input_tokens, u.output_tokens)),
            _ => None,
        };
        let content = self
            .inner
            .config
            .capture_content
            .then_some(output.text.as_str());
        crate::runtime::spans::close_chat(
            span,
            &self.record.model,
            started.elapsed(),
            finish,
            error,
            usage,
            content,
        );
    }
}

fn model_error_code(err: &ModelError) -> ErrorCode {
    match err {
        ModelError::Unavailable(_)
        | ModelError::Truncated(_)
        | ModelError::Malformed(_)
        | ModelError::Unauthorized(_) => ErrorCode::Unavailable,
        ModelError::RateLimited(_) | ModelError::QuotaExhausted(_) => ErrorCode::ResourceExhausted,
        ModelError::Rejected(_) => ErrorCode::FailedPrecondition,
        ModelError::RetryAfter { error, .. } => model_error_code(error),
    }
}

/// The `error.type` of a failed model step: bounded, no message text.
fn model_error_type(err: &ModelError) -> &'static str {
    match err {
        ModelError::Unavailable(_) => "unavailable",
        ModelError::RateLimited(_) => "rate_limited",
        ModelError::Unauthorized(_) => "unauthorized",
        ModelError::Rejected(_) => "rejected",
        ModelError::Truncated(_) => "truncated",
        ModelError::Malformed(_) => "malformed",
        ModelError::QuotaExhausted(_) => "quota_exhausted",
        ModelError::RetryAfter { error, .. } => model_error_type(error),
    }
}
