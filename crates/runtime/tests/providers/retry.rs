//! [`RetryingProvider`] in front of the OpenAI-compatible provider and a
//! scripted upstream ([`agentrt_testkit::fake_openai`]): what is retried,
//! how long it waits, when it gives up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_runtime::model::endpoint::EndpointConfig;
use agentrt_runtime::model::openai::{OpenAiConfig, OpenAiProvider};
use agentrt_runtime::model::retry::{RetryPolicy, RetryingProvider};
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider as _, ModelRequest};
use agentrt_runtime::types::StopReason;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk};
use agentrt_testkit::provider::{self as test_support, Item};

fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(5),
        max_retry_after: Duration::from_secs(1),
    }
}

fn provider(fake: &FakeOpenAi, policy: RetryPolicy) -> RetryingProvider {
    let inner = OpenAiProvider::new(OpenAiConfig::new(EndpointConfig {
        idle_timeout: Duration::from_secs(5),
        ..EndpointConfig::new(fake.base_url())
    }))
    .unwrap();
    RetryingProvider::new(Arc::new(inner), policy)
}

fn request() -> ModelRequest {
    test_support::request("gpt-test", "hi")
}

async fn run(provider: &RetryingProvider) -> Result<Vec<Item>, ModelError> {
    test_support::run(provider, request()).await
}

fn success() -> FakeReply {
    FakeReply::sse(vec![text_chunk("ok"), finish_chunk("stop")])
}

fn success_events() -> Vec<ModelEvent> {
    vec![
        ModelEvent::TextDelta("ok".into()),
        ModelEvent::Finished(StopReason::Stop),
    ]
}

fn status(code: u16) -> FakeReply {
    FakeReply::Status {
        code,
        body: r#"{"error":{"message":"upstream-body-secret"}}"#.into(),
    }
}

fn status_with(code: u16, header: &str, value: &str) -> FakeReply {
    FakeReply::StatusWithHeaders {
        code,
        headers: vec![(header.into(), value.into())],
        body: "{}".into(),
    }
}

fn ok_events(items: Vec<Item>) -> Vec<ModelEvent> {
    items.into_iter().map(Result::unwrap).collect()
}

#[tokio::test]
async fn rate_limited_with_retry_after_ms_waits_then_succeeds() {
    let fake = FakeOpenAi::start(vec![status_with(429, "retry-after-ms", "50"), success()]).await;
    let started = Instant::now();
    let items = run(&provider(&fake, fast_policy())).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(50));
    assert_eq!(ok_events(items), success_events());
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn rate_limited_with_retry_after_seconds_waits_then_succeeds() {
    let fake = FakeOpenAi::start(vec![status_with(429, "Retry-After", "1"), success()]).await;
    let policy = RetryPolicy {
        max_retry_after: Duration::from_secs(2),
        ..fast_policy()
    };
    let started = Instant::now();
    let items = run(&provider(&fake, policy)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert_eq!(ok_events(items), success_events());
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn server_error_then_success_is_retried() {
    let fake = FakeOpenAi::start(vec![status(500), success()]).await;
    let items = run(&provider(&fake, fast_policy())).await.unwrap();
    assert_eq!(ok_events(items), success_events());
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn conflict_and_overloaded_are_retried() {
    let fake = FakeOpenAi::start(vec![status(409), status(529), success()]).await;
    let items = run(&provider(&fake, fast_policy())).await.unwrap();
    assert_eq!(ok_events(items), success_events());
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn three_unavailable_give_up_after_max_attempts() {
    let fake = FakeOpenAi::start(vec![status(503)]).await;
    let err = run(&provider(&fake, fast_policy())).await.unwrap_err();
    assert!(matches!(err, ModelError::Unavailable(_)), "{err:?}");
    assert!(!format!("{err:?}").contains("upstream-body-secret"));
    assert_eq!(fake.requests().len(), 3);
}

#[tokio::test]
async fn max_retries_zero_sends_once() {
    let fake = FakeOpenAi::start(vec![status(503), success()]).await;
    let policy = RetryPolicy {
        max_attempts: RetryPolicy::with_max_retries(0).max_attempts,
        ..fast_policy()
    };
    let err = run(&provider(&fake, policy)).await.unwrap_err();
    assert!(matches!(err, ModelError::Unavailable(_)), "{err:?}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn stream_cut_after_text_is_not_retried() {
    let fake = FakeOpenAi::start(vec![
        FakeReply::Sse {
            chunks: vec![text_chunk("par")],
            done: false,
            then_hang: false,
        },
        success(),
    ])
    .await;
    let items = run(&provider(&fake, fast_policy())).await.unwrap();
    assert_eq!(items.len(), 2, "{items:?}");
    assert_eq!(
        items[0].as_ref().unwrap(),
        &ModelEvent::TextDelta("par".into())
    );
    assert!(
        matches!(items[1], Err(ModelError::Truncated(_))),
        "{items:?}"
    );
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn stream_cut_before_any_event_is_retried() {
    let fake = FakeOpenAi::start(vec![
        FakeReply::Sse {
            chunks: vec![],
            done: false,
            then_hang: false,
        },
        success(),
    ])
    .await;
    let items = run(&provider(&fake, fast_policy())).await.unwrap();
    assert_eq!(ok_events(items), success_events());
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn bad_request_is_not_retried() {
    let fake = FakeOpenAi::start(vec![status(400), success()]).await;
    let err = run(&provider(&fake, fast_policy())).await.unwrap_err();
    assert!(matches!(err, ModelError::Rejected(_)), "{err:?}");
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn insufficient_quota_is_not_retried_even_with_a_retry_after() {
    let quota = FakeReply::StatusWithHeaders {
        code: 429,
        headers: vec![("retry-after-ms".into(), "1".into())],
        body: r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","param":null,"code":"insufficient_quota"}}"#.into(),
    };
    let fake = FakeOpenAi::start(vec![quota, success()]).await;
    let err = run(&provider(&fake, fast_policy())).await.unwrap_err();
    assert!(matches!(err, ModelError::QuotaExhausted(_)), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.public_message().contains("quota"), "{err}");
    assert_eq!(fake.requests().len(), 1);
    // A plain 429 is still a rate limit, and retried.
    let fake = FakeOpenAi::start(vec![status(429), success()]).await;
    run(&provider(&fake, fast_policy())).await.unwrap();
    assert_eq!(fake.requests().len(), 2);
}

#[tokio::test]
async fn retry_after_above_the_cap_gives_up_at_once() {
    let fake = FakeOpenAi::start(vec![status_with(429, "retry-after", "120"), success()]).await;
    let err = run(&provider(&fake, fast_policy())).await.unwrap_err();
    assert!(matches!(err, ModelError::RateLimited(_)), "{err:?}");
    // Given up without waiting: one request, no second attempt.
    assert_eq!(fake.requests().len(), 1);
}

#[tokio::test]
async fn dropping_the_future_stops_the_retries() {
    let fake = FakeOpenAi::start(vec![status_with(503, "retry-after-ms", "300")]).await;
    let provider = provider(&fake, fast_policy());
    let pending = tokio::time::timeout(Duration::from_millis(100), provider.stream(request()));
    assert!(pending.await.is_err(), "should still be waiting");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(fake.requests().len(), 1);
}
