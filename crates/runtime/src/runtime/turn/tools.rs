//! The tool phase of a turn: after a model step that called tools, store
//! the calls, route each to the toolbox (server tools) or to the caller
//! (announced with a `ToolCall` event, answered by `SubmitToolResult`),
//! through the toolbox's hooks either way, wait for the results — bounded
//! by cancellation and the deadline — and store one result per call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use tokio::sync::{Semaphore, oneshot};

use super::emitter::Emitter;
use super::step::{StepEnd, StepOutput, ToolCallRequest};
use super::{TIMEOUT_NOTICE, Turn, TurnEnd, until};
use crate::events::{EventKind, Phase, ToolStatus, ToolUse, TurnOutcome};
use crate::model::ToolSpec;
use crate::runtime::caller_tools::PendingCall;
use crate::runtime::runners::Runner;
use crate::toolbox::{ToolCallInfo, ToolKind, ToolOutcome, Toolbox};
use crate::types::{CancelReason, ContentBlock, Interrupted, NewMessage, Role, StopReason};

/// How a tool phase ended.
enum ToolsEnd {
    /// Every result is stored; the loop goes on.
    Done,
    Cancelled(CancelReason),
    TimedOut,
}

/// Where a tool call goes.
enum Route {
    /// To the toolbox (hooks and limits applied there).
    Server,
    /// To the caller, with these arguments (after the hooks).
    Caller(String),
    /// Nowhere: this is its result (denied, or not an offered tool).
    Done(ToolOutcome),
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
}

impl Reach {
    /// What became of the call when the turn ended without its result.
    fn interrupted(&self) -> Interrupted {
        match self {
            Self::Server(started) if !started.load(Ordering::Acquire) => Interrupted::Cancelled,
            Self::Answered | Self::Server(_) | Self::Caller => Interrupted::OutcomeUnknown,
        }
    }
}

fn info<'a>(call: &'a ToolCallRequest, kind: ToolKind) -> ToolCallInfo<'a> {
    ToolCallInfo {
        call_id: &call.id,
        name: &call.name,
        arguments_json: &call.arguments_json,
        kind,
    }
}

/// Decides where `call` goes; for caller tools the before-call hooks run
/// here, so a denied call is never announced. A call whose arguments are
/// not a JSON object goes nowhere: its result is an error telling the model
/// so, and neither a server tool nor the caller sees it.
async fn route(
    toolbox: &Toolbox,
    runner: &Runner,
    offered: &[ToolSpec],
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
    if runner.tools.iter().any(|t| t.name == call.name) {
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

/// Runs a server tool call; dropping the future cancels it. `started` is
/// set once the tool is called.
fn server_call(
    toolbox: Arc<Toolbox>,
    permits: Arc<Semaphore>,
    index: usize,
    call: ToolCallRequest,
    capture_content: bool,
    started: Arc<AtomicBool>,
) -> ToolWait {
    let span = crate::runtime::spans::execute_tool(&call.name, &call.id, "extension");
    if capture_content {
        span.record(
            crate::telemetry::semconv::GEN_AI_TOOL_CALL_ARGUMENTS,
            call.arguments_json.as_str(),
        );
    }
    let traced = span.clone();
    Box::pin(tracing::Instrument::instrument(
        async move {
            let outcome = toolbox
                .run(info(&call, ToolKind::Server), &permits, &started)
                .await;
            if outcome.is_error {
                crate::runtime::spans::failed(&traced, "tool_error");
            }
            (index, outcome)
        },
        span,
    ))
}

/// Waits for a caller tool's result and runs the after-call hooks on it.
fn caller_result(
    toolbox: Arc<Toolbox>,
    index: usize,
    call: ToolCallRequest,
    rx: oneshot::Receiver<ToolOutcome>,
) -> ToolWait {
    let span = crate::runtime::spans::execute_tool(&call.name, &call.id, "function");
    Box::pin(tracing::Instrument::instrument(
        async move {
            let outcome = rx
                .await
                .unwrap_or_else(|_| ToolOutcome::error("the tool call was abandoned"));
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
        output: &mut StepOutput,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        self.emit_usage(output, emitter).await;
        self.store_partial(output, StopReason::ToolUse, emitter)
            .await?;
        match self
            .run_tools(std::mem::take(&mut output.tool_calls), emitter)
            .await?
        {
            ToolsEnd::Done => Ok(()),
            ToolsEnd::Cancelled(reason) => {
                self.record.cancel_reason = Some(reason);
                Err(TurnEnd::of(TurnOutcome::Canceled))
            }
            ToolsEnd::TimedOut => {
                self.store_timeout_notice(emitter).await;
                Err(TurnEnd::of(TurnOutcome::TimedOut))
            }
        }
    }

    /// Announces the calls, waits (concurrently) for their results, bounded
    /// by cancellation and the deadline, and stores every call's result in
    /// call order — calls left without one get an error result, so each
    /// call in history has exactly one result. `Err` when a result could
    /// not be stored.
    async fn run_tools(
        &mut self,
        calls: Vec<ToolCallRequest>,
        emitter: &mut Emitter,
    ) -> Result<ToolsEnd, TurnEnd> {
        self.live.set_phase(Phase::Tool);
        let mut results: Vec<Option<ToolOutcome>> = vec![None; calls.len()];
        let (mut waits, reach) = self.dispatch(&calls, &mut results, emitter).await;
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
        crate::runtime::lock(&self.live.pending_tools).clear();
        let why = match end {
            ToolsEnd::TimedOut => "the turn reached its time limit",
            ToolsEnd::Done | ToolsEnd::Cancelled(_) => "the turn was stopped",
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

    /// Announces each call (`tool_use` RUNNING) and routes it: a server
    /// call starts (returned, to be awaited), a caller call is announced
    /// with a `ToolCall` event and waited for, and a call answered at once
    /// (unknown tool, a hook's answer) has its result in `results`.
    async fn dispatch(
        &self,
        calls: &[ToolCallRequest],
        results: &mut [Option<ToolOutcome>],
        emitter: &mut Emitter,
    ) -> (FuturesUnordered<ToolWait>, Vec<Reach>) {
        let toolbox = Arc::clone(&self.inner.toolbox);
        // Server calls of this step share the parallelism limit.
        let permits = Arc::new(toolbox.permits());
        let waits = FuturesUnordered::<ToolWait>::new();
        let mut reach = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            emitter
                .emit(EventKind::ToolUse(Box::new(ToolUse {
                    call_id: call.id.clone(),
                    tool_name: call.name.clone(),
                    status: ToolStatus::Running,
                    input_summary: input_summary(&call.arguments_json),
                    arguments_json: call.arguments_json.clone(),
                    detail: String::new(),
                    content: String::new(),
                })))
                .await;
            match route(&toolbox, &self.runner, &self.tools, call).await {
                Route::Server => {
                    let started = Arc::new(AtomicBool::new(false));
                    reach.push(Reach::Server(Arc::clone(&started)));
                    waits.push(server_call(
                        Arc::clone(&toolbox),
                        Arc::clone(&permits),
                        i,
                        call.clone(),
                        self.inner.config.capture_content,
                        started,
                    ));
                }
                Route::Caller(arguments_json) => {
                    let rx = crate::runtime::lock(&self.live.pending_tools).wait_for(PendingCall {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        arguments_json: arguments_json.clone(),
                    });
                    emitter
                        .emit(EventKind::ToolCall {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            arguments_json,
                        })
                        .await;
                    waits.push(caller_result(Arc::clone(&toolbox), i, call.clone(), rx));
                    reach.push(Reach::Caller);
                }
                Route::Done(output) => {
                    results[i] = Some(output);
                    reach.push(Reach::Answered);
                }
            }
        }
        (waits, reach)
    }

    /// Stores one tool result, then announces it (DONE/ERROR): a result is
    /// durable before anyone is told it exists.
    async fn store_tool_result(
        &mut self,
        call: ToolCallRequest,
        output: ToolOutcome,
        interrupted: Option<Interrupted>,
        emitter: &mut Emitter,
    ) -> Result<(), TurnEnd> {
        let message = NewMessage::new(
            &self.record.turn_id,
            Role::Tool,
            vec![ContentBlock::ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                content: output.content.clone(),
                is_error: output.is_error,
                interrupted,
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
