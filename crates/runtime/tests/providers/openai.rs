//! The OpenAI-compatible provider against a scripted upstream
//! ([`agentrt_testkit::fake_openai`]): events, faults, the request it sends.

use std::time::Duration;

use agentrt_runtime::model::endpoint::EndpointConfig;
use agentrt_runtime::model::openai::{MaxTokensParam, OpenAiConfig, OpenAiProvider};
use agentrt_runtime::model::{
    ModelError, ModelEvent, ModelProvider as _, ModelRequest, OutputLimits,
};
use agentrt_runtime::types::{StopReason, ThinkingLevel, Usage};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, reasoning_chunk, slice_bytes, sse_data, text_chunk,
};
use agentrt_testkit::provider::{self as test_support, GUARD, Item, run};
use futures::StreamExt as _;
use serde_json::json;

fn config(fake: &FakeOpenAi) -> EndpointConfig {
    EndpointConfig {
        api_key: Some("sk-test-secret".into()),
        idle_timeout: Duration::from_secs(5),
        ..EndpointConfig::new(fake.base_url())
    }
}

fn request(text: &str) -> ModelRequest {
    test_support::request("gpt-test", text)
}

async fn run_script(reply: FakeReply) -> (FakeOpenAi, Result<Vec<Item>, ModelError>) {
    let fake = FakeOpenAi::start(vec![reply]).await;
    let provider = OpenAiProvider::new(OpenAiConfig::new(config(&fake))).unwrap();
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(config(&fake))).unwrap();
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig {
        limits: limits.clone(),
        ..config(&fake)
    }))
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
        endpoint: EndpointConfig {
            limits,
            ..config(&fake)
        },
        max_tokens_param: MaxTokensParam::MaxCompletionTokens,
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig::new(
        fake.base_url() + "/",
    )))
    .unwrap();
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig {
        idle_timeout: idle,
        ..config(&fake)
    }))
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(config(&fake))).unwrap();
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
    let provider = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig::new(format!(
        "http://{addr}/v1"
    ))))
    .unwrap();
    let err = run(&provider, request("hi")).await.unwrap_err();
    assert!(matches!(err, ModelError::Unavailable(_)), "{err:?}");
}
