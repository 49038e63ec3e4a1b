//! The typed events of a turn, as the runtime emits them. The gRPC adapter
//! converts them one to one into `agentrt.v1.ChatEvent`.

use std::time::{Duration, SystemTime};

use crate::types::{CancelReason, MediaRef, Role, ThinkingLevel, Usage};

/// Status codes carried by turn errors (named like `google.rpc.Code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// Cancelled by a caller.
    Cancelled,
    /// Bad input.
    InvalidArgument,
    /// A deadline passed.
    DeadlineExceeded,
    /// Quota or rate limits.
    ResourceExhausted,
    /// State does not allow the operation.
    FailedPrecondition,
    /// A bug or an unexpected failure.
    Internal,
    /// A dependency (the model, the store) is unavailable.
    Unavailable,
    /// Credentials were rejected (by the model upstream).
    PermissionDenied,
}

/// Outcome of a finished turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TurnOutcome {
    /// The model finished.
    Success,
    /// The turn failed; an [`EventKind::Error`] precedes the end.
    Error,
    /// Stopped, disconnected, shut down or deleted.
    Canceled,
    /// The turn deadline passed.
    TimedOut,
    /// The session's budget was reached; the turn ended after a step.
    BudgetExceeded,
}

/// What a live turn is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Admitted, loading context.
    Starting,
    /// Waiting for or streaming from the model.
    Model,
    /// Waiting for tool results.
    Tool,
    /// Writing to the store.
    Storing,
    /// Recording the outcome.
    Finishing,
}

impl Phase {
    /// Lowercase name (`"model"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Starting => "starting",
            Self::Model => "model",
            Self::Tool => "tool",
            Self::Storing => "storing",
            Self::Finishing => "finishing",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Starting,
            1 => Self::Model,
            2 => Self::Tool,
            3 => Self::Storing,
            _ => Self::Finishing,
        }
    }
}

/// Where a tool call is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolStatus {
    /// Started.
    Running,
    /// Finished; result stored.
    Done,
    /// Failed; error result stored.
    Error,
    /// The turn ended before the call started; its stored result says so.
    Cancelled,
    /// The turn ended while the call ran (or while the caller had it): it
    /// may have had effects; its stored result says so.
    OutcomeUnknown,
}

/// One `tool_use` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolUse {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub tool_name: String,
    /// Lifecycle state.
    pub status: ToolStatus,
    /// Short summary of the arguments.
    pub input_summary: String,
    /// Arguments as a JSON document.
    pub arguments_json: String,
    /// Short summary of the result (Done/Error).
    pub detail: String,
    /// The result text (Done/Error).
    pub content: String,
    /// What the result carried or cited (Done/Error).
    pub references: Vec<Reference>,
}

/// An item a tool's result carried or cited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reference {
    /// An image or file stored in the session.
    Blob {
        /// The blob.
        blob: MediaRef,
        /// Why it is referenced (`"result"`).
        intent: &'static str,
    },
    /// A resource the tool linked.
    Uri {
        /// Where it is.
        uri: String,
        /// A name or title.
        title: String,
        /// A short description.
        preview: String,
        /// Its media type, when the tool said.
        mime_type: String,
    },
}

impl Reference {
    fn approx_size(&self) -> usize {
        match self {
            Self::Blob { blob, .. } => blob.approx_bytes(),
            Self::Uri {
                uri,
                title,
                preview,
                mime_type,
            } => uri.len() + title.len() + preview.len() + mime_type.len(),
        }
    }
}

/// An `image` or `file` event: media a tool returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaEvent {
    /// The stored blob.
    pub blob: MediaRef,
    /// Its bytes, when small enough to send inline.
    pub data: Option<bytes::Bytes>,
    /// The tool call that returned it.
    pub call_id: String,
    /// Where the tool said it is (a file it wrote), if anywhere.
    pub uri: String,
}

/// Where a compaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompactionStatus {
    /// The context is over the budget; summarising.
    Started,
    /// The summary is stored; the turn runs on summary + tail.
    Completed,
    /// No summary; the turn runs on a truncated context.
    Failed,
}

/// One `compaction` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compaction {
    /// Started, completed or failed.
    pub status: CompactionStatus,
    /// Estimated context tokens before.
    pub tokens_before: u64,
    /// Estimated context tokens sent from now on (Completed, Failed).
    pub tokens_after: u64,
    /// The stored summary's seq (Completed).
    pub summary_seq: u64,
    /// Messages the summary newly covers (Completed).
    pub messages_compacted: u64,
    /// Why it failed (Failed).
    pub message: String,
}

/// Model step boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// A model step begins.
    Start,
    /// A model step ended.
    Finish,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// First event of every admitted turn.
    TurnStarted {
        /// Effective `provider/model`.
        model: String,
        /// Effective thinking level.
        thinking: Option<ThinkingLevel>,
        /// Seq of the stored user message.
        user_message_seq: u64,
        /// Whether a per-call system prompt replaced the session's.
        system_overridden: bool,
    },
    /// Assistant text delta.
    Text(String),
    /// Reasoning delta.
    Reasoning(String),
    /// Model step boundary (`index` starts at 1).
    Step {
        /// Start or finish.
        kind: StepKind,
        /// 1-based step index.
        index: u32,
    },
    /// A message was durably appended.
    MessageStored {
        /// Its per-session seq.
        seq: u64,
        /// Its id.
        id: String,
        /// Its role.
        role: Role,
    },
    /// Usage of one model step.
    Usage {
        /// Token counts.
        usage: Usage,
        /// The model that used them.
        model: String,
    },
    /// The turn failed.
    Error {
        /// Status code of the cause.
        code: ErrorCode,
        /// Caller-safe message.
        message: String,
    },
    /// Nothing else was sent for the heartbeat interval.
    Heartbeat {
        /// What the turn is doing.
        phase: Phase,
        /// The tool waited for, in [`Phase::Tool`].
        tool: Option<String>,
    },
    /// Tool lifecycle: `Running`, then `Done` or `Error` once the result is
    /// stored.
    ToolUse(Box<ToolUse>),
    /// A caller-executed tool call; the turn waits for its result.
    ToolCall {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// A server tool call that requires approval; the turn waits (paused)
    /// for `SubmitToolApproval`.
    ApprovalRequired {
        /// Call id.
        call_id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// Compaction of the context before the turn's first model step.
    Compaction(Box<Compaction>),
    /// An image a tool returned (between its `ToolUse` Running and Done).
    Image(Box<MediaEvent>),
    /// A file a tool returned or wrote.
    File(Box<MediaEvent>),
    /// Resources a tool cited.
    References {
        /// The call that cited them.
        call_id: String,
        /// What it cited.
        references: Vec<Reference>,
    },
    /// Something the caller should know that is not an error (e.g. media
    /// the model could not read).
    Notice {
        /// `"MEDIA_NOT_SHOWN"`, ...
        code: &'static str,
        /// For a person.
        message: String,
    },
    /// Watchers only (seq 0): events were skipped.
    ReplayGap {
        /// Seq of the next event delivered.
        first_available_seq: u64,
        /// The watcher fell behind (rather than asking for evicted events).
        lagged: bool,
    },
    /// The Chat's message was queued in the session's inbox
    /// (`OnBusy::Enqueue`): it runs as its own turn, whose id this event
    /// carries, once the turns before it ended. Seq 0, before that turn's
    /// events.
    Queued {
        /// 1-based place in the inbox when it was queued.
        position: u64,
    },
    /// The Chat's message joined a live turn (`OnBusy::Steer`): stored as
    /// a user message at seq `message_seq`, sent to the model in the
    /// turn's next step. `None` when the turn ended before its next step
    /// boundary: the message was queued instead (a `Queued` event follows)
    /// and runs as a later turn.
    Steered {
        /// Seq of the stored user message, when it joined the turn.
        message_seq: Option<u64>,
    },
    /// Last event of every turn.
    TurnFinished {
        /// How it ended.
        outcome: TurnOutcome,
        /// Why, for [`TurnOutcome::Canceled`].
        cancel_reason: Option<CancelReason>,
        /// Total usage.
        usage: Usage,
        /// Wall time since admission.
        duration: Duration,
    },
}

/// One event of a turn.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnEvent {
    /// Per turn: 1, 2, 3, ... without gaps.
    pub seq: u64,
    /// When it was emitted.
    pub at: SystemTime,
    /// What happened.
    pub kind: EventKind,
}

impl TurnEvent {
    /// A rough size in bytes, for replay budgets.
    pub fn approx_size(&self) -> usize {
        let payload = match &self.kind {
            EventKind::Text(t) | EventKind::Reasoning(t) => t.len(),
            EventKind::Error { message, .. } => message.len(),
            EventKind::TurnStarted { model, .. } | EventKind::Usage { model, .. } => model.len(),
            EventKind::MessageStored { id, .. } => id.len(),
            EventKind::Queued { .. } | EventKind::Steered { .. } => 0,
            EventKind::ToolUse(t) => {
                std::mem::size_of::<ToolUse>()
                    + t.arguments_json.len()
                    + t.content.len()
                    + t.references
                        .iter()
                        .map(Reference::approx_size)
                        .sum::<usize>()
            }
            EventKind::Image(m) | EventKind::File(m) => {
                std::mem::size_of::<MediaEvent>()
                    + m.blob.approx_bytes()
                    + m.uri.len()
                    + m.data.as_ref().map_or(0, bytes::Bytes::len)
            }
            EventKind::References { references, .. } => {
                references.iter().map(Reference::approx_size).sum()
            }
            EventKind::Notice { message, .. } => message.len(),
            EventKind::ToolCall { arguments_json, .. }
            | EventKind::ApprovalRequired { arguments_json, .. } => arguments_json.len(),
            EventKind::Compaction(c) => std::mem::size_of::<Compaction>() + c.message.len(),
            EventKind::Step { .. }
            | EventKind::TurnFinished { .. }
            | EventKind::Heartbeat { .. }
            | EventKind::ReplayGap { .. } => 0,
        };
        std::mem::size_of::<Self>() + payload
    }

    /// True for the last event of a turn.
    pub fn is_final(&self) -> bool {
        matches!(self.kind, EventKind::TurnFinished { .. })
    }
}
