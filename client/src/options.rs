//! [`ChatOptions`]: what one turn asks for, and [`ResumePolicy`]: how a
//! resuming chat reconnects.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::proto;

pub use proto::{OnBusy, OnDisconnect, ThinkingLevel};

/// One turn's request, built step by step:
///
/// ```
/// use std::time::Duration;
/// use agentrt_client::{ChatOptions, OnDisconnect, ThinkingLevel};
///
/// let options = ChatOptions::new("hello")
///     .model("openai/gpt-4o-mini")
///     .thinking(ThinkingLevel::Low)
///     .timeout(Duration::from_secs(120))
///     .on_disconnect(OnDisconnect::Continue);
/// # let _ = options;
/// ```
///
/// With [`OnDisconnect::Continue`] the chat resumes after a dropped
/// connection (see [`crate::Client::chat`]); a `request_id` is generated
/// for it when none is set. A plain `&str` or `String` converts into
/// options with just that text.
#[derive(Debug, Clone, Default)]
pub struct ChatOptions {
    pub(crate) text: String,
    /// Image and file blocks, after the text.
    pub(crate) images: Vec<proto::ContentBlock>,
    pub(crate) model: Option<String>,
    pub(crate) system: Option<String>,
    pub(crate) thinking: ThinkingLevel,
    pub(crate) timeout: Option<Duration>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) on_disconnect: OnDisconnect,
    pub(crate) request_id: Option<String>,
    pub(crate) excluded_tools: Vec<String>,
    pub(crate) extra_tools: Vec<proto::ToolDefinition>,
    pub(crate) max_steps: Option<u32>,
    pub(crate) max_output_tokens: Option<u32>,
    pub(crate) metadata: HashMap<String, String>,
    pub(crate) resume: Option<ResumePolicy>,
    pub(crate) when_busy: WhenBusy,
    pub(crate) on_busy: OnBusy,
    pub(crate) require_approval: Vec<String>,
    pub(crate) speaker: Option<proto::Speaker>,
}

/// What [`crate::Client::chat`] does when the session already has a live
/// turn (or is being compacted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenBusy {
    /// Return [`crate::Error::Busy`] (or [`crate::Error::Compacting`]).
    #[default]
    Fail,
    /// Wait for the live turn to end (watching it; its events are not
    /// yielded), then send this chat; at most the resume policy's number
    /// of attempts, within the call's deadline.
    Wait,
}

impl ChatOptions {
    /// A turn with the user text `text`.
    pub fn new(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            ..Self::default()
        }
    }

    /// Adds an image block (after the text).
    pub fn image(mut self, mime_type: impl Into<String>, data: impl Into<Vec<u8>>) -> Self {
        self.images.push(proto::ContentBlock {
            block: Some(proto::content_block::Block::Image(proto::ImageBlock {
                mime_type: mime_type.into(),
                data: data.into(),
                ..proto::ImageBlock::default()
            })),
        });
        self
    }

    /// Adds a file block with its bytes inline (after the text): a PDF, a
    /// text file, ... within the server's inline limit
    /// (`[blobs] max_inline_bytes`); upload larger ones with
    /// [`crate::Client::upload_blob`] and attach them with
    /// [`ChatOptions::blob`].
    pub fn file(
        mut self,
        mime_type: impl Into<String>,
        name: impl Into<String>,
        data: impl Into<Vec<u8>>,
    ) -> Self {
        self.images.push(proto::ContentBlock {
            block: Some(proto::content_block::Block::File(proto::FileBlock {
                mime_type: mime_type.into(),
                name: name.into(),
                data: data.into(),
                ..proto::FileBlock::default()
            })),
        });
        self
    }

    /// Attaches a blob uploaded to the session (by
    /// [`crate::Client::upload_blob`]): as an image block when it is an
    /// image, a file block otherwise.
    pub fn blob(mut self, blob: &proto::BlobRef) -> Self {
        let block = if blob.kind == proto::MediaKind::Image as i32 {
            proto::content_block::Block::Image(proto::ImageBlock {
                blob_id: blob.blob_id.clone(),
                mime_type: blob.mime_type.clone(),
                name: blob.name.clone(),
                ..proto::ImageBlock::default()
            })
        } else {
            proto::content_block::Block::File(proto::FileBlock {
                blob_id: blob.blob_id.clone(),
                mime_type: blob.mime_type.clone(),
                name: blob.name.clone(),
                ..proto::FileBlock::default()
            })
        };
        self.images.push(proto::ContentBlock { block: Some(block) });
        self
    }

    /// `provider/model` for this turn only.
    pub fn model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Replaces the session's system prompt for this turn only.
    pub fn system(mut self, prompt: impl Into<String>) -> Self {
        self.system = Some(prompt.into());
        self
    }

    /// The thinking level of this turn.
    pub fn thinking(mut self, level: ThinkingLevel) -> Self {
        self.thinking = level;
        self
    }

    /// The turn's own time limit (`ChatRequest.timeout`): on expiry the
    /// turn ends TIMED_OUT with its partial output stored.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The gRPC deadline of this call (overrides the client's
    /// [`crate::ClientBuilder::chat_deadline`]); it bounds the turn too.
    /// A resuming chat gives each re-attachment what is left of it.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// What the server does with the turn when this caller goes away.
    /// [`OnDisconnect::Continue`] also makes the chat resume after a
    /// dropped connection.
    pub fn on_disconnect(mut self, on_disconnect: OnDisconnect) -> Self {
        self.on_disconnect = on_disconnect;
        self
    }

    /// The idempotency key (1-128 printable ASCII characters): a retry
    /// with the same key joins or replays the turn instead of running it
    /// again.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Hides a tool from the model for this turn.
    pub fn exclude_tool(mut self, name: impl Into<String>) -> Self {
        self.excluded_tools.push(name.into());
        self
    }

    /// Offers a tool the caller executes: its calls arrive as
    /// [`crate::ChatEvent::ToolCall`], answered with
    /// [`crate::Client::submit_tool_result`].
    pub fn extra_tool(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        parameters_json_schema: impl Into<String>,
    ) -> Self {
        self.extra_tools.push(proto::ToolDefinition {
            name: name.into(),
            description: description.into(),
            parameters_json_schema: parameters_json_schema.into(),
        });
        self
    }

    /// The most model steps of the agent loop.
    pub fn max_steps(mut self, steps: u32) -> Self {
        self.max_steps = Some(steps);
        self
    }

    /// The most tokens each model step may generate.
    pub fn max_output_tokens(mut self, tokens: u32) -> Self {
        self.max_output_tokens = Some(tokens);
        self
    }

    /// Adds a gRPC metadata entry (an ASCII header) to the call.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// How this chat reconnects (overrides the client's
    /// [`crate::ClientBuilder::resume_policy`]). Only used with
    /// [`OnDisconnect::Continue`].
    pub fn resume_policy(mut self, policy: ResumePolicy) -> Self {
        self.resume = Some(policy);
        self
    }

    /// What the client does when the session is busy with another turn (a
    /// client-side policy; the server still refuses the busy Chat itself).
    pub fn when_busy(mut self, when_busy: WhenBusy) -> Self {
        self.when_busy = when_busy;
        self
    }

    /// What the server does with this chat when the session already runs
    /// a turn: refuse it ([`OnBusy::Reject`], the default), queue it in
    /// the session's inbox to run as its own turn ([`OnBusy::Enqueue`]: a
    /// [`crate::ChatEvent::Queued`] event first), stop the live turn and
    /// run this one ([`OnBusy::Interrupt`]), or add it to the live turn at
    /// its next step ([`OnBusy::Steer`]: a [`crate::ChatEvent::Steered`]
    /// event, then the live turn's events).
    pub fn on_busy(mut self, on_busy: OnBusy) -> Self {
        self.on_busy = on_busy;
        self
    }

    /// Server tools whose calls in this turn wait for an approval
    /// ([`crate::ChatEvent::ApprovalRequired`], then
    /// [`crate::Client::submit_tool_approval`]); `"*"` for every one.
    pub fn require_approval<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        self.require_approval = tools.into_iter().map(Into::into).collect();
        self
    }

    /// Whether this chat resumes after a dropped connection.
    pub fn resumes(&self) -> bool {
        self.on_disconnect == OnDisconnect::Continue
    }

    /// Names who wrote the message in a group session: `id` is the
    /// caller's id for the participant, `display_name` what the model is
    /// shown (empty: the id). Stored on the user message and returned in
    /// history (`Message::speaker`); it never changes the session's owner
    /// or what the call may do — the message's `input_actor` comes from
    /// the credentials.
    pub fn speaker(mut self, id: impl Into<String>, display_name: impl Into<String>) -> Self {
        self.speaker = Some(proto::Speaker {
            id: id.into(),
            display_name: display_name.into(),
        });
        self
    }

    /// The request id, generating one when resuming needs it.
    pub(crate) fn ensure_request_id(&mut self) {
        if self.resumes() && self.request_id.is_none() {
            self.request_id = Some(format!("rs-{}", uuid::Uuid::new_v4()));
        }
    }

    /// The wire request for `session_id`.
    pub(crate) fn to_request(&self, session_id: &str) -> proto::ChatRequest {
        use proto::content_block::Block;
        let mut content = Vec::new();
        if !self.text.is_empty() || self.images.is_empty() {
            content.push(proto::ContentBlock {
                block: Some(Block::Text(proto::TextBlock {
                    text: self.text.clone(),
                })),
            });
        }
        content.extend(self.images.iter().cloned());
        proto::ChatRequest {
            session_id: session_id.to_owned(),
            content,
            model: self.model.clone().unwrap_or_default(),
            thinking: self.thinking as i32,
            system_override: self.system.clone(),
            timeout: self
                .timeout
                .and_then(|t| prost_types::Duration::try_from(t).ok()),
            on_disconnect: self.on_disconnect as i32,
            request_id: self.request_id.clone().unwrap_or_default(),
            excluded_tools: self.excluded_tools.clone(),
            extra_tools: self.extra_tools.clone(),
            max_steps: self.max_steps,
            max_output_tokens: self.max_output_tokens,
            on_busy: self.on_busy as i32,
            require_approval: self.require_approval.clone(),
            speaker: self.speaker.clone(),
        }
    }
}

impl From<&str> for ChatOptions {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

impl From<String> for ChatOptions {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl From<&String> for ChatOptions {
    fn from(text: &String) -> Self {
        Self::new(text.as_str())
    }
}

/// What a resuming stream reports about its connection (see
/// [`ResumePolicy::on_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumeNotice {
    /// The connection broke; reconnecting.
    Disconnected {
        /// What broke.
        cause: String,
        /// The last event seq yielded before it.
        last_seq: u64,
    },
    /// Re-attached to the live turn with `Subscribe` after `after_seq`.
    Resubscribed {
        /// The last seq seen.
        after_seq: u64,
    },
    /// Re-sent the Chat with its `request_id` (joins the live turn or
    /// replays the finished one).
    Retried {
        /// The last seq seen.
        after_seq: u64,
    },
    /// The chat found the session busy with `turn_id` and waits for it
    /// ([`WhenBusy::Wait`]).
    WaitingForTurn {
        /// The live turn (empty while the session is being compacted).
        turn_id: String,
    },
    /// A reconnect attempt failed.
    AttemptFailed {
        /// 1-based attempt number.
        attempt: u32,
        /// Why.
        cause: String,
    },
}

/// The callback of [`ResumePolicy::on_event`].
type Observer = Arc<dyn Fn(&ResumeNotice) + Send + Sync>;

/// How a resuming stream reconnects: bounded attempts with exponential
/// backoff. Default: 8 attempts, 100 ms doubling up to 5 s.
#[derive(Clone)]
pub struct ResumePolicy {
    pub(crate) attempts: u32,
    pub(crate) initial_backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) observer: Option<Observer>,
}

impl fmt::Debug for ResumePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResumePolicy")
            .field("attempts", &self.attempts)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

impl Default for ResumePolicy {
    fn default() -> Self {
        Self {
            attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            observer: None,
        }
    }
}

impl ResumePolicy {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `attempts` reconnect attempts per break (0: never resume).
    pub fn attempts(mut self, attempts: u32) -> Self {
        self.attempts = attempts;
        self
    }

    /// The wait before the first attempt and its cap as it doubles.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Calls `observer` with every [`ResumeNotice`] (from the task polling
    /// the stream; keep it quick).
    pub fn on_event(mut self, observer: impl Fn(&ResumeNotice) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    pub(crate) fn notify(&self, notice: ResumeNotice) {
        if let Some(o) = &self.observer {
            o(&notice);
        }
    }
}
