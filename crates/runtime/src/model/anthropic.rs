//! Anthropic Messages streaming over HTTP.
//!
//! One model step is one `POST {base_url}/messages` with `stream: true`;
//! the `text/event-stream` answer is parsed with [`SseParser`](super::sse::SseParser). A step only
//! counts as finished once `message_stop` arrives; a body that ends earlier
//! is reported as truncated. Thinking blocks are sent back with their
//! signatures (unsigned ones are dropped, since the API rejects them).
//!
//! Usage is relayed as it becomes known: the input at `message_start` (its
//! output count there is a placeholder and is left at 0, so a step stopped
//! mid-stream gets the runtime's estimate of its output; see
//! [`ModelEvent::Usage`]), the whole at `message_delta`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderName, HeaderValue};
use serde_json::{Value, json};

use super::http::{self, SseDecoder, truncated};
use super::sse::SseEvent;
use super::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, OutputLimits};
use crate::types::{ContentBlock, Role, StopReason, ThinkingLevel, Usage, flatten_text};

/// The API version this provider speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Bounds on what one step may hold, so a misbehaving upstream cannot grow
/// memory without limit.
const MAX_BLOCKS: usize = 1024;
const MAX_TOOL_ARGUMENT_BYTES: usize = 1 << 20;
const MAX_SIGNATURE_BYTES: usize = 1 << 20;

/// Settings of one Anthropic Messages endpoint.
#[derive(Clone)]
pub struct AnthropicConfig {
    /// The API root, e.g. `https://api.anthropic.com/v1`.
    pub base_url: String,
    /// Sent as `x-api-key`; empty counts as none.
    pub api_key: Option<String>,
    /// Model names served; `None` serves any name.
    pub models: Option<Vec<String>>,
    /// Bound on establishing the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Longest silence allowed while waiting for headers or between chunks.
    pub idle_timeout: Duration,
    /// How much a step may generate: the `max_tokens` of each request
    /// (raised above the thinking budget when thinking is enabled).
    pub limits: OutputLimits,
}

impl AnthropicConfig {
    /// `base_url` with no key, no allow-list, a 10 s connect timeout, a
    /// 60 s idle timeout and the default [`OutputLimits`] (`max_tokens`
    /// 4096).
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            api_key: None,
            models: None,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            limits: OutputLimits::default(),
        }
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Why an [`AnthropicConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnthropicConfigError {
    /// `base_url` is not an http(s) URL without query or fragment.
    #[error("invalid model base_url {url:?}: {reason}")]
    InvalidBaseUrl {
        /// The configured value.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The key contains bytes that cannot appear in an HTTP header.
    #[error("the model api_key cannot be sent in an HTTP header")]
    InvalidApiKey,
    /// A zero timeout would fail every request.
    #[error("model timeouts must be greater than zero")]
    ZeroTimeout,
    /// The output limits are inconsistent (e.g. `max_tokens` of zero, which
    /// the API rejects).
    #[error("{0}")]
    Limits(String),
    /// The HTTP client could not be built (e.g. no TLS roots).
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// A provider for one Anthropic Messages endpoint.
pub struct AnthropicProvider {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    api_key: Option<HeaderValue>,
    models: Option<Vec<String>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    limits: OutputLimits,
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("endpoint", &self.endpoint.as_str())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("idle_timeout", &self.idle_timeout)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl AnthropicProvider {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: AnthropicConfig) -> Result<Self, AnthropicConfigError> {
        let invalid = |reason: String| AnthropicConfigError::InvalidBaseUrl {
            url: config.base_url.clone(),
            reason,
        };
        let endpoint = http::endpoint(&config.base_url, "messages").map_err(invalid)?;
        if config.connect_timeout.is_zero() || config.idle_timeout.is_zero() {
            return Err(AnthropicConfigError::ZeroTimeout);
        }
        config
            .limits
            .check()
            .map_err(AnthropicConfigError::Limits)?;
        let api_key = match config.api_key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => {
                let mut value =
                    HeaderValue::from_str(key).map_err(|_| AnthropicConfigError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client = http::client(&endpoint, config.connect_timeout)
            .map_err(AnthropicConfigError::Client)?;
        Ok(Self {
            client,
            endpoint,
            api_key,
            models: config.models,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            limits: config.limits,
        })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let max_tokens = self
            .limits
            .tokens_for(&request.model, request.max_output_tokens);
        let body = serde_json::to_vec(&request_body(&request, max_tokens))
            .map_err(|e| ModelError::Rejected(format!("could not encode the request: {e}")))?;
        let mut http = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .header(
                HeaderName::from_static("anthropic-version"),
                ANTHROPIC_VERSION,
            )
            .body(body);
        if let Some(key) = &self.api_key {
            http = http.header(HeaderName::from_static("x-api-key"), key.clone());
        }
        // The `chat` span's W3C context, so the provider's side of the
        // call joins the trace (nothing is added without telemetry).
        let mut trace = reqwest::header::HeaderMap::new();
        crate::telemetry::inject_trace_context(&mut trace);
        if !trace.is_empty() {
            http = http.headers(trace);
        }
        tracing::debug!(model = %request.model, endpoint = %self.endpoint, "starting anthropic message");
        let response = http::send_for_stream(http, self.connect_timeout, self.idle_timeout).await?;
        Ok(http::sse_stream(
            response,
            self.idle_timeout,
            EventDecoder::default(),
        ))
    }

    fn serves(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    }

    fn max_output_tokens_limit(&self, _model: &str) -> Option<u32> {
        Some(self.limits.max_tokens_limit)
    }

    fn max_step_output_bytes(&self, _model: &str) -> usize {
        self.limits.max_output_bytes
    }
}

fn thinking_budget(level: Option<ThinkingLevel>) -> Option<u32> {
    match level? {
        ThinkingLevel::None => None,
        ThinkingLevel::Minimal => Some(1024),
        ThinkingLevel::Low => Some(2048),
        ThinkingLevel::Medium => Some(8192),
        ThinkingLevel::High => Some(16384),
        ThinkingLevel::XHigh => Some(32000),
    }
}

fn request_body(request: &ModelRequest, max_tokens: u32) -> Value {
    let budget = thinking_budget(request.thinking);
    // The budget counts against max_tokens and must stay below it; the
    // configured amount is kept as room for the answer itself.
    let max_tokens = match budget {
        Some(budget) if max_tokens <= budget => budget.saturating_add(max_tokens),
        _ => max_tokens,
    };
    let mut body = json!({
        "model": request.model,
        "max_tokens": max_tokens,
        "stream": true,
        "messages": wire_messages(request),
    });
    if let Some(system) = request.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        body["system"] = json!(system);
    }
    if let Some(budget) = budget {
        body["thinking"] = json!({ "type": "enabled", "budget_tokens": budget });
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "description": t.description,
                    "input_schema": t.parameters,
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    body
}

/// The history as Anthropic messages: roles alternate (consecutive
/// same-role messages are merged) and empty messages are left out.
fn wire_messages(request: &ModelRequest) -> Vec<Value> {
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in request.messages.iter() {
        let content = &message.body.content;
        let (role, blocks) = match message.body.role {
            Role::User => ("user", user_blocks(content)),
            Role::Assistant => ("assistant", assistant_blocks(content)),
            Role::Tool => ("user", content.iter().filter_map(tool_result).collect()),
            Role::Summary => (
                "user",
                text_block(format!(
                    "Summary of earlier conversation:\n{}",
                    flatten_text(content)
                )),
            ),
            Role::Notice => (
                "user",
                text_block(format!("Runtime notice: {}", flatten_text(content))),
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    turns
        .into_iter()
        .map(|(role, content)| json!({ "role": role, "content": content }))
        .collect()
}

fn text_block(text: String) -> Vec<Value> {
    vec![json!({ "type": "text", "text": text })]
}

/// Empty text blocks are rejected by the API, so they are skipped.
fn user_blocks(content: &[ContentBlock]) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({ "type": "text", "text": text }))
            }
            ContentBlock::Image { data, mime_type } => Some(json!({
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": mime_type,
                    "data": STANDARD.encode(data),
                },
            })),
            _ => None,
        })
        .collect()
}

/// Thinking goes back only with its signature (the API rejects unsigned
/// thinking); tool calls carry their arguments as a JSON object.
fn assistant_blocks(content: &[ContentBlock]) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({ "type": "text", "text": text }))
            }
            ContentBlock::Thinking {
                thinking,
                signature,
            } if !signature.is_empty() => Some(json!({
                "type": "thinking",
                "thinking": thinking,
                "signature": signature,
            })),
            ContentBlock::ToolCall {
                id,
                name,
                arguments_json,
            } => {
                // `input` must be an object; anything else the model produced
                // cannot be replayed as is.
                let input = serde_json::from_str::<Value>(arguments_json)
                    .ok()
                    .filter(Value::is_object)
                    .unwrap_or_else(|| json!({}));
                Some(json!({ "type": "tool_use", "id": id, "name": name, "input": input }))
            }
            _ => None,
        })
        .collect()
}

fn tool_result(block: &ContentBlock) -> Option<Value> {
    let ContentBlock::ToolResult {
        call_id,
        content,
        is_error,
        ..
    } = block
    else {
        return None;
    };
    Some(json!({
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": content,
        "is_error": is_error,
    }))
}

/// A content block being streamed.
enum Block {
    Text,
    Thinking {
        signature: String,
    },
    ToolUse {
        id: String,
        name: String,
        json: String,
    },
    /// A block type this provider does not relay (e.g. `redacted_thinking`).
    Other,
}

fn stop_reason(wire: &str) -> StopReason {
    match wire {
        "max_tokens" => StopReason::Length,
        "tool_use" => StopReason::ToolUse,
        // "end_turn", "stop_sequence", "refusal", "pause_turn", ...: the
        // model is done talking.
        _ => StopReason::Stop,
    }
}

/// The decoding state of one Messages stream.
#[derive(Default)]
struct EventDecoder {
    decoded: VecDeque<ModelEvent>,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<StopReason>,
    usage: Option<WireUsage>,
    /// Set at `message_stop`.
    done: bool,
}

impl SseDecoder for EventDecoder {
    const END: &'static str = "message_stop";

    fn decode(&mut self, event: SseEvent) -> Result<bool, ModelError> {
        let data = event.data.trim();
        if data.is_empty() {
            return Ok(false);
        }
        let value: Value = serde_json::from_str(data).map_err(|e| {
            tracing::debug!(event = %truncated(data), "unparseable model stream event");
            ModelError::Malformed(format!("a stream event is not valid JSON: {e}"))
        })?;
        // The data repeats the event name as `type`; prefer it.
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or(event.event)
            .unwrap_or_default();
        self.on_event(&kind, &value)?;
        Ok(self.done)
    }

    fn next_decoded(&mut self) -> Option<ModelEvent> {
        self.decoded.pop_front()
    }
}

impl EventDecoder {
    fn on_event(&mut self, kind: &str, data: &Value) -> Result<(), ModelError> {
        match kind {
            "message_start" => {
                if let Some(usage) = data.pointer("/message/usage") {
                    self.on_usage(usage);
                    if let Some(usage) = &mut self.usage {
                        // A placeholder (usually 1) until message_delta.
                        usage.output = 0;
                    }
                    self.relay_usage();
                }
            }
            "content_block_start" => {
                let index = block_index(data)?;
                if self.blocks.len() >= MAX_BLOCKS && !self.blocks.contains_key(&index) {
                    return Err(ModelError::Malformed(format!(
                        "more than {MAX_BLOCKS} content blocks in one step"
                    )));
                }
                let block = data.get("content_block").unwrap_or(&Value::Null);
                let str_field = |name: &str| {
                    block
                        .get(name)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                let block = match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        self.push_text(str_field("text"));
                        Block::Text
                    }
                    Some("thinking") => {
                        let thinking = str_field("thinking");
                        if !thinking.is_empty() {
                            self.decoded.push_back(ModelEvent::ReasoningDelta(thinking));
                        }
                        Block::Thinking {
                            signature: str_field("signature"),
                        }
                    }
                    Some("tool_use") => Block::ToolUse {
                        id: str_field("id"),
                        name: str_field("name"),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let index = block_index(data)?;
                let delta = data.get("delta").unwrap_or(&Value::Null);
                let str_field = |name: &str| delta.get(name).and_then(Value::as_str);
                let block = self.blocks.get_mut(&index).ok_or_else(|| {
                    ModelError::Malformed(format!("a delta for unstarted block {index}"))
                })?;
                match (delta.get("type").and_then(Value::as_str), block) {
                    (Some("text_delta"), _) => {
                        let text = str_field("text").unwrap_or_default().to_owned();
                        self.push_text(text);
                    }
                    (Some("thinking_delta"), _) => {
                        let thinking = str_field("thinking").unwrap_or_default();
                        if !thinking.is_empty() {
                            self.decoded
                                .push_back(ModelEvent::ReasoningDelta(thinking.to_owned()));
                        }
                    }
                    (Some("signature_delta"), Block::Thinking { signature }) => {
                        signature.push_str(str_field("signature").unwrap_or_default());
                        if signature.len() > MAX_SIGNATURE_BYTES {
                            return Err(ModelError::Malformed(
                                "a thinking signature is too large".into(),
                            ));
                        }
                    }
                    (Some("input_json_delta"), Block::ToolUse { json, .. }) => {
                        json.push_str(str_field("partial_json").unwrap_or_default());
                        if json.len() > MAX_TOOL_ARGUMENT_BYTES {
                            return Err(ModelError::Malformed("a tool call is too large".into()));
                        }
                    }
                    // Deltas this provider does not relay (e.g. citations).
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = block_index(data)?;
                match self.blocks.remove(&index) {
                    Some(Block::Thinking { signature }) if !signature.is_empty() => {
                        self.decoded
                            .push_back(ModelEvent::ThinkingSignature(signature));
                    }
                    Some(Block::ToolUse { id, name, json }) => {
                        if id.is_empty() || name.is_empty() {
                            return Err(ModelError::Malformed(
                                "a tool call arrived without an id or a name".into(),
                            ));
                        }
                        let arguments_json = if json.trim().is_empty() {
                            "{}".to_owned()
                        } else {
                            json
                        };
                        // Input that is not JSON is passed on: the runtime
                        // does not run the call and tells the model why.
                        self.decoded.push_back(ModelEvent::ToolCall {
                            id,
                            name,
                            arguments_json,
                        });
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = data.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(stop_reason(reason));
                }
                if let Some(usage) = data.get("usage") {
                    self.on_usage(usage);
                    self.relay_usage();
                }
            }
            "message_stop" => {
                self.done = true;
                let reason = self.stop_reason.unwrap_or(StopReason::Stop);
                self.decoded.push_back(ModelEvent::Finished(reason));
            }
            "error" => {
                let kind = data
                    .pointer("/error/type")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                tracing::debug!(error = %truncated(&data.to_string()), "model upstream error mid-stream");
                let message = format!("the upstream reported {kind:?} mid-stream");
                return Err(match kind {
                    "overloaded_error" | "api_error" => ModelError::Unavailable(message),
                    "rate_limit_error" => ModelError::RateLimited(message),
                    _ => ModelError::Malformed(message),
                });
            }
            // "ping" and event types added later.
            _ => {}
        }
        Ok(())
    }

    fn push_text(&mut self, text: String) {
        if !text.is_empty() {
            self.decoded.push_back(ModelEvent::TextDelta(text));
        }
    }

    /// Queues the usage known so far.
    fn relay_usage(&mut self) {
        if let Some(usage) = &self.usage {
            self.decoded.push_back(ModelEvent::Usage(usage.into()));
        }
    }

    /// Usage fields are cumulative: whatever an event carries replaces
    /// what came before.
    fn on_usage(&mut self, wire: &Value) {
        let usage = self.usage.get_or_insert_with(WireUsage::default);
        for (name, slot) in [
            ("input_tokens", &mut usage.input),
            ("cache_read_input_tokens", &mut usage.cache_read),
            ("cache_creation_input_tokens", &mut usage.cache_write),
            ("output_tokens", &mut usage.output),
        ] {
            if let Some(value) = wire.get(name).and_then(Value::as_u64) {
                *slot = value;
            }
        }
    }
}

/// Token counts as the API reports them: `input_tokens` excludes the cached
/// and cache-writing parts of the prompt.
#[derive(Default)]
struct WireUsage {
    input: u64,
    cache_read: u64,
    cache_write: u64,
    output: u64,
}

impl From<&WireUsage> for Usage {
    /// [`Usage::input_tokens`] counts the whole prompt, cached or not.
    fn from(u: &WireUsage) -> Self {
        Self {
            input_tokens: u
                .input
                .saturating_add(u.cache_read)
                .saturating_add(u.cache_write),
            output_tokens: u.output,
            reasoning_tokens: 0,
            cached_input_tokens: u.cache_read,
        }
    }
}

fn block_index(data: &Value) -> Result<u64, ModelError> {
    data.get("index")
        .and_then(Value::as_u64)
        .ok_or_else(|| ModelError::Malformed("a content block event without an index".into()))
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use serde_json::json;

    use super::*;
    use crate::model::ToolSpec;
    use crate::model::fake_anthropic::{
        FakeAnthropic, FakeReply, block_stop, error_event, input_json_delta, message_delta,
        message_start, message_stop, ping, signature_delta, slice_bytes, stream, text_delta,
        text_start, thinking_delta, thinking_start, tool_use_start,
    };
    use crate::model::test_support::{self, GUARD, Item, message, run};

    fn config(fake: &FakeAnthropic) -> AnthropicConfig {
        AnthropicConfig {
            api_key: Some("sk-ant-test-secret".into()),
            idle_timeout: Duration::from_secs(5),
            ..AnthropicConfig::new(fake.base_url())
        }
    }

    fn request(text: &str) -> ModelRequest {
        test_support::request("claude-test", text)
    }

    async fn run_script(reply: FakeReply) -> (FakeAnthropic, Result<Vec<Item>, ModelError>) {
        let fake = FakeAnthropic::start(vec![reply]).await;
        let provider = AnthropicProvider::new(config(&fake)).unwrap();
        let result = run(&provider, request("hello")).await;
        (fake, result)
    }

    fn ok_events(items: Vec<Item>) -> Vec<ModelEvent> {
        items.into_iter().map(Result::unwrap).collect()
    }

    fn happy_body() -> Vec<u8> {
        [
            message_start(12, 4),
            ping(),
            thinking_start(0),
            thinking_delta(0, "Thinking é"),
            signature_delta(0, "sig-abc"),
            block_stop(0),
            text_start(1),
            text_delta(1, "Hel"),
            text_delta(1, ""),
            text_delta(1, "lo 🎉"),
            block_stop(1),
            tool_use_start(2, "toolu_1", "ls"),
            input_json_delta(2, ""),
            input_json_delta(2, r#"{"pa"#),
            input_json_delta(2, r#"th": "/tmp"}"#),
            block_stop(2),
            tool_use_start(3, "toolu_2", "pwd"),
            block_stop(3),
            message_delta("tool_use", 42),
            message_stop(),
        ]
        .concat()
    }

    fn happy_events() -> Vec<ModelEvent> {
        vec![
            // The input is relayed at once, the output only once counted.
            ModelEvent::Usage(Usage {
                input_tokens: 16,
                output_tokens: 0,
                reasoning_tokens: 0,
                cached_input_tokens: 4,
            }),
            ModelEvent::ReasoningDelta("Thinking é".into()),
            ModelEvent::ThinkingSignature("sig-abc".into()),
            ModelEvent::TextDelta("Hel".into()),
            ModelEvent::TextDelta("lo 🎉".into()),
            ModelEvent::ToolCall {
                id: "toolu_1".into(),
                name: "ls".into(),
                arguments_json: r#"{"path": "/tmp"}"#.into(),
            },
            ModelEvent::ToolCall {
                id: "toolu_2".into(),
                name: "pwd".into(),
                arguments_json: "{}".into(),
            },
            ModelEvent::Usage(Usage {
                input_tokens: 16,
                output_tokens: 42,
                reasoning_tokens: 0,
                cached_input_tokens: 4,
            }),
            ModelEvent::Finished(StopReason::ToolUse),
        ]
    }

    #[tokio::test]
    async fn relays_thinking_signature_text_tool_calls_and_usage() {
        let (_fake, items) = run_script(stream(vec![happy_body()])).await;
        assert_eq!(ok_events(items.unwrap()), happy_events());
    }

    #[tokio::test]
    async fn one_byte_slices_give_the_same_events_as_whole_chunks() {
        let (_fake, items) = run_script(stream(slice_bytes(&happy_body(), 1))).await;
        assert_eq!(ok_events(items.unwrap()), happy_events());
    }

    #[tokio::test]
    async fn stop_reasons_map() {
        for (wire, expected) in [
            ("end_turn", StopReason::Stop),
            ("stop_sequence", StopReason::Stop),
            ("max_tokens", StopReason::Length),
            ("tool_use", StopReason::ToolUse),
        ] {
            let (_fake, items) =
                run_script(stream(vec![message_delta(wire, 1), message_stop()])).await;
            let events = ok_events(items.unwrap());
            assert_eq!(events.last(), Some(&ModelEvent::Finished(expected)));
        }
    }

    #[tokio::test]
    async fn body_cut_before_message_stop_is_truncated() {
        let (_fake, items) = run_script(stream(vec![
            message_start(1, 0),
            text_start(0),
            text_delta(0, "par"),
            block_stop(0),
            message_delta("end_turn", 2),
        ]))
        .await;
        let items = items.unwrap();
        let usage = |output_tokens| {
            ModelEvent::Usage(Usage {
                input_tokens: 1,
                output_tokens,
                ..Usage::default()
            })
        };
        assert_eq!(items.len(), 4, "{items:?}");
        assert_eq!(items[0].as_ref().unwrap(), &usage(0));
        assert_eq!(
            items[1].as_ref().unwrap(),
            &ModelEvent::TextDelta("par".into())
        );
        assert_eq!(items[2].as_ref().unwrap(), &usage(2));
        assert!(
            matches!(items[3], Err(ModelError::Truncated(_))),
            "{items:?}"
        );
    }

    #[tokio::test]
    async fn tool_input_that_is_not_json_is_passed_on_for_the_runtime_to_refuse() {
        let (_fake, items) = run_script(stream(vec![
            tool_use_start(0, "toolu_1", "ls"),
            input_json_delta(0, r#"{"path": "#),
            block_stop(0),
            message_stop(),
        ]))
        .await;
        assert_eq!(
            ok_events(items.unwrap()),
            vec![
                ModelEvent::ToolCall {
                    id: "toolu_1".into(),
                    name: "ls".into(),
                    arguments_json: r#"{"path": "#.into(),
                },
                ModelEvent::Finished(StopReason::Stop),
            ]
        );
    }

    #[tokio::test]
    async fn error_events_map_by_type() {
        for (kind, check) in [
            (
                "overloaded_error",
                (|e: &ModelError| matches!(e, ModelError::Unavailable(_)))
                    as fn(&ModelError) -> bool,
            ),
            ("rate_limit_error", |e| {
                matches!(e, ModelError::RateLimited(_))
            }),
            ("invalid_request_error", |e| {
                matches!(e, ModelError::Malformed(_))
            }),
        ] {
            let (_fake, items) = run_script(stream(vec![
                text_start(0),
                text_delta(0, "a"),
                error_event(kind),
                message_stop(),
            ]))
            .await;
            let items = items.unwrap();
            assert_eq!(items.len(), 2, "{items:?}");
            let err = items[1].as_ref().unwrap_err();
            assert!(check(err), "{kind}: {err:?}");
            assert!(!format!("{err:?}").contains("upstream-error-secret"));
        }
    }

    #[tokio::test]
    async fn http_statuses_map_to_errors_without_body_or_key() {
        for code in [529, 500, 503, 408, 409, 429, 401, 403, 400, 404] {
            let (_fake, result) = run_script(FakeReply::Status {
                code,
                body: r#"{"type":"error","error":{"message":"upstream-body-secret"}}"#.into(),
            })
            .await;
            let err = result.expect_err("a refusal must fail stream()");
            let matches_kind = match code {
                429 => matches!(err, ModelError::RateLimited(_)),
                401 | 403 => matches!(err, ModelError::Unauthorized(_)),
                408 | 409 | 500 | 503 | 529 => matches!(err, ModelError::Unavailable(_)),
                _ => matches!(err, ModelError::Rejected(_)),
            };
            assert!(matches_kind, "HTTP {code} gave {err:?}");
            let text = format!("{err} {err:?}");
            assert!(
                !text.contains("upstream-body-secret") && !text.contains("sk-ant"),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn request_carries_headers_model_system_thinking_and_tools() {
        let fake = FakeAnthropic::start(vec![stream(vec![message_stop()])]).await;
        let provider = AnthropicProvider::new(config(&fake)).unwrap();
        let mut req = request("what is up");
        req.thinking = Some(ThinkingLevel::High);
        req.tools = vec![ToolSpec {
            name: "ls".into(),
            description: "lists".into(),
            parameters: json!({ "type": "object" }),
        }];
        run(&provider, req).await.unwrap();

        let recorded = fake.requests();
        assert_eq!(recorded.len(), 1);
        let r = &recorded[0];
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/messages")
        );
        assert_eq!(r.header("x-api-key"), Some("sk-ant-test-secret"));
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("authorization"), None);
        assert_eq!(r.body["model"], "claude-test");
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.body["system"], "be brief");
        assert_eq!(
            r.body["thinking"],
            json!({ "type": "enabled", "budget_tokens": 16384 })
        );
        assert!(r.body["max_tokens"].as_u64().unwrap() > 16384);
        assert_eq!(
            r.body["tools"],
            json!([{ "name": "ls", "description": "lists", "input_schema": { "type": "object" } }])
        );
        assert_eq!(
            r.body["messages"],
            json!([{ "role": "user", "content": [{ "type": "text", "text": "what is up" }] }])
        );
    }

    #[tokio::test]
    async fn thinking_signature_is_sent_back_in_the_next_request() {
        let fake = FakeAnthropic::start(vec![stream(vec![message_stop()])]).await;
        let provider = AnthropicProvider::new(AnthropicConfig::new(fake.base_url() + "/")).unwrap();
        let mut req = request("first");
        req.system_prompt = None;
        std::sync::Arc::make_mut(&mut req.messages).push(message(
            Role::Assistant,
            vec![
                ContentBlock::Thinking {
                    thinking: "hmm".into(),
                    signature: "sig-abc".into(),
                },
                ContentBlock::text("answer"),
            ],
        ));
        std::sync::Arc::make_mut(&mut req.messages)
            .push(message(Role::User, vec![ContentBlock::text("second")]));
        run(&provider, req).await.unwrap();
        let r = &fake.requests()[0];
        assert_eq!(r.path, "/v1/messages");
        assert_eq!(r.header("x-api-key"), None);
        assert!(r.body.get("system").is_none() && r.body.get("thinking").is_none());
        assert_eq!(r.body["max_tokens"], 4096);
        assert_eq!(
            r.body["messages"][1],
            json!({ "role": "assistant", "content": [
                { "type": "thinking", "thinking": "hmm", "signature": "sig-abc" },
                { "type": "text", "text": "answer" },
            ]})
        );
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_connection() {
        let fake = FakeAnthropic::start(vec![FakeReply::Sse {
            chunks: vec![text_start(0), text_delta(0, "hi")],
            done: false,
            then_hang: true,
        }])
        .await;
        let provider = AnthropicProvider::new(config(&fake)).unwrap();
        let mut stream = provider.stream(request("hi")).await.unwrap();
        let first = tokio::time::timeout(GUARD, stream.next()).await.unwrap();
        assert_eq!(first.unwrap().unwrap(), ModelEvent::TextDelta("hi".into()));
        drop(stream);
        tokio::time::timeout(GUARD, fake.wait_clients_gone(1))
            .await
            .unwrap();
    }

    #[test]
    fn history_maps_roles_images_tool_use_results_and_merges_turns() {
        let req = ModelRequest {
            model: "m".into(),
            system_prompt: None,
            messages: std::sync::Arc::new(vec![
                message(Role::Summary, vec![ContentBlock::text("earlier")]),
                message(
                    Role::User,
                    vec![
                        ContentBlock::text("look"),
                        ContentBlock::Image {
                            data: vec![1, 2, 3],
                            mime_type: "image/png".into(),
                        },
                    ],
                ),
                message(
                    Role::Assistant,
                    vec![
                        ContentBlock::Thinking {
                            thinking: "unsigned".into(),
                            signature: String::new(),
                        },
                        ContentBlock::ToolCall {
                            id: "c1".into(),
                            name: "ls".into(),
                            arguments_json: r#"{"path":"/"}"#.into(),
                        },
                    ],
                ),
                message(
                    Role::Tool,
                    vec![ContentBlock::ToolResult {
                        call_id: "c1".into(),
                        name: "ls".into(),
                        content: "denied".into(),
                        is_error: true,
                    }],
                ),
                message(
                    Role::Assistant,
                    vec![ContentBlock::Thinking {
                        thinking: "only unsigned thoughts".into(),
                        signature: String::new(),
                    }],
                ),
                message(Role::Notice, vec![ContentBlock::text("turn timed out")]),
            ]),
            thinking: Some(ThinkingLevel::XHigh),
            tools: Vec::new(),
            ..Default::default()
        };
        let body = request_body(&req, 4096);
        assert_eq!(body["thinking"]["budget_tokens"], 32000);
        assert_eq!(body["max_tokens"], 32000 + 4096);
        assert_eq!(
            body["messages"],
            json!([
                { "role": "user", "content": [
                    { "type": "text", "text": "Summary of earlier conversation:\nearlier" },
                    { "type": "text", "text": "look" },
                    { "type": "image", "source": {
                        "type": "base64", "media_type": "image/png", "data": "AQID",
                    }},
                ]},
                { "role": "assistant", "content": [
                    { "type": "tool_use", "id": "c1", "name": "ls", "input": { "path": "/" } },
                ]},
                { "role": "user", "content": [
                    { "type": "tool_result", "tool_use_id": "c1", "content": "denied", "is_error": true },
                    { "type": "text", "text": "Runtime notice: turn timed out" },
                ]},
            ])
        );
    }

    #[test]
    fn config_is_validated_and_the_key_never_printed() {
        let bad = |url: &str| AnthropicProvider::new(AnthropicConfig::new(url)).unwrap_err();
        assert!(matches!(
            bad("ftp://x/v1"),
            AnthropicConfigError::InvalidBaseUrl { .. }
        ));
        assert!(matches!(
            bad("http://x/v1?a=b"),
            AnthropicConfigError::InvalidBaseUrl { .. }
        ));
        let config = AnthropicConfig {
            api_key: Some("sk-ant-test-secret".into()),
            models: Some(vec!["a".into()]),
            ..AnthropicConfig::new("https://api.anthropic.com/v1")
        };
        assert!(!format!("{config:?}").contains("sk-ant"));
        let provider = AnthropicProvider::new(config).unwrap();
        assert!(!format!("{provider:?}").contains("sk-ant"));
        assert!(provider.serves("a") && !provider.serves("b"));
        let zero = AnthropicConfig {
            limits: OutputLimits {
                max_tokens: 0,
                ..OutputLimits::default()
            },
            ..AnthropicConfig::new("http://localhost:1/v1")
        };
        assert!(matches!(
            AnthropicProvider::new(zero).unwrap_err(),
            AnthropicConfigError::Limits(e) if e.contains("max_tokens")
        ));
        let bad_key = AnthropicConfig {
            api_key: Some("line\nbreak".into()),
            ..AnthropicConfig::new("http://localhost:1/v1")
        };
        assert_eq!(
            AnthropicProvider::new(bad_key).unwrap_err(),
            AnthropicConfigError::InvalidApiKey
        );
    }
}
