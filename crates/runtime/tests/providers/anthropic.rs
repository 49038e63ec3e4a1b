//! The Anthropic provider against a scripted upstream
//! ([`agentrt_testkit::fake_anthropic`]): events, faults, the request it
//! sends.

use std::time::Duration;

use agentrt_runtime::model::anthropic::{AnthropicConfig, AnthropicProvider};
use agentrt_runtime::model::endpoint::EndpointConfig;
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider as _, ModelRequest, ToolSpec};
use agentrt_runtime::types::{ContentBlock, Role, StopReason, ThinkingLevel, Usage};
use agentrt_testkit::fake_anthropic::{
    FakeAnthropic, FakeReply, block_stop, error_event, input_json_delta, message_delta,
    message_start, message_stop, ping, signature_delta, slice_bytes, stream, text_delta,
    text_start, thinking_delta, thinking_start, tool_use_start,
};
use agentrt_testkit::provider::{self as test_support, GUARD, Item, message, run};
use futures::StreamExt as _;
use serde_json::json;

fn config(fake: &FakeAnthropic) -> EndpointConfig {
    EndpointConfig {
        api_key: Some("sk-ant-test-secret".into()),
        idle_timeout: Duration::from_secs(5),
        ..EndpointConfig::new(fake.base_url())
    }
}

fn request(text: &str) -> ModelRequest {
    test_support::request("claude-test", text)
}

async fn run_script(reply: FakeReply) -> (FakeAnthropic, Result<Vec<Item>, ModelError>) {
    let fake = FakeAnthropic::start(vec![reply]).await;
    let provider = AnthropicProvider::new(AnthropicConfig::new(config(&fake))).unwrap();
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
        let (_fake, items) = run_script(stream(vec![message_delta(wire, 1), message_stop()])).await;
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
            (|e: &ModelError| matches!(e, ModelError::Unavailable(_))) as fn(&ModelError) -> bool,
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
    let provider = AnthropicProvider::new(AnthropicConfig::new(config(&fake))).unwrap();
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
    let provider = AnthropicProvider::new(AnthropicConfig::new(EndpointConfig::new(
        fake.base_url() + "/",
    )))
    .unwrap();
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
    let provider = AnthropicProvider::new(AnthropicConfig::new(config(&fake))).unwrap();
    let mut stream = provider.stream(request("hi")).await.unwrap();
    let first = tokio::time::timeout(GUARD, stream.next()).await.unwrap();
    assert_eq!(first.unwrap().unwrap(), ModelEvent::TextDelta("hi".into()));
    drop(stream);
    tokio::time::timeout(GUARD, fake.wait_clients_gone(1))
        .await
        .unwrap();
}
