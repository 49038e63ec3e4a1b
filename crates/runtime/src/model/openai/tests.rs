use serde_json::json;

use super::*;
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
                    interrupted: None,
                    media: Vec::new(),
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
fn a_speaker_is_the_user_message_name_and_the_text_is_unchanged() {
    let mut alice = message(Role::User, vec![ContentBlock::text("hello")]);
    alice.body.speaker = Some(crate::types::Speaker::new("u1", "Alice Smith"));
    let req = ModelRequest {
        model: "m".into(),
        messages: std::sync::Arc::new(vec![
            alice,
            message(Role::Assistant, vec![ContentBlock::text("hi")]),
            message(Role::User, vec![ContentBlock::text("anonymous")]),
        ]),
        ..Default::default()
    };
    let body = request_body(&req);
    assert_eq!(
        body["messages"],
        json!([
            { "role": "user", "content": "hello", "name": "Alice_Smith" },
            { "role": "assistant", "content": "hi" },
            { "role": "user", "content": "anonymous" },
        ])
    );
}

#[test]
fn config_is_validated_and_the_key_never_printed() {
    let bad =
        |url: &str| OpenAiProvider::new(OpenAiConfig::new(EndpointConfig::new(url))).unwrap_err();
    assert!(matches!(
        bad("ftp://x/v1"),
        EndpointError::InvalidBaseUrl { .. }
    ));
    assert!(matches!(
        bad("not a url"),
        EndpointError::InvalidBaseUrl { .. }
    ));
    assert!(matches!(
        bad("http://x/v1?a=b"),
        EndpointError::InvalidBaseUrl { .. }
    ));
    let config = OpenAiConfig::new(EndpointConfig {
        api_key: Some("sk-test-secret".into()),
        models: Some(vec!["a".into()]),
        ..EndpointConfig::new("https://api.example.com/v1")
    });
    assert!(!format!("{config:?}").contains("sk-test"));
    let provider = OpenAiProvider::new(config).unwrap();
    assert!(!format!("{provider:?}").contains("sk-test"));
    assert!(provider.serves("a") && !provider.serves("b"));
    let any = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig::new(
        "http://localhost:1/v1",
    )))
    .unwrap();
    assert!(any.serves("whatever"));
    let bad_key = OpenAiConfig::new(EndpointConfig {
        api_key: Some("line\nbreak".into()),
        ..EndpointConfig::new("http://localhost:1/v1")
    });
    assert_eq!(
        OpenAiProvider::new(bad_key).unwrap_err(),
        EndpointError::InvalidApiKey
    );
}
