use serde_json::json;

use super::*;
use crate::model::OutputLimits;
use crate::types::{Message, NewMessage};

/// A stored-looking message (seq 1).
fn message(role: Role, content: Vec<ContentBlock>) -> Message {
    let body = NewMessage::new("t", role, content);
    Message {
        seq: 1,
        body,
        compacted: false,
    }
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
                    interrupted: None,
                    media: Vec::new(),
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

/// A user message `speaker` wrote.
fn spoken(speaker: Option<Speaker>, content: Vec<ContentBlock>) -> Message {
    let mut m = message(Role::User, content);
    m.body.speaker = speaker;
    m
}

#[test]
fn a_speaker_prefixes_the_user_text_and_nothing_else() {
    let image = ContentBlock::Image {
        data: vec![1, 2, 3],
        mime_type: "image/png".into(),
    };
    let req = ModelRequest {
        model: "m".into(),
        messages: std::sync::Arc::new(vec![
            spoken(
                Some(Speaker::new("u1", "Alice")),
                vec![ContentBlock::text("hello"), ContentBlock::text("again")],
            ),
            message(Role::Assistant, vec![ContentBlock::text("hi Alice")]),
            spoken(Some(Speaker::new("u2", "")), vec![image]),
            message(Role::Assistant, vec![ContentBlock::text("nice")]),
            spoken(None, vec![ContentBlock::text("anonymous")]),
        ]),
        ..Default::default()
    };
    let body = request_body(&req, 4096);
    assert_eq!(
        body["messages"],
        json!([
            { "role": "user", "content": [
                { "type": "text", "text": "[Alice]: hello" },
                { "type": "text", "text": "again" },
            ]},
            { "role": "assistant", "content": [{ "type": "text", "text": "hi Alice" }] },
            { "role": "user", "content": [
                { "type": "text", "text": "[u2]:" },
                { "type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "AQID",
                }},
            ]},
            { "role": "assistant", "content": [{ "type": "text", "text": "nice" }] },
            { "role": "user", "content": [{ "type": "text", "text": "anonymous" }] },
        ])
    );
    assert!(body.get("name").is_none());
}

#[test]
fn config_is_validated_and_the_key_never_printed() {
    let bad = |url: &str| {
        AnthropicProvider::new(AnthropicConfig::new(EndpointConfig::new(url))).unwrap_err()
    };
    assert!(matches!(
        bad("ftp://x/v1"),
        EndpointError::InvalidBaseUrl { .. }
    ));
    assert!(matches!(
        bad("http://x/v1?a=b"),
        EndpointError::InvalidBaseUrl { .. }
    ));
    let config = AnthropicConfig::new(EndpointConfig {
        api_key: Some("sk-ant-test-secret".into()),
        models: Some(vec!["a".into()]),
        ..EndpointConfig::new("https://api.anthropic.com/v1")
    });
    assert!(!format!("{config:?}").contains("sk-ant"));
    let provider = AnthropicProvider::new(config).unwrap();
    assert!(!format!("{provider:?}").contains("sk-ant"));
    assert!(provider.serves("a") && !provider.serves("b"));
    let zero = AnthropicConfig::new(EndpointConfig {
        limits: OutputLimits {
            max_tokens: 0,
            ..OutputLimits::default()
        },
        ..EndpointConfig::new("http://localhost:1/v1")
    });
    assert!(matches!(
        AnthropicProvider::new(zero).unwrap_err(),
        EndpointError::Limits(e) if e.contains("max_tokens")
    ));
    let bad_key = AnthropicConfig::new(EndpointConfig {
        api_key: Some("line\nbreak".into()),
        ..EndpointConfig::new("http://localhost:1/v1")
    });
    assert_eq!(
        AnthropicProvider::new(bad_key).unwrap_err(),
        EndpointError::InvalidApiKey
    );
}
