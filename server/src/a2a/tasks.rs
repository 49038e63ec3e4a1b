//! Tasks: an A2A task is one agentrt turn, its context the turn's session.
//! The task id names both (`<session id>/<turn id>`; opaque to callers),
//! since the store looks turns up by session and turn.
//!
//! [`Translator`] turns a turn's events into the A2A stream: the `Task`,
//! `WORKING`, the answer's text deltas as chunks of one artifact, then the
//! terminal status with the agent's final message. [`task_of`] builds the
//! same task from what the store has (GetTask, CancelTask, SendMessage).

use std::collections::VecDeque;
use std::time::SystemTime;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_runtime::events::{EventKind, TurnEvent, TurnOutcome};
use agentrt_runtime::runtime::TurnDetail;
use agentrt_runtime::types::{ContentBlock, Role, TurnStatus};

use super::budget::{self, Clipped, Entry};

/// The one artifact of a task: the agent's answer text.
pub const ANSWER_ARTIFACT: &str = "answer";

/// The task id of turn `turn_id` of session `session_id`.
pub fn task_id(session_id: &str, turn_id: &str) -> String {
    format!("{session_id}/{turn_id}")
}

/// A protobuf timestamp.
pub fn timestamp(at: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(at)
}

/// A text part.
pub fn text_part(text: impl Into<String>) -> a2a::Part {
    a2a::Part {
        content: Some(a2a::part::Content::Text(text.into())),
        media_type: "text/plain".to_owned(),
        ..Default::default()
    }
}

/// An agent message of task `task_id` in `context_id`.
pub fn agent_message(
    message_id: String,
    context_id: &str,
    task_id: &str,
    text: impl Into<String>,
) -> a2a::Message {
    a2a::Message {
        message_id,
        context_id: context_id.to_owned(),
        task_id: task_id.to_owned(),
        role: a2a::Role::Agent as i32,
        parts: vec![text_part(text)],
        ..Default::default()
    }
}

/// An agent message whose text is `text` within [`budget::MESSAGE_BYTES`]
/// (the marker and metadata say when it was cut).
fn budgeted_message(
    message_id: String,
    context_id: &str,
    task_id: &str,
    text: Clipped,
) -> a2a::Message {
    let cut = text.cut_from();
    let mut message = agent_message(message_id, context_id, task_id, text.finish(context_id));
    message.metadata = cut.map(budget::truncated_metadata);
    message
}

/// The A2A state of a stored turn status.
pub fn state_of(status: TurnStatus) -> a2a::TaskState {
    match status {
        TurnStatus::Running => a2a::TaskState::Working,
        TurnStatus::Paused => a2a::TaskState::InputRequired,
        TurnStatus::Success => a2a::TaskState::Completed,
        TurnStatus::Canceled => a2a::TaskState::Canceled,
        TurnStatus::Error
        | TurnStatus::TimedOut
        | TurnStatus::Interrupted
        | TurnStatus::BudgetExceeded => a2a::TaskState::Failed,
    }
}

/// The A2A state of a turn's outcome.
pub fn state_of_outcome(outcome: TurnOutcome) -> a2a::TaskState {
    match outcome {
        TurnOutcome::Success => a2a::TaskState::Completed,
        TurnOutcome::Canceled => a2a::TaskState::Canceled,
        TurnOutcome::Error | TurnOutcome::TimedOut | TurnOutcome::BudgetExceeded => {
            a2a::TaskState::Failed
        }
    }
}

/// The text blocks of `content`, concatenated.
fn text_of(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The task a stored turn is: its status (with the agent's last message
/// once it has ended), the answer artifact, and at most `history_length`
/// of its most recent user and agent messages (all when `None`) — the
/// texts within their budgets ([`budget`]).
pub fn task_of(detail: &TurnDetail, history_length: Option<i32>) -> a2a::Task {
    let record = &detail.record;
    let id = task_id(&record.session_id, &record.turn_id);
    let context = &record.session_id;
    let mut entries = Vec::new();
    let mut answer = Clipped::new(budget::ARTIFACT_BYTES);
    let mut last_agent: Option<(String, Clipped)> = None;
    for m in &detail.messages {
        let role = match m.body.role {
            Role::User => a2a::Role::User,
            Role::Assistant => a2a::Role::Agent,
            Role::Tool | Role::Summary | Role::Notice => continue,
        };
        let text = text_of(&m.body.content);
        if text.is_empty() {
            continue;
        }
        if role == a2a::Role::Agent {
            answer.push(&text);
            last_agent = Some((m.body.id.clone(), Clipped::of(&text, budget::MESSAGE_BYTES)));
        }
        entries.push(Entry {
            id: m.body.id.clone(),
            role,
            text,
        });
    }
    if let Some(n) = history_length {
        let keep = usize::try_from(n.max(0)).unwrap_or(0);
        let drop = entries.len().saturating_sub(keep);
        entries.drain(..drop);
    }
    let history = history_messages(entries, context, &id);
    let state = state_of(record.status);
    let message = match (record.status, &record.error) {
        (TurnStatus::Running, _) => None,
        (TurnStatus::Paused, _) => Some(agent_message(
            format!("{}:status", record.turn_id),
            context,
            &id,
            "the task waits for its pending tool calls: answer them (GetSessionStatus lists \
             them) and it goes on",
        )),
        (
            TurnStatus::Error
            | TurnStatus::TimedOut
            | TurnStatus::Interrupted
            | TurnStatus::BudgetExceeded,
            Some(error),
        ) => Some(budgeted_message(
            format!("{}:status", record.turn_id),
            context,
            &id,
            Clipped::of(error, budget::MESSAGE_BYTES),
        )),
        (TurnStatus::Interrupted, None) => Some(agent_message(
            format!("{}:status", record.turn_id),
            context,
            &id,
            "the task was interrupted by a server restart; send the message again",
        )),
        (
            TurnStatus::Success
            | TurnStatus::Canceled
            | TurnStatus::Error
            | TurnStatus::TimedOut
            | TurnStatus::BudgetExceeded,
            _,
        ) => last_agent.map(|(mid, text)| budgeted_message(mid, context, &id, text)),
    };
    let artifacts = if answer.is_empty() {
        Vec::new()
    } else {
        let cut = answer.cut_from();
        vec![a2a::Artifact {
            artifact_id: ANSWER_ARTIFACT.to_owned(),
            name: ANSWER_ARTIFACT.to_owned(),
            parts: vec![text_part(answer.finish(context))],
            metadata: cut.map(budget::truncated_metadata),
            ..Default::default()
        }]
    };
    a2a::Task {
        id,
        context_id: context.clone(),
        status: Some(a2a::TaskStatus {
            state: state as i32,
            message,
            timestamp: Some(timestamp(record.finished_at.unwrap_or(record.started_at))),
        }),
        artifacts,
        history,
        metadata: None,
    }
}

/// A task's history entries as messages, within the history budget.
fn history_messages(entries: Vec<Entry>, context: &str, task_id: &str) -> Vec<a2a::Message> {
    budget::history(entries, context)
        .into_iter()
        .map(|(entry, cut)| a2a::Message {
            message_id: entry.id,
            context_id: context.to_owned(),
            task_id: task_id.to_owned(),
            role: entry.role as i32,
            parts: vec![text_part(entry.text)],
            metadata: cut.map(budget::truncated_metadata),
            ..Default::default()
        })
        .collect()
}

/// The task of a message waiting in its context's inbox (SUBMITTED), or
/// taken out of it before it ran (`canceled`).
pub fn queued_task(q: &agentrt_runtime::types::Queued, canceled: bool) -> a2a::Task {
    let id = task_id(&q.session_id, &q.id);
    let context = &q.session_id;
    let text = text_of(&q.input.content);
    let state = if canceled {
        a2a::TaskState::Canceled
    } else {
        a2a::TaskState::Submitted
    };
    let user = Entry {
        id: q.id.clone(),
        role: a2a::Role::User,
        text,
    };
    let history = history_messages(vec![user], context, &id);
    a2a::Task {
        id,
        context_id: context.clone(),
        status: Some(a2a::TaskStatus {
            state: state as i32,
            message: None,
            timestamp: Some(timestamp(q.enqueued_at)),
        }),
        artifacts: Vec::new(),
        history,
        metadata: None,
    }
}

/// A turn's events as A2A stream responses.
#[derive(Debug)]
pub struct Translator {
    task_id: String,
    context_id: String,
    /// The caller's message, for the first `Task`'s history (sends only).
    user: Option<a2a::Message>,
    /// The `Task` was sent (at `TurnStarted`, or up front for a
    /// subscription).
    started: bool,
    /// The WORKING status was sent.
    working: bool,
    /// A chunk of the answer was sent (the next ones append).
    chunked: bool,
    /// The answer so far, within [`budget::MESSAGE_BYTES`] (for the
    /// terminal status message).
    answer: Clipped,
    /// The stored id of the turn's latest agent message.
    agent_message_id: Option<String>,
    /// The turn's error message, for a FAILED end.
    error: Option<String>,
    /// The terminal (or `INPUT_REQUIRED`) status was sent.
    finished: bool,
    /// Resuming after the caller answered this tool call: the events up to
    /// that call were sent on an earlier stream and are not sent again.
    resume_after: Option<String>,
    /// The stream ended at a caller tool call or an approval
    /// (`INPUT_REQUIRED`).
    input_required: Option<a2a::TaskStatus>,
}

impl Translator {
    /// For the turn of a SendStreamingMessage: its first event sends the
    /// `Task` (SUBMITTED, the caller's message as its history).
    pub fn for_send(task_id: String, context_id: String, mut user: a2a::Message) -> Self {
        budget::clip_message(&mut user);
        Self::new(task_id, context_id, Some(user))
    }

    /// For a SubscribeToTask: the `Task` (WORKING) comes first, then the
    /// live turn's events from its start.
    pub fn for_subscribe(
        task_id: String,
        context_id: String,
        out: &mut VecDeque<a2a::StreamResponse>,
    ) -> Self {
        let mut this = Self::new(task_id, context_id, None);
        this.started = true;
        this.working = true;
        out.push_back(this.task(a2a::TaskState::Working, SystemTime::now()));
        this
    }

    /// For the stream that follows the caller's result of tool call
    /// `call_id`: the `Task` (WORKING) first, then the live turn's events
    /// after that call.
    pub fn for_resume(
        task_id: String,
        context_id: String,
        call_id: String,
        out: &mut VecDeque<a2a::StreamResponse>,
    ) -> Self {
        let mut this = Self::for_subscribe(task_id, context_id, out);
        this.resume_after = Some(call_id);
        this
    }

    /// The status the stream ended with when it ended at a caller tool
    /// call.
    pub fn input_required(&self) -> Option<&a2a::TaskStatus> {
        self.input_required.as_ref()
    }

    fn new(task_id: String, context_id: String, user: Option<a2a::Message>) -> Self {
        Self {
            task_id,
            context_id,
            user,
            started: false,
            working: false,
            chunked: false,
            answer: Clipped::new(budget::MESSAGE_BYTES),
            agent_message_id: None,
            error: None,
            finished: false,
            resume_after: None,
            input_required: None,
        }
    }

    /// The terminal status was sent: the stream ends.
    pub fn finished(&self) -> bool {
        self.finished
    }

    fn task(&mut self, state: a2a::TaskState, at: SystemTime) -> a2a::StreamResponse {
        let history = self.user.take().into_iter().collect();
        response(a2a::stream_response::Payload::Task(a2a::Task {
            id: self.task_id.clone(),
            context_id: self.context_id.clone(),
            status: Some(a2a::TaskStatus {
                state: state as i32,
                message: None,
                timestamp: Some(timestamp(at)),
            }),
            artifacts: Vec::new(),
            history,
            metadata: None,
        }))
    }

    fn status(
        &self,
        state: a2a::TaskState,
        message: Option<a2a::Message>,
        at: SystemTime,
    ) -> a2a::StreamResponse {
        response(a2a::stream_response::Payload::StatusUpdate(
            a2a::TaskStatusUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                status: Some(a2a::TaskStatus {
                    state: state as i32,
                    message,
                    timestamp: Some(timestamp(at)),
                }),
                metadata: None,
            },
        ))
    }

    fn chunk(&mut self, text: String, last_chunk: bool) -> a2a::StreamResponse {
        let append = self.chunked;
        self.chunked = true;
        response(a2a::stream_response::Payload::ArtifactUpdate(
            a2a::TaskArtifactUpdateEvent {
                task_id: self.task_id.clone(),
                context_id: self.context_id.clone(),
                artifact: Some(a2a::Artifact {
                    artifact_id: ANSWER_ARTIFACT.to_owned(),
                    name: ANSWER_ARTIFACT.to_owned(),
                    parts: vec![text_part(text)],
                    ..Default::default()
                }),
                append,
                last_chunk,
                metadata: None,
            },
        ))
    }

    /// The stream's end at a call that waits for the caller: an
    /// `INPUT_REQUIRED` status whose agent message carries `part`.
    fn ask_caller(
        &mut self,
        call_id: &str,
        part: a2a::Part,
        at: SystemTime,
        out: &mut VecDeque<a2a::StreamResponse>,
    ) {
        let message = a2a::Message {
            message_id: format!("{}:{call_id}", self.task_id),
            context_id: self.context_id.clone(),
            task_id: self.task_id.clone(),
            role: a2a::Role::Agent as i32,
            parts: vec![part],
            ..Default::default()
        };
        let update = self.status(a2a::TaskState::InputRequired, Some(message), at);
        if let Some(a2a::stream_response::Payload::StatusUpdate(u)) = &update.payload {
            self.input_required = u.status.clone();
        }
        out.push_back(update);
        self.finished = true;
    }

    /// Appends what `event` means on the A2A stream to `out` (at most
    /// three responses).
    pub fn on_event(&mut self, event: &TurnEvent, out: &mut VecDeque<a2a::StreamResponse>) {
        if self.finished {
            return;
        }
        if let Some(call) = &self.resume_after {
            // Already sent: only the answer so far is kept, for the final
            // message.
            match &event.kind {
                EventKind::Text(text) => {
                    self.answer.push(text);
                    self.chunked |= !text.is_empty();
                    return;
                }
                EventKind::ToolCall { call_id, .. }
                | EventKind::ApprovalRequired { call_id, .. }
                    if call_id == call =>
                {
                    self.resume_after = None;
                    return;
                }
                EventKind::TurnFinished { .. } => self.resume_after = None,
                _ => return,
            }
        }
        match &event.kind {
            // A message for a busy context waits in its inbox: the task
            // exists (SUBMITTED) until its turn starts.
            EventKind::Queued { .. } => {
                if !self.started {
                    self.started = true;
                    out.push_back(self.task(a2a::TaskState::Submitted, event.at));
                }
            }
            EventKind::TurnStarted { .. } => {
                if !self.started {
                    self.started = true;
                    out.push_back(self.task(a2a::TaskState::Submitted, event.at));
                }
                if !self.working {
                    self.working = true;
                    out.push_back(self.status(a2a::TaskState::Working, None, event.at));
                }
            }
            EventKind::Text(text) => {
                if text.is_empty() {
                    return;
                }
                // Each delta goes out at once (no delta waits for the next
                // one); the end of the answer is an empty closing chunk.
                self.answer.push(text);
                out.push_back(self.chunk(text.clone(), false));
            }
            EventKind::MessageStored { id, role, .. } => {
                if *role == Role::Assistant {
                    self.agent_message_id = Some(id.clone());
                }
            }
            EventKind::Error { message, .. } => self.error = Some(message.clone()),
            EventKind::TurnFinished { outcome, .. } => {
                if self.chunked {
                    out.push_back(self.chunk(String::new(), true));
                }
                let state = state_of_outcome(*outcome);
                let answer = std::mem::replace(&mut self.answer, Clipped::new(0));
                let text = match (state, &self.error) {
                    (a2a::TaskState::Failed, Some(error)) => {
                        Some(Clipped::of(error, budget::MESSAGE_BYTES))
                    }
                    _ => (!answer.is_empty()).then_some(answer),
                };
                let message = text.map(|text| {
                    let id = self
                        .agent_message_id
                        .clone()
                        .unwrap_or_else(|| format!("{}:status", self.task_id));
                    budgeted_message(id, &self.context_id, &self.task_id, text)
                });
                out.push_back(self.status(state, message, event.at));
                self.finished = true;
            }
            // No closing chunk: the answer goes on once the caller has sent
            // the result (a data part `{"call_id", "content"}`) or the
            // decision (`{"call_id", "approved", "reason"?}`).
            EventKind::ToolCall {
                call_id,
                name,
                arguments_json,
            } => {
                let part = super::caller_tools::call_part(call_id, name, arguments_json);
                self.ask_caller(call_id, part, event.at, out);
            }
            EventKind::ApprovalRequired {
                call_id,
                name,
                arguments_json,
            } => {
                let part = super::caller_tools::approval_part(call_id, name, arguments_json);
                self.ask_caller(call_id, part, event.at, out);
            }
            EventKind::Reasoning(_)
            | EventKind::Step { .. }
            | EventKind::Usage { .. }
            | EventKind::Heartbeat { .. }
            | EventKind::ToolUse(_)
            | EventKind::Compaction(_)
            | EventKind::Steered { .. }
            | EventKind::Image(_)
            | EventKind::File(_)
            | EventKind::References { .. }
            | EventKind::Notice { .. }
            | EventKind::ReplayGap { .. } => {}
        }
    }
}

fn response(payload: a2a::stream_response::Payload) -> a2a::StreamResponse {
    a2a::StreamResponse {
        payload: Some(payload),
    }
}

#[cfg(test)]
mod tests;
