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

use super::Inner;
use super::runners::Runner;
use super::slots::{LiveTurn, TurnSlot};
use super::tools::ToolOutput;
use prestart::{FirstStep, Loaded};
use tools::Route;

pub(crate) mod prestart;
pub(crate) mod tools;
use crate::events::{
    ErrorCode, EventKind, Phase, StepKind, ToolStatus, ToolUse, TurnEvent, TurnOutcome,
};
use crate::model::{ModelError, ModelEvent, ModelRequest};
use crate::store::StoreError;
use crate::types::{
    CancelReason, ContentBlock, Message, NewMessage, Role, StopReason, TurnRecord, TurnStatus,
    Usage,
};

/// The text of the NOTICE stored when a turn reaches its deadline.
pub(crate) const TIMEOUT_NOTICE: &str = "the turn reached its time limit";
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

/// How long a cancelled turn waits, in all, for a caller that does not read
/// its last events before it ends without it.
pub(crate) const END_GRACE: Duration = Duration::from_secs(1);

/// Numbers events, publishes them to the hub and forwards them to the
/// caller while the caller is there.
///
/// A send to the caller never blocks the turn for long: it races the
/// turn's cancellation, and a caller that reads nothing for
/// `stalled_reader_timeout` is treated as gone (with `on_disconnect =
/// CANCEL` the turn is cancelled `CLIENT_GONE`; with `CONTINUE` it runs on
/// without that caller, watchable with Subscribe). Once the turn is
/// cancelled, its remaining events get [`END_GRACE`] in all to reach a
/// caller that is not reading, so Stop and Delete end a turn promptly even
/// when its caller never grants HTTP/2 flow-control window.
pub(crate) struct Emitter {
    seq: u64,
    live: Arc<LiveTurn>,
    caller: Option<mpsc::Sender<Arc<TurnEvent>>>,
    heartbeat_interval: Duration,
    stalled_reader_timeout: Duration,
    on_disconnect: super::OnDisconnect,
    last_emit: tokio::time::Instant,
    /// Set when the emitter first sees the turn cancelled: the caller's
    /// sends stop waiting then.
    end_by: Option<tokio::time::Instant>,
    /// `TurnFinished` was emitted.
    finished: bool,
    /// When the turn was admitted; `None` once the first model output was
    /// emitted (and `agentrt.turn.time_to_first_event` recorded).
    admitted: Option<Instant>,
}

impl Emitter {
    pub(crate) fn new(
        live: Arc<LiveTurn>,
        caller: mpsc::Sender<Arc<TurnEvent>>,
        config: &super::RuntimeConfig,
        on_disconnect: super::OnDisconnect,
        admitted: Instant,
    ) -> Self {
        Self {
            seq: 0,
            live,
            caller: Some(caller),
            heartbeat_interval: config.heartbeat_interval,
            stalled_reader_timeout: config.stalled_reader_timeout,
            on_disconnect,
            last_emit: tokio::time::Instant::now(),
            end_by: None,
            finished: false,
            admitted: Some(admitted),
        }
    }

    /// When a heartbeat is due if nothing else is emitted.
    fn heartbeat_due(&self) -> tokio::time::Instant {
        self.last_emit + self.heartbeat_interval
    }

    pub(super) async fn emit(&mut self, kind: EventKind) {
        self.last_emit = tokio::time::Instant::now();
        self.seq += 1;
        self.finished |= matches!(kind, EventKind::TurnFinished { .. });
        let metrics = crate::telemetry::metrics::get();
        metrics.relay_events.add(1, &[]);
        if matches!(
            kind,
            EventKind::Text(_) | EventKind::Reasoning(_) | EventKind::ToolUse(_)
        ) && let Some(admitted) = self.admitted.take()
        {
            metrics
                .time_to_first_event
                .record(admitted.elapsed().as_secs_f64(), &[]);
        }
        let event = Arc::new(TurnEvent {
            seq: self.seq,
            at: SystemTime::now(),
            kind,
        });
        self.live.hub.publish(Arc::clone(&event));
        let Some(tx) = self.caller.take() else { return };
        match tx.try_send(event) {
            Ok(()) => {
                self.caller = Some(tx);
                tokio::task::consume_budget().await;
            }
            // The caller went away; its stream's drop has cancelled the
            // turn (unless it asked to continue).
            Err(mpsc::error::TrySendError::Closed(_)) => {}
            Err(mpsc::error::TrySendError::Full(event)) => {
                if self.send_waiting(&tx, event).await {
                    self.caller = Some(tx);
                }
            }
        }
    }

    /// Sends to a caller whose buffer is full, bounded as the type says.
    /// `false` when the caller is dropped.
    async fn send_waiting(
        &mut self,
        tx: &mpsc::Sender<Arc<TurnEvent>>,
        event: Arc<TurnEvent>,
    ) -> bool {
        let now = tokio::time::Instant::now();
        let stall_by = now + self.stalled_reader_timeout;
        let cancel = self.live.cancel.clone();
        loop {
            if self.end_by.is_none() && self.live.is_cancelled() {
                self.end_by = Some(now + END_GRACE);
            }
            let give_up = self.end_by.map_or(stall_by, |end| end.min(stall_by));
            tokio::select! {
                biased;
                permit = tx.reserve() => {
                    return match permit {
                        Ok(permit) => {
                            permit.send(event);
                            true
                        }
                        Err(_) => false,
                    };
                }
                () = cancel.cancelled(), if self.end_by.is_none() => {}
                () = tokio::time::sleep_until(give_up) => {
                    if self.end_by.is_none() {
                        tracing::warn!(
                            stalled_for_ms = u64::try_from(self.stalled_reader_timeout.as_millis()).unwrap_or(u64::MAX),
                            on_disconnect = %format_args!("{:?}", self.on_disconnect),
                            "the caller has read nothing for too long; treating it as gone"
                        );
                        if self.on_disconnect == super::OnDisconnect::Cancel {
                            self.live.cancel(CancelReason::ClientGone);
                        }
                    }
                    return false;
                }
            }
        }
    }
}

/// How the model step ended.
enum StepEnd {
    Finished(StopReason),
    Failed(ModelError),
    Cancelled(CancelReason),
    TimedOut,
}

/// What the step produced so far; kept outside the step future so a panic
/// inside it still leaves the partial output to store.
#[derive(Default)]
struct StepOutput {
    text: String,
    reasoning: String,
    signature: String,
    usage: Option<Usage>,
    tool_calls: Vec<ToolCallRequest>,
}

/// A tool call the model made in a step.
#[derive(Debug, Clone)]
pub(super) struct ToolCallRequest {
    pub(super) id: String,
    pub(super) name: String,
    pub(super) arguments_json: String,
}

/// How a tool phase ended.
enum ToolsEnd {
    /// Every result is stored; the loop goes on.
    Done,
    Cancelled(CancelReason),
    TimedOut,
    StoreFailed,
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
    pub(crate) prestart: Option<prestart::Prestart>,
    /// The session as read at admission.
    pub(crate) session: crate::types::Session,
    /// What the model is sent: loaded once (see `prepare_context`), then
    /// every message the turn stores is appended.
    pub(crate) context: Arc<Vec<Message>>,
    /// The context was compacted (or truncated) during this turn.
    pub(crate) compacted: bool,
    /// A store write of this turn failed.
    pub(crate) store_failed: bool,
    /// The first model step's span, made at admission (its request starts
    /// there).
    pub(crate) first_chat: Option<tracing::Span>,
    /// Counts the turn in `agentrt.turns.live` while it exists.
    pub(crate) _live_metric: crate::telemetry::metrics::LiveGuard,
}

/// How a model step's request starts.
type StartFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<crate::model::ModelStream, ModelError>> + Send + 'a,
    >,
>;

/// Resolves at `deadline`, or never.
pub(super) async fn until(deadline: Option<tokio::time::Instant>) {
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
        if let Err(err) = super::recovery::answer_open_calls(
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
                super::spans::chat(&tracing::Span::current(), &self.record.model)
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

    /// Stores the assistant message with its tool calls, runs the calls and
    /// stores their results. `None` when the loop should go on.
    async fn tool_step(
        &mut self,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> Option<(TurnOutcome, Option<(ErrorCode, String)>)> {
        if let Some(usage) = output.usage {
            emitter
                .emit(EventKind::Usage {
                    usage,
                    model: self.record.model.clone(),
                })
                .await;
        }
        if !self
            .store_partial(output, StopReason::ToolUse, emitter)
            .await
        {
            return Some(store_failed());
        }
        match self
            .run_tools(std::mem::take(&mut output.tool_calls), emitter)
            .await
        {
            ToolsEnd::Done => None,
            ToolsEnd::Cancelled(reason) => {
                self.record.cancel_reason = Some(reason);
                Some((TurnOutcome::Canceled, None))
            }
            ToolsEnd::TimedOut => {
                self.store_timeout_notice(emitter).await;
                Some((TurnOutcome::TimedOut, None))
            }
            ToolsEnd::StoreFailed => Some(store_failed()),
        }
    }

    /// Announces the calls, waits (concurrently) for their results, bounded
    /// by cancellation and the deadline, and stores every call's result in
    /// call order — calls left without one get an error result, so each
    /// call in history has exactly one result.
    async fn run_tools(&mut self, calls: Vec<ToolCallRequest>, emitter: &mut Emitter) -> ToolsEnd {
        use futures::stream::FuturesUnordered;

        self.live.set_phase(Phase::Tool);
        let toolbox = Arc::clone(&self.inner.toolbox);
        // Server calls of this step share the parallelism limit.
        let permits = Arc::new(toolbox.permits());
        let mut results: Vec<Option<ToolOutput>> = vec![None; calls.len()];
        let mut waits = FuturesUnordered::<tools::ToolWait>::new();
        for (i, call) in calls.iter().enumerate() {
            emitter
                .emit(EventKind::ToolUse(Box::new(ToolUse {
                    call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    status: ToolStatus::Running,
                    input_summary: super::tools::input_summary(&call.arguments_json),
                    arguments_json: call.arguments_json.clone(),
                    detail: String::new(),
                    content: String::new(),
                })))
                .await;
            match tools::route(&toolbox, &self.runner, &self.tools, call).await {
                Route::Server => waits.push(tools::server_call(
                    Arc::clone(&toolbox),
                    Arc::clone(&permits),
                    i,
                    call.clone(),
                    self.inner.config.capture_content,
                )),
                Route::Caller(arguments_json) => {
                    let rx = super::lock(&self.live.pending_tools).wait_for(&call.id);
                    emitter
                        .emit(EventKind::ToolCall {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            arguments_json,
                        })
                        .await;
                    waits.push(tools::caller_result(
                        Arc::clone(&toolbox),
                        i,
                        call.clone(),
                        rx,
                    ));
                }
                Route::Done(output) => results[i] = Some(output),
            }
        }
        let cancel = self.live.cancel.clone();
        let mut end = ToolsEnd::Done;
        while !waits.is_empty() {
            tokio::select! {
                biased;
                () = cancel.cancelled() => {
                    end = match self.cancelled() {
                        StepEnd::TimedOut => ToolsEnd::TimedOut,
                        StepEnd::Cancelled(reason) => ToolsEnd::Cancelled(reason),
                        _ => ToolsEnd::Cancelled(CancelReason::Stopped),
                    };
                    break;
                }
                () = until(self.deadline) => {
                    end = ToolsEnd::TimedOut;
                    break;
                }
                Some((i, output)) = waits.next() => results[i] = Some(output),
                () = tokio::time::sleep_until(emitter.heartbeat_due()) => {
                    let waiting = calls
                        .iter()
                        .zip(&results)
                        .find(|(_, r)| r.is_none())
                        .map(|(c, _)| c.name.clone());
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Tool, tool: waiting }).await;
                }
            }
        }
        // Dropping unfinished server calls cancels them (MCP sends
        // `notifications/cancelled`).
        drop(waits);
        super::lock(&self.live.pending_tools).clear();
        let missing = match end {
            ToolsEnd::TimedOut => "the turn reached its time limit before this tool call finished",
            _ => "the tool call was cancelled",
        };
        for (call, result) in calls.into_iter().zip(results) {
            let output = result.unwrap_or_else(|| ToolOutput::error(missing));
            if !self.store_tool_result(call, output, emitter).await {
                return ToolsEnd::StoreFailed;
            }
        }
        end
    }

    /// Stores one tool result, then announces it (DONE/ERROR): a result is
    /// durable before anyone is told it exists.
    async fn store_tool_result(
        &mut self,
        call: ToolCallRequest,
        output: ToolOutput,
        emitter: &mut Emitter,
    ) -> bool {
        let message = NewMessage::new(
            &self.record.turn_id,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: output.content.clone(),
                is_error: output.is_error,
            }],
        );
        if !self.store(message, emitter).await {
            return false;
        }
        emitter
            .emit(EventKind::ToolUse(Box::new(ToolUse {
                call_id: call.id,
                tool_name: call.name,
                status: if output.is_error {
                    ToolStatus::Error
                } else {
                    ToolStatus::Done
                },
                input_summary: super::tools::input_summary(&call.arguments_json),
                arguments_json: call.arguments_json,
                detail: super::tools::result_detail(&output.content),
                content: output.content,
            })))
            .await;
        true
    }

    async fn store_timeout_notice(&mut self, emitter: &mut Emitter) {
        let notice = NewMessage::new(
            &self.record.turn_id,
            Role::Notice,
            vec![ContentBlock::text(TIMEOUT_NOTICE)],
        );
        self.store(notice, emitter).await;
    }

    /// One model step; `first` is the request admission already started.
    /// A step that does not finish keeps the usage its provider reported,
    /// with the output tokens estimated from what was relayed when the
    /// provider had counted none (see [`ModelEvent::Usage`]).
    async fn model_step(
        &self,
        first: Option<FirstStep>,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> StepEnd {
        let end = self.relay_step(first, output, emitter).await;
        if !matches!(end, StepEnd::Finished(_)) {
            output.estimate_usage();
        }
        end
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
            .provider
            .max_step_output_bytes(&self.runner.provider_model);
        let cancel = &self.live.cancel;
        let start = match first {
            Some(first) => Box::pin(first) as StartFuture<'_>,
            None => self.runner.provider.stream(ModelRequest {
                model: self.runner.provider_model.clone(),
                system_prompt: self.system_prompt.clone(),
                messages: self.context.clone(),
                thinking: self.runner.key.thinking,
                tools: self.tools.clone(),
                max_output_tokens: self.max_output_tokens,
                reservation: None,
            }),
        };
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
                    emitter.emit(EventKind::Heartbeat { phase: Phase::Model, tool: None }).await;
                }
            }
        };
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
                    if output.bytes() > max_bytes {
                        return output.cut(max_bytes);
                    }
                }
                Some(Ok(ModelEvent::ReasoningDelta(t))) => {
                    output.reasoning.push_str(&t);
                    emitter.emit(EventKind::Reasoning(t)).await;
                    if output.bytes() > max_bytes {
                        return output.cut(max_bytes);
                    }
                }
                Some(Ok(ModelEvent::ThinkingSignature(s))) => output.signature = s,
                Some(Ok(ModelEvent::Usage(u))) => output.usage = Some(u),
                Some(Ok(ModelEvent::ToolCall {
                    id,
                    name,
                    arguments_json,
                })) => output.tool_calls.push(ToolCallRequest {
                    id,
                    name,
                    arguments_json,
                }),
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
                // Stored with the turn record in one durable write.
                self.final_message = self.assistant_message(output, reason);
                (TurnOutcome::Success, None)
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
        }
    }

    /// Stores the assistant message of the step (if it produced anything)
    /// and announces it. `false` when the store failed.
    async fn store_partial(
        &mut self,
        output: &StepOutput,
        reason: StopReason,
        emitter: &mut Emitter,
    ) -> bool {
        match self.assistant_message(output, reason) {
            Some(message) => self.store(message, emitter).await,
            None => true,
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

    /// Appends a message (never raced against cancellation) and announces
    /// it. `false` when the store failed.
    async fn store(&mut self, message: NewMessage, emitter: &mut Emitter) -> bool {
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
        match self
            .inner
            .store
            .finish_turn_with(self.record.clone(), last)
            .await
        {
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
            Err(err) if had_last => {
                tracing::error!(error = %err, "storing the answer and the turn record failed");
                let message = "the answer could not be stored".to_owned();
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
            super::title::spawn(
                Arc::clone(&self.inner),
                self.record.session_id.clone(),
                self.record.incarnation.clone(),
                answer,
            );
        }
    }
}

impl Turn {
    /// Ends a model step's `chat` span with what the step produced, and
    /// records the step's duration and token usage.
    fn close_chat(
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
        super::spans::close_chat(
            span,
            &self.record.model,
            started.elapsed(),
            finish,
            error,
            usage,
            content,
        );
    }

    /// The turn's one summary log line, its outcome on the turn's span and
    /// in `agentrt.turns`.
    fn finished_summary(&self, outcome: TurnOutcome, usage: Usage) {
        super::spans::turn_finished(
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

fn store_failed() -> (TurnOutcome, Option<(ErrorCode, String)>) {
    (
        TurnOutcome::Error,
        Some((
            ErrorCode::Unavailable,
            "the turn's output could not be stored".to_owned(),
        )),
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
