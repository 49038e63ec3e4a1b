//! Policy hooks around tool calls: the [`ToolHook`] trait and the
//! config-driven [`ToolPolicy`] (deny list, per-tool timeout, result size
//! limit, parallelism limit).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use super::ToolOutcome;

/// Who executes a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolKind {
    /// A server tool (a [`super::ToolSource`]).
    Server,
    /// A caller-executed tool (answered with `SubmitToolResult`).
    Caller,
}

/// A tool call as hooks see it.
#[derive(Debug, Clone, Copy)]
pub struct ToolCallInfo<'a> {
    /// The model's call id.
    pub call_id: &'a str,
    /// The tool name the model used (namespaced for server tools).
    pub name: &'a str,
    /// The arguments (as rewritten by earlier hooks).
    pub arguments_json: &'a str,
    /// Who executes it.
    pub kind: ToolKind,
}

/// What a hook decides before a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookDecision {
    /// Go on.
    Allow,
    /// Do not run the call; the model receives this reason as an error
    /// result.
    Deny(String),
    /// Run the call with these arguments (a JSON document) instead.
    Rewrite(String),
}

/// A policy hook around tool calls. Both methods default to doing nothing.
#[async_trait]
pub trait ToolHook: Send + Sync + fmt::Debug {
    /// Runs before the call is executed (or announced, for caller tools).
    async fn before_call(&self, call: &ToolCallInfo<'_>) -> HookDecision {
        let _ = call;
        HookDecision::Allow
    }

    /// Runs once the call has an outcome (denials and timeouts included);
    /// may observe or rewrite (redact) it.
    async fn after_call(&self, call: &ToolCallInfo<'_>, outcome: &mut ToolOutcome) {
        let _ = (call, outcome);
    }
}

/// The configured tool policy. As a hook it denies listed tools and cuts
/// long results; the toolbox applies its timeouts and parallelism limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolPolicy {
    /// Tool names (as the model sees them) that are never run.
    pub deny: BTreeSet<String>,
    /// Longest a server tool call may take. Default 60 s.
    pub timeout: Duration,
    /// Per-tool overrides of `timeout`.
    pub timeouts: BTreeMap<String, Duration>,
    /// Longest result, in bytes; longer ones are cut and marked. Default
    /// 64 KiB.
    pub max_result_bytes: usize,
    /// Most server tool calls of one step running at once. Default 4.
    pub max_parallel: usize,
}

impl Default for ToolPolicy {
    fn default() -> Self {
        Self {
            deny: BTreeSet::new(),
            timeout: Duration::from_secs(60),
            timeouts: BTreeMap::new(),
            max_result_bytes: 64 << 10,
            max_parallel: 4,
        }
    }
}

impl ToolPolicy {
    /// The timeout of tool `name`.
    pub fn timeout_for(&self, name: &str) -> Duration {
        self.timeouts.get(name).copied().unwrap_or(self.timeout)
    }
}

#[async_trait]
impl ToolHook for ToolPolicy {
    async fn before_call(&self, call: &ToolCallInfo<'_>) -> HookDecision {
        if self.deny.contains(call.name) {
            HookDecision::Deny(format!(
                "the tool {:?} is denied by the server's tool policy",
                call.name
            ))
        } else {
            HookDecision::Allow
        }
    }

    async fn after_call(&self, _call: &ToolCallInfo<'_>, outcome: &mut ToolOutcome) {
        cut(&mut outcome.content, self.max_result_bytes);
    }
}

/// Cuts `text` to at most `max` bytes (at a character boundary) and marks
/// the cut.
pub fn cut(text: &mut String, max: usize) {
    let total = text.len();
    if total <= max {
        return;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!(
        "\n[result truncated: {end} of {total} bytes shown]"
    ));
}

/// `60s`, `1.5s`, `250ms`.
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else if ms >= 1000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        format!("{ms}ms")
    }
}
