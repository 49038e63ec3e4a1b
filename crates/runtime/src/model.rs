//! Model providers behind the [`ModelProvider`] trait, and the [`Models`]
//! registry that routes `provider/model` names to them.
//!
//! - [`echo`]: `builtin/echo`, a deterministic offline demo/test model.
//! - [`anthropic`]: Anthropic Messages streaming over HTTP.
//! - [`openai`]: OpenAI-compatible Chat Completions streaming over HTTP.
//! - [`endpoint`]: the settings both HTTP providers share
//!   ([`endpoint::EndpointConfig`]) and their validation.
//! - [`retry`]: retries with backoff in front of any HTTP provider.
//! - [`sse`]: the Server-Sent Events parser the HTTP providers share.

use std::any::Any;
use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;

use crate::types::{Message, StopReason, ThinkingLevel, Usage};

pub mod anthropic;
pub mod echo;
pub mod endpoint;
pub(crate) mod http;
pub mod openai;
pub mod retry;
pub mod sse;

/// What a provider is asked to do: one model step.
#[derive(Debug, Clone, Default)]
pub struct ModelRequest {
    /// The model name *without* the provider prefix.
    pub model: String,
    /// System prompt, if any.
    pub system_prompt: Option<String>,
    /// The conversation so far, oldest first, ending with the new user
    /// message. Shared with the turn, which only copies it when it appends
    /// while a provider still holds a request.
    pub messages: Arc<Vec<Message>>,
    /// Requested reasoning effort, if any.
    pub thinking: Option<ThinkingLevel>,
    /// Tools the model may call in this step.
    pub tools: Vec<ToolSpec>,
    /// Most tokens the step may generate, as the call asked
    /// (`ChatRequest.max_output_tokens`, already checked against
    /// [`ModelProvider::max_output_tokens_limit`]); `None` uses the
    /// provider's configured default for the model.
    pub max_output_tokens: Option<u32>,
    /// The capacity [`ModelProvider::reserve`] set aside for this step at
    /// admission, which the provider consumes; `None` when it reserved
    /// nothing (or this is not a turn's first step).
    pub reservation: Option<Reservation>,
}

impl ModelRequest {
    /// A one-shot request outside any conversation (a compaction summary,
    /// a title): `system_prompt`, then `text` as the only user message, no
    /// tools, no thinking.
    pub fn prompt(model: &str, system_prompt: &str, text: String) -> Self {
        use crate::types::{ContentBlock, NewMessage, Role};
        Self {
            model: model.to_owned(),
            system_prompt: Some(system_prompt.to_owned()),
            messages: Arc::new(vec![Message {
                seq: 0,
                body: NewMessage::new("prompt", Role::User, vec![ContentBlock::text(text)]),
                compacted: false,
            }]),
            thinking: None,
            tools: Vec::new(),
            max_output_tokens: None,
            reservation: None,
        }
    }
}

/// The most text and reasoning a provider lets one step produce before the
/// runtime cuts it with stop reason `length` (see
/// [`ModelProvider::max_step_output_bytes`]): 1 MiB.
pub const DEFAULT_MAX_STEP_OUTPUT_BYTES: usize = 1 << 20;

/// How much one step of an HTTP provider may generate: the `max_tokens` it
/// sends (per provider, optionally per model, overridable per call up to
/// `max_tokens_limit`) and the byte bound the runtime enforces whatever the
/// upstream does with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputLimits {
    /// `max_tokens` sent when neither the call nor `model_max_tokens` says
    /// otherwise. Default 4096.
    pub max_tokens: u32,
    /// Per-model `max_tokens` (model name without the provider prefix).
    pub model_max_tokens: BTreeMap<String, u32>,
    /// The most a call may ask for with `max_output_tokens`. Default 32768.
    pub max_tokens_limit: u32,
    /// The most bytes of text and reasoning one step may produce before it
    /// is cut with stop reason `length`. Default 1 MiB.
    pub max_output_bytes: usize,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_tokens: 4096,
            model_max_tokens: BTreeMap::new(),
            max_tokens_limit: 32_768,
            max_output_bytes: DEFAULT_MAX_STEP_OUTPUT_BYTES,
        }
    }
}

impl OutputLimits {
    /// The `max_tokens` to send for `model`: the call's own when it gave
    /// one, else the model's, else the provider's.
    pub fn tokens_for(&self, model: &str, requested: Option<u32>) -> u32 {
        requested
            .or_else(|| self.model_max_tokens.get(model).copied())
            .unwrap_or(self.max_tokens)
    }

    /// What is wrong with these limits, if anything: every token count at
    /// least 1 and at most `max_tokens_limit`, and a byte bound of at least
    /// 1 KiB.
    pub fn check(&self) -> Result<(), String> {
        if self.max_tokens_limit == 0 {
            return Err("max_tokens_limit must be at least 1".to_owned());
        }
        if self.max_tokens == 0 || self.max_tokens > self.max_tokens_limit {
            return Err(format!(
                "max_tokens must be between 1 and max_tokens_limit ({})",
                self.max_tokens_limit
            ));
        }
        if let Some((model, n)) = self
            .model_max_tokens
            .iter()
            .find(|(_, n)| **n == 0 || **n > self.max_tokens_limit)
        {
            return Err(format!(
                "model_max_tokens.{model} = {n} must be between 1 and max_tokens_limit ({})",
                self.max_tokens_limit
            ));
        }
        if self.max_output_bytes < 1024 {
            return Err("max_output_bytes must be at least 1024".to_owned());
        }
        Ok(())
    }
}

/// Capacity a provider set aside for one model step at admission
/// ([`ModelProvider::reserve`]). The provider's own slot type is inside;
/// the slot is given back when the last clone of the reservation is
/// dropped, so a turn rejected after admission took it (or whose request
/// is never sent) returns it without the provider's help.
#[derive(Clone)]
pub struct Reservation(Arc<dyn Any + Send + Sync>);

impl Reservation {
    /// Wraps a provider's slot.
    pub fn new<T: Any + Send + Sync>(slot: T) -> Self {
        Self(Arc::new(slot))
    }

    /// The provider's slot, when it is of type `T`.
    pub fn slot<T: Any + Send + Sync>(self) -> Option<Arc<T>> {
        self.0.downcast::<T>().ok()
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Reservation")
    }
}

/// [`ModelProvider::reserve`] found the provider's queue full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoCapacity;

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Name the model calls it by.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub parameters: serde_json::Value,
}

/// One streamed item of a model step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelEvent {
    /// Assistant text delta (non-empty).
    TextDelta(String),
    /// Reasoning delta (non-empty).
    ReasoningDelta(String),
    /// The provider's signature of the reasoning streamed so far, to be
    /// stored on the thinking block and sent back with it (non-empty).
    ThinkingSignature(String),
    /// Token usage of the step so far. Providers send it as soon as they
    /// know any of it and again when it grows; the runtime keeps the last
    /// one (cumulative, never a delta). What is known when differs:
    /// Anthropic reports the input at `message_start` and the output at
    /// the end; the local model counts both exactly as it generates;
    /// OpenAI-compatible servers report everything only at the end. For a
    /// step that does not finish (stopped, timed out, failed, cut at the
    /// output bound) after the provider reported no output tokens, the
    /// runtime estimates them from the text and reasoning relayed (a token
    /// per 4 bytes, rounded up).
    Usage(Usage),
    /// A complete tool call (providers assemble streamed fragments first).
    ToolCall {
        /// Call id, unique within the step.
        id: String,
        /// Tool name.
        name: String,
        /// Arguments as a JSON document.
        arguments_json: String,
    },
    /// The step ended normally. Always the last item of a successful stream.
    Finished(StopReason),
}

/// Why a model step failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ModelError {
    /// The upstream could not be reached or answered 5xx.
    #[error("model upstream unavailable: {0}")]
    Unavailable(String),
    /// The upstream refused for quota/rate (429).
    #[error("model upstream rate limited: {0}")]
    RateLimited(String),
    /// The upstream rejected our credentials (401/403).
    #[error("model upstream rejected credentials: {0}")]
    Unauthorized(String),
    /// The upstream rejected the request (other 4xx).
    #[error("model upstream rejected the request: {0}")]
    Rejected(String),
    /// The stream ended before the model finished (no finish reason / `[DONE]`).
    #[error("model stream ended early: {0}")]
    Truncated(String),
    /// The upstream sent something we cannot parse.
    #[error("malformed model response: {0}")]
    Malformed(String),
    /// The upstream said the account's quota is exhausted (OpenAI's 429
    /// `insufficient_quota`): waiting does not help, so it is never retried.
    #[error("model upstream quota exhausted: {0}")]
    QuotaExhausted(String),
    /// `error` together with how long the upstream asked us to wait before
    /// trying again (`Retry-After` / `retry-after-ms`). Never nests.
    #[error("{error} (retry after {retry_after:?})")]
    RetryAfter {
        /// What went wrong (never itself a `RetryAfter`).
        error: Box<ModelError>,
        /// The upstream's requested wait.
        retry_after: Duration,
    },
}

impl ModelError {
    /// A message safe to show callers: no upstream bodies, no secrets.
    pub fn public_message(&self) -> &'static str {
        match self {
            Self::Unavailable(_) => "the model service is unavailable",
            Self::RateLimited(_) => "the model service is rate limiting requests",
            Self::QuotaExhausted(_) => {
                "the model provider's quota is exhausted (check the plan and billing of the \
                 configured account); retrying will not help until it is raised"
            }
            Self::Unauthorized(_) => "the model service rejected the configured credentials",
            Self::Rejected(_) => "the model service rejected the request",
            Self::Truncated(_) => "the model stream ended before the model finished",
            Self::Malformed(_) => "the model service sent a malformed response",
            Self::RetryAfter { error, .. } => error.public_message(),
        }
    }

    /// Attaches the upstream's requested wait to `self` (replacing any
    /// earlier one).
    pub fn with_retry_after(self, retry_after: Duration) -> Self {
        Self::RetryAfter {
            error: Box::new(self.without_retry_after()),
            retry_after,
        }
    }

    /// How long the upstream asked us to wait before retrying, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RetryAfter { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The error without the retry hint.
    pub fn without_retry_after(self) -> Self {
        match self {
            Self::RetryAfter { error, .. } => error.without_retry_after(),
            other => other,
        }
    }

    /// The error without the retry hint, by reference.
    pub fn kind(&self) -> &Self {
        match self {
            Self::RetryAfter { error, .. } => error.kind(),
            other => other,
        }
    }

    /// Whether sending the same request again may succeed: the upstream was
    /// unreachable, overloaded or failing (connect errors, 408, 409, 5xx,
    /// 529) or rate limiting (429).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), Self::Unavailable(_) | Self::RateLimited(_))
    }
}

/// A model step's stream. Dropping it cancels the step (closing the
/// upstream request).
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<ModelEvent, ModelError>> + Send>>;

/// A source of model output.
#[async_trait]
pub trait ModelProvider: Send + Sync + fmt::Debug + 'static {
    /// Starts one model step. Errors before the first byte are returned
    /// here; later ones arrive in the stream. A stream that ends without
    /// [`ModelEvent::Finished`] is treated as truncated by the runtime.
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError>;

    /// Whether `model` (without the provider prefix) is served. Providers
    /// without an allow-list accept any name.
    fn serves(&self, model: &str) -> bool {
        let _ = model;
        true
    }

    /// What `model` reads besides text (images, PDFs): what it cannot read
    /// is replaced by a placeholder in its requests. Default: text only.
    fn media_support(&self, model: &str) -> crate::types::MediaSupport {
        let _ = model;
        crate::types::MediaSupport::TEXT
    }

    /// Whether a turn may offer tools to `model`. When this is false, the
    /// runtime rejects a turn that would offer it any tool at admission
    /// (`INVALID_ARGUMENT`, naming the model) instead of letting the model
    /// silently ignore them. Default: true.
    fn supports_tools(&self, model: &str) -> bool {
        let _ = model;
        true
    }

    /// Whether `model` can take another step now. A provider with a bounded
    /// queue (the local model) returns false when it is full, and the
    /// runtime refuses the turn at admission (`RESOURCE_EXHAUSTED`) rather
    /// than admitting it into an unbounded wait. Default: true.
    fn has_capacity(&self, model: &str) -> bool {
        let _ = model;
        true
    }

    /// Takes capacity for one step of `model` at admission, before anything
    /// is stored; the runtime passes it to the turn's first request
    /// ([`ModelRequest::reservation`]), and dropping it unused gives it
    /// back. `Ok(None)` when the provider does not bound its queue.
    /// `Err(NoCapacity)` refuses the turn (`RESOURCE_EXHAUSTED`). The
    /// default reserves nothing and refuses when [`Self::has_capacity`] is
    /// false.
    fn reserve(&self, model: &str) -> Result<Option<Reservation>, NoCapacity> {
        if self.has_capacity(model) {
            Ok(None)
        } else {
            Err(NoCapacity)
        }
    }

    /// The most `max_output_tokens` a call may ask of `model`; `None` when
    /// the provider sets no maximum (it has no token budget). Default
    /// `None`.
    fn max_output_tokens_limit(&self, model: &str) -> Option<u32> {
        let _ = model;
        None
    }

    /// The most bytes of text and reasoning one step of `model` may
    /// produce; past it the runtime ends the step with stop reason `length`
    /// and closes the stream, so an upstream that never stops cannot grow
    /// memory or the stored message without bound. Default
    /// [`DEFAULT_MAX_STEP_OUTPUT_BYTES`].
    fn max_step_output_bytes(&self, model: &str) -> usize {
        let _ = model;
        DEFAULT_MAX_STEP_OUTPUT_BYTES
    }
}

/// A `provider/model` name, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelName<'a> {
    /// The provider part (before the first `/`).
    pub provider: &'a str,
    /// The model part.
    pub model: &'a str,
}

impl<'a> ModelName<'a> {
    /// Splits `provider/model`; `None` when either part is empty.
    pub fn parse(full: &'a str) -> Option<Self> {
        let (provider, model) = full.split_once('/')?;
        (!provider.is_empty() && !model.is_empty()).then_some(Self { provider, model })
    }
}

/// Why a model name cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelLookupError {
    /// Not of the form `provider/model`.
    #[error("model name {0:?} is not of the form provider/model")]
    Malformed(String),
    /// No provider of that name is configured.
    #[error("model {name:?}: no provider named {provider:?} is configured")]
    UnknownProvider {
        /// The full name.
        name: String,
        /// The provider part.
        provider: String,
    },
    /// The provider does not serve that model.
    #[error("model {0:?} is not served by its provider")]
    UnknownModel(String),
}

/// The configured providers, by name.
#[derive(Clone, Default)]
pub struct Models {
    providers: BTreeMap<String, Arc<dyn ModelProvider>>,
}

impl fmt::Debug for Models {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Models")
            .field("providers", &self.providers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Models {
    /// A registry holding only `builtin` (the echo model).
    pub fn with_builtin() -> Self {
        let mut models = Self::default();
        models.insert("builtin", Arc::new(echo::EchoProvider));
        models
    }

    /// Registers (or replaces) a provider under `name`.
    pub fn insert(&mut self, name: impl Into<String>, provider: Arc<dyn ModelProvider>) {
        self.providers.insert(name.into(), provider);
    }

    /// Resolves a full `provider/model` name.
    pub fn resolve(
        &self,
        full: &str,
    ) -> Result<(Arc<dyn ModelProvider>, String), ModelLookupError> {
        let name =
            ModelName::parse(full).ok_or_else(|| ModelLookupError::Malformed(full.into()))?;
        let provider =
            self.providers
                .get(name.provider)
                .ok_or_else(|| ModelLookupError::UnknownProvider {
                    name: full.to_owned(),
                    provider: name.provider.to_owned(),
                })?;
        if !provider.serves(name.model) {
            return Err(ModelLookupError::UnknownModel(full.to_owned()));
        }
        Ok((Arc::clone(provider), name.model.to_owned()))
    }
}
