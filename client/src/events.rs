//! Typed turn events and the stream that yields them.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt as _};

use crate::Error;
use crate::proto;

/// What happened in a turn (the `kind` of `agentrt.v1.ChatEvent`).
#[derive(Debug, Clone, PartialEq)]
pub enum ChatEvent {
    /// First event: effective model and options, the stored user message.
    TurnStarted(proto::TurnStarted),
    /// Assistant text delta.
    Text(String),
    /// Reasoning delta.
    Reasoning(String),
    /// Model step boundary.
    Step {
        /// START or FINISH.
        kind: proto::StepKind,
        /// 1-based step index.
        index: u32,
    },
    /// A message was durably stored.
    MessageStored {
        /// Its per-session seq.
        seq: u64,
        /// Its id.
        id: String,
        /// Its role.
        role: proto::Role,
    },
    /// Usage of one model step.
    Usage {
        /// Token counts.
        usage: proto::Usage,
        /// The model.
        model: String,
    },
    /// The turn failed.
    Error {
        /// Status code of the cause.
        code: proto::ErrorCode,
        /// Message.
        message: String,
    },
    /// Keep-alive on a quiet stream, with what the turn is doing.
    Heartbeat {
        /// e.g. "model" or "tool".
        phase: String,
        /// The tool waited for, in phase "tool".
        tool_name: String,
    },
    /// Tool lifecycle (RUNNING, then DONE or ERROR).
    ToolUse(proto::ToolUse),
    /// A caller-executed tool call: answer it with
    /// [`crate::Client::submit_tool_result`].
    ToolCall {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// Compaction of the context before the first model step (STARTED,
    /// then COMPLETED or FAILED).
    Compaction(proto::Compaction),
    /// (Subscribe) events were skipped; the next one has this seq.
    ReplayGap {
        /// Seq of the next event delivered.
        first_available_seq: u64,
        /// The watcher fell behind.
        lagged: bool,
    },
    /// Last event.
    TurnFinished {
        /// How it ended.
        outcome: proto::TurnOutcome,
        /// Why, when cancelled.
        cancel_reason: proto::CancelReason,
        /// Total usage.
        usage: proto::Usage,
        /// Wall time.
        duration: Duration,
    },
}

/// One event with its envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Session id.
    pub session_id: String,
    /// Turn id.
    pub turn_id: String,
    /// Per-turn sequence number (1, 2, ...).
    pub seq: u64,
    /// Server time of the event.
    pub at: Option<SystemTime>,
    /// What happened.
    pub kind: ChatEvent,
}

fn enum_or<E: TryFrom<i32> + Default>(v: i32) -> E {
    E::try_from(v).unwrap_or_default()
}

impl TryFrom<proto::ChatEvent> for Event {
    type Error = Error;

    fn try_from(e: proto::ChatEvent) -> Result<Self, Error> {
        use proto::chat_event::Kind;
        let kind = match e.kind {
            Some(Kind::TurnStarted(t)) => ChatEvent::TurnStarted(t),
            Some(Kind::Text(t)) => ChatEvent::Text(t.text),
            Some(Kind::Reasoning(t)) => ChatEvent::Reasoning(t.text),
            Some(Kind::Step(s)) => ChatEvent::Step {
                kind: enum_or(s.kind),
                index: s.index,
            },
            Some(Kind::MessageStored(m)) => ChatEvent::MessageStored {
                seq: m.message_seq,
                id: m.message_id,
                role: enum_or(m.role),
            },
            Some(Kind::Usage(u)) => ChatEvent::Usage {
                usage: u.usage.unwrap_or_default(),
                model: u.model,
            },
            Some(Kind::Error(err)) => ChatEvent::Error {
                code: enum_or(err.code),
                message: err.message,
            },
            Some(Kind::Heartbeat(h)) => ChatEvent::Heartbeat {
                phase: h.phase,
                tool_name: h.tool_name,
            },
            Some(Kind::ToolUse(t)) => ChatEvent::ToolUse(t),
            Some(Kind::ToolCall(c)) => ChatEvent::ToolCall {
                call_id: c.call_id,
                name: c.name,
                arguments_json: c.arguments_json,
            },
            Some(Kind::Compaction(c)) => ChatEvent::Compaction(c),
            Some(Kind::ReplayGap(g)) => ChatEvent::ReplayGap {
                first_available_seq: g.first_available_seq,
                lagged: g.lagged,
            },
            Some(Kind::TurnFinished(f)) => ChatEvent::TurnFinished {
                outcome: enum_or(f.outcome),
                cancel_reason: enum_or(f.cancel_reason),
                usage: f.usage.unwrap_or_default(),
                duration: f
                    .duration
                    .and_then(|d| Duration::try_from(d).ok())
                    .unwrap_or_default(),
            },
            None => {
                return Err(Error::Protocol(format!(
                    "event {} of turn {} has no kind (a newer server?)",
                    e.seq, e.turn_id
                )));
            }
        };
        let at = e.at.and_then(|t| {
            let secs = u64::try_from(t.seconds).ok()?;
            let nanos = u32::try_from(t.nanos).ok()?;
            Some(UNIX_EPOCH + Duration::new(secs, nanos))
        });
        Ok(Self {
            session_id: e.session_id,
            turn_id: e.turn_id,
            seq: e.seq,
            at,
            kind,
        })
    }
}

/// The events of one turn. Ends after `TurnFinished`; when the outcome is
/// not SUCCESS the trailing status follows as an `Err(Error::Status)`.
pub struct EventStream {
    inner: tonic::Streaming<proto::ChatEvent>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl EventStream {
    pub(crate) fn new(inner: tonic::Streaming<proto::ChatEvent>) -> Self {
        Self { inner }
    }

    /// Reads the whole turn.
    pub async fn finish(mut self) -> Result<TurnSummary, Error> {
        let mut summary = TurnSummary::default();
        while let Some(item) = self.next().await {
            match item {
                Ok(event) => {
                    match &event.kind {
                        ChatEvent::Text(t) => summary.text.push_str(t),
                        ChatEvent::Reasoning(t) => summary.reasoning.push_str(t),
                        ChatEvent::TurnFinished { outcome, .. } => summary.outcome = Some(*outcome),
                        _ => {}
                    }
                    summary.events.push(event);
                }
                Err(Error::Status(status)) => summary.status = Some(status),
                Err(other) => return Err(other),
            }
        }
        Ok(summary)
    }
}

impl Stream for EventStream {
    type Item = Result<Event, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(e))) => Poll::Ready(Some(Event::try_from(e))),
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(Error::Status(status)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A whole turn, read by [`EventStream::finish`].
#[derive(Debug, Default)]
pub struct TurnSummary {
    /// Every event, in order.
    pub events: Vec<Event>,
    /// The concatenated text deltas.
    pub text: String,
    /// The concatenated reasoning deltas.
    pub reasoning: String,
    /// The outcome of `TurnFinished`, if it arrived.
    pub outcome: Option<proto::TurnOutcome>,
    /// The trailing status, when not OK.
    pub status: Option<tonic::Status>,
}
