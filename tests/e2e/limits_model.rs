//! Bounds on a model step through gRPC, against fake upstreams on loopback:
//! the `max_tokens` sent and the per-call override's maximum, the byte
//! bound that cuts an upstream that never stops, the usage of a stopped
//! turn, a quota refusal, tool arguments that are not JSON, and the local
//! model's queue taken at admission.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::config::{ProviderConfig, ProviderKind};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_anthropic::{self, FakeAnthropic};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, read_until,
    text_request,
};

/// Bounds every wait, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(30);

async fn serve(provider: ProviderConfig, model: &str, dir: &std::path::Path) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = model.into();
    config.providers.push(provider);
    TestServer::start_with(config, &Providers::default()).await
}

fn finished_usage(events: &[agentrt_client::Event]) -> proto::Usage {
    match events.last().map(|e| &e.kind) {
        Some(ChatEvent::TurnFinished { usage, .. }) => *usage,
        other => panic!("the last event is not turn_finished: {other:?}"),
    }
}

#[tokio::test]
async fn an_upstream_that_never_stops_is_cut_at_the_output_bound_with_stop_reason_length() {
    const BOUND: usize = 64 * 1024;
    let delta = "x".repeat(1000);
    let fake = FakeOpenAi::start(vec![FakeReply::Endless {
        chunk: text_chunk(&delta),
    }])
    .await;
    let mut provider = mock_provider(&fake, None);
    provider.max_output_bytes = Some(BOUND);
    let dir = tempfile::tempdir().unwrap();
    let server = serve(provider, "mock/m", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let summary = tokio::time::timeout(
        WAIT,
        client
            .chat(&session, "talk forever")
            .await
            .unwrap()
            .finish(),
    )
    .await
    .expect("the turn ends although the upstream never does")
    .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert!(
        summary.text.len() > BOUND && summary.text.len() <= BOUND + delta.len(),
        "relayed {} bytes",
        summary.text.len()
    );
    // The upstream connection is closed, not left streaming.
    tokio::time::timeout(WAIT, fake.wait_clients_gone(1))
        .await
        .expect("the upstream request is dropped");

    let history = client.history(&session).await.unwrap();
    assert_eq!(history.len(), 2);
    let answer = &history[1];
    assert_eq!(answer.stop_reason, "length");
    let stored = message_text(answer).len();
    assert!(
        stored > BOUND && stored <= BOUND + delta.len(),
        "stored {stored} bytes, bound {BOUND} + one delta of {}",
        delta.len()
    );
    // No usage came from the upstream: the output is estimated.
    let usage = answer.usage.expect("the stored answer has usage");
    assert_eq!(usage.output_tokens, (stored as u64).div_ceil(4));
    assert_eq!(
        finished_usage(&summary.events).output_tokens,
        usage.output_tokens
    );
    server.stop().await;
}

#[tokio::test]
async fn max_tokens_is_sent_by_default_per_model_and_per_call() {
    let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![
        text_chunk("ok"),
        finish_chunk("stop"),
    ])])
    .await;
    let mut provider = mock_provider(&fake, None);
    provider.model_max_tokens = Some([("big".to_owned(), 9000)].into());
    let dir = tempfile::tempdir().unwrap();
    let server = serve(provider, "mock/m", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut requests = vec![text_request(&session, "default")];
    let mut big = text_request(&session, "per model");
    big.model = "mock/big".into();
    requests.push(big);
    let mut asked = text_request(&session, "per call");
    asked.max_output_tokens = Some(123);
    requests.push(asked);
    for request in requests {
        let summary = client
            .chat_with(request)
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
        assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    }
    let sent: Vec<_> = fake
        .requests()
        .iter()
        .map(|r| r.body["max_tokens"].clone())
        .collect();
    assert_eq!(sent, [json!(4096), json!(9000), json!(123)]);
    server.stop().await;
}

#[tokio::test]
async fn max_output_tokens_over_the_maximum_is_invalid_argument_before_anything_is_stored() {
    let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![finish_chunk("stop")])]).await;
    let mut provider = mock_provider(&fake, None);
    provider.max_tokens_limit = Some(8192);
    let dir = tempfile::tempdir().unwrap();
    let server = serve(provider, "mock/m", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    for (asked, says) in [(8193, "maximum of 8192"), (0, "at least 1")] {
        let mut request = text_request(&session, "too much");
        request.max_output_tokens = Some(asked);
        let err = match client.chat_with(request).await {
            Err(e) if e.status().is_some() => e.status().cloned().expect("a status"),
            other => panic!("{asked}: expected a refusal, got {other:?}"),
        };
        assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("max_output_tokens") && err.message().contains(says),
            "{}",
            err.message()
        );
    }
    assert!(client.history(&session).await.unwrap().is_empty());
    assert!(fake.requests().is_empty(), "the model was never called");
    // The maximum itself is fine.
    let mut request = text_request(&session, "just enough");
    request.max_output_tokens = Some(8192);
    client
        .chat_with(request)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(fake.requests()[0].body["max_tokens"], 8192);
    server.stop().await;
}

#[tokio::test]
async fn insufficient_quota_ends_the_turn_resource_exhausted_after_one_request() {
    let fake = FakeOpenAi::start(vec![FakeReply::Status {
        code: 429,
        body: json!({"error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota", "param": null, "code": "insufficient_quota",
        }})
        .to_string(),
    }])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = serve(mock_provider(&fake, None), "mock/m", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let summary = tokio::time::timeout(WAIT, client.chat(&session, "hi").await.unwrap().finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    assert_eq!(fake.requests().len(), 1, "a quota refusal is never retried");
    let (code, message) = summary
        .events
        .iter()
        .find_map(|e| match &e.kind {
            ChatEvent::Error { code, message } => Some((*code, message.clone())),
            _ => None,
        })
        .expect("an error event");
    assert_eq!(code, proto::ErrorCode::ResourceExhausted);
    assert!(message.contains("quota is exhausted"), "{message}");
    server.stop().await;
}

/// `probe`: a server tool that counts its calls.
#[derive(Debug, Default)]
struct Probe {
    calls: AtomicUsize,
}

#[async_trait]
impl ToolSource for Probe {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "probe".into(),
            description: "counts its calls".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ToolOutcome::ok("probed")
    }
}

fn call_chunk(index: usize, id: &str, name: &str, arguments: &str) -> Vec<u8> {
    let call = json!({
        "index": index, "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments}
    });
    sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}

#[tokio::test]
async fn tool_arguments_that_are_not_json_are_not_run_and_the_model_is_told() {
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            call_chunk(0, "call_1", "local__probe", "{\"depth\": "),
            call_chunk(1, "call_2", "get_time", "not json at all"),
            finish_chunk("tool_calls"),
        ]),
        FakeReply::sse(vec![text_chunk("let me try again"), finish_chunk("stop")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    let probe = Arc::new(Probe::default());
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", probe.clone()))
            .await;
    let url = server.url();
    let client = Client::connect(url).await.unwrap();
    let session = new_session(&client).await;

    let mut request = text_request(&session, "what time is it?");
    request.extra_tools = vec![proto::ToolDefinition {
        name: "get_time".into(),
        description: "the caller's clock".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }];
    let mut chat = client.chat_with(request).await.unwrap();
    // The caller must never be asked to run the garbage call: reading stops
    // at a tool_call (the failure) or at the end.
    let events = tokio::time::timeout(
        WAIT,
        read_until(&mut chat, |e| {
            matches!(
                e.kind,
                ChatEvent::ToolCall { .. } | ChatEvent::TurnFinished { .. }
            )
        }),
    )
    .await
    .unwrap();
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, ChatEvent::ToolCall { .. })),
        "the caller received a tool_call with arguments that are not JSON"
    );
    assert!(matches!(
        events.last().map(|e| &e.kind),
        Some(ChatEvent::TurnFinished {
            outcome: proto::TurnOutcome::Success,
            ..
        })
    ));
    assert_eq!(probe.calls.load(Ordering::SeqCst), 0, "the server tool ran");
    for id in ["call_1", "call_2"] {
        let last = events
            .iter()
            .filter_map(|e| match &e.kind {
                ChatEvent::ToolUse(u) if u.call_id == id => Some(u.status()),
                _ => None,
            })
            .next_back();
        assert_eq!(last, Some(proto::ToolStatus::Error), "{id}");
    }

    // Each call has an error result saying why, which the model is sent.
    let history = client.history(&session).await.unwrap();
    let results: Vec<_> = history
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::ToolResult(r)) => Some(r.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2, "{history:?}");
    for result in &results {
        assert!(result.is_error, "{result:?}");
        assert!(
            result.content.contains("not valid JSON") && result.content.contains("not executed"),
            "{}",
            result.content
        );
    }
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let told: Vec<_> = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(told.len(), 2);
    assert!(
        told.iter().all(|t| t.contains("not valid JSON")),
        "{told:?}"
    );
    assert_eq!(message_text(history.last().unwrap()), "let me try again");
    server.stop().await;
}

/// Streams `texts` after a `message_start` reporting `input_tokens`, then
/// hangs until the client goes away.
fn anthropic_hanging(input_tokens: u64, texts: &[&str]) -> FakeReply {
    let mut chunks = vec![
        fake_anthropic::message_start(input_tokens, 0),
        fake_anthropic::text_start(0),
    ];
    chunks.extend(texts.iter().map(|t| fake_anthropic::text_delta(0, t)));
    FakeReply::Sse {
        chunks,
        done: false,
        then_hang: true,
    }
}

/// Sends `text`, reads `deltas` text events, stops the turn; returns the
/// events and the stored partial answer.
async fn stop_after(
    client: &Client,
    session: &str,
    deltas: usize,
) -> (Vec<agentrt_client::Event>, proto::Message) {
    let mut chat = client.chat(session, "count slowly").await.unwrap();
    let mut seen = 0;
    let mut events = tokio::time::timeout(
        WAIT,
        read_until(&mut chat, |e| {
            seen += usize::from(matches!(e.kind, ChatEvent::Text(_)));
            seen == deltas
        }),
    )
    .await
    .unwrap();
    assert!(client.stop_session(session).await.unwrap());
    let rest = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Canceled));
    events.extend(rest.events);
    let history = client.history(session).await.unwrap();
    assert_eq!(history.len(), 2, "{history:?}");
    (events, history[1].clone())
}

#[tokio::test]
async fn a_stopped_turn_reports_and_stores_the_usage_its_provider_reported() {
    let fake = FakeAnthropic::start(vec![anthropic_hanging(25, &["one ", "two ", "three "])]).await;
    let provider = ProviderConfig {
        name: "claude".into(),
        kind: ProviderKind::Anthropic,
        ..mock_provider(&fake, None)
    };
    let dir = tempfile::tempdir().unwrap();
    let server = serve(provider, "claude/c", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let (events, partial) = stop_after(&client, &session, 3).await;
    assert_eq!(message_text(&partial), "one two three ");
    assert_eq!(partial.stop_reason, "cancelled");
    // The input from message_start; the output estimated from the 14 bytes
    // relayed, since Anthropic counts it only at the end.
    let expected = (25, 4);
    let finished = finished_usage(&events);
    assert_eq!(
        (finished.input_tokens, finished.output_tokens),
        expected,
        "turn_finished.usage"
    );
    let stored = partial.usage.expect("the partial answer has usage");
    assert_eq!(
        (stored.input_tokens, stored.output_tokens),
        expected,
        "the stored partial message's usage"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_stopped_openai_turn_stores_output_tokens_estimated_from_the_deltas() {
    let fake = FakeOpenAi::start(vec![FakeReply::Sse {
        chunks: vec![text_chunk("abcdefgh"), text_chunk("ijklmnop")],
        done: false,
        then_hang: true,
    }])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = serve(mock_provider(&fake, None), "mock/m", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let (events, partial) = stop_after(&client, &session, 2).await;
    assert_eq!(finished_usage(&events).output_tokens, 4);
    assert_eq!(partial.usage.map(|u| u.output_tokens), Some(4));
    server.stop().await;
}

/// The real model file: `AGENTRT_TEST_MODEL`, or `None` (skipped loudly)
/// unless `CI=true` / `AGENTRT_REQUIRE_MODEL=1` require it.
fn test_model() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("AGENTRT_TEST_MODEL").map(std::path::PathBuf::from);
    if let Some(path) = path.filter(|p| p.exists()) {
        return Some(path);
    }
    let required = std::env::var("CI").is_ok_and(|v| v == "true")
        || std::env::var("AGENTRT_REQUIRE_MODEL").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "AGENTRT_TEST_MODEL must name the local model file (CI / AGENTRT_REQUIRE_MODEL=1)"
    );
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED: AGENTRT_TEST_MODEL is not set to the local model file ***\n"
    );
    None
}

#[tokio::test]
async fn a_burst_on_the_local_model_is_refused_at_admission_not_inside_the_stream() {
    let Some(model) = test_model() else {
        return;
    };
    const BURST: usize = 14;
    let dir = tempfile::tempdir().unwrap();
    let mut config: Config = base_config(dir.path());
    config.local_model.path = Some(model);
    // One turn at a time, none waiting, each long enough to outlast the
    // burst.
    config.local_model.queue_depth = Some(0);
    config.local_model.max_tokens = Some(2048);
    let server = TestServer::start_with(config, &Providers::default()).await;
    let client = server.client().await;
    let mut sessions = Vec::new();
    for _ in 0..BURST {
        sessions.push(new_session(&client).await);
    }

    // All at once; each is admitted (its stream starts) or refused.
    let admissions = futures::future::join_all(sessions.iter().map(|session| {
        let mut request = text_request(session, "Tell me a long story about the sea.");
        request.model = "local/smollm2".into();
        client.chat_with(request)
    }));
    let admissions = tokio::time::timeout(WAIT, admissions)
        .await
        .expect("the burst is answered");
    let mut admitted = 0;
    let mut failed = Vec::new();
    for (session, admission) in sessions.iter().zip(admissions) {
        match admission {
            Err(e) if e.status().is_some() => {
                let status = e.status().cloned().expect("a status");
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(
                    client.history(session).await.unwrap().is_empty(),
                    "a refused turn stores nothing"
                );
            }
            Err(other) => panic!("{other:?}"),
            Ok(mut chat) => {
                // Admitted: it must run. End it once it streams.
                admitted += 1;
                let mut events = tokio::time::timeout(
                    Duration::from_secs(120),
                    read_until(&mut chat, |e| {
                        matches!(e.kind, ChatEvent::Text(_) | ChatEvent::TurnFinished { .. })
                    }),
                )
                .await
                .unwrap();
                let _ = client.stop_session(session).await;
                events.extend(
                    tokio::time::timeout(WAIT, chat.finish())
                        .await
                        .unwrap()
                        .unwrap()
                        .events,
                );
                let errors: Vec<_> = events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        ChatEvent::Error { code, message } => Some((*code, message.clone())),
                        _ => None,
                    })
                    .collect();
                if !errors.is_empty() {
                    failed.push(errors);
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {admitted} admitted turns failed inside the stream ({} refused at admission): \
         {failed:?}",
        failed.len(),
        BURST - admitted
    );
    assert!(
        (1..BURST).contains(&admitted),
        "{admitted} of {BURST} admitted"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_timed_out_turn_reports_and_stores_the_usage_seen() {
    let fake = FakeAnthropic::start(vec![anthropic_hanging(31, &["slow ", "answer"])]).await;
    let provider = ProviderConfig {
        name: "claude".into(),
        kind: ProviderKind::Anthropic,
        ..mock_provider(&fake, None)
    };
    let dir = tempfile::tempdir().unwrap();
    let server = serve(provider, "claude/c", dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut request = text_request(&session, "take your time");
    request.timeout = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let summary = tokio::time::timeout(WAIT, client.chat_with(request).await.unwrap().finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::TimedOut));
    assert_eq!(summary.text, "slow answer");
    // 11 bytes relayed: 3 tokens estimated.
    let finished = finished_usage(&summary.events);
    assert_eq!((finished.input_tokens, finished.output_tokens), (31, 3));
    let history = client.history(&session).await.unwrap();
    let partial = &history[1];
    assert_eq!(partial.stop_reason, "timeout");
    let stored = partial.usage.expect("the partial answer has usage");
    assert_eq!((stored.input_tokens, stored.output_tokens), (31, 3));
    server.stop().await;
}
