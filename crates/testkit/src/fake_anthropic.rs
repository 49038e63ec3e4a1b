//! A scripted stand-in for the Anthropic Messages API: it fakes the
//! upstream of the Anthropic provider, driven like [`crate::fake_openai`].
//!
//! The loopback server itself is [`FakeOpenAi`](crate::fake_openai::FakeOpenAi)
//! (it records requests and plays back raw body pieces, whatever the
//! protocol); this module adds builders for Anthropic's named stream events.
//! Anthropic streams have no `[DONE]` sentinel, so use [`stream`] (or
//! `FakeReply::Sse { done: false, .. }`) rather than `FakeReply::sse`.

use serde_json::{Value, json};

pub use crate::fake_openai::{FakeReply, RecordedRequest, slice_bytes};

/// The loopback fake server (shared with the OpenAI fake).
pub type FakeAnthropic = crate::fake_openai::FakeOpenAi;

/// A complete stream of `chunks` without any sentinel, then close.
pub fn stream(chunks: Vec<Vec<u8>>) -> FakeReply {
    FakeReply::Sse {
        chunks,
        done: false,
        then_hang: false,
    }
}

/// `event: <name>\ndata: <json>\n\n`.
pub fn event(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

/// `message_start` with this input usage.
pub fn message_start(input_tokens: u64, cache_read_input_tokens: u64) -> Vec<u8> {
    event(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": "msg_fake",
                "type": "message",
                "role": "assistant",
                "model": "claude-fake",
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_read_input_tokens": cache_read_input_tokens,
                    "cache_creation_input_tokens": 0,
                    "output_tokens": 1,
                },
            },
        }),
    )
}

fn block_start(index: usize, block: Value) -> Vec<u8> {
    event(
        "content_block_start",
        &json!({ "type": "content_block_start", "index": index, "content_block": block }),
    )
}

fn block_delta(index: usize, delta: Value) -> Vec<u8> {
    event(
        "content_block_delta",
        &json!({ "type": "content_block_delta", "index": index, "delta": delta }),
    )
}

/// Starts a text block.
pub fn text_start(index: usize) -> Vec<u8> {
    block_start(index, json!({ "type": "text", "text": "" }))
}

/// A `text_delta`.
pub fn text_delta(index: usize, text: &str) -> Vec<u8> {
    block_delta(index, json!({ "type": "text_delta", "text": text }))
}

/// Starts a thinking block.
pub fn thinking_start(index: usize) -> Vec<u8> {
    block_start(
        index,
        json!({ "type": "thinking", "thinking": "", "signature": "" }),
    )
}

/// A `thinking_delta`.
pub fn thinking_delta(index: usize, thinking: &str) -> Vec<u8> {
    block_delta(
        index,
        json!({ "type": "thinking_delta", "thinking": thinking }),
    )
}

/// A `signature_delta`.
pub fn signature_delta(index: usize, signature: &str) -> Vec<u8> {
    block_delta(
        index,
        json!({ "type": "signature_delta", "signature": signature }),
    )
}

/// Starts a `tool_use` block.
pub fn tool_use_start(index: usize, id: &str, name: &str) -> Vec<u8> {
    block_start(
        index,
        json!({ "type": "tool_use", "id": id, "name": name, "input": {} }),
    )
}

/// An `input_json_delta` carrying a fragment of a tool call's input.
pub fn input_json_delta(index: usize, partial_json: &str) -> Vec<u8> {
    block_delta(
        index,
        json!({ "type": "input_json_delta", "partial_json": partial_json }),
    )
}

/// `content_block_stop`.
pub fn block_stop(index: usize) -> Vec<u8> {
    event(
        "content_block_stop",
        &json!({ "type": "content_block_stop", "index": index }),
    )
}

/// `message_delta` with a stop reason and cumulative output tokens.
pub fn message_delta(stop_reason: &str, output_tokens: u64) -> Vec<u8> {
    event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": { "stop_reason": stop_reason, "stop_sequence": null },
            "usage": { "output_tokens": output_tokens },
        }),
    )
}

/// `message_stop`.
pub fn message_stop() -> Vec<u8> {
    event("message_stop", &json!({ "type": "message_stop" }))
}

/// `ping`.
pub fn ping() -> Vec<u8> {
    event("ping", &json!({ "type": "ping" }))
}

/// An `error` event of this error type (e.g. `overloaded_error`).
pub fn error_event(kind: &str) -> Vec<u8> {
    event(
        "error",
        &json!({ "type": "error", "error": { "type": kind, "message": "upstream-error-secret" } }),
    )
}
