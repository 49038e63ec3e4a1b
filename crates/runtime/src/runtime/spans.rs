//! The spans of a turn, named and attributed per the GenAI semantic
//! conventions: `invoke_agent` per turn, `chat {model}` per model step,
//! `execute_tool {name}` per tool call. Their parents are explicit: a turn
//! runs in a spawned task, so each span is made with its parent named, and
//! the task is instrumented with it.
//!
//! Attributes that carry no message content only; content (model output,
//! tool arguments) goes on spans only with `capture_content`.

use std::time::Duration;

use opentelemetry::{StringValue, Value};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::events::TurnOutcome;
use crate::types::{StopReason, Usage};

use crate::telemetry::semconv::{
    AGENTRT_TURN_OUTCOME, ERROR_TYPE, GEN_AI_AGENT_ID, GEN_AI_CONVERSATION_ID,
    GEN_AI_OPERATION_NAME, GEN_AI_OUTPUT_MESSAGES, GEN_AI_PROVIDER_NAME, GEN_AI_REQUEST_MODEL,
    GEN_AI_RESPONSE_FINISH_REASONS, GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    GEN_AI_TOOL_CALL_ARGUMENTS, GEN_AI_TOOL_CALL_ID, GEN_AI_TOOL_NAME, GEN_AI_TOOL_TYPE,
    GEN_AI_USAGE_INPUT_TOKENS, GEN_AI_USAGE_OUTPUT_TOKENS, OP_CHAT, OP_EXECUTE_TOOL,
    OP_INVOKE_AGENT,
};
use crate::types::Session;

/// `provider/model` → (`provider`, `model`).
pub(super) fn split_model(model: &str) -> (&str, &str) {
    model.split_once('/').unwrap_or(("", model))
}

/// A turn's span, a child of the current span (the RPC's). `session_id`
/// and `turn_id` are plain fields for the log lines inside it.
pub(super) fn invoke_agent(session: &Session, turn_id: &str, model: &str) -> Span {
    let name = if session.agent_id.is_empty() {
        OP_INVOKE_AGENT.to_owned()
    } else {
        format!("{OP_INVOKE_AGENT} {}", session.agent_id)
    };
    let agent = (!session.agent_id.is_empty()).then_some(session.agent_id.as_str());
    // The id its client knows, never the stored key (which tags the owner).
    let conversation = super::keys::client_id(&session.id);
    let span = tracing::info_span!(
        "invoke_agent",
        otel.name = %name,
        otel.kind = "internal",
        { GEN_AI_OPERATION_NAME } = OP_INVOKE_AGENT,
        { GEN_AI_CONVERSATION_ID } = %conversation,
        { GEN_AI_REQUEST_MODEL } = %model,
        { GEN_AI_AGENT_ID } = Empty,
        { AGENTRT_TURN_OUTCOME } = Empty,
        { ERROR_TYPE } = Empty,
        otel.status_code = Empty,
        session_id = %conversation,
        turn_id = %turn_id,
    );
    if let Some(agent) = agent {
        span.record(GEN_AI_AGENT_ID, agent);
    }
    span
}

/// A model step's span (kind CLIENT), a child of `parent`.
pub(super) fn chat(parent: &Span, model: &str) -> Span {
    let (provider, provider_model) = split_model(model);
    tracing::info_span!(
        parent: parent,
        "chat",
        otel.name = %format_args!("{OP_CHAT} {provider_model}"),
        otel.kind = "client",
        { GEN_AI_OPERATION_NAME } = OP_CHAT,
        { GEN_AI_PROVIDER_NAME } = %provider,
        { GEN_AI_REQUEST_MODEL } = %provider_model,
        { GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK } = Empty,
        { GEN_AI_USAGE_INPUT_TOKENS } = Empty,
        { GEN_AI_USAGE_OUTPUT_TOKENS } = Empty,
        { GEN_AI_OUTPUT_MESSAGES } = Empty,
        { ERROR_TYPE } = Empty,
        otel.status_code = Empty,
    )
}

/// A tool call's span, a child of the current span (the turn's).
pub(super) fn execute_tool(name: &str, call_id: &str, kind: &'static str) -> Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = %format_args!("{OP_EXECUTE_TOOL} {name}"),
        otel.kind = "internal",
        { GEN_AI_OPERATION_NAME } = OP_EXECUTE_TOOL,
        { GEN_AI_TOOL_NAME } = %name,
        { GEN_AI_TOOL_CALL_ID } = %call_id,
        { GEN_AI_TOOL_TYPE } = kind,
        { GEN_AI_TOOL_CALL_ARGUMENTS } = Empty,
        { ERROR_TYPE } = Empty,
        otel.status_code = Empty,
    )
}

/// Marks `span` failed with `error_type`.
pub(super) fn failed(span: &Span, error_type: &str) {
    span.record(ERROR_TYPE, error_type);
    span.record("otel.status_code", "error");
}

/// The `finish_reasons` value of a step's stop reason (OpenAI's words
/// where there is one).
fn finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Stop => "stop",
        StopReason::Length => "length",
        StopReason::ToolUse => "tool_calls",
        StopReason::Error => "error",
        StopReason::Cancelled => "cancelled",
        StopReason::ClientGone => "client_gone",
        StopReason::Timeout => "timeout",
        StopReason::Shutdown => "shutdown",
    }
}

/// Closes a model step's span: finish reason, usage, error, and (opt-in
/// only) the output text; records the step's metrics.
pub(super) fn close_chat(
    span: &Span,
    model: &str,
    took: Duration,
    finish: Option<StopReason>,
    error: Option<&'static str>,
    usage: Option<(u64, u64)>,
    content: Option<&str>,
) {
    if let Some(reason) = finish {
        span.set_attribute(
            GEN_AI_RESPONSE_FINISH_REASONS,
            Value::Array(vec![StringValue::from(finish_reason(reason))].into()),
        );
    }
    if let Some((input, output)) = usage {
        span.record(GEN_AI_USAGE_INPUT_TOKENS, input);
        span.record(GEN_AI_USAGE_OUTPUT_TOKENS, output);
    }
    if let Some(error) = error {
        failed(span, error);
    }
    if let Some(text) = content {
        let messages = serde_json::json!([{
            "role": "assistant",
            "parts": [{"type": "text", "content": text}],
        }]);
        span.record(GEN_AI_OUTPUT_MESSAGES, messages.to_string());
    }
    let (provider, provider_model) = split_model(model);
    crate::telemetry::metrics::model_step(provider, provider_model, took, usage, error);
}

/// The lowercase outcome name used on spans, metrics and log lines.
pub(super) fn outcome_name(outcome: TurnOutcome) -> &'static str {
    match outcome {
        TurnOutcome::Success => "success",
        TurnOutcome::Error => "error",
        TurnOutcome::Canceled => "canceled",
        TurnOutcome::TimedOut => "timed_out",
        TurnOutcome::BudgetExceeded => "budget_exceeded",
    }
}

/// A finished turn: its outcome on the turn's span, `agentrt.turns`, and
/// the one `info` line per turn (no content, no caller identity beyond the
/// session).
pub(super) fn turn_finished(
    span: &Span,
    session_id: &str,
    turn_id: &str,
    model: &str,
    outcome: TurnOutcome,
    took: Duration,
    usage: Usage,
) {
    let name = outcome_name(outcome);
    span.record(AGENTRT_TURN_OUTCOME, name);
    if outcome == TurnOutcome::Error {
        failed(span, "turn_error");
    }
    crate::telemetry::metrics::get().turns.add(
        1,
        &[opentelemetry::KeyValue::new(AGENTRT_TURN_OUTCOME, name)],
    );
    let session_id = super::keys::client_id(session_id);
    tracing::info!(
        session_id,
        turn_id,
        model,
        outcome = name,
        duration_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
        input_tokens = usage.input_tokens,
        output_tokens = usage.output_tokens,
        "turn finished"
    );
}
