//! The built-in [`DELEGATE`] tool: a turn hands a task to another agent,
//! which runs it as a turn of a **delegate session** — a child session of
//! the turn's own, of the same owner — and answers with its final text.
//!
//! - **Which agents.** The profile's `delegates`; the tool is offered only
//!   when it names some and the session is less than
//!   [`DelegationLimits::max_depth`](crate::agents::DelegationLimits)
//!   delegations deep. A call may name a child session of this session
//!   (`session_id`) to continue its conversation.
//! - **The child.** A new session of the delegate agent, linked by
//!   [`AgentBinding::parent_session_id`](crate::types::AgentBinding) (so
//!   `ListSessions` finds the children of a session), titled after the
//!   task. Its input is the task, whose input actor is the parent session
//!   ([`ActorKind::Delegate`]); it runs on its own agent's prompt, model
//!   and tools.
//! - **What it inherits.** The owner (and with it the owner's quotas and
//!   daily budget); the parent turn's remaining time, as a deadline ending a
//!   margin before the parent's; what is left of the parent session's
//!   budget, as the child session's budget; and the parent's end —
//!   stopping the parent (or its deadline, or the server's shutdown) ends
//!   the child with the same reason.
//! - **What the parent sees.** The child's progress as `tool_use` RUNNING
//!   events of the call with a short `detail` (its steps, its tool calls,
//!   how much it wrote), and the child's final answer — or how its turn
//!   ended — as the call's result, with the child's session id to continue
//!   it by. What the child used and cost is added to the parent turn's
//!   [`TurnRecord::delegated`](crate::types::TurnRecord), hence to the
//!   parent session's spending.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agents::DELEGATE;
use crate::error::RuntimeError;
use crate::events::{EventKind, StepKind, ToolStatus, TurnOutcome};
use crate::model::ToolSpec;
use crate::runtime::slots::LiveTurn;
use crate::runtime::{ChatInput, Inner, OnBusy, OnDisconnect, Runtime, TurnStream};
use crate::toolbox::ToolOutcome;
use crate::types::{
    ActorKind, AgentBinding, Budget, ContentBlock, InputActor, NewSession, Principal, Session,
    SessionUpdate, Spent,
};

/// Longest answer of a delegate kept as the call's result, in bytes (the
/// rest is cut, saying so).
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Longest title of a delegate session (its task's first line), in chars.
const TITLE_CHARS: usize = 80;
/// A progress update on the child's text every this many bytes written.
const TEXT_PROGRESS_BYTES: usize = 400;
/// Progress updates waiting for the parent's stream; more are dropped
/// (the next one says as much).
pub(crate) const PROGRESS_BUFFER: usize = 32;

/// A progress line of the call at this index of the step.
pub(crate) type Progress = (usize, String);

/// The tool offered for delegating to `delegates`.
pub(crate) fn spec(delegates: &[String]) -> ToolSpec {
    ToolSpec {
        name: DELEGATE.to_owned(),
        description: format!(
            "Hands a task to another agent, which works on it in its own conversation and \
             answers with its result. Agents you may delegate to: {}. Describe the task \
             completely: the agent sees only what you write. The result ends with the \
             delegate conversation's session_id: pass it to continue that conversation \
             (the agent remembers it) instead of starting a new one.",
            delegates.join(", ")
        ),
        parameters: json!({
            "type": "object",
            "properties": {
                "agent": {"type": "string", "enum": delegates, "description": "the agent to delegate to"},
                "task": {"type": "string", "description": "what the agent should do, completely described"},
                "session_id": {"type": "string", "description": "a delegate conversation to continue (from an earlier result); omit to start a new one"}
            },
            "required": ["task"]
        }),
    }
}

/// The agents the offered `spec` delegates to (the turn's snapshot of its
/// profile's `delegates`).
pub(crate) fn delegates_of(spec: &ToolSpec) -> Vec<String> {
    spec.parameters
        .pointer("/properties/agent/enum")
        .and_then(Value::as_array)
        .map(|agents| {
            agents
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// One delegate call of a parent turn, ready to run.
pub(crate) struct DelegateCall {
    pub(crate) inner: Arc<Inner>,
    /// The parent session (its stored key).
    pub(crate) parent: Session,
    /// The parent's live turn: its end ends the child.
    pub(crate) parent_live: Arc<LiveTurn>,
    /// The agents the parent may delegate to.
    pub(crate) delegates: Vec<String>,
    /// The parent turn's time left, when it has a deadline.
    pub(crate) time_left: Option<Duration>,
    /// What is left of the parent session's budget.
    pub(crate) budget_left: Budget,
    /// The call's index in its step, and where its progress goes.
    pub(crate) index: usize,
    pub(crate) progress: mpsc::Sender<Progress>,
    /// What the parent turn's delegates used, summed.
    pub(crate) spent: Arc<Mutex<Spent>>,
}

/// A child turn being followed: ends it with the parent's reason when the
/// parent stops following before its end.
struct Child {
    stream: TurnStream,
    live: Option<Arc<LiveTurn>>,
    parent_live: Arc<LiveTurn>,
    finished: bool,
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // The parent was stopped (or shut down, or deleted): the child ends
        // for the same reason. Otherwise (the parent's deadline) the
        // stream's drop ends it as a caller gone past its deadline, which a
        // turn reports as timed out.
        if let (Some(live), Some(reason)) = (&self.live, self.parent_live.cancel_reason()) {
            live.cancel(reason);
        }
    }
}

impl DelegateCall {
    /// Runs the call; dropping the future ends the child turn.
    pub(crate) async fn run(self, arguments_json: &str) -> ToolOutcome {
        match self.delegate(arguments_json).await {
            Ok(outcome) => outcome,
            Err(problem) => ToolOutcome::error(problem),
        }
    }

    async fn delegate(&self, arguments_json: &str) -> Result<ToolOutcome, String> {
        let args: Value = serde_json::from_str(arguments_json).unwrap_or(Value::Null);
        let text = |key: &str| {
            args.get(key)
                .and_then(Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        let task = text("task").ok_or("describe the task: {\"task\": \"...\"}")?;
        if task.len() > self.inner.config.max_input_bytes {
            return Err(format!(
                "the task is {} bytes; the limit is {}",
                task.len(),
                self.inner.config.max_input_bytes
            ));
        }
        if self.time_left.is_some_and(|t| t.is_zero()) {
            return Err("the turn has no time left to delegate".to_owned());
        }
        if let Some((limit, _)) = self.budget_left.reached(&Spent::default()) {
            return Err(format!(
                "the session's budget ({limit:?}) is spent: nothing is left to delegate with"
            ));
        }
        let runtime = Runtime {
            inner: Arc::clone(&self.inner),
        };
        let who = Principal {
            user_id: self.parent.owner.clone(),
            admin: false,
            restricted: false,
            actor: InputActor::new(ActorKind::Delegate, super::keys::client_id(&self.parent.id)),
        };
        let child = match text("session_id") {
            Some(id) => self.continued(&runtime, &who, &id, text("agent")).await?,
            None => {
                let agent = text("agent").ok_or_else(|| {
                    format!(
                        "name the agent to delegate to: one of {}",
                        self.delegates.join(", ")
                    )
                })?;
                self.created(&runtime, &who, agent, &task).await?
            }
        };
        let input = ChatInput {
            session_id: child.id.clone(),
            content: vec![ContentBlock::text(task)],
            // Ends a margin before the parent's deadline, so the parent
            // stores the child's end before its own.
            transport_deadline: self.time_left,
            on_disconnect: OnDisconnect::Cancel,
            on_busy: OnBusy::Reject,
            ..ChatInput::default()
        };
        let stream = runtime.chat(&who, input).await.map_err(|e| match e {
            RuntimeError::SessionBusy { .. } => format!(
                "delegate session {} is running another turn; wait for it or start a new one",
                child.id
            ),
            other => format!("the delegate could not start: {}", safe(&other)),
        })?;
        let live = stream.live();
        let child_run = Child {
            stream,
            live,
            parent_live: Arc::clone(&self.parent_live),
            finished: false,
        };
        Ok(self.follow(child_run, &child).await)
    }

    /// A new delegate session of `agent` for `task`.
    async fn created(
        &self,
        runtime: &Runtime,
        who: &Principal,
        agent: String,
        task: &str,
    ) -> Result<Session, String> {
        if !self.delegates.contains(&agent) {
            return Err(format!(
                "agent {:?} is not one this agent may delegate to: {}",
                crate::error::display_clip(&agent, 64),
                self.delegates.join(", ")
            ));
        }
        let defined = (self.inner.store.agents().get_agent(&agent, None).await)
            .map_err(|e| format!("the agent could not be read: {}", safe(&e.into())))?;
        if defined.is_none() {
            return Err(format!(
                "agent {agent:?} is not defined on this server; ask its operator"
            ));
        }
        let new = NewSession {
            owner: who.user_id.clone(),
            agent_id: agent,
            title: title(task),
            budget: self.budget_left,
            agent: AgentBinding {
                parent_session_id: self.parent.id.clone(),
                depth: self.parent.agent.depth.saturating_add(1),
                ..AgentBinding::default()
            },
            ..NewSession::default()
        };
        let child = runtime
            .create_session(who, new)
            .await
            .map_err(|e| format!("the delegate session could not be created: {}", safe(&e)))?;
        // `create_session` answers with the client's id; generated ids are
        // their own stored keys.
        Ok(child)
    }

    /// The delegate session `id` of this session, its budget brought to
    /// what the parent has left.
    async fn continued(
        &self,
        runtime: &Runtime,
        who: &Principal,
        id: &str,
        agent: Option<String>,
    ) -> Result<Session, String> {
        let not_ours = || {
            format!(
                "session {:?} is not a delegate session of this conversation",
                crate::error::display_clip(id, 64)
            )
        };
        crate::limits::validate_session_id("session_id", id).map_err(|_| not_ours())?;
        let child = match runtime.owned_session(who, id).await {
            Ok(child) => child,
            Err(RuntimeError::SessionNotFound) => return Err(not_ours()),
            Err(e) => return Err(format!("the session could not be read: {}", safe(&e))),
        };
        if child.agent.parent_session_id != self.parent.id {
            return Err(not_ours());
        }
        if agent.is_some_and(|a| a != child.agent_id) {
            return Err(format!(
                "session {id:?} is a conversation with agent {:?}; name that agent or none",
                child.agent_id
            ));
        }
        if !self.delegates.contains(&child.agent_id) {
            return Err(format!(
                "agent {:?} is no longer one this agent may delegate to",
                child.agent_id
            ));
        }
        if self.budget_left == Budget::NONE {
            return Ok(child);
        }
        let budget = Budget {
            max_tokens: (self.budget_left.max_tokens)
                .map(|left| left.saturating_add(child.spent.tokens())),
            max_cost_nano_usd: (self.budget_left.max_cost_nano_usd)
                .map(|left| left.saturating_add(child.spent.cost_nano_usd)),
        };
        let update = SessionUpdate {
            budget: Some(budget),
            ..SessionUpdate::default()
        };
        runtime
            .update_session(who, &child.id, update)
            .await
            .map_err(|e| format!("the delegate session could not be updated: {}", safe(&e)))
    }

    /// Follows the child turn to its end, relaying its progress; its answer
    /// (or how it ended) is the result.
    async fn follow(&self, mut child: Child, session: &Session) -> ToolOutcome {
        let agent = &session.agent_id;
        let mut model = String::new();
        let mut answer = String::new();
        let mut cut = false;
        let mut reported = 0;
        let mut error = String::new();
        self.report(format!("{agent}: started in session {}", session.id));
        while let Some(event) = child.stream.next().await {
            match &event.kind {
                EventKind::TurnStarted { model: m, .. } => model.clone_from(m),
                EventKind::Step {
                    kind: StepKind::Start,
                    index,
                } => {
                    answer.clear();
                    cut = false;
                    reported = 0;
                    self.report(format!("{agent}: step {index}"));
                }
                EventKind::Text(delta) => {
                    if answer.len() + delta.len() > MAX_ANSWER_BYTES {
                        cut = true;
                    } else {
                        answer.push_str(delta);
                    }
                    if answer.len() >= reported + TEXT_PROGRESS_BYTES {
                        reported = answer.len();
                        self.report(format!("{agent}: writing ({} bytes)", answer.len()));
                    }
                }
                EventKind::ToolUse(t) => {
                    let what = match t.status {
                        ToolStatus::Running if t.detail.is_empty() => "calling",
                        ToolStatus::Running => "running",
                        ToolStatus::Done => "done with",
                        ToolStatus::Error => "failed calling",
                        ToolStatus::Cancelled | ToolStatus::OutcomeUnknown => "interrupted",
                    };
                    let detail = if t.detail.is_empty() || t.status != ToolStatus::Running {
                        String::new()
                    } else {
                        format!(": {}", t.detail)
                    };
                    self.report(format!("{agent}: {what} {}{detail}", t.tool_name));
                }
                EventKind::ApprovalRequired { name, .. } => self.report(format!(
                    "{agent}: waits for the approval of {name} in session {}",
                    session.id
                )),
                EventKind::Error { message, .. } => error.clone_from(message),
                EventKind::TurnFinished { outcome, usage, .. } => {
                    child.finished = true;
                    let cost = self.inner.config.prices.cost_nano_usd(&model, usage);
                    {
                        let mut spent = crate::runtime::lock(&self.spent);
                        *spent = spent.plus(usage, cost);
                    }
                    return result(*outcome, &answer, cut, &error, &session.id);
                }
                EventKind::Reasoning(_)
                | EventKind::Step { .. }
                | EventKind::MessageStored { .. }
                | EventKind::Usage { .. }
                | EventKind::Heartbeat { .. }
                | EventKind::ToolCall { .. }
                | EventKind::Compaction(_)
                | EventKind::Image(_)
                | EventKind::File(_)
                | EventKind::References { .. }
                | EventKind::Notice { .. }
                | EventKind::ReplayGap { .. }
                | EventKind::Queued { .. }
                | EventKind::Steered { .. } => {}
            }
        }
        child.finished = true;
        ToolOutcome::error(format!(
            "the delegate's turn ended without an outcome (session_id: {})",
            session.id
        ))
    }

    /// Sends a progress line; dropped when the parent's stream is behind.
    fn report(&self, line: String) {
        let _ = self.progress.try_send((self.index, line));
    }
}

/// The call's result for a child turn that ended as `outcome`.
fn result(
    outcome: TurnOutcome,
    answer: &str,
    cut: bool,
    error: &str,
    session_id: &str,
) -> ToolOutcome {
    let cut_note = if cut {
        format!("\n[the answer was cut at {MAX_ANSWER_BYTES} bytes]")
    } else {
        String::new()
    };
    let continue_note = format!("\n\n(session_id: {session_id})");
    if outcome == TurnOutcome::Success {
        return ToolOutcome::ok(format!("{answer}{cut_note}{continue_note}"));
    }
    let how = match outcome {
        TurnOutcome::Success => "successfully",
        TurnOutcome::Canceled => "cancelled",
        TurnOutcome::TimedOut => "at its time limit",
        TurnOutcome::Error => "in an error",
        TurnOutcome::BudgetExceeded => "with its budget spent",
    };
    let mut text = format!("The delegate's turn ended {how} without a final answer.");
    if !error.is_empty() {
        text.push_str(&format!(" The error: {error}."));
    }
    if !answer.trim().is_empty() {
        text.push_str(&format!(" What it wrote so far:\n{answer}{cut_note}"));
    }
    text.push_str(&continue_note);
    ToolOutcome::error(text)
}

/// What a failure may tell the model: a store's failure says nothing of
/// the store.
fn safe(e: &RuntimeError) -> String {
    match e {
        RuntimeError::Store(_) => "the store is unavailable; try again later".to_owned(),
        other => other.to_string(),
    }
}

/// A delegate session's title: its task's first line, clipped.
fn title(task: &str) -> String {
    let line = task.lines().next().unwrap_or_default().trim();
    let mut title: String = line.chars().take(TITLE_CHARS).collect();
    if line.chars().count() > TITLE_CHARS {
        title.push('…');
    }
    title
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offered_spec_carries_its_delegates() {
        let agents = vec!["researcher".to_owned(), "writer".to_owned()];
        assert_eq!(delegates_of(&spec(&agents)), agents);
    }

    #[test]
    fn titles_are_the_first_line_clipped() {
        assert_eq!(title("Find X\nthen Y"), "Find X");
        assert_eq!(title(&"a".repeat(100)).chars().count(), TITLE_CHARS + 1);
    }

    #[test]
    fn a_failed_child_says_how_and_how_to_continue() {
        let r = result(TurnOutcome::TimedOut, "half", false, "", "s1");
        assert!(r.is_error);
        assert!(r.content.contains("time limit") && r.content.contains("half"));
        assert!(r.content.ends_with("(session_id: s1)"));
        let ok = result(TurnOutcome::Success, "done", false, "", "s1");
        assert!(!ok.is_error && ok.content.starts_with("done"));
    }
}
