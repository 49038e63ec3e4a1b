//! The tool phase of a turn: after a model step that called tools, store
//! the calls, route each to the toolbox (server tools) or to the caller
//! (announced with a `ToolCall` event, answered by `SubmitToolResult`),
//! through the toolbox's hooks either way, wait for the results — bounded
//! by cancellation and the deadline — and store one result per call.

use crate::runtime::media::{ToolMediaStored, store_tool_media};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::stream::FuturesUnordered;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::emitter::Emitter;
use super::step::{StepOutput, ToolCallRequest};
use super::{TIMEOUT_NOTICE, Turn, TurnEnd};
use crate::events::{EventKind, Phase, ToolStatus, ToolUse, TurnOutcome};
use crate::model::ToolSpec;
use crate::runtime::caller_tools::{Answer, PendingCall};
use crate::runtime::delegate::{DelegateCall, PROGRESS_BUFFER, Progress};
use crate::runtime::runners::Runner;
use crate::toolbox::{ToolCallInfo, ToolKind, ToolOutcome, Toolbox};
use crate::types::{
    CancelReason, ContentBlock, Interrupted, NewMessage, PausedCall, Role, StopReason, Wait,
};

mod wait;

/// How a tool phase ended.
enum ToolsEnd {
    /// Every result is stored; the loop goes on.
    Done,
    Cancelled(CancelReason),
    TimedOut,
    /// The server drains or shuts down while the phase waits only for the
    /// caller (results, approvals): the answers it has are stored, the
    /// rest stay waited for in the paused record.
    Suspended,
}

/// Where a tool call goes.
enum Route {
    /// To the toolbox (hooks and limits applied there).
    Server,
    /// To the toolbox once approved (`SubmitToolApproval`).
    Approval,
    /// To the caller, with these arguments (after the hooks).
    Caller(String),
    /// To the runtime's built-in tool of that name (`runtime::builtins`).
    Builtin,
    /// To a delegate session (`runtime::delegate`).
    Delegate,
    /// Nowhere: this is its result (denied, or not an offered tool).
    Done(ToolOutcome),
}

/// A call a pause waits for.
fn paused(call: &ToolCallRequest, arguments_json: &str, wait: Wait) -> PausedCall {
    PausedCall {
        call_id: call.id.clone(),
        name: call.name.clone(),
        arguments_json: arguments_json.to_owned(),
        wait,
    }
}

/// A tool call in flight: its index in the step and its result.
type ToolWait = Pin<Box<dyn Future<Output = (usize, ToolOutcome)> + Send>>;

/// How far a call of the step got, for the record of one the turn's end
/// cut short.
enum Reach {
    /// Answered at once (unknown tool, a hook's answer).
    Answered,
    /// A server call: whether the tool was called.
    Server(Arc<AtomicBool>),
    /// Handed to the caller (announced with `ToolCall`).
    Caller,
    /// Waiting for an approval (announced with `ApprovalRequired`):
    /// whether it was decided, and whether the tool was called.
    Approval {
        decided: Arc<AtomicBool>,
        started: Arc<AtomicBool>,
    },
}

impl Reach {
    /// What became of the call when the turn ended without its result.
    fn interrupted(&self) -> Interrupted {
        match self {
            Self::Server(started) | Self::Approval { started, .. }
                if !started.load(Ordering::Acquire) =>
            {
                Interrupted::Cancelled
            }
            Self::Answered | Self::Server(_) | Self::Approval { .. } | Self::Caller => {
                Interrupted::OutcomeUnknown
            }
        }
    }

    /// Whether the call waits for its caller (a result, a decision), and
    /// so may wait in a paused record instead.
    fn pausable(&self) -> bool {
        match self {
            Self::Caller => true,
            Self::Approval { decided, .. } => !decided.load(Ordering::Acquire),
            Self::Answered | Self::Server(_) => false,
        }
    }
}

/// The calls the tool phase dispatched: their waits, how far each got, and
/// those that wait for the caller (the pause).
struct Dispatched {
    waits: FuturesUnordered<ToolWait>,
    reach: Vec<Reach>,
    paused: Vec<PausedCall>,
    /// The calls' `tool_use` RUNNING and `ToolCall` / `ApprovalRequired`
    /// events, in order, emitted once the pause is durable (no call runs
    /// before they are: the waits are polled after).
    announce: Vec<EventKind>,
    /// The progress of calls that report it (delegate calls), by index.
    progress: mpsc::Receiver<Progress>,
    /// Its sender, while calls are dispatched.
    progress_tx: Option<mpsc::Sender<Progress>>,
    /// Delegate calls started so far in the step.
    delegates: usize,
}

fn info<'a>(call: &'a ToolCallRequest, kind: ToolKind) -> ToolCallInfo<'a> {
    ToolCallInfo {
        call_id: &call.id,
        name: &call.name,
        arguments_json: &call.arguments_json,
        kind,
    }
}

/// Decides where `call` goes — a server tool named in `approval` (the
/// call's list and the configuration's; `*`: every one) waits for its
/// approval; for caller tools the before-call hooks run
/// here, so a denied call is never announced. A call whose arguments are
/// not a JSON object goes nowhere: its result is an error telling the model
/// so, and neither a server tool nor the caller sees it.
async fn route(
    toolbox: &Toolbox,
    runner: &Runner,
    offered: &[ToolSpec],
    approval: [&[String]; 2],
    call: &ToolCallRequest,
) -> Route {
    if !offered.iter().any(|t| t.name == call.name) {
        return Route::Done(ToolOutcome::error(format!("unknown tool {:?}", call.name)));
    }
    if let Some(problem) = invalid_arguments(&call.arguments_json) {
        return Route::Done(ToolOutcome::error(format!(
            "the call was not executed: its arguments {problem}; call {:?} again with its \
             arguments as a JSON object matching its parameters",
            call.name
        )));
    }
    if !runner.tools.iter().any(|t| t.name == call.name) {
        if call.name == crate::agents::DELEGATE {
            return Route::Delegate;
        }
        if crate::runtime::builtins::is_builtin(&call.name) {
            return Route::Builtin;
        }
    }
    if runner.tools.iter().any(|t| t.name == call.name) {
        if approval
            .iter()
            .flat_map(|names| names.iter())
            .any(|n| n == "*" || *n == call.name)
        {
            return Route::Approval;
        }
        return Route::Server;
    }
    let info = info(call, ToolKind::Caller);
    match toolbox.before(info).await {
        Ok(arguments) => Route::Caller(arguments),
        Err(denied) => Route::Done(toolbox.after(info, denied).await),
    }
}

/// Why `arguments_json` cannot be a tool's arguments (tools take a JSON
/// object), or `None` when it can.
fn invalid_arguments(arguments_json: &str) -> Option<String> {
    match serde_json::from_str::<serde_json::Value>(arguments_json) {
        Ok(serde_json::Value::Object(_)) => None,
        Ok(_) => Some("are valid JSON but not an object".to_owned()),
        Err(e) => Some(format!("are not valid JSON ({e})")),
    }
}

/// A server tool call of the step, ready to run.
struct ServerCall {
    toolbox: Arc<Toolbox>,
    /// The session's own tool sources (the runner's).
    session: Option<Arc<crate::toolbox::SessionTools>>,
    permits: Arc<Semaphore>,
    index: usize,
    capture_content: bool,
    /// Set once the tool is called.
    started: Arc<AtomicBool>,
    /// The operator's tool hooks, when any serve tool calls.
    hooks: Option<Arc<super::hooks::ToolHooks>>,
}

impl ServerCall {
    /// Runs the call; dropping the future cancels it.
    fn run(self, call: ToolCallRequest) -> ToolWait {
        let span = crate::runtime::spans::execute_tool(&call.name, &call.id, "extension");
        if self.capture_content {
            span.record(
                crate::telemetry::semconv::GEN_AI_TOOL_CALL_ARGUMENTS,
                call.arguments_json.as_str(),
            );
        }
        let traced = span.clone();
        Box::pin(tracing::Instrument::instrument(
            async move {
                let mut call = call;
                let gate = match &self.hooks {
                    Some(hooks) => hooks.before(&call).await,
                    None => crate::hooks::ToolGate::Run(None),
                };
                let outcome = match gate {
                    crate::hooks::ToolGate::Denied(why) => ToolOutcome::error(why),
                    crate::hooks::ToolGate::Run(rewritten) => {
                        if let Some(arguments_json) = rewritten {
                            call.arguments_json = arguments_json;
                        }
                        self.toolbox
                            .run_in(
                                self.session.as_deref(),
                                info(&call, ToolKind::Server),
                                &self.permits,
                                &self.started,
                            )
                            .await
                    }
                };
                let outcome = match &self.hooks {
                    Some(hooks) => hooks.after(&call, outcome).await,
                    None => outcome,
                };
                if outcome.is_error {
                    crate::runtime::spans::failed(&traced, "tool_error");
                }
                (self.index, outcome)
            },
            span,
        ))
    }
}

/// Waits for the decision on a server tool call that requires approval:
/// approved, it runs (as [`server_call`]); denied, its result says so.
fn approved_call(
    server: ServerCall,
    call: ToolCallRequest,
    rx: oneshot::Receiver<Answer>,
    decided: Arc<AtomicBool>,
) -> ToolWait {
    Box::pin(async move {
        let reason = match rx.await {
            Ok(Answer::Decision { approved: true, .. }) => {
                decided.store(true, Ordering::Release);
                return server.run(call).await;
            }
            Ok(Answer::Decision {
                approved: false,
                reason,
            }) => reason,
            Ok(Answer::Result(_)) | Err(_) => "the approval was abandoned".to_owned(),
        };
        decided.store(true, Ordering::Release);
        (server.index, denied(&call.name, &reason))
    })
}

/// The result of a call whose approval was denied.
fn denied(name: &str, reason: &str) -> ToolOutcome {
    let why = if reason.trim().is_empty() {
        String::new()
    } else {
        format!(" The reason given: {reason}")
    };
    ToolOutcome::error(format!(
        "The user denied this call of {name}: it was not run.{why}"
    ))
}

/// Waits for a caller tool's result and runs the after-call hooks on it.
fn caller_result(
    toolbox: Arc<Toolbox>,
    index: usize,
    call: ToolCallRequest,
    rx: oneshot::Receiver<Answer>,
) -> ToolWait {
    let span = crate::runtime::spans::execute_tool(&call.name, &call.id, "function");
    Box::pin(tracing::Instrument::instrument(
        async move {
            let outcome = match rx.await {
                Ok(Answer::Result(outcome)) => outcome,
                Ok(Answer::Decision { .. }) | Err(_) => {
                    ToolOutcome::error("the tool call was abandoned")
                }
            };
            let outcome = toolbox.after(info(&call, ToolKind::Caller), outcome).await;
            if outcome.is_error {
                crate::runtime::spans::failed(&tracing::Span::current(), "tool_error");
            }
            (index, outcome)
        },
        span,
    ))
}

impl Turn {
    /// Stores the assistant message with its tool calls, runs the calls and
    /// stores their results. `Ok` when the loop should go on; `Err` is how
    /// the turn ended.
    pub(super) async fn tool_step(
        &mut self,
        index: u32,
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        self.emit_usage(output, emitter).await;
        self.store_partial(output, StopReason::ToolUse, emitter)
            .await?;
        let calls = std::mem::take(&mut output.tool_calls);
        let ended = self.run_tools(index, calls, emitter).await?;
        self.tools_ended(ended, emitter).await
    }

    /// The tool phase of a resumed turn: the calls its pause waits for
    /// that are still open (their waits registered by the resume).
    pub(super) async fn resumed_tool_step(
        &mut self,
        index: u32,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        let calls = self
            .resume
            .as_ref()
            .map(|r| r.open.iter().map(ToolCallRequest::from).collect())
            .unwrap_or_default();
        let ended = self.run_tools(index, calls, emitter).await?;
        self.tools_ended(ended, emitter).await
    }

    async fn tools_ended(&mut self, ended: ToolsEnd, emitter: &mut Emitter) -> Result<(), TurnEnd> {
        match ended {
            ToolsEnd::Done => Ok(()),
            ToolsEnd::Cancelled(reason) => {
                self.record.cancel_reason = Some(reason);
                Err(TurnEnd::of(TurnOutcome::Canceled))
            }
            ToolsEnd::TimedOut => {
                self.store_timeout_notice(emitter).await;
                Err(TurnEnd::of(TurnOutcome::TimedOut))
            }
            ToolsEnd::Suspended => Err(TurnEnd::suspended()),
        }
    }

    /// Announces the calls, waits (concurrently) for their results, bounded
    /// by cancellation, the deadline and — while it waits for the caller —
    /// the pause's bound, and stores every call's result in call order —
    /// calls left without one get an error result, so each call in history
    /// has exactly one result. A phase that waits for the caller (results,
    /// approvals) writes its pause first, so a restart leaves the turn
    /// paused rather than interrupted; a drain suspends it. `Err` when a
    /// result could not be stored.
    async fn run_tools(
        &mut self,
        index: u32,
        calls: Vec<ToolCallRequest>,
        emitter: &mut Emitter,
    ) -> Result<ToolsEnd, TurnEnd> {
        self.live.set_phase(Phase::Tool);
        let mut results: Vec<Option<ToolOutcome>> = vec![None; calls.len()];
        let Dispatched {
            mut waits,
            reach,
            paused,
            announce,
            mut progress,
            ..
        } = self.dispatch(&calls, &mut results).await;
        if !paused.is_empty() {
            // Durable before the caller is asked: an answer always finds
            // the turn, live or paused.
            self.write_pause(index, paused, emitter.seq()).await;
        }
        for event in announce {
            emitter.emit(event).await;
        }
        let end = self
            .wait_tools(
                &calls,
                (&mut waits, &mut progress),
                &mut results,
                &reach,
                emitter,
            )
            .await;
        // Dropping unfinished server calls cancels them (MCP sends
        // `notifications/cancelled`).
        drop(waits);
        crate::runtime::lock(&self.live.pending_tools).clear();
        if matches!(end, ToolsEnd::Suspended) {
            self.store_suspended(calls, results, emitter).await?;
            return Ok(end);
        }
        self.record.pause = None;
        self.pause_until = None;
        let why = match end {
            ToolsEnd::TimedOut => "the turn reached its time limit",
            ToolsEnd::Done | ToolsEnd::Cancelled(_) | ToolsEnd::Suspended => "the turn was stopped",
        };
        for ((call, result), reach) in calls.into_iter().zip(results).zip(reach) {
            let (output, interrupted) = match result {
                Some(output) => (output, None),
                None => {
                    let interrupted = reach.interrupted();
                    (cut_short(why, interrupted), Some(interrupted))
                }
            };
            self.store_tool_result(call, output, interrupted, emitter)
                .await?;
        }
        Ok(end)
    }

    /// Routes each call, its announcement (`tool_use` RUNNING) returned to
    /// emit: a server
    /// call starts (returned, to be awaited), a call that requires approval
    /// waits for the decision (`ApprovalRequired`, returned to announce), a
    /// caller call waits for its result (`ToolCall`, returned to announce),
    /// and
    /// a call answered at once (unknown tool, a hook's answer) has its
    /// result in `results`. A resumed turn's calls wait as its pause says,
    /// on the waits the resume registered.
    async fn dispatch(
        &mut self,
        calls: &[ToolCallRequest],
        results: &mut [Option<ToolOutcome>],
    ) -> Dispatched {
        let toolbox = Arc::clone(&self.inner.toolbox);
        // Server calls of this step share the parallelism limit.
        let permits = Arc::new(toolbox.permits());
        let hooks = self.tool_hooks();
        let mut resumed = self.resume.take().map(|r| r.waits).unwrap_or_default();
        let (progress_tx, progress) = mpsc::channel(PROGRESS_BUFFER);
        let mut out = Dispatched {
            waits: FuturesUnordered::new(),
            reach: Vec::with_capacity(calls.len()),
            paused: Vec::new(),
            announce: Vec::new(),
            progress,
            progress_tx: Some(progress_tx),
            delegates: 0,
        };
        for (i, call) in calls.iter().enumerate() {
            out.announce.push(EventKind::ToolUse(Box::new(ToolUse {
                call_id: call.id.clone(),
                tool_name: call.name.clone(),
                status: ToolStatus::Running,
                input_summary: input_summary(&call.arguments_json),
                arguments_json: call.arguments_json.clone(),
                detail: String::new(),
                content: String::new(),
                references: Vec::new(),
            })));
            let waited = resumed.remove(&call.id);
            let route = match &waited {
                Some((Wait::Result, _)) => Route::Caller(call.arguments_json.clone()),
                Some((Wait::Approval, _)) => Route::Approval,
                None => {
                    route(
                        &toolbox,
                        &self.runner,
                        &self.tools,
                        [&self.require_approval, &self.inner.config.require_approval],
                        call,
                    )
                    .await
                }
            };
            let server = ServerCall {
                toolbox: Arc::clone(&toolbox),
                session: self.runner.session_tools.clone(),
                permits: Arc::clone(&permits),
                index: i,
                capture_content: self.inner.config.capture_content,
                started: Arc::new(AtomicBool::new(false)),
                hooks: hooks.clone(),
            };
            self.start_call(call, route, server, waited, (&mut out, results));
        }
        // The progress channel closes once the calls holding it end.
        out.progress_tx = None;
        out
    }

    /// Starts `call` on its `route`: its wait, how far it got, its pause
    /// and its announcement go to `out`; an answer at once to `results`.
    fn start_call(
        &self,
        call: &ToolCallRequest,
        route: Route,
        server: ServerCall,
        waited: Option<(Wait, oneshot::Receiver<Answer>)>,
        (out, results): (&mut Dispatched, &mut [Option<ToolOutcome>]),
    ) {
        match route {
            Route::Done(output) => {
                results[server.index] = Some(output);
                out.reach.push(Reach::Answered);
            }
            Route::Server => {
                out.reach.push(Reach::Server(Arc::clone(&server.started)));
                out.waits.push(server.run(call.clone()));
            }
            Route::Builtin => {
                // Runs at once: cut short, its outcome is unknown.
                out.reach
                    .push(Reach::Server(Arc::new(AtomicBool::new(true))));
                let (inner, session) = (Arc::clone(&self.inner), self.session.clone());
                let (index, call) = (server.index, call.clone());
                out.waits.push(Box::pin(async move {
                    let outcome = crate::runtime::builtins::run(
                        inner,
                        &session,
                        &call.name,
                        &call.arguments_json,
                    )
                    .await;
                    (index, outcome)
                }));
            }
            Route::Delegate => self.start_delegate(call, server.index, out, results),
            Route::Approval => {
                let rx = self.wait_for(call, &call.arguments_json, Wait::Approval, waited);
                out.announce.push(EventKind::ApprovalRequired {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments_json: call.arguments_json.clone(),
                });
                let decided = Arc::new(AtomicBool::new(false));
                let started = Arc::clone(&server.started);
                out.waits.push(approved_call(
                    server,
                    call.clone(),
                    rx,
                    Arc::clone(&decided),
                ));
                out.reach.push(Reach::Approval { decided, started });
                out.paused
                    .push(paused(call, &call.arguments_json, Wait::Approval));
            }
            Route::Caller(arguments_json) => {
                let rx = self.wait_for(call, &arguments_json, Wait::Result, waited);
                out.announce.push(EventKind::ToolCall {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments_json: arguments_json.clone(),
                });
                out.waits.push(caller_result(
                    Arc::clone(&server.toolbox),
                    server.index,
                    call.clone(),
                    rx,
                ));
                out.reach.push(Reach::Caller);
                out.paused.push(paused(call, &arguments_json, Wait::Result));
            }
        }
    }

    /// Starts delegate call `call` (the `index`th of its step) — unless
    /// the step already runs as many as the configuration allows at once.
    fn start_delegate(
        &self,
        call: &ToolCallRequest,
        index: usize,
        out: &mut Dispatched,
        results: &mut [Option<ToolOutcome>],
    ) {
        let limit = self.inner.config.delegation.max_parallel;
        let (Some(progress), true) = (&out.progress_tx, out.delegates < limit) else {
            results[index] = Some(ToolOutcome::error(format!(
                "not run: at most {limit} delegate calls run at once; call it again once \
                 those have answered"
            )));
            out.reach.push(Reach::Answered);
            return;
        };
        out.delegates += 1;
        let delegates = self
            .tools
            .iter()
            .find(|t| t.name == crate::agents::DELEGATE)
            .map(crate::runtime::delegate::delegates_of)
            .unwrap_or_default();
        let delegate = DelegateCall {
            inner: Arc::clone(&self.inner),
            parent: self.session.clone(),
            parent_live: Arc::clone(&self.live),
            delegates,
            time_left: self
                .deadline
                .map(|d| d.saturating_duration_since(tokio::time::Instant::now())),
            budget_left: self.budget_left(),
            index,
            progress: progress.clone(),
            spent: Arc::clone(&self.delegated),
        };
        // Runs at once: cut short, its outcome is unknown.
        out.reach
            .push(Reach::Server(Arc::new(AtomicBool::new(true))));
        let arguments_json = call.arguments_json.clone();
        let span = crate::runtime::spans::execute_tool(&call.name, &call.id, "extension");
        out.waits.push(Box::pin(tracing::Instrument::instrument(
            async move { (index, delegate.run(&arguments_json).await) },
            span,
        )));
    }

    /// The wait for the answer to `call`: the one a resume registered, or
    /// a new one.
    fn wait_for(
        &self,
        call: &ToolCallRequest,
        arguments_json: &str,
        wait: Wait,
        registered: Option<(Wait, oneshot::Receiver<Answer>)>,
    ) -> oneshot::Receiver<Answer> {
        match registered {
            Some((_, rx)) => rx,
            None => crate::runtime::lock(&self.live.pending_tools).wait_for(PendingCall {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments_json: arguments_json.to_owned(),
                wait,
            }),
        }
    }

    /// Stores one tool result, then announces it (DONE/ERROR): a result is
    /// durable before anyone is told it exists.
    ///
    /// Media the result carries are stored as blobs first and shown
    /// (`image` / `file` / `references` events, before DONE).
    async fn store_tool_result(
        &mut self,
        call: ToolCallRequest,
        mut output: ToolOutcome,
        interrupted: Option<Interrupted>,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        let mut stored = ToolMediaStored::default();
        if !output.media.is_empty() {
            let mut events = Vec::new();
            stored = store_tool_media(
                &self.inner,
                (&self.session.owner, &self.session.id),
                &call.id,
                std::mem::take(&mut output.media),
                &mut events,
            )
            .await;
            for event in events {
                emitter.emit(event).await;
            }
            for note in &stored.notes {
                if !output.content.is_empty() {
                    output.content.push('\n');
                }
                output.content.push_str(note);
            }
        }
        let message = NewMessage::new(
            &self.record.turn_id,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: output.content.clone(),
                is_error: output.is_error,
                interrupted,
                media: stored.media,
            }],
        );
        self.store(message, emitter).await?;
        emitter
            .emit(EventKind::ToolUse(Box::new(ToolUse {
                call_id: call.id,
                tool_name: call.name,
                status: match interrupted {
                    Some(Interrupted::Cancelled) => ToolStatus::Cancelled,
                    Some(Interrupted::OutcomeUnknown) => ToolStatus::OutcomeUnknown,
                    None if output.is_error => ToolStatus::Error,
                    None => ToolStatus::Done,
                },
                input_summary: input_summary(&call.arguments_json),
                arguments_json: call.arguments_json,
                detail: result_detail(&output.content),
                content: output.content,
                references: stored.references,
            })))
            .await;
        Ok(())
    }

    /// Stores the NOTICE of a turn that reached its deadline; a failed
    /// write changes nothing (the turn timed out either way).
    pub(super) async fn store_timeout_notice(&mut self, emitter: &mut Emitter) {
        let notice = NewMessage::new(
            &self.record.turn_id,
            Role::Notice,
            vec![ContentBlock::text(TIMEOUT_NOTICE)],
        );
        self.store(notice, emitter).await.ok();
    }
}

/// The result stored for a call the turn's end cut short (`why`: what
/// ended it).
fn cut_short(why: &str, interrupted: Interrupted) -> ToolOutcome {
    ToolOutcome::error(match interrupted {
        Interrupted::Cancelled => {
            format!("{why} before this tool call started: it was not run")
        }
        Interrupted::OutcomeUnknown => format!(
            "{why} while this tool call was running: its outcome is unknown (it may have had \
             effects; the call id is the idempotency key to check or retry it with)"
        ),
    })
}

/// Longest input summary and result detail in `tool_use` events.
const SUMMARY_CHARS: usize = 80;
const DETAIL_CHARS: usize = 120;

fn clip(text: &str, chars: usize) -> String {
    let mut out: String = text.chars().take(chars).collect();
    if text.chars().count() > chars {
        out.push('…');
    }
    out
}

/// A short, single-line rendering of a call's arguments.
fn input_summary(arguments_json: &str) -> String {
    let compact = serde_json::from_str::<serde_json::Value>(arguments_json)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments_json.replace('\n', " "));
    clip(&compact, SUMMARY_CHARS)
}

/// The first line of a result, clipped; "N lines" for multi-line results.
fn result_detail(content: &str) -> String {
    let lines = content.lines().count();
    let first = content.lines().next().unwrap_or_default();
    if lines > 1 {
        format!("{} ({lines} lines)", clip(first, DETAIL_CHARS))
    } else {
        clip(first, DETAIL_CHARS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_short_single_lines() {
        assert_eq!(
            input_summary("{ \"city\":\n \"Oslo\" }"),
            r#"{"city":"Oslo"}"#
        );
        assert!(
            input_summary(&format!("{{\"x\":\"{}\"}}", "y".repeat(500)))
                .chars()
                .count()
                <= 81
        );
        assert_eq!(result_detail("sunny\nwindy"), "sunny (2 lines)");
    }
}
