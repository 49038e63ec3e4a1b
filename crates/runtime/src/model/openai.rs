//! OpenAI-compatible Chat Completions streaming over HTTP (OpenAI itself,
//! vLLM, llama.cpp's server, Ollama, LiteLLM, ...).
//!
//! One model step is one `POST {base_url}/chat/completions` with
//! `stream: true`; the `text/event-stream` answer is parsed with
//! [`SseParser`](super::sse::SseParser). A step only counts as finished once
//! `data: [DONE]` arrives: servers send usage after the finish reason, so a
//! body that ends earlier is reported as truncated.
//!
//! Every request carries a `max_tokens` (see
//! [`OutputLimits`](super::OutputLimits)), and asks
//! for usage with `stream_options.include_usage`, which servers send only
//! at the end: a usage object is relayed as soon as it arrives, and for a
//! step that ends earlier the runtime estimates the output tokens (see
//! [`ModelEvent::Usage`]).

use std::collections::VecDeque;

use crate::types::MediaSupport;

/// What its models read unless configured.
const DEFAULT_READS: MediaSupport = MediaSupport {
    images: true,
    pdf: false,
};

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::AUTHORIZATION;
use serde::Deserialize;
use serde_json::{Value, json};

use super::endpoint::{Endpoint, EndpointConfig, EndpointError};
use super::http::{SseDecoder, truncated};
use super::sse::SseEvent;
use super::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use crate::types::{ContentBlock, Role, StopReason, ThinkingLevel, Usage, flatten_text};

/// Settings of one OpenAI-compatible endpoint.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Where it is, the key (sent as `Authorization: Bearer <key>`), the
    /// timeouts, the models served and the output limits.
    pub endpoint: EndpointConfig,
    /// The request field the token budget goes in.
    pub max_tokens_param: MaxTokensParam,
}

/// The request field that carries the token budget.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MaxTokensParam {
    /// `max_tokens`: what every compatible server (vLLM, llama.cpp,
    /// Ollama, LiteLLM) reads. Default.
    #[default]
    MaxTokens,
    /// `max_completion_tokens`: what OpenAI's reasoning models require
    /// (they reject `max_tokens`).
    MaxCompletionTokens,
}

impl MaxTokensParam {
    fn field(self) -> &'static str {
        match self {
            Self::MaxTokens => "max_tokens",
            Self::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

impl OpenAiConfig {
    /// `endpoint` with the default [`MaxTokensParam`] (`max_tokens`).
    pub fn new(endpoint: EndpointConfig) -> Self {
        Self {
            endpoint,
            max_tokens_param: MaxTokensParam::default(),
        }
    }
}

/// A provider for one OpenAI-compatible endpoint.
#[derive(Debug)]
pub struct OpenAiProvider {
    endpoint: Endpoint,
    max_tokens_param: MaxTokensParam,
}

impl OpenAiProvider {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, EndpointError> {
        let endpoint = Endpoint::new(config.endpoint, "chat/completions", AUTHORIZATION, |key| {
            format!("Bearer {key}")
        })?;
        Ok(Self {
            endpoint,
            max_tokens_param: config.max_tokens_param,
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let max_tokens = self
            .endpoint
            .limits()
            .tokens_for(&request.model, request.max_output_tokens);
        let mut body = request_body(&request);
        body[self.max_tokens_param.field()] = json!(max_tokens);
        let body = serde_json::to_vec(&body)
            .map_err(|e| ModelError::Rejected(format!("could not encode the request: {e}")))?;
        let http = self.endpoint.post(body);
        tracing::debug!(model = %request.model, endpoint = %self.endpoint.url(), "starting chat completion");
        self.endpoint.stream(http, ChunkDecoder::default()).await
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

fn request_body(request: &ModelRequest) -> Value {
    let mut body = json!({
        "model": request.model,
        "stream": true,
        "stream_options": { "include_usage": true },
        "messages": wire_messages(request),
    });
    let effort = match request.thinking {
        None | Some(ThinkingLevel::None) => None,
        Some(ThinkingLevel::Minimal) => Some("minimal"),
        Some(ThinkingLevel::Low) => Some("low"),
        Some(ThinkingLevel::Medium) => Some("medium"),
        // The Chat Completions API knows no effort above "high".
        Some(ThinkingLevel::High | ThinkingLevel::XHigh) => Some("high"),
    };
    if let Some(effort) = effort {
        body["reasoning_effort"] = json!(effort);
    }
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                })
            })
            .collect();
        body["tools"] = Value::Array(tools);
    }
    body
}

fn wire_messages(request: &ModelRequest) -> Vec<Value> {
    let mut out = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = request.system_prompt.as_deref().filter(|s| !s.is_empty()) {
        out.push(json!({ "role": "system", "content": system }));
    }
    // Media tool results returned: the API's tool messages carry text
    // only, so they follow the run of tool messages as one user message.
    let mut tool_media: Vec<Value> = Vec::new();
    for message in request.messages.iter() {
        let content = &message.body.content;
        if message.body.role != Role::Tool && !tool_media.is_empty() {
            out.push(tool_media_message(std::mem::take(&mut tool_media)));
        }
        match message.body.role {
            Role::User => {
                let mut user = json!({ "role": "user", "content": user_content(content) });
                // A group session's speaker, the API's way: a participant
                // name the model can tell apart.
                if let Some(speaker) = &message.body.speaker {
                    user["name"] = Value::String(speaker.wire_name());
                }
                out.push(user);
            }
            Role::Assistant => out.extend(assistant_message(content)),
            Role::Tool => {
                out.extend(content.iter().filter_map(tool_message));
                tool_media.extend(content.iter().filter_map(media_part));
            }
            Role::Summary => out.push(json!({
                "role": "system",
                "content": format!("Summary of earlier conversation:\n{}", flatten_text(content)),
            })),
            Role::Notice => out.push(json!({ "role": "system", "content": flatten_text(content) })),
        }
    }
    if !tool_media.is_empty() {
        out.push(tool_media_message(tool_media));
    }
    out
}

fn tool_media_message(parts: Vec<Value>) -> Value {
    let mut content =
        vec![json!({ "type": "text", "text": "Media the tool calls above returned:" })];
    content.extend(parts);
    json!({ "role": "user", "content": content })
}

/// An image or file block as a content part (image parts; file parts with
/// the bytes as a data URL).
fn media_part(block: &ContentBlock) -> Option<Value> {
    match block {
        ContentBlock::Image { data, mime_type } => Some(json!({
            "type": "image_url",
            "image_url": { "url": format!("data:{mime_type};base64,{}", STANDARD.encode(data)) },
        })),
        ContentBlock::File {
            data,
            mime_type,
            name,
        } => Some(json!({
            "type": "file",
            "file": {
                "filename": if name.is_empty() { "file" } else { name.as_str() },
                "file_data": format!("data:{mime_type};base64,{}", STANDARD.encode(data)),
            },
        })),
        _ => None,
    }
}

/// Text-only content goes as a plain string, which every compatible server
/// accepts; the parts array is only needed for images and files.
fn user_content(content: &[ContentBlock]) -> Value {
    if !content
        .iter()
        .any(|b| matches!(b, ContentBlock::Image { .. } | ContentBlock::File { .. }))
    {
        return Value::String(flatten_text(content));
    }
    let parts: Vec<Value> = content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({ "type": "text", "text": text }))
            }
            other => media_part(other),
        })
        .collect();
    Value::Array(parts)
}

/// Thinking is not sent back: the API has no field for it. An assistant
/// message left with neither text nor tool calls (e.g. a step cancelled
/// while reasoning) is dropped, since servers reject empty ones.
fn assistant_message(content: &[ContentBlock]) -> Option<Value> {
    let text = flatten_text(content);
    let tool_calls: Vec<Value> = content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::ToolCall {
                id,
                name,
                arguments_json,
            } => Some(json!({
                "id": id,
                "type": "function",
                "function": { "name": name, "arguments": arguments_json },
            })),
            _ => None,
        })
        .collect();
    if text.is_empty() && tool_calls.is_empty() {
        return None;
    }
    let mut message = json!({ "role": "assistant", "content": text });
    if !tool_calls.is_empty() {
        if text.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = Value::Array(tool_calls);
    }
    Some(message)
}

/// The API has no error flag for tool results, so failure is said in words.
fn tool_message(block: &ContentBlock) -> Option<Value> {
    let ContentBlock::ToolResult {
        call_id,
        content,
        is_error,
        ..
    } = block
    else {
        return None;
    };
    let content = if *is_error {
        format!("Error: {content}")
    } else {
        content.clone()
    };
    Some(json!({ "role": "tool", "tool_call_id": call_id, "content": content }))
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Vec<WireChoice>,
    usage: Option<WireUsage>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    delta: Option<WireDelta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireDelta {
    content: Option<String>,
    reasoning_content: Option<String>,
    reasoning: Option<String>,
    tool_calls: Option<Vec<WireToolCall>>,
}

/// One fragment of a streamed tool call: the id and name usually come
/// first, the arguments in pieces; `index` says which call it extends.
#[derive(Deserialize)]
struct WireToolCall {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    name: Option<String>,
    arguments: Option<String>,
}

/// A tool call being assembled from fragments.
#[derive(Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// Bounds on what one step's tool calls may hold, so a misbehaving upstream
/// cannot grow memory without limit.
const MAX_TOOL_CALLS: usize = 128;
const MAX_TOOL_ARGUMENT_BYTES: usize = 1 << 20;

#[derive(Deserialize)]
struct WireUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    completion_tokens_details: Option<WireCompletionDetails>,
    prompt_tokens_details: Option<WirePromptDetails>,
}

#[derive(Deserialize)]
struct WireCompletionDetails {
    reasoning_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct WirePromptDetails {
    cached_tokens: Option<u64>,
}

impl From<WireUsage> for Usage {
    fn from(u: WireUsage) -> Self {
        Self {
            input_tokens: u.prompt_tokens.unwrap_or(0),
            output_tokens: u.completion_tokens.unwrap_or(0),
            reasoning_tokens: u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            cached_input_tokens: u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        }
    }
}

fn stop_reason(finish_reason: &str) -> StopReason {
    match finish_reason {
        "length" => StopReason::Length,
        "tool_calls" | "function_call" => StopReason::ToolUse,
        // "stop", "content_filter" and server-specific reasons all mean the
        // model is done talking.
        _ => StopReason::Stop,
    }
}

/// The decoding state of one Chat Completions stream.
#[derive(Default)]
pub(crate) struct ChunkDecoder {
    decoded: VecDeque<ModelEvent>,
    finish_reason: Option<StopReason>,
    /// The last usage relayed.
    usage: Option<Usage>,
    tool_calls: Vec<PartialCall>,
}

impl SseDecoder for ChunkDecoder {
    const END: &'static str = "[DONE]";

    fn decode(&mut self, event: SseEvent) -> Result<bool, ModelError> {
        self.on_data(event.data.trim())
    }

    fn next_decoded(&mut self) -> Option<ModelEvent> {
        self.decoded.pop_front()
    }
}

impl ChunkDecoder {
    fn on_tool_fragment(&mut self, fragment: WireToolCall) -> Result<(), ModelError> {
        let index = fragment
            .index
            .unwrap_or(self.tool_calls.len().saturating_sub(1));
        if index >= MAX_TOOL_CALLS {
            return Err(ModelError::Malformed(format!(
                "more than {MAX_TOOL_CALLS} tool calls in one step"
            )));
        }
        if index >= self.tool_calls.len() {
            self.tool_calls.resize_with(index + 1, PartialCall::default);
        }
        let call = &mut self.tool_calls[index];
        if let Some(id) = fragment.id.filter(|id| !id.is_empty()) {
            call.id = id;
        }
        if let Some(function) = fragment.function {
            if let Some(name) = function.name {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
        if call.arguments.len() > MAX_TOOL_ARGUMENT_BYTES || call.name.len() > 256 {
            return Err(ModelError::Malformed("a tool call is too large".into()));
        }
        Ok(())
    }

    /// Queues the assembled tool calls; every one needs an id and a name.
    fn flush_tool_calls(&mut self) -> Result<(), ModelError> {
        if self
            .tool_calls
            .iter()
            .any(|call| call.id.is_empty() || call.name.is_empty())
        {
            return Err(ModelError::Malformed(
                "a tool call arrived without an id or a name".into(),
            ));
        }
        for call in std::mem::take(&mut self.tool_calls) {
            let arguments_json = if call.arguments.trim().is_empty() {
                "{}".to_owned()
            } else {
                call.arguments
            };
            self.decoded.push_back(ModelEvent::ToolCall {
                id: call.id,
                name: call.name,
                arguments_json,
            });
        }
        Ok(())
    }

    /// Handles one event's data; `Ok(true)` at `[DONE]`.
    fn on_data(&mut self, data: &str) -> Result<bool, ModelError> {
        // Some servers send empty events as keep-alives.
        if data.is_empty() {
            return Ok(false);
        }
        if data == "[DONE]" {
            self.flush_tool_calls()?;
            let reason = self.finish_reason.unwrap_or(StopReason::Stop);
            self.decoded.push_back(ModelEvent::Finished(reason));
            return Ok(true);
        }
        let chunk: WireChunk = serde_json::from_str(data).map_err(|e| {
            tracing::debug!(chunk = %truncated(data), "unparseable model stream chunk");
            ModelError::Malformed(format!("a stream chunk is not valid JSON: {e}"))
        })?;
        if let Some(error) = chunk.error {
            tracing::debug!(error = %truncated(&error.to_string()), "model upstream error mid-stream");
            return Err(ModelError::Unavailable(
                "the upstream reported an error mid-stream".into(),
            ));
        }
        if let Some(choice) = chunk.choices.into_iter().next() {
            if let Some(delta) = choice.delta {
                let reasoning = delta
                    .reasoning_content
                    .filter(|r| !r.is_empty())
                    .or(delta.reasoning);
                if let Some(reasoning) = reasoning.filter(|r| !r.is_empty()) {
                    self.decoded
                        .push_back(ModelEvent::ReasoningDelta(reasoning));
                }
                if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
                    self.decoded.push_back(ModelEvent::TextDelta(text));
                }
                for fragment in delta.tool_calls.into_iter().flatten() {
                    self.on_tool_fragment(fragment)?;
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(stop_reason(&reason));
            }
        }
        if let Some(usage) = chunk.usage {
            // Relayed at once (a step stopped before [DONE] keeps it), but
            // only when it changed: some servers repeat a cumulative usage
            // object on every chunk.
            let usage = Usage::from(usage);
            if self.usage != Some(usage) {
                self.usage = Some(usage);
                self.decoded.push_back(ModelEvent::Usage(usage));
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests;
