//! Operator hooks: external calls the operator configures around a turn —
//! before it starts, before each model request, after each model step,
//! before and after each server tool call — without forking the runtime.
//!
//! The transport-free part lives here: the domain requests and decisions
//! (what a hook is sent never holds a credential), the [`HookClient`] trait
//! a transport implements (HTTP JSON in [`http`]; the server implements the
//! gRPC `agentrt.hooks.v1.HookService` client), and [`Hooks`], which runs
//! the configured hooks of a point in order, each bounded by its timeout and
//! failing open or closed as configured, with a span and metrics per call.
//!
//! - [`http`]: the HTTP JSON client (`POST <url>/<Rpc>`, proto3 JSON).
//! - `messages`: the requests and decisions (re-exported here).

pub use crate::error::HookStop;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use opentelemetry::KeyValue;

use crate::error::display_clip;

pub mod http;
mod messages;

pub use messages::{
    AfterStepRequest, AfterToolCallRequest, BeforeModelCallRequest, BeforeToolCallRequest,
    BeforeTurnRequest, HookToolCall, HookUsage, ModelCallDecision, ToolCallDecision,
    ToolResultDecision, TurnContext, TurnDecision,
};

/// Longest reason a hook's refusal or denial carries to callers and the
/// model, in characters; longer ones are clipped.
pub const MAX_REASON_CHARS: usize = 1024;
/// Longest system prompt a `BeforeTurn` hook may substitute (as a session's).
pub const MAX_SYSTEM_PROMPT_BYTES: usize = crate::limits::MAX_TEXT_FIELD_BYTES;
/// Longest arguments a `BeforeToolCall` hook may rewrite a call to.
pub const MAX_ARGUMENTS_BYTES: usize = 1 << 20;
/// Longest a hook's timeout may be.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// A hook's timeout when its configuration names none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where in a turn a hook is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HookPoint {
    /// Before a turn starts (nothing stored yet).
    BeforeTurn,
    /// Before each model request of the agent loop.
    BeforeModelCall,
    /// After each model step that finished.
    AfterStep,
    /// Before a server tool runs.
    BeforeToolCall,
    /// After a server tool ran (or was denied).
    AfterToolCall,
}

impl HookPoint {
    /// Every point, in the order of a turn.
    pub const ALL: [Self; 5] = [
        Self::BeforeTurn,
        Self::BeforeModelCall,
        Self::AfterStep,
        Self::BeforeToolCall,
        Self::AfterToolCall,
    ];

    /// Its configuration and metric name: `before_turn`, `before_model_call`,
    /// `after_step`, `before_tool_call`, `after_tool_call`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::BeforeTurn => "before_turn",
            Self::BeforeModelCall => "before_model_call",
            Self::AfterStep => "after_step",
            Self::BeforeToolCall => "before_tool_call",
            Self::AfterToolCall => "after_tool_call",
        }
    }

    /// Its RPC in `agentrt.hooks.v1.HookService` (and the HTTP path).
    pub const fn rpc(self) -> &'static str {
        match self {
            Self::BeforeTurn => "BeforeTurn",
            Self::BeforeModelCall => "BeforeModelCall",
            Self::AfterStep => "AfterStep",
            Self::BeforeToolCall => "BeforeToolCall",
            Self::AfterToolCall => "AfterToolCall",
        }
    }

    /// The point named `name` (see [`HookPoint::name`]).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// A hook call that did not produce an answer: unreachable, an error
/// status, a malformed answer. The text is for the server's log only.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

/// A transport to one hook implementation. One method per hook point;
/// [`Hooks`] bounds each call by the hook's timeout.
#[async_trait]
pub trait HookClient: Send + Sync + fmt::Debug {
    /// `BeforeTurn`.
    async fn before_turn(&self, request: &BeforeTurnRequest) -> Result<TurnDecision, HookError>;
    /// `BeforeModelCall`.
    async fn before_model_call(
        &self,
        request: &BeforeModelCallRequest,
    ) -> Result<ModelCallDecision, HookError>;
    /// `AfterStep`.
    async fn after_step(&self, request: &AfterStepRequest) -> Result<(), HookError>;
    /// `BeforeToolCall`.
    async fn before_tool_call(
        &self,
        request: &BeforeToolCallRequest,
    ) -> Result<ToolCallDecision, HookError>;
    /// `AfterToolCall`.
    async fn after_tool_call(
        &self,
        request: &AfterToolCallRequest,
    ) -> Result<ToolResultDecision, HookError>;
}

/// One configured hook.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Its name (the `[[hooks]]` entry's), in spans, metrics and statuses.
    pub name: String,
    /// The points it serves.
    pub points: Vec<HookPoint>,
    /// Longest a call may take. Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Whether a call that fails or times out is ignored (`true`) or
    /// refuses what it guards (`false`, the default).
    pub fail_open: bool,
    /// The transport.
    pub client: Arc<dyn HookClient>,
}

/// What a tool call does after the `BeforeToolCall` hooks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolGate {
    /// Run it, with these arguments when a hook rewrote them.
    Run(Option<String>),
    /// Do not run it; this is its (error) result for the model.
    Denied(String),
}

/// The configured hooks, run in the order configured. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    hooks: Arc<[Hook]>,
}

/// How one hook call ended, for its span and metrics.
enum Outcome {
    /// It answered with a decision of this name.
    Answered(&'static str),
    /// It failed (`error`) or timed out (`timeout`).
    Failed(&'static str),
}

impl Hooks {
    /// `hooks`, run in this order.
    pub fn new(hooks: Vec<Hook>) -> Self {
        Self {
            hooks: hooks.into(),
        }
    }

    /// Whether any hook serves `point`.
    pub fn serves(&self, point: HookPoint) -> bool {
        self.hooks.iter().any(|h| h.points.contains(&point))
    }

    fn at(&self, point: HookPoint) -> impl Iterator<Item = &Hook> {
        self.hooks.iter().filter(move |h| h.points.contains(&point))
    }

    /// Runs `hook`'s call `call` for `point`, bounded by its timeout, in a
    /// span, counted; `None` when it failed or timed out (logged).
    async fn call<T, F>(
        hook: &Hook,
        point: HookPoint,
        call: F,
        name_of: fn(&T) -> &'static str,
    ) -> Option<T>
    where
        F: std::future::Future<Output = Result<T, HookError>>,
    {
        let span = tracing::info_span!(
            "hook",
            otel.name = %format_args!("agentrt.hook {}", point.name()),
            otel.kind = "client",
            hook = %hook.name,
            point = point.name(),
            outcome = tracing::field::Empty,
            error.type = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let started = Instant::now();
        let answered =
            tracing::Instrument::instrument(tokio::time::timeout(hook.timeout, call), span.clone())
                .await;
        let (answer, outcome) = match answered {
            Ok(Ok(answer)) => {
                let name = name_of(&answer);
                (Some(answer), Outcome::Answered(name))
            }
            Ok(Err(err)) => {
                tracing::warn!(parent: &span, hook = %hook.name, point = point.name(),
                    fail_open = hook.fail_open, error = %err, "hook call failed");
                (None, Outcome::Failed("error"))
            }
            Err(_) => {
                tracing::warn!(parent: &span, hook = %hook.name, point = point.name(),
                    fail_open = hook.fail_open, timeout_ms = hook.timeout.as_millis() as u64,
                    "hook call timed out");
                (None, Outcome::Failed("timeout"))
            }
        };
        let label = match outcome {
            Outcome::Answered(name) => name,
            Outcome::Failed(kind) => {
                span.record("error.type", kind);
                span.record("otel.status_code", "error");
                kind
            }
        };
        span.record("outcome", label);
        let metrics = crate::telemetry::metrics::get();
        let hook_label = KeyValue::new("hook", hook.name.clone());
        let point_label = KeyValue::new("point", point.name());
        metrics.hook_calls.add(
            1,
            &[
                hook_label.clone(),
                point_label.clone(),
                KeyValue::new("outcome", label),
            ],
        );
        metrics
            .hook_duration
            .record(started.elapsed().as_secs_f64(), &[hook_label, point_label]);
        answer
    }

    /// Runs the `BeforeTurn` hooks: the system prompt to use instead when
    /// one replaced it (each later hook sees the replacement), or why the
    /// turn must not run.
    pub async fn before_turn(
        &self,
        mut request: BeforeTurnRequest,
    ) -> Result<Option<String>, HookStop> {
        let mut replaced = None;
        for hook in self.at(HookPoint::BeforeTurn) {
            request.turn.hook_name.clone_from(&hook.name);
            let answer = Self::call(
                hook,
                HookPoint::BeforeTurn,
                hook.client.before_turn(&request),
                |d| match d {
                    TurnDecision::Allow {
                        system_prompt: None,
                    } => "allow",
                    TurnDecision::Allow { .. } => "rewrite",
                    TurnDecision::Refuse { .. } => "refuse",
                },
            )
            .await;
            match answer {
                Some(TurnDecision::Allow {
                    system_prompt: Some(prompt),
                }) if prompt.len() > MAX_SYSTEM_PROMPT_BYTES => {
                    tracing::warn!(hook = %hook.name, bytes = prompt.len(),
                        max = MAX_SYSTEM_PROMPT_BYTES,
                        "a BeforeTurn hook's system prompt is too long; treated as a failed call");
                    failed(hook)?;
                }
                Some(TurnDecision::Allow {
                    system_prompt: Some(prompt),
                }) => {
                    request.system_prompt.clone_from(&prompt);
                    replaced = Some(prompt);
                }
                Some(TurnDecision::Allow {
                    system_prompt: None,
                }) => {}
                Some(TurnDecision::Refuse { reason }) => return Err(refused(hook, &reason)),
                None => failed(hook)?,
            }
        }
        Ok(replaced)
    }

    /// Runs the `BeforeModelCall` hooks: `Err` when the model must not be
    /// called (and the turn ends).
    pub async fn before_model_call(
        &self,
        mut request: BeforeModelCallRequest,
    ) -> Result<(), HookStop> {
        for hook in self.at(HookPoint::BeforeModelCall) {
            request.turn.hook_name.clone_from(&hook.name);
            let answer = Self::call(
                hook,
                HookPoint::BeforeModelCall,
                hook.client.before_model_call(&request),
                |d| match d {
                    ModelCallDecision::Allow => "allow",
                    ModelCallDecision::Refuse { .. } => "refuse",
                },
            )
            .await;
            match answer {
                Some(ModelCallDecision::Allow) => {}
                Some(ModelCallDecision::Refuse { reason }) => return Err(refused(hook, &reason)),
                None => failed(hook)?,
            }
        }
        Ok(())
    }

    /// Runs the `AfterStep` hooks: `Err` only when a fail-closed one did
    /// not answer (the turn ends).
    pub async fn after_step(&self, mut request: AfterStepRequest) -> Result<(), HookStop> {
        for hook in self.at(HookPoint::AfterStep) {
            request.turn.hook_name.clone_from(&hook.name);
            let answer = Self::call(
                hook,
                HookPoint::AfterStep,
                hook.client.after_step(&request),
                |()| "observed",
            )
            .await;
            if answer.is_none() {
                failed(hook)?;
            }
        }
        Ok(())
    }

    /// Runs the `BeforeToolCall` hooks: whether the call runs (with which
    /// arguments; each later hook sees a rewrite). A fail-closed hook that
    /// did not answer denies the call.
    pub async fn before_tool_call(&self, mut request: BeforeToolCallRequest) -> ToolGate {
        let mut rewritten = None;
        for hook in self.at(HookPoint::BeforeToolCall) {
            request.turn.hook_name.clone_from(&hook.name);
            let answer = Self::call(
                hook,
                HookPoint::BeforeToolCall,
                hook.client.before_tool_call(&request),
                |d| match d {
                    ToolCallDecision::Allow => "allow",
                    ToolCallDecision::Deny { .. } => "deny",
                    ToolCallDecision::Rewrite { .. } => "rewrite",
                },
            )
            .await;
            let answer = match answer {
                Some(ToolCallDecision::Rewrite { arguments_json }) => {
                    match bad_arguments(&arguments_json) {
                        None => Some(ToolCallDecision::Rewrite { arguments_json }),
                        Some(why) => {
                            tracing::warn!(hook = %hook.name, problem = why,
                                "a BeforeToolCall hook's rewritten arguments are unusable; \
                                 treated as a failed call");
                            None
                        }
                    }
                }
                other => other,
            };
            match answer {
                Some(ToolCallDecision::Allow) => {}
                Some(ToolCallDecision::Rewrite { arguments_json }) => {
                    request.call.arguments_json.clone_from(&arguments_json);
                    rewritten = Some(arguments_json);
                }
                Some(ToolCallDecision::Deny { reason }) => {
                    return ToolGate::Denied(format!(
                        "The call of {} was denied by the server's policy and not run: {}",
                        request.call.tool_name,
                        clip_reason(&reason)
                    ));
                }
                None if hook.fail_open => {}
                None => {
                    return ToolGate::Denied(format!(
                        "The call of {} was not run: the server's policy check ({}) is \
                         unavailable.",
                        request.call.tool_name, hook.name
                    ));
                }
            }
        }
        ToolGate::Run(rewritten)
    }

    /// Runs the `AfterToolCall` hooks: the result's replacement when one
    /// redacted it (each later hook sees the replacement). A fail-closed
    /// hook that did not answer withholds the result.
    pub async fn after_tool_call(&self, mut request: AfterToolCallRequest) -> Option<String> {
        let mut replaced = None;
        for hook in self.at(HookPoint::AfterToolCall) {
            request.turn.hook_name.clone_from(&hook.name);
            let answer = Self::call(
                hook,
                HookPoint::AfterToolCall,
                hook.client.after_tool_call(&request),
                |d| match d {
                    ToolResultDecision::Keep => "keep",
                    ToolResultDecision::Redact { .. } => "redact",
                },
            )
            .await;
            match answer {
                Some(ToolResultDecision::Keep) => {}
                Some(ToolResultDecision::Redact { replacement }) => {
                    request.result.clone_from(&replacement);
                    replaced = Some(replacement);
                }
                None if hook.fail_open => {}
                None => {
                    // Nothing later hooks could release: the result stays
                    // withheld.
                    return Some(format!(
                        "The result of this call was withheld: the server's policy check ({}) \
                         is unavailable.",
                        hook.name
                    ));
                }
            }
        }
        replaced
    }
}

/// A refusal by `hook`, its reason clipped.
fn refused(hook: &Hook, reason: &str) -> HookStop {
    HookStop::Refused {
        hook: hook.name.clone(),
        reason: clip_reason(reason),
    }
}

/// `Ok` for a fail-open hook that did not answer, else the stop.
fn failed(hook: &Hook) -> Result<(), HookStop> {
    if hook.fail_open {
        Ok(())
    } else {
        Err(HookStop::Failed {
            hook: hook.name.clone(),
        })
    }
}

fn clip_reason(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        "no reason given".to_owned()
    } else {
        display_clip(reason, MAX_REASON_CHARS)
    }
}

/// Why rewritten arguments cannot be a tool's (a JSON object within
/// [`MAX_ARGUMENTS_BYTES`]).
fn bad_arguments(arguments_json: &str) -> Option<&'static str> {
    if arguments_json.len() > MAX_ARGUMENTS_BYTES {
        return Some("longer than 1 MiB");
    }
    match serde_json::from_str::<serde_json::Value>(arguments_json) {
        Ok(serde_json::Value::Object(_)) => None,
        Ok(_) => Some("not a JSON object"),
        Err(_) => Some("not JSON"),
    }
}

#[cfg(test)]
mod tests;
