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

/// The one artifact of a task: the agent's answer text.
pub const ANSWER_ARTIFACT: &str = "answer";

/// The task id of turn `turn_id` of session `session_id`.
pub fn task_id(session_id: &str, turn_id: &str) -> String {
    format!("{session_id}/{turn_id}")
}

/// The (session id, turn id) a task id names; `None` for an id this
/// server never returned.
pub fn parse_task_id(id: &str) -> Option<(&str, &str)> {
    let (session, turn) = id.rsplit_once('/')?;
    (!session.is_empty() && !turn.is_empty() && !session.contains('/')).then_some((session, turn))
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

/// The A2A state of a stored turn status.
pub fn state_of(status: TurnStatus) -> a2a::TaskState {
    match status {
        TurnStatus::Running => a2a::TaskState::Working,
        TurnStatus::Success => a2a::TaskState::Completed,
        TurnStatus::Canceled => a2a::TaskState::Canceled,
        TurnStatus::Error | TurnStatus::TimedOut | TurnStatus::Interrupted => {
            a2a::TaskState::Failed
        }
    }
}

/// The A2A state of a turn's outcome.
pub fn state_of_outcome(outcome: TurnOutcome) -> a2a::TaskState {
    match outcome {
        TurnOutcome::Success => a2a::TaskState::Completed,
        TurnOutcome::Canceled => a2a::TaskState::Canceled,
        TurnOutcome::Error | TurnOutcome::TimedOut => a2a::TaskState::Failed,
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
/// of its most recent user and agent messages (all when `None`).
pub fn task_of(detail: &TurnDetail, history_length: Option<i32>) -> a2a::Task {
    let record = &detail.record;
    let id = task_id(&record.session_id, &record.turn_id);
    let context = &record.session_id;
    let mut history = Vec::new();
    let mut answer = String::new();
    let mut last_agent: Option<(String, String)> = None;
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
            answer.push_str(&text);
            last_agent = Some((m.body.id.clone(), text.clone()));
        }
        history.push(a2a::Message {
            message_id: m.body.id.clone(),
            context_id: context.clone(),
            task_id: id.clone(),
            role: role as i32,
            parts: vec![text_part(text)],
            ..Default::default()
        });
    }
    if let Some(n) = history_length {
        let keep = usize::try_from(n.max(0)).unwrap_or(0);
        let drop = history.len().saturating_sub(keep);
        history.drain(..drop);
    }
    let state = state_of(record.status);
    let message = match (record.status, &record.error) {
        (TurnStatus::Running, _) => None,
        (TurnStatus::Error | TurnStatus::TimedOut | TurnStatus::Interrupted, Some(error)) => {
            Some(agent_message(
                format!("{}:status", record.turn_id),
                context,
                &id,
                error.clone(),
            ))
        }
        (TurnStatus::Interrupted, None) => Some(agent_message(
            format!("{}:status", record.turn_id),
            context,
            &id,
            "the task was interrupted by a server restart; send the message again",
        )),
        (
            TurnStatus::Success | TurnStatus::Canceled | TurnStatus::Error | TurnStatus::TimedOut,
            _,
        ) => last_agent.map(|(mid, text)| agent_message(mid, context, &id, text)),
    };
    let artifacts = if answer.is_empty() {
        Vec::new()
    } else {
        vec![a2a::Artifact {
            artifact_id: ANSWER_ARTIFACT.to_owned(),
            name: ANSWER_ARTIFACT.to_owned(),
            parts: vec![text_part(answer)],
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
    /// A chunk of the answer was sent (the next ones append).
    chunked: bool,
    /// The whole answer so far.
    answer: String,
    /// The stored id of the turn's latest agent message.
    agent_message_id: Option<String>,
    /// The turn's error message, for a FAILED end.
    error: Option<String>,
    /// The terminal (or `INPUT_REQUIRED`) status was sent.
    finished: bool,
    /// Resuming after the caller answered this tool call: the events up to
    /// that call were sent on an earlier stream and are not sent again.
    resume_after: Option<String>,
    /// The stream ended at a caller tool call (`INPUT_REQUIRED`).
    input_required: Option<a2a::TaskStatus>,
}

impl Translator {
    /// For the turn of a SendStreamingMessage: its first event sends the
    /// `Task` (SUBMITTED, the caller's message as its history).
    pub fn for_send(task_id: String, context_id: String, user: a2a::Message) -> Self {
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
            chunked: false,
            answer: String::new(),
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
                    self.answer.push_str(text);
                    self.chunked |= !text.is_empty();
                    return;
                }
                EventKind::ToolCall { call_id, .. } if call_id == call => {
                    self.resume_after = None;
                    return;
                }
                EventKind::TurnFinished { .. } => self.resume_after = None,
                _ => return,
            }
        }
        match &event.kind {
            EventKind::TurnStarted { .. } => {
                if !self.started {
                    self.started = true;
                    out.push_back(self.task(a2a::TaskState::Submitted, event.at));
                    out.push_back(self.status(a2a::TaskState::Working, None, event.at));
                }
            }
            EventKind::Text(text) => {
                if text.is_empty() {
                    return;
                }
                // Each delta goes out at once (no delta waits for the next
                // one); the end of the answer is an empty closing chunk.
                self.answer.push_str(text);
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
                let text = match (state, &self.error) {
                    (a2a::TaskState::Failed, Some(error)) => Some(error.clone()),
                    _ => (!self.answer.is_empty()).then(|| self.answer.clone()),
                };
                let message = text.map(|text| {
                    let id = self
                        .agent_message_id
                        .clone()
                        .unwrap_or_else(|| format!("{}:status", self.task_id));
                    agent_message(id, &self.context_id, &self.task_id, text)
                });
                out.push_back(self.status(state, message, event.at));
                self.finished = true;
            }
            EventKind::ToolCall {
                call_id,
                name,
                arguments_json,
            } => {
                // No closing chunk: the answer goes on once the caller has
                // sent the result.
                let message = a2a::Message {
                    message_id: format!("{}:{call_id}", self.task_id),
                    context_id: self.context_id.clone(),
                    task_id: self.task_id.clone(),
                    role: a2a::Role::Agent as i32,
                    parts: vec![super::tools::call_part(call_id, name, arguments_json)],
                    ..Default::default()
                };
                let update = self.status(a2a::TaskState::InputRequired, Some(message), event.at);
                if let Some(a2a::stream_response::Payload::StatusUpdate(u)) = &update.payload {
                    self.input_required = u.status.clone();
                }
                out.push_back(update);
                self.finished = true;
            }
            EventKind::Reasoning(_)
            | EventKind::Step { .. }
            | EventKind::Usage { .. }
            | EventKind::Heartbeat { .. }
            | EventKind::ToolUse(_)
            | EventKind::Compaction(_)
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
mod tests {
    use super::*;
    use agentrt_runtime::types::Usage;
    use std::time::Duration;

    fn ev(kind: EventKind) -> TurnEvent {
        TurnEvent {
            seq: 0,
            at: SystemTime::now(),
            kind,
        }
    }

    #[test]
    fn task_ids_round_trip_and_foreign_ids_are_refused() {
        let id = task_id("s-1", "0190-abc");
        assert_eq!(parse_task_id(&id), Some(("s-1", "0190-abc")));
        for bad in ["", "nope", "/t", "s/", "a/b/c"] {
            assert_eq!(parse_task_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_turn_streams_task_working_chunks_and_the_terminal_status() {
        let mut out = VecDeque::new();
        let user = a2a::Message::default();
        let mut t = Translator::for_send("s/t".into(), "s".into(), user);
        t.on_event(
            &ev(EventKind::TurnStarted {
                model: "m".into(),
                thinking: None,
                user_message_seq: 1,
                system_overridden: false,
            }),
            &mut out,
        );
        for delta in ["echo", ": ", "hi"] {
            t.on_event(&ev(EventKind::Text(delta.into())), &mut out);
        }
        t.on_event(
            &ev(EventKind::TurnFinished {
                outcome: TurnOutcome::Success,
                cancel_reason: None,
                usage: Usage::default(),
                duration: Duration::ZERO,
            }),
            &mut out,
        );
        assert!(t.finished());
        let kinds: Vec<_> = out.iter().map(|r| r.payload.clone().unwrap()).collect();
        assert!(
            matches!(&kinds[0], a2a::stream_response::Payload::Task(t) if t.status.as_ref().unwrap().state == a2a::TaskState::Submitted as i32 && t.history.len() == 1)
        );
        assert!(
            matches!(&kinds[1], a2a::stream_response::Payload::StatusUpdate(s) if s.status.as_ref().unwrap().state == a2a::TaskState::Working as i32)
        );
        let chunks: Vec<(String, bool, bool)> = kinds[2..6]
            .iter()
            .map(|k| match k {
                a2a::stream_response::Payload::ArtifactUpdate(a) => {
                    let part = &a.artifact.as_ref().unwrap().parts[0];
                    let Some(a2a::part::Content::Text(text)) = &part.content else {
                        panic!("a text part")
                    };
                    (text.clone(), a.append, a.last_chunk)
                }
                other => panic!("an artifact update, got {other:?}"),
            })
            .collect();
        assert_eq!(
            chunks,
            [
                ("echo".to_owned(), false, false),
                (": ".to_owned(), true, false),
                ("hi".to_owned(), true, false),
                (String::new(), true, true)
            ]
        );
        let a2a::stream_response::Payload::StatusUpdate(last) = &kinds[6] else {
            panic!("the terminal status")
        };
        let status = last.status.as_ref().unwrap();
        assert_eq!(status.state, a2a::TaskState::Completed as i32);
        let text = &status.message.as_ref().unwrap().parts[0].content;
        assert_eq!(text, &Some(a2a::part::Content::Text("echo: hi".into())));
        assert_eq!(out.len(), 7);
    }

    #[test]
    fn a_failed_turn_ends_failed_with_its_error() {
        let mut out = VecDeque::new();
        let mut t = Translator::for_subscribe("s/t".into(), "s".into(), &mut out);
        t.on_event(
            &ev(EventKind::Error {
                code: agentrt_runtime::events::ErrorCode::Unavailable,
                message: "upstream said no".into(),
            }),
            &mut out,
        );
        t.on_event(
            &ev(EventKind::TurnFinished {
                outcome: TurnOutcome::Error,
                cancel_reason: None,
                usage: Usage::default(),
                duration: Duration::ZERO,
            }),
            &mut out,
        );
        assert_eq!(out.len(), 2);
        let Some(a2a::stream_response::Payload::StatusUpdate(s)) = &out[1].payload else {
            panic!("a status update")
        };
        let status = s.status.as_ref().unwrap();
        assert_eq!(status.state, a2a::TaskState::Failed as i32);
        assert_eq!(
            status.message.as_ref().unwrap().parts[0].content,
            Some(a2a::part::Content::Text("upstream said no".into()))
        );
    }
}
