//! OpenAI-compatible Chat Completions streaming over HTTP (OpenAI itself,
//! vLLM, llama.cpp's server, Ollama, LiteLLM, ...).
//!
//! One model step is one `POST {base_url}/chat/completions` with
//! `stream: true`; the `text/event-stream` answer is parsed with
//! [`SseParser`](super::sse::SseParser). A step only counts as finished once
//! `data: [DONE]` arrives: servers send usage after the finish reason, so a
//! body that ends earlier is reported as truncated.
//!
//! Every request carries a `max_tokens` (see [`OutputLimits`]), and asks
//! for usage with `stream_options.include_usage`, which servers send only
//! at the end: a usage object is relayed as soon as it arrives, and for a
//! step that ends earlier the runtime estimates the output tokens (see
//! [`ModelEvent::Usage`]).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::Deserialize;
use serde_json::{Value, json};

use super::http::SseDecoder;
use super::http::{self, truncated};
use super::sse::SseEvent;
use super::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, OutputLimits};
use crate::types::{ContentBlock, Role, StopReason, ThinkingLevel, Usage, flatten_text};

/// Settings of one OpenAI-compatible endpoint.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// The API root, e.g. `http://127.0.0.1:8080/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>`; empty counts as none.
    pub api_key: Option<String>,
    /// Model names served; `None` serves any name.
    pub models: Option<Vec<String>>,
    /// Bound on establishing the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Longest silence allowed while waiting for headers or between chunks.
    pub idle_timeout: Duration,
    /// How much a step may generate.
    pub limits: OutputLimits,
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
            max_tokens_param: MaxTokensParam::default(),
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("connect_timeout", &self.connect_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("limits", &self.limits)
            .field("max_tokens_param", &self.max_tokens_param)
            .finish()
    }
}

/// Why an [`OpenAiConfig`] cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenAiConfigError {
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
    /// The output limits are inconsistent.
    #[error("{0}")]
    Limits(String),
    /// The HTTP client could not be built (e.g. no TLS roots).
    #[error("could not build the HTTP client: {0}")]
    Client(String),
}

/// A provider for one OpenAI-compatible endpoint.
pub struct OpenAiProvider {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    auth: Option<HeaderValue>,
    models: Option<Vec<String>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    limits: OutputLimits,
    max_tokens_param: MaxTokensParam,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("endpoint", &self.endpoint.as_str())
            .field("api_key", &self.auth.as_ref().map(|_| "<redacted>"))
            .field("models", &self.models)
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// Validates `config` and builds the HTTP client.
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiConfigError> {
        let invalid = |reason: String| OpenAiConfigError::InvalidBaseUrl {
            url: config.base_url.clone(),
            reason,
        };
        let endpoint = http::endpoint(&config.base_url, "chat/completions").map_err(invalid)?;
        if config.connect_timeout.is_zero() || config.idle_timeout.is_zero() {
            return Err(OpenAiConfigError::ZeroTimeout);
        }
        config.limits.check().map_err(OpenAiConfigError::Limits)?;
        let auth = match config.api_key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| OpenAiConfigError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let client =
            http::client(&endpoint, config.connect_timeout).map_err(OpenAiConfigError::Client)?;
        Ok(Self {
            client,
            endpoint,
            auth,
            models: config.models,
            connect_timeout: config.connect_timeout,
            idle_timeout: config.idle_timeout,
            limits: config.limits,
            max_tokens_param: config.max_tokens_param,
        })
    }
}

#[async_trait]
impl ModelProvider for OpenAiProvider {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let max_tokens = self
            .limits
            .tokens_for(&request.model, request.max_output_tokens);
        let mut body = request_body(&request);
        body[self.max_tokens_param.field()] = json!(max_tokens);
        let body = serde_json::to_vec(&body)
            .map_err(|e| ModelError::Rejected(format!("could not encode the request: {e}")))?;
        let mut http = self
            .client
            .post(self.endpoint.clone())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "text/event-stream")
            .body(body);
        if let Some(auth) = &self.auth {
            http = http.header(AUTHORIZATION, auth.clone());
        }
        // The `chat` span's W3C context, so the provider's side of the
        // call joins the trace (nothing is added without telemetry).
        let mut trace = reqwest::header::HeaderMap::new();
        crate::telemetry::inject_trace_context(&mut trace);
        if !trace.is_empty() {
            http = http.headers(trace);
        }
        tracing::debug!(model = %request.model, endpoint = %self.endpoint, "starting chat completion");
        let response = http::send_for_stream(http, self.connect_timeout, self.idle_timeout).await?;
        Ok(http::sse_stream(
            response,
            self.idle_timeout,
            ChunkDecoder::default(),
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
    for message in request.messages.iter() {
        let content = &message.body.content;
        match message.body.role {
            Role::User => out.push(json!({ "role": "user", "content": user_content(content) })),
            Role::Assistant => out.extend(assistant_message(content)),
            Role::Tool => out.extend(content.iter().filter_map(tool_message)),
            Role::Summary => out.push(json!({
                "role": "system",
                "content": format!("Summary of earlier conversation:\n{}", flatten_text(content)),
            })),
            Role::Notice => out.push(json!({ "role": "system", "content": flatten_text(content) })),
        }
    }
    out
}

/// Text-only content goes as a plain string, which every compatible server
/// accepts; the parts array is only needed for images.
fn user_content(content: &[ContentBlock]) -> Value {
    if !content
        .iter()
        .any(|b| matches!(b, ContentBlock::Image { .. }))
    {
        return Value::String(flatten_text(content));
    }
    let parts: Vec<Value> = content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({ "type": "text", "text": text }))
            }
            ContentBlock::Image { data, mime_type } => Some(json!({
                "type": "image_url",
                "image_url": { "url": format!("data:{mime_type};base64,{}", STANDARD.encode(data)) },
            })),
            _ => None,
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
struct ChunkDecoder {
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
mod tests {
    use futures::StreamExt as _;
    use serde_json::json;

    use super::*;
    use crate::model::fake_openai::{
        FakeOpenAi, FakeReply, finish_chunk, reasoning_chunk, slice_bytes, sse_data, text_chunk,
    };
    use crate::model::test_support::{self, GUARD, Item, message, run};

    fn config(fake: &FakeOpenAi) -> OpenAiConfig {
        OpenAiConfig {
            api_key: Some("sk-test-secret".into()),
            idle_timeout: Duration::from_secs(5),
            ..OpenAiConfig::new(fake.base_url())
        }
    }

    fn request(text: &str) -> ModelRequest {
        test_support::request("gpt-test", text)
    }

    async fn run_script(reply: FakeReply) -> (FakeOpenAi, Result<Vec<Item>, ModelError>) {
        let fake = FakeOpenAi::start(vec![reply]).await;
        let provider = OpenAiProvider::new(config(&fake)).unwrap();
        let result = run(&provider, request("hello")).await;
        (fake, result)
    }

    fn happy_body() -> Vec<u8> {
        let usage = json!({
            "choices": [],
            "usage": {
                "prompt_tokens": 12, "completion_tokens": 7,
                "completion_tokens_details": { "reasoning_tokens": 3 },
                "prompt_tokens_details": { "cached_tokens": 4 },
            },
        });
        [
            b": keep-alive\n\n".to_vec(),
            reasoning_chunk("Thinking é"),
            text_chunk("Hel"),
            text_chunk(""),
            text_chunk("lo 🎉"),
            finish_chunk("stop"),
            sse_data(&usage),
        ]
        .concat()
    }

    fn happy_events() -> Vec<ModelEvent> {
        vec![
            ModelEvent::ReasoningDelta("Thinking é".into()),
            ModelEvent::TextDelta("Hel".into()),
            ModelEvent::TextDelta("lo 🎉".into()),
            ModelEvent::Usage(Usage {
                input_tokens: 12,
                output_tokens: 7,
                reasoning_tokens: 3,
                cached_input_tokens: 4,
            }),
            ModelEvent::Finished(StopReason::Stop),
        ]
    }

    fn ok_events(items: Vec<Item>) -> Vec<ModelEvent> {
        items.into_iter().map(Result::unwrap).collect()
    }

    #[tokio::test]
    async fn relays_text_reasoning_and_usage_then_finishes() {
        let (_fake, items) = run_script(FakeReply::sse(vec![happy_body()])).await;
        assert_eq!(ok_events(items.unwrap()), happy_events());
    }

    #[tokio::test]
    async fn one_byte_slices_give_the_same_events_as_whole_chunks() {
        let (_fake, items) = run_script(FakeReply::sse(slice_bytes(&happy_body(), 1))).await;
        assert_eq!(ok_events(items.unwrap()), happy_events());
    }

    #[tokio::test]
    async fn finish_reasons_map_to_stop_reasons() {
        for (wire, expected) in [
            ("length", StopReason::Length),
            ("tool_calls", StopReason::ToolUse),
            ("content_filter", StopReason::Stop),
        ] {
            let (_fake, items) = run_script(FakeReply::sse(vec![finish_chunk(wire)])).await;
            assert_eq!(
                ok_events(items.unwrap()),
                vec![ModelEvent::Finished(expected)]
            );
        }
    }

    #[tokio::test]
    async fn body_cut_before_done_is_truncated_after_the_partial_text() {
        let (_fake, items) = run_script(FakeReply::Sse {
            chunks: vec![text_chunk("par"), finish_chunk("stop")],
            done: false,
            then_hang: false,
        })
        .await;
        let items = items.unwrap();
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(
            items[0].as_ref().unwrap(),
            &ModelEvent::TextDelta("par".into())
        );
        assert!(
            matches!(items[1], Err(ModelError::Truncated(_))),
            "{items:?}"
        );
    }

    #[tokio::test]
    async fn http_statuses_map_to_errors_without_body_or_key() {
        for code in [500, 503, 408, 429, 401, 403, 400, 404] {
            let (_fake, result) = run_script(FakeReply::Status {
                code,
                body: r#"{"error":{"message":"upstream-body-secret"}}"#.into(),
            })
            .await;
            let err = result.expect_err("a refusal must fail stream()");
            let matches_kind = match code {
                429 => matches!(err, ModelError::RateLimited(_)),
                401 | 403 => matches!(err, ModelError::Unauthorized(_)),
                408 | 500 | 503 => matches!(err, ModelError::Unavailable(_)),
                _ => matches!(err, ModelError::Rejected(_)),
            };
            assert!(matches_kind, "HTTP {code} gave {err:?}");
            let text = format!("{err} {err:?}");
            assert!(
                !text.contains("upstream-body-secret") && !text.contains("sk-test"),
                "{text}"
            );
        }
    }

    #[tokio::test]
    async fn malformed_chunk_is_malformed_and_ends_the_stream() {
        let (_fake, items) = run_script(FakeReply::sse(vec![
            text_chunk("ok"),
            b"data: {not json\n\n".to_vec(),
            text_chunk("never"),
        ]))
        .await;
        let items = items.unwrap();
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(
            items[0].as_ref().unwrap(),
            &ModelEvent::TextDelta("ok".into())
        );
        assert!(
            matches!(items[1], Err(ModelError::Malformed(_))),
            "{items:?}"
        );
    }

    #[tokio::test]
    async fn error_object_mid_stream_is_unavailable() {
        let error = sse_data(&json!({ "error": { "message": "overloaded" } }));
        let (_fake, items) = run_script(FakeReply::sse(vec![text_chunk("a"), error])).await;
        let items = items.unwrap();
        assert!(
            matches!(items.last(), Some(Err(ModelError::Unavailable(_)))),
            "{items:?}"
        );
        assert_eq!(items.len(), 2);
    }

    #[tokio::test]
    async fn request_carries_model_flags_messages_and_bearer_token() {
        let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![finish_chunk("stop")])]).await;
        let provider = OpenAiProvider::new(config(&fake)).unwrap();
        let mut req = request("what is up");
        req.thinking = Some(ThinkingLevel::XHigh);
        run(&provider, req).await.unwrap();

        let recorded = fake.requests();
        assert_eq!(recorded.len(), 1);
        let r = &recorded[0];
        assert_eq!(
            (r.method.as_str(), r.path.as_str()),
            ("POST", "/v1/chat/completions")
        );
        assert_eq!(r.header("authorization"), Some("Bearer sk-test-secret"));
        assert_eq!(r.body["model"], "gpt-test");
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.body["stream_options"]["include_usage"], true);
        assert_eq!(r.body["reasoning_effort"], "high");
        assert_eq!(
            r.body["messages"],
            json!([
                { "role": "system", "content": "be brief" },
                { "role": "user", "content": "what is up" },
            ])
        );
    }

    #[tokio::test]
    async fn max_tokens_is_the_calls_else_the_models_else_the_providers() {
        let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![finish_chunk("stop")])]).await;
        let limits = OutputLimits {
            max_tokens: 1000,
            model_max_tokens: [("big".to_owned(), 3000)].into(),
            ..OutputLimits::default()
        };
        let provider = OpenAiProvider::new(OpenAiConfig {
            limits: limits.clone(),
            ..config(&fake)
        })
        .unwrap();
        run(&provider, request("a")).await.unwrap();
        run(&provider, test_support::request("big", "b"))
            .await
            .unwrap();
        let mut asked = request("c");
        asked.max_output_tokens = Some(77);
        run(&provider, asked).await.unwrap();
        let sent: Vec<_> = fake
            .requests()
            .iter()
            .map(|r| r.body["max_tokens"].clone())
            .collect();
        assert_eq!(sent, [json!(1000), json!(3000), json!(77)]);
        assert_eq!(provider.max_output_tokens_limit("x"), Some(32_768));

        let reasoning = OpenAiProvider::new(OpenAiConfig {
            limits,
            max_tokens_param: MaxTokensParam::MaxCompletionTokens,
            ..config(&fake)
        })
        .unwrap();
        run(&reasoning, request("d")).await.unwrap();
        let last = fake.requests().pop().unwrap();
        assert_eq!(last.body["max_completion_tokens"], 1000);
        assert!(last.body.get("max_tokens").is_none());
    }

    #[tokio::test]
    async fn usage_is_relayed_when_it_arrives_and_only_when_it_changed() {
        let usage = |completion: u64| {
            sse_data(&json!({
                "choices": [{ "index": 0, "delta": { "content": "x" } }],
                "usage": { "prompt_tokens": 9, "completion_tokens": completion },
            }))
        };
        let (_fake, items) = run_script(FakeReply::sse(vec![usage(1), usage(1), usage(2)])).await;
        let seen = |output_tokens| {
            ModelEvent::Usage(Usage {
                input_tokens: 9,
                output_tokens,
                ..Usage::default()
            })
        };
        let text = || ModelEvent::TextDelta("x".into());
        assert_eq!(
            ok_events(items.unwrap()),
            vec![
                text(),
                seen(1),
                text(),
                text(),
                seen(2),
                ModelEvent::Finished(StopReason::Stop)
            ]
        );
    }

    #[tokio::test]
    async fn no_authorization_header_or_effort_when_not_configured() {
        let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![finish_chunk("stop")])]).await;
        let provider = OpenAiProvider::new(OpenAiConfig::new(fake.base_url() + "/")).unwrap();
        let mut req = request("hi");
        req.thinking = Some(ThinkingLevel::None);
        run(&provider, req).await.unwrap();
        let r = &fake.requests()[0];
        assert_eq!(r.path, "/v1/chat/completions");
        assert_eq!(r.header("authorization"), None);
        assert!(r.body.get("reasoning_effort").is_none());
    }

    #[tokio::test]
    async fn silence_after_headers_is_unavailable_within_the_idle_timeout() {
        let fake = FakeOpenAi::start(vec![FakeReply::Sse {
            chunks: vec![],
            done: false,
            then_hang: true,
        }])
        .await;
        let idle = Duration::from_millis(200);
        let provider = OpenAiProvider::new(OpenAiConfig {
            idle_timeout: idle,
            ..config(&fake)
        })
        .unwrap();
        let started = std::time::Instant::now();
        let items = run(&provider, request("hi")).await.unwrap();
        assert!(
            matches!(items[..], [Err(ModelError::Unavailable(_))]),
            "{items:?}"
        );
        assert!(started.elapsed() >= idle);
        // Giving up must also hang up on the server.
        tokio::time::timeout(GUARD, fake.wait_clients_gone(1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn dropping_the_stream_closes_the_connection() {
        let fake = FakeOpenAi::start(vec![FakeReply::Sse {
            chunks: vec![text_chunk("hi")],
            done: false,
            then_hang: true,
        }])
        .await;
        let provider = OpenAiProvider::new(config(&fake)).unwrap();
        let mut stream = provider.stream(request("hi")).await.unwrap();
        let first = tokio::time::timeout(GUARD, stream.next()).await.unwrap();
        assert_eq!(first.unwrap().unwrap(), ModelEvent::TextDelta("hi".into()));
        assert_eq!(fake.clients_gone(), 0);
        drop(stream);
        tokio::time::timeout(GUARD, fake.wait_clients_gone(1))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn unreachable_server_is_unavailable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let provider = OpenAiProvider::new(OpenAiConfig::new(format!("http://{addr}/v1"))).unwrap();
        let err = run(&provider, request("hi")).await.unwrap_err();
        assert!(matches!(err, ModelError::Unavailable(_)), "{err:?}");
    }

    #[test]
    fn history_maps_roles_images_tool_calls_and_drops_thinking() {
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
                            thinking: "hmm".into(),
                            signature: String::new(),
                        },
                        ContentBlock::ToolCall {
                            id: "c1".into(),
                            name: "ls".into(),
                            arguments_json: "{}".into(),
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
                        thinking: "only thoughts".into(),
                        signature: String::new(),
                    }],
                ),
                message(Role::Notice, vec![ContentBlock::text("turn timed out")]),
            ]),
            thinking: Some(ThinkingLevel::Minimal),
            tools: Vec::new(),
            ..Default::default()
        };
        let body = request_body(&req);
        assert_eq!(body["reasoning_effort"], "minimal");
        assert_eq!(
            body["messages"],
            json!([
                { "role": "system", "content": "Summary of earlier conversation:\nearlier" },
                { "role": "user", "content": [
                    { "type": "text", "text": "look" },
                    { "type": "image_url", "image_url": { "url": "data:image/png;base64,AQID" } },
                ]},
                { "role": "assistant", "content": null, "tool_calls": [
                    { "id": "c1", "type": "function", "function": { "name": "ls", "arguments": "{}" } },
                ]},
                { "role": "tool", "tool_call_id": "c1", "content": "Error: denied" },
                { "role": "system", "content": "turn timed out" },
            ])
        );
    }

    #[test]
    fn config_is_validated_and_the_key_never_printed() {
        let bad = |url: &str| OpenAiProvider::new(OpenAiConfig::new(url)).unwrap_err();
        assert!(matches!(
            bad("ftp://x/v1"),
            OpenAiConfigError::InvalidBaseUrl { .. }
        ));
        assert!(matches!(
            bad("not a url"),
            OpenAiConfigError::InvalidBaseUrl { .. }
        ));
        assert!(matches!(
            bad("http://x/v1?a=b"),
            OpenAiConfigError::InvalidBaseUrl { .. }
        ));
        let config = OpenAiConfig {
            api_key: Some("sk-test-secret".into()),
            models: Some(vec!["a".into()]),
            ..OpenAiConfig::new("https://api.example.com/v1")
        };
        assert!(!format!("{config:?}").contains("sk-test"));
        let provider = OpenAiProvider::new(config).unwrap();
        assert!(!format!("{provider:?}").contains("sk-test"));
        assert!(provider.serves("a") && !provider.serves("b"));
        let any = OpenAiProvider::new(OpenAiConfig::new("http://localhost:1/v1")).unwrap();
        assert!(any.serves("whatever"));
        let bad_key = OpenAiConfig {
            api_key: Some("line\nbreak".into()),
            ..OpenAiConfig::new("http://localhost:1/v1")
        };
        assert_eq!(
            OpenAiProvider::new(bad_key).unwrap_err(),
            OpenAiConfigError::InvalidApiKey
        );
    }
}
