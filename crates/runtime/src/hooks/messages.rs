//! What a hook is sent and what it answers: the domain side of the
//! `agentrt.hooks.v1` messages. The requests serialize as the proto3 JSON
//! mapping of the same messages (the HTTP JSON transport sends them as
//! they are); none of them holds a credential.

use serde::Serialize;

/// The turn a hook call belongs to (`TurnContext` of the proto).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnContext {
    /// The session's id as its client knows it.
    pub session_id: String,
    /// The session's owner.
    pub user_id: String,
    /// The session's agent (empty when none).
    pub agent_id: String,
    /// The turn's id.
    pub turn_id: String,
    /// The turn's `provider/model`.
    pub model: String,
    /// The name of the hook the call is for (set by [`super::Hooks`]).
    pub hook_name: String,
}

/// Token counts of a model step, 64-bit counts as decimal strings (the
/// proto3 JSON mapping of `uint64`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookUsage {
    /// Prompt tokens.
    #[serde(serialize_with = "as_decimal")]
    pub input_tokens: u64,
    /// Of the input, tokens served from a prompt cache.
    #[serde(serialize_with = "as_decimal")]
    pub cached_input_tokens: u64,
    /// Generated tokens.
    #[serde(serialize_with = "as_decimal")]
    pub output_tokens: u64,
    /// Of the output, reasoning tokens.
    #[serde(serialize_with = "as_decimal")]
    pub reasoning_tokens: u64,
}

impl From<crate::types::Usage> for HookUsage {
    fn from(u: crate::types::Usage) -> Self {
        Self {
            input_tokens: u.input_tokens,
            cached_input_tokens: u.cached_input_tokens,
            output_tokens: u.output_tokens,
            reasoning_tokens: u.reasoning_tokens,
        }
    }
}

fn as_decimal<S: serde::Serializer>(n: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(n)
}

/// `BeforeTurn`: the turn about to start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BeforeTurnRequest {
    /// The turn.
    pub turn: TurnContext,
    /// The caller's message text.
    pub user_text: String,
    /// The system prompt the turn would run with (empty when none).
    pub system_prompt: String,
}

/// A `BeforeTurn` hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnDecision {
    /// Run the turn, with this system prompt instead when set.
    Allow {
        /// The replacement system prompt.
        system_prompt: Option<String>,
    },
    /// Do not run it.
    Refuse {
        /// Why, for the caller.
        reason: String,
    },
}

/// `BeforeModelCall`: a model request about to be sent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BeforeModelCallRequest {
    /// The turn.
    pub turn: TurnContext,
    /// The agent loop's step, from 1.
    pub step: u32,
    /// How many messages the request carries.
    pub message_count: u32,
    /// The tools offered.
    pub tool_names: Vec<String>,
}

/// A `BeforeModelCall` hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelCallDecision {
    /// Call the model.
    Allow,
    /// End the turn.
    Refuse {
        /// Why, for the turn's callers.
        reason: String,
    },
}

/// A tool call as hooks see it (`ToolCall` of the proto).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookToolCall {
    /// The model's call id.
    pub call_id: String,
    /// The tool's name as the model sees it.
    pub tool_name: String,
    /// The arguments (a JSON document).
    pub arguments_json: String,
}

/// `AfterStep`: a model step that finished.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AfterStepRequest {
    /// The turn.
    pub turn: TurnContext,
    /// The agent loop's step, from 1.
    pub step: u32,
    /// Why the model stopped (`stop`, `length`, `tool_use`, ...).
    pub stop_reason: String,
    /// The step's text.
    pub text: String,
    /// The tool calls it made.
    pub tool_calls: Vec<HookToolCall>,
    /// Its usage.
    pub usage: HookUsage,
}

/// `BeforeToolCall`: a server tool call about to run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BeforeToolCallRequest {
    /// The turn.
    pub turn: TurnContext,
    /// The step that made the call.
    pub step: u32,
    /// The call.
    pub call: HookToolCall,
}

/// A `BeforeToolCall` hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolCallDecision {
    /// Run it.
    Allow,
    /// Do not run it; the model gets the reason as the result.
    Deny {
        /// Why.
        reason: String,
    },
    /// Run it with these arguments (a JSON object).
    Rewrite {
        /// The new arguments.
        arguments_json: String,
    },
}

/// `AfterToolCall`: a server tool call's result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AfterToolCallRequest {
    /// The turn.
    pub turn: TurnContext,
    /// The step that made the call.
    pub step: u32,
    /// The call, with the arguments it ran with.
    pub call: HookToolCall,
    /// The result's text.
    pub result: String,
    /// Whether the result is an error.
    pub is_error: bool,
}

/// An `AfterToolCall` hook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolResultDecision {
    /// Keep the result.
    Keep,
    /// Replace it with this text.
    Redact {
        /// The replacement.
        replacement: String,
    },
}
