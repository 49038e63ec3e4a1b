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

use crate::types::MediaSupport;

/// What its models read unless configured.
const DEFAULT_READS: MediaSupport = MediaSupport {
    images: true,
    pdf: true,
};

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::HeaderName;
use serde_json::{Value, json};

use super::endpoint::{Endpoint, EndpointConfig, EndpointError};
use super::http::{SseDecoder, truncated};
use super::sse::SseEvent;
use super::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use crate::types::{ContentBlock, Role, Speaker, StopReason, ThinkingLevel, Usage, flatten_text};

/// The API version this provider speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// Bounds on what one step may hold, so a misbehaving upstream cannot grow
/// memory without limit.
const MAX_BLOCKS: usize = 1024;
const MAX_TOOL_ARGUMENT_BYTES: usize = 1 << 20;
const MAX_SIGNATURE_BYTES: usize = 1 << 20;

/// Settings of one Anthropic Messages endpoint.
#[derive(Debug, Clone)]
pub struct AnthropicConfig {
    /// Where it is, the key (sent as `x-api-key`), the timeouts, the
    /// models served, and the output limits: the `max_tokens` of each
    /// request (raised above the thinking budget when thinking is enabled).
    pub endpoint: EndpointConfig,
}

impl AnthropicConfig {
    /// The settings of `endpoint`.
    pub fn new(endpoint: EndpointConfig) -> Self {
        Self { endpoint }
    }
}

/// A provider for one Anthropic Messages endpoint.
#[derive(Debug)]
pub struct AnthropicProvider {
    endpoint: Endpoint,
}

impl AnthropicProvider {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: AnthropicConfig) -> Result<Self, EndpointError> {
        let key_header = HeaderName::from_static("x-api-key");
        let endpoint = Endpoint::new(config.endpoint, "messages", key_header, str::to_owned)?;
        Ok(Self { endpoint })
    }
}

#[async_trait]
impl ModelProvider for AnthropicProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let max_tokens = self
            .endpoint
            .limits()
            .tokens_for(&request.model, request.max_output_tokens);
        let body = serde_json::to_vec(&request_body(&request, max_tokens))
            .map_err(|e| ModelError::Rejected(format!("could not encode the request: {e}")))?;
        let http = self.endpoint.post(body).header(
            HeaderName::from_static("anthropic-version"),
            ANTHROPIC_VERSION,
        );
        tracing::debug!(model = %request.model, endpoint = %self.endpoint.url(), "starting anthropic message");
        self.endpoint.stream(http, EventDecoder::default()).await
    }

    fn serves(&self, model: &str) -> bool {
        self.endpoint.serves(model)
    }

    fn media_support(&self, model: &str) -> MediaSupport {
        self.endpoint.reads(model, DEFAULT_READS)
    }

    fn max_output_tokens_limit(&self, _model: &str) -> Option<u32> {
        Some(self.endpoint.limits().max_tokens_limit)
    }

    fn max_step_output_bytes(&self, _model: &str) -> usize {
        self.endpoint.limits().max_output_bytes
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
            Role::User => ("user", user_blocks(content, message.body.speaker.as_ref())),
            Role::Assistant => ("assistant", assistant_blocks(content)),
            Role::Tool => ("user", tool_results(content)),
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

/// Empty text blocks are rejected by the API, so they are skipped. The API
/// has no author name: a group session's `speaker` prefixes the first text
/// block (`[Alice]: …`), or leads as a text block of its own when the
/// message has no text.
fn user_blocks(content: &[ContentBlock], speaker: Option<&Speaker>) -> Vec<Value> {
    let mut prefix = speaker.map(Speaker::prefix);
    let mut blocks: Vec<Value> = content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } if !text.is_empty() => match prefix.take() {
                Some(prefix) => Some(json!({ "type": "text", "text": prefix + text })),
                None => Some(json!({ "type": "text", "text": text })),
            },
            other => media_block(other),
        })
        .collect();
    if let Some(prefix) = prefix
        && !blocks.is_empty()
    {
        blocks.insert(0, json!({ "type": "text", "text": prefix.trim_end() }));
    }
    blocks
}

/// An image as an image block, a PDF as a document block.
fn media_block(block: &ContentBlock) -> Option<Value> {
    match block {
        ContentBlock::Image { data, mime_type } => Some(json!({
            "type": "image",
            "source": {
                "type": "base64",
                "media_type": mime_type,
                "data": STANDARD.encode(data),
            },
        })),
        ContentBlock::File {
            data,
            mime_type,
            name,
        } => {
            let mut document = json!({
                "type": "document",
                "source": {
                    "type": "base64",
                    "media_type": mime_type,
                    "data": STANDARD.encode(data),
                },
            });
            if !name.is_empty() {
                document["title"] = json!(name);
            }
            Some(document)
        }
        _ => None,
    }
}

/// A tool message's result, with the images and documents that follow it
/// in the message (what the tool returned) inside its content.
fn tool_results(content: &[ContentBlock]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for block in content {
        if let Some(result) = tool_result(block) {
            out.push(result);
        } else if let (Some(media), Some(last)) = (media_block(block), out.last_mut()) {
            let text = last["content"].take();
            let mut parts = match text {
                Value::Array(parts) => parts,
                Value::String(text) if text.is_empty() => Vec::new(),
                Value::String(text) => vec![json!({ "type": "text", "text": text })],
                _ => Vec::new(),
            };
            parts.push(media);
            last["content"] = Value::Array(parts);
        }
    }
    out
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
pub(crate) struct EventDecoder {
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
mod tests;
