//! Domain types shared by the store, the model providers and the runtime.
//!
//! These are plain Rust values (serde-serialisable for the store); the gRPC
//! adapter converts them to and from the protobuf messages. The rules the
//! stores apply to session and turn records are methods of these types
//! (in `types/session.rs`), so both stores share one copy of each.

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

mod agent;
mod provenance;
mod session;

pub use agent::{AgentBinding, Memory};

pub use provenance::{MAX_SPEAKER_ID_BYTES, MAX_SPEAKER_NAME_BYTES, Speaker};

/// Who is calling: every call runs as a principal derived from credentials.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    /// The user id that owns sessions.
    pub user_id: String,
    /// Admin principals may call the operator API.
    pub admin: bool,
    /// Restricted principals (`restricted = true` on their API key or mTLS
    /// entry) get a capability-free runner: no server tools, no per-call
    /// overrides, their own quotas, never admin.
    pub restricted: bool,
    /// How the server established who this is: stored on the messages the
    /// principal sends (the input actor), never taken from a request field.
    pub actor: InputActor,
}

impl Principal {
    /// The single user of an unauthenticated loopback server.
    pub fn local() -> Self {
        Self {
            user_id: "local".to_owned(),
            admin: true,
            restricted: false,
            actor: InputActor::new(ActorKind::Local, "local"),
        }
    }

    /// A principal authenticated by `kind` as `user_id` (unrestricted);
    /// its actor's id is the user id (see [`Principal::identified_as`]).
    pub fn new(user_id: impl Into<String>, admin: bool, kind: ActorKind) -> Self {
        let user_id = user_id.into();
        Self {
            actor: InputActor::new(kind, &user_id),
            user_id,
            admin,
            restricted: false,
        }
    }

    /// The principal with its actor identified as `id` (e.g. the
    /// certificate identity an mTLS caller was mapped by).
    #[must_use]
    pub fn identified_as(mut self, id: &str) -> Self {
        id.clone_into(&mut self.actor.id);
        self
    }

    /// The input actor stored on the messages this principal sends: its
    /// [`actor`](Self::actor), marked admin when the principal is.
    pub fn input_actor(&self) -> InputActor {
        InputActor {
            admin: self.admin,
            ..self.actor.clone()
        }
    }
}

/// The provenance of an input: how its sender was authenticated, derived by
/// the server from the credentials (CONTRACT §8).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InputActor {
    /// The kind of credential.
    pub kind: ActorKind,
    /// Its identity: the API key's user, the certificate's identity, the
    /// delegating parent session's id, …
    pub id: String,
    /// Whether the credential was an admin's (an admin is not a kind of
    /// its own: it authenticates by key or certificate like anyone).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin: bool,
}

impl InputActor {
    /// An actor of `kind` identified as `id` (not an admin).
    pub fn new(kind: ActorKind, id: &str) -> Self {
        Self {
            kind,
            id: id.to_owned(),
            admin: false,
        }
    }
}

/// The kind of credential an input came with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// An unauthenticated loopback server's single user.
    Local,
    /// An API key (`authorization: Bearer`).
    ApiKey,
    /// A client certificate (mTLS).
    Mtls,
    /// A caller of the A2A binding.
    A2a,
    /// A parent session delegating to its child session.
    Delegate,
    /// The runtime itself (a queued message, a resumed turn) on behalf of
    /// the session's owner.
    System,
}

/// The author of a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The caller's input.
    User,
    /// Model output.
    Assistant,
    /// A tool result.
    Tool,
    /// A compaction summary.
    Summary,
    /// A runtime notice (e.g. a timeout).
    Notice,
}

/// Reasoning effort requested from a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ThinkingLevel {
    /// No reasoning.
    None,
    /// The least reasoning a model supports.
    Minimal,
    /// Low effort.
    Low,
    /// Medium effort.
    Medium,
    /// High effort.
    High,
    /// Highest effort.
    XHigh,
}

impl ThinkingLevel {
    /// The lowercase name used in provider requests (`"low"`, `"xhigh"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Minimal => "minimal",
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::XHigh => "xhigh",
        }
    }
}

/// One block of message content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Model reasoning.
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Provider signature to send back with it (may be empty).
        #[serde(default)]
        signature: String,
    },
    /// An image.
    Image {
        /// Raw image bytes (base64 in the store).
        #[serde(with = "crate::types::base64_bytes")]
        data: Vec<u8>,
        /// e.g. `image/png`.
        mime_type: String,
    },
    /// A file given inline (a request's, or on its way to a model): the
    /// runtime stores it as a blob at admission, so history holds a
    /// [`ContentBlock::Media`] instead.
    File {
        /// Raw bytes (base64 in the store).
        #[serde(with = "crate::types::base64_bytes")]
        data: Vec<u8>,
        /// e.g. `application/pdf`.
        mime_type: String,
        /// The file's name (may be empty).
        #[serde(default)]
        name: String,
    },
    /// An image or file stored as a blob of the session's owner, by
    /// reference: history carries this, never the bytes.
    Media(MediaRef),
    /// A tool call made by the model.
    ToolCall {
        /// Call id, unique within the turn.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// The result of a tool call.
    ToolResult {
        /// The id of the call this answers.
        call_id: String,
        /// Tool name.
        name: String,
        /// Result text.
        content: String,
        /// True when the tool failed.
        is_error: bool,
        /// Set when the turn's end interrupted the call before it had a
        /// result of its own (the result says so, `is_error` is set).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        interrupted: Option<Interrupted>,
        /// Images and files the tool returned, stored as blobs.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        media: Vec<MediaRef>,
    },
}

/// What kind of media a [`MediaRef`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediaKind {
    /// An image (a model that reads images is shown it).
    Image,
    /// Any other file: a PDF, text, audio, ...
    File,
}

/// A blob of the session owner's, as a message refers to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaRef {
    /// Image or file.
    pub kind: MediaKind,
    /// The blob's id: the sha256 of its bytes, lower-case hex.
    pub blob_id: String,
    /// e.g. `image/png`, `application/pdf`.
    pub mime_type: String,
    /// Its size in bytes.
    pub size: u64,
    /// A file name (may be empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

/// What became of a tool call the turn's end (a stop, an interrupt, the
/// deadline, a disconnect, a crash) cut short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Interrupted {
    /// It had not started: the tool never saw it.
    Cancelled,
    /// It was running (or handed to the caller): it may have had effects.
    OutcomeUnknown,
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }
}

impl MediaRef {
    /// "an image \"cat.png\" (image/png, 12 KB)": how a placeholder or a
    /// summariser transcript names it.
    pub fn describe(&self) -> String {
        let what = match self.kind {
            MediaKind::Image => "an image",
            MediaKind::File => "a file",
        };
        let name = if self.name.is_empty() {
            String::new()
        } else {
            format!(" {:?}", self.name)
        };
        format!(
            "{what}{name} ({}, {})",
            self.mime_type,
            human_size(self.size)
        )
    }

    /// Bytes it takes in memory, roughly.
    pub fn approx_bytes(&self) -> usize {
        self.blob_id.len() + self.mime_type.len() + self.name.len() + 8
    }
}

/// What a model can read besides text (per model, in the configuration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MediaSupport {
    /// Images.
    pub images: bool,
    /// PDF documents.
    pub pdf: bool,
}

impl MediaSupport {
    /// A model that reads text only (text files are text: every model
    /// reads them).
    pub const TEXT: Self = Self {
        images: false,
        pdf: false,
    };

    /// Whether a model with this support is shown `media` (rather than a
    /// placeholder).
    pub fn reads(self, media: &MediaRef) -> bool {
        match media.kind {
            MediaKind::Image => self.images,
            MediaKind::File => is_text(&media.mime_type) || (self.pdf && is_pdf(&media.mime_type)),
        }
    }
}

/// Whether `mime_type` is text a model reads as text.
pub fn is_text(mime_type: &str) -> bool {
    mime_type.starts_with("text/") || mime_type == "application/json"
}

/// Whether `mime_type` is a PDF.
pub fn is_pdf(mime_type: &str) -> bool {
    mime_type == "application/pdf"
}

/// `n` bytes as "812 B", "12 KB", "3.4 MB".
pub fn human_size(n: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * KB;
    if n < KB {
        format!("{n} B")
    } else if n < MB {
        format!("{} KB", n.div_ceil(KB))
    } else {
        let tenths = n.saturating_mul(10).div_ceil(MB);
        format!("{}.{} MB", tenths / 10, tenths % 10)
    }
}

/// Joins the text blocks of `content` with newlines.
pub fn flatten_text(content: &[ContentBlock]) -> String {
    let mut out = String::new();
    for block in content {
        if let ContentBlock::Text { text } = block {
            if !out.is_empty() && !text.is_empty() {
                out.push('\n');
            }
            out.push_str(text);
        }
    }
    out
}

/// Token usage of a model step or a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Of the output, reasoning tokens.
    pub reasoning_tokens: u64,
    /// Of the input, tokens served from a prompt cache.
    pub cached_input_tokens: u64,
}

impl Usage {
    /// Adds `other` to `self`, saturating.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        self.cached_input_tokens = self
            .cached_input_tokens
            .saturating_add(other.cached_input_tokens);
    }
}

/// Why generation of an assistant message stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished.
    Stop,
    /// The model hit its output token limit.
    Length,
    /// The model stopped to call tools.
    ToolUse,
    /// The model or the transport failed.
    Error,
    /// Stopped by a caller (StopSession).
    Cancelled,
    /// The Chat caller went away.
    ClientGone,
    /// The turn deadline passed.
    Timeout,
    /// The server shut down.
    Shutdown,
}

impl StopReason {
    /// The lowercase wire name (`"stop"`, `"tool_use"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolUse => "tool_use",
            Self::Error => "error",
            Self::Cancelled => "cancelled",
            Self::ClientGone => "client_gone",
            Self::Timeout => "timeout",
            Self::Shutdown => "shutdown",
        }
    }
}

/// A message to append; the store assigns its `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewMessage {
    /// Unique message id.
    pub id: String,
    /// The turn that produced it.
    pub turn_id: String,
    /// Author.
    pub role: Role,
    /// Content blocks.
    pub content: Vec<ContentBlock>,
    /// Producing model (assistant messages).
    pub model: Option<String>,
    /// Usage of the step that produced it.
    pub usage: Option<Usage>,
    /// Why generation stopped (assistant messages).
    pub stop_reason: Option<StopReason>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Who the caller says wrote it (user messages of a Chat that named a
    /// speaker): shown to the model, never an identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<Speaker>,
    /// How the server authenticated the call that brought it (user
    /// messages); `None` for messages stored before provenance existed and
    /// for messages the runtime writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_actor: Option<InputActor>,
}

impl NewMessage {
    /// A message with a fresh id, created now.
    pub fn new(turn_id: &str, role: Role, content: Vec<ContentBlock>) -> Self {
        Self {
            id: new_id(),
            turn_id: turn_id.to_owned(),
            role,
            content,
            model: None,
            usage: None,
            stop_reason: None,
            created_at: SystemTime::now(),
            speaker: None,
            input_actor: None,
        }
    }

    /// A user message with its provenance: `speaker` from the request,
    /// `actor` from the credentials.
    pub fn from_user(
        turn_id: &str,
        content: Vec<ContentBlock>,
        speaker: Option<Speaker>,
        actor: InputActor,
    ) -> Self {
        Self {
            speaker,
            input_actor: Some(actor),
            ..Self::new(turn_id, Role::User, content)
        }
    }
}

/// A stored message.
///
/// Serialised as one flat object (the body's fields next to `seq` and
/// `compacted`) through a private flat shape: serde's `flatten` would give the
/// same JSON but decodes through a buffered intermediate, which dominated
/// the cost of loading a long history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "FlatMessage", into = "FlatMessage")]
pub struct Message {
    /// Per-session sequence number: strictly increasing, never reused.
    pub seq: u64,
    /// The message itself.
    pub body: NewMessage,
    /// True once a summary covers it.
    pub compacted: bool,
}

/// The stored shape of a [`Message`].
#[derive(Serialize, Deserialize)]
struct FlatMessage {
    seq: u64,
    id: String,
    turn_id: String,
    role: Role,
    content: Vec<ContentBlock>,
    model: Option<String>,
    usage: Option<Usage>,
    stop_reason: Option<StopReason>,
    created_at: SystemTime,
    #[serde(default)]
    compacted: bool,
    // Absent from records stored before provenance existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    speaker: Option<Speaker>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    input_actor: Option<InputActor>,
}

impl From<FlatMessage> for Message {
    fn from(f: FlatMessage) -> Self {
        Self {
            seq: f.seq,
            body: NewMessage {
                id: f.id,
                turn_id: f.turn_id,
                role: f.role,
                content: f.content,
                model: f.model,
                usage: f.usage,
                stop_reason: f.stop_reason,
                created_at: f.created_at,
                speaker: f.speaker,
                input_actor: f.input_actor,
            },
            compacted: f.compacted,
        }
    }
}

impl From<Message> for FlatMessage {
    fn from(m: Message) -> Self {
        Self {
            seq: m.seq,
            id: m.body.id,
            turn_id: m.body.turn_id,
            role: m.body.role,
            content: m.body.content,
            model: m.body.model,
            usage: m.body.usage,
            stop_reason: m.body.stop_reason,
            created_at: m.body.created_at,
            compacted: m.compacted,
            speaker: m.body.speaker,
            input_actor: m.body.input_actor,
        }
    }
}

/// The state of a turn record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Still running (or the process died while it ran; see recovery).
    Running,
    /// Finished normally.
    Success,
    /// Failed.
    Error,
    /// Stopped, the caller went away, or the server shut down.
    Canceled,
    /// The deadline passed.
    TimedOut,
    /// Found running at start-up: the process died during the turn.
    Interrupted,
    /// Ended after a step because the session's budget was reached.
    BudgetExceeded,
    /// Waiting for a caller-executed tool's result or an approval, with no
    /// process running it (a restart, a drain or a dead replica left it
    /// so): [`TurnRecord::pause`] says what it waits for, and
    /// `SubmitToolResult` / `SubmitToolApproval` resume it. The session is
    /// busy meanwhile.
    Paused,
}

impl TurnStatus {
    /// Whether the turn has ended (neither running nor paused).
    pub fn is_final(self) -> bool {
        !matches!(self, Self::Running | Self::Paused)
    }
}

/// Why a turn was cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// StopSession.
    Stopped,
    /// The Chat caller went away.
    ClientGone,
    /// The server shut down.
    Shutdown,
    /// The session was deleted.
    SessionDeleted,
    /// A Chat with `OnBusy::Interrupt` took the session over.
    Interrupted,
}

impl CancelReason {
    /// The stop reason stored on a partial assistant message.
    pub fn stop_reason(self) -> StopReason {
        match self {
            Self::Stopped | Self::SessionDeleted | Self::Interrupted => StopReason::Cancelled,
            Self::ClientGone => StopReason::ClientGone,
            Self::Shutdown => StopReason::Shutdown,
        }
    }
}

/// The durable record of one turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Turn id.
    pub turn_id: String,
    /// Session id.
    pub session_id: String,
    /// Current state.
    pub status: TurnStatus,
    /// Admission time.
    pub started_at: SystemTime,
    /// End time, once ended.
    pub finished_at: Option<SystemTime>,
    /// Effective `provider/model`.
    pub model: String,
    /// Effective thinking level, if any.
    pub thinking: Option<ThinkingLevel>,
    /// Whether a per-call system prompt replaced the session's.
    pub system_overridden: bool,
    /// Total usage so far.
    pub usage: Usage,
    /// The seq of the stored user message.
    pub user_message_seq: u64,
    /// Caller-safe error message, for ERROR outcomes.
    pub error: Option<String>,
    /// For CANCELED outcomes.
    pub cancel_reason: Option<CancelReason>,
    /// Idempotency key of the Chat that started it.
    #[serde(default)]
    pub request_id: Option<String>,
    /// The [`Session::incarnation`] the turn was admitted in: the store
    /// refuses the turn's writes once the session is another incarnation.
    #[serde(default)]
    pub incarnation: String,
    /// Model steps started so far.
    #[serde(default)]
    pub steps: u32,
    /// What [`usage`](Self::usage) cost by the price table, in billionths
    /// of a US dollar; `None` when the model has no price.
    #[serde(default)]
    pub cost_nano_usd: Option<u64>,
    /// The queued message this turn runs ([`Queued::id`]): the write that
    /// begins the turn takes it out of the inbox, and is refused when it
    /// is gone.
    #[serde(default)]
    pub from_inbox: Option<String>,
    /// Set while the turn waits for caller-executed tool results or
    /// approvals: what it needs to resume from history after a restart or
    /// on another replica.
    #[serde(default)]
    pub pause: Option<Pause>,
    /// What the turn's delegate sessions (the `delegate` tool) used and
    /// cost: added to its session's [`Session::spent`] with the turn's own,
    /// so a parent's budget covers its children.
    #[serde(default, skip_serializing_if = "Spent::is_zero")]
    pub delegated: Spent,
}

/// What a paused turn waits for, and what its next steps need of the Chat
/// that started it (its content is in history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// The model step whose tool calls wait.
    pub step: u32,
    /// The calls waited for.
    pub calls: Vec<PausedCall>,
    /// The seq of the last event the turn emitted before the pause; a
    /// resumed turn numbers its events on from it.
    pub event_seq: u64,
    /// When the wait ends unanswered (the turn's deadline, or
    /// `approval_timeout` after the pause began): the turn times out then.
    pub until: SystemTime,
    /// The turn's own deadline.
    pub deadline: SystemTime,
    /// The Chat's options (without its content).
    pub input: QueuedInput,
}

/// A tool call a paused turn waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedCall {
    /// Call id.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// Arguments (a JSON document).
    pub arguments_json: String,
    /// What it waits for.
    pub wait: Wait,
}

/// What a tool call waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Wait {
    /// A caller-executed tool's result (`SubmitToolResult`).
    Result,
    /// An approval of a server tool call (`SubmitToolApproval`).
    Approval,
}

/// A Chat that arrived while its session was busy, kept in the session's
/// inbox until it runs as its own turn (see `store::inbox`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Queued {
    /// Its id, UUIDv7: id order is arrival order.
    pub id: String,
    /// The session (its stored key).
    pub session_id: String,
    /// The session's incarnation it was sent to.
    pub incarnation: String,
    /// When it arrived.
    pub enqueued_at: SystemTime,
    /// Whether its sender was an admin principal (the sender is the
    /// session's owner).
    pub admin: bool,
    /// How its sender was authenticated: the input actor of the user
    /// message its turn stores. `None` in records queued before provenance
    /// existed (their turn's message is the runtime's, `ActorKind::System`).
    #[serde(default)]
    pub actor: Option<InputActor>,
    /// What to run.
    pub input: QueuedInput,
}

/// The request of a queued Chat, as admission takes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueuedInput {
    /// The user message.
    pub content: Vec<ContentBlock>,
    /// `provider/model` override.
    pub model: Option<String>,
    /// Thinking override.
    pub thinking: Option<ThinkingLevel>,
    /// System prompt for this turn.
    pub system_override: Option<String>,
    /// Turn time limit.
    pub timeout: Option<std::time::Duration>,
    /// Idempotency key.
    pub request_id: Option<String>,
    /// Server tools left out.
    pub excluded_tools: Vec<String>,
    /// Caller-executed tools offered.
    pub extra_tools: Vec<QueuedTool>,
    /// Agent-loop step limit.
    pub max_steps: Option<u32>,
    /// Output token limit per step.
    pub max_output_tokens: Option<u32>,
    /// The turn runs on when its caller is gone.
    pub continue_on_disconnect: bool,
    /// Server tools whose calls wait for an approval (`*`: every one).
    pub require_approval: Vec<String>,
    /// Who the caller said wrote the message.
    pub speaker: Option<Speaker>,
    /// Its sender was a restricted principal: the turn it runs (queued, or
    /// resumed from a pause) is capability-free too. Records from before
    /// restricted principals existed read as `false`.
    pub restricted: bool,
}

/// A caller-executed tool of a queued Chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueuedTool {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

/// Summary of a session's latest turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastTurn {
    /// Turn id.
    pub turn_id: String,
    /// Its state.
    pub status: TurnStatus,
    /// Admission time.
    pub started_at: SystemTime,
    /// End time, once ended.
    pub finished_at: Option<SystemTime>,
}

impl From<&TurnRecord> for LastTurn {
    fn from(t: &TurnRecord) -> Self {
        Self {
            turn_id: t.turn_id.clone(),
            status: t.status,
            started_at: t.started_at,
            finished_at: t.finished_at,
        }
    }
}

/// A stored session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Session id.
    pub id: String,
    /// Owning user id.
    pub owner: String,
    /// Agent id (free-form).
    pub agent_id: String,
    /// Project id (free-form).
    pub project_id: String,
    /// Title; empty until set.
    pub title: String,
    /// `provider/model`; empty means the runtime default.
    pub model: String,
    /// System prompt; empty means none.
    pub system_prompt: String,
    /// Caller metadata.
    pub metadata: BTreeMap<String, String>,
    /// Creation time.
    pub created_at: SystemTime,
    /// Last activity (creation, update, message).
    pub last_active_at: SystemTime,
    /// Archived sessions reject new turns.
    pub archived: bool,
    /// The latest turn, if any.
    pub last_turn: Option<LastTurn>,
    /// Number of stored messages.
    pub message_count: u64,
    /// The seq the next stored message gets (starts at 1).
    pub next_seq: u64,
    /// Every non-summary message with a seq up to this one is covered by
    /// the summary [`Session::summary_seq`] (0: never compacted).
    #[serde(default)]
    pub compacted_through: u64,
    /// The seq of the latest compaction summary (0: none). Earlier
    /// summaries are covered by it.
    #[serde(default)]
    pub summary_seq: u64,
    /// This session's identity, fixed when it is created and never reused:
    /// a session deleted and created again under the same id is another
    /// incarnation. Live turns, waiters and writes are keyed by it, so
    /// nothing of the old one (a turn still ending, a watcher, a title job)
    /// can reach the new one. Empty for sessions stored before it existed.
    #[serde(default)]
    pub incarnation: String,
    /// What the session may spend ([`Budget::NONE`]: no limit).
    #[serde(default)]
    pub budget: Budget,
    /// What its ended turns used and cost, summed.
    #[serde(default)]
    pub spent: Spent,
    /// How it uses its agent: the version, the parent session, the prompt's
    /// memory snapshot.
    #[serde(default)]
    pub agent: AgentBinding,
}

/// A session's budget: turns stop being admitted once what the session
/// spent reaches a limit, and a turn that crosses one ends after its
/// current step (`TurnStatus::BudgetExceeded`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    /// Most tokens (input plus output, summed over every turn).
    pub max_tokens: Option<u64>,
    /// Most cost, in nano-USD, by the price table (turns of a model without
    /// a price cost nothing).
    pub max_cost_nano_usd: Option<u64>,
}

impl Budget {
    /// No limit.
    pub const NONE: Self = Self {
        max_tokens: None,
        max_cost_nano_usd: None,
    };

    /// The first limit `spent` reached, if any: (which, the limit).
    pub fn reached(&self, spent: &Spent) -> Option<(BudgetLimit, u64)> {
        if let Some(max) = self.max_tokens
            && spent.tokens() >= max
        {
            return Some((BudgetLimit::Tokens, max));
        }
        match self.max_cost_nano_usd {
            Some(max) if spent.cost_nano_usd >= max => Some((BudgetLimit::Cost, max)),
            Some(_) | None => None,
        }
    }
}

/// Which limit of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetLimit {
    /// [`Budget::max_tokens`].
    Tokens,
    /// [`Budget::max_cost_nano_usd`].
    Cost,
}

/// What a session's turns used and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spent {
    /// Tokens, summed over its turns.
    pub usage: Usage,
    /// Cost in nano-USD by the price table, summed (turns of a model
    /// without a price add nothing).
    pub cost_nano_usd: u64,
}

impl Spent {
    /// Input plus output tokens (cached input is part of input, reasoning
    /// part of output).
    pub fn tokens(&self) -> u64 {
        self.usage
            .input_tokens
            .saturating_add(self.usage.output_tokens)
    }

    /// Whether nothing was used.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// `self` plus `other`.
    pub fn add(&self, other: &Self) -> Self {
        self.plus(&other.usage, Some(other.cost_nano_usd))
    }

    /// `self` plus a turn's usage and cost.
    pub fn plus(&self, usage: &Usage, cost_nano_usd: Option<u64>) -> Self {
        let mut sum = *self;
        sum.usage.add(usage);
        sum.cost_nano_usd = sum.cost_nano_usd.saturating_add(cost_nano_usd.unwrap_or(0));
        sum
    }
}

impl Session {
    /// Whether a summary covers `message` (its `compacted` flag as callers
    /// see it): an older summary, or a message at or below
    /// `compacted_through`.
    pub fn covers(&self, message: &Message) -> bool {
        message.compacted
            || if message.body.role == Role::Summary {
                message.seq != self.summary_seq
            } else {
                message.seq <= self.compacted_through
            }
    }
}

/// Fields of a new session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewSession {
    /// Client-chosen id; the store generates one when `None`.
    pub id: Option<String>,
    /// Owning user id.
    pub owner: String,
    /// Agent id.
    pub agent_id: String,
    /// Project id.
    pub project_id: String,
    /// Title.
    pub title: String,
    /// `provider/model` or empty.
    pub model: String,
    /// System prompt.
    pub system_prompt: String,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Budget.
    pub budget: Budget,
    /// How the session uses its agent.
    pub agent: AgentBinding,
}

/// A partial update of a session; `None` leaves a field unchanged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionUpdate {
    /// New title.
    pub title: Option<String>,
    /// New model.
    pub model: Option<String>,
    /// New system prompt.
    pub system_prompt: Option<String>,
    /// Replacement metadata map.
    pub metadata: Option<BTreeMap<String, String>>,
    /// New archived flag.
    pub archived: Option<bool>,
    /// New budget (replacing the whole budget).
    pub budget: Option<Budget>,
    /// The agent version to run with from now on (0: the latest).
    pub agent_version: Option<u64>,
    /// Whether the prompt re-reads memory at every turn.
    pub refresh_memory: Option<bool>,
    /// The prompt's memory snapshot (set by the session's first turn).
    pub memory_snapshot: Option<Memory>,
}

/// A new unique id (UUID v7: time-ordered, so ids sort by creation).
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

/// Serde helper: `Vec<u8>` as a base64 string.
pub(crate) mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        STANDARD.decode(text).map_err(serde::de::Error::custom)
    }
}
