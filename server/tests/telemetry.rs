//! Traces end to end, in process: the real OTLP/gRPC exporter (configured
//! through the injectable `OTEL_*` lookup) sends to a test receiver the
//! spans of one tool-using turn started with a caller's `traceparent`, and
//! the fake upstream sees the `chat` spans' trace context; content is on
//! spans only with `capture_content`.
//!
//! One test per file: it installs the process-wide subscriber and
//! propagator.

#[path = "support/otlp.rs"]
mod otlp;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::config::LogFormat;
use agentrt_server::telemetry::{OtelEnv, Telemetry};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
const SECRET_TEXT: &str = "my private question";

#[derive(Debug)]
struct Clock;

#[async_trait]
impl ToolSource for Clock {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "now".into(),
            description: "the time".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        ToolOutcome::ok("noon")
    }
}

fn tool_call(id: &str, name: &str) -> Vec<u8> {
    let call = json!({
        "index": 0, "id": id, "type": "function",
        "function": {"name": name, "arguments": "{}"}
    });
    sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The span id in a `traceparent` header (`00-trace-span-flags`).
fn traceparent_ids(header: &str) -> (String, String) {
    let parts: Vec<&str> = header.split('-').collect();
    assert_eq!(parts.len(), 4, "{header}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn complete(spans: &[otlp::Got]) -> bool {
    let count = |name: &str| spans.iter().filter(|s| s.name.starts_with(name)).count();
    count("agentrt.v1.AgentRuntime/Chat") == 1
        && count("invoke_agent") == 1
        && count("chat ") == 2
        && count("execute_tool ") == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_using_turn_exports_rpc_agent_chat_and_tool_spans_under_the_callers_trace() {
    let mut receiver = otlp::Receiver::start().await;
    let vars: HashMap<&str, String> = HashMap::from([
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            receiver.endpoint.clone(),
        ),
        ("OTEL_METRICS_EXPORTER", "none".to_owned()),
        ("OTEL_SERVICE_NAME", "agentrt-under-test".to_owned()),
    ]);
    let otel = OtelEnv::from_lookup(&|k| vars.get(k).cloned()).unwrap();
    let telemetry = Arc::new(Telemetry::init(LogFormat::Json, Some("warn"), &otel, false).unwrap());
    assert!(telemetry.traces_on());

    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            tool_call("call_1", "local__now"),
            finish_chunk("tool_calls"),
            usage_chunk(11, 3),
        ]),
        FakeReply::sse(vec![
            text_chunk("it is noon"),
            finish_chunk("stop"),
            usage_chunk(20, 4),
        ]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse_toml(&format!(
        "default_model = \"mock/m\"\n[[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n",
        fake.base_url()
    ))
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().to_path_buf();
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", Arc::new(Clock)))
            .await;
    let url = server.url();
    let client = Client::connect(url).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;

    let mut request = tonic::Request::new(proto::ChatRequest {
        session_id: session.clone(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: SECRET_TEXT.into(),
            })),
        }],
        ..Default::default()
    });
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
            .parse()
            .unwrap(),
    );
    let mut stream = client
        .runtime_raw()
        .chat(request)
        .await
        .unwrap()
        .into_inner();
    let mut outcome = None;
    while let Some(event) = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
    {
        if let Some(proto::chat_event::Kind::TurnFinished(f)) = event.kind {
            outcome = Some(f.outcome);
        }
    }
    assert_eq!(outcome, Some(proto::TurnOutcome::Success as i32));

    // The turn's spans end as its tasks do (the title job last): flush
    // until all of them arrived.
    let started = Instant::now();
    let mut spans = Vec::new();
    while !complete(&spans) {
        assert!(started.elapsed() < WAIT, "spans so far: {spans:#?}");
        let t = Arc::clone(&telemetry);
        tokio::task::spawn_blocking(move || t.flush())
            .await
            .unwrap();
        spans.extend(receiver.drain(Duration::from_millis(100)).await);
    }
    server.stop().await;

    let by_prefix = |name: &str| -> Vec<&otlp::Got> {
        spans.iter().filter(|s| s.name.starts_with(name)).collect()
    };
    let rpc = by_prefix("agentrt.v1.AgentRuntime/Chat")[0];
    let agent = by_prefix("invoke_agent")[0];
    let chats = by_prefix("chat ");
    let tool = by_prefix("execute_tool ")[0];

    // The RPC span continues the caller's trace.
    assert_eq!(hex(&rpc.trace_id), CALLER_TRACE);
    assert_eq!(hex(&rpc.parent_span_id), CALLER_SPAN);
    assert_eq!(rpc.kind, 2, "SERVER");
    assert_eq!(rpc.attr("rpc.system.name"), Some("grpc"));
    assert_eq!(rpc.attr("rpc.method"), Some("agentrt.v1.AgentRuntime/Chat"));
    assert_eq!(rpc.attr("rpc.response.status_code"), Some("OK"));
    assert_eq!(rpc.service_name.as_deref(), Some("agentrt-under-test"));

    // RPC → invoke_agent → chat ×2 and execute_tool, all in one trace.
    assert_eq!(agent.parent_span_id, rpc.span_id);
    assert_eq!(agent.attr("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(agent.attr("gen_ai.conversation.id"), Some(session.as_str()));
    assert_eq!(agent.attr("agentrt.turn.outcome"), Some("success"));
    for s in chats.iter().chain([&tool]) {
        assert_eq!(hex(&s.trace_id), CALLER_TRACE, "{s:?}");
        assert_eq!(s.parent_span_id, agent.span_id, "{s:?}");
    }
    let (first, second) = if chats[0].attr("gen_ai.usage.input_tokens") == Some("11") {
        (chats[0], chats[1])
    } else {
        (chats[1], chats[0])
    };
    for c in [first, second] {
        assert_eq!(c.name, "chat m");
        assert_eq!(c.kind, 3, "CLIENT");
        assert_eq!(c.attr("gen_ai.operation.name"), Some("chat"));
        assert_eq!(c.attr("gen_ai.provider.name"), Some("mock"));
        assert_eq!(c.attr("gen_ai.request.model"), Some("m"));
        assert!(
            c.attr("gen_ai.response.time_to_first_chunk").is_some(),
            "{c:?}"
        );
    }
    assert_eq!(first.attr("gen_ai.usage.input_tokens"), Some("11"));
    assert_eq!(first.attr("gen_ai.usage.output_tokens"), Some("3"));
    assert_eq!(
        first.attr("gen_ai.response.finish_reasons"),
        Some("tool_calls")
    );
    assert_eq!(second.attr("gen_ai.usage.input_tokens"), Some("20"));
    assert_eq!(second.attr("gen_ai.usage.output_tokens"), Some("4"));
    assert_eq!(second.attr("gen_ai.response.finish_reasons"), Some("stop"));
    assert_eq!(tool.name, "execute_tool local__now");
    assert_eq!(tool.attr("gen_ai.tool.name"), Some("local__now"));
    assert_eq!(tool.attr("gen_ai.tool.call.id"), Some("call_1"));

    // Each provider request carried its own chat span's context.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    for (request, chat) in requests.iter().zip([first, second]) {
        let header = request.header("traceparent").expect("a traceparent");
        assert_eq!(
            traceparent_ids(header),
            (CALLER_TRACE.to_owned(), hex(&chat.span_id))
        );
    }

    // No message content on any span without capture_content.
    for s in &spans {
        for v in s.attrs.values() {
            assert!(
                !v.contains(SECRET_TEXT) && !v.contains("it is noon"),
                "{s:?}"
            );
        }
    }

    // With `[telemetry] capture_content = true` the answer is on its span.
    let fake = FakeOpenAi::start(vec![FakeReply::sse(vec![
        text_chunk("captured answer"),
        finish_chunk("stop"),
        usage_chunk(1, 1),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse_toml(&format!(
        "default_model = \"mock/m\"\n[telemetry]\ncapture_content = true\n[[providers]]\nname = \"mock\"\nkind = \"openai\"\nbase_url = \"{}\"\n",
        fake.base_url()
    ))
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().to_path_buf();
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    let url = server.url();
    let client = Client::connect(url).await.unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let turn = client
        .chat(&session, "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(turn.text, "captured answer");
    let started = Instant::now();
    let mut spans = Vec::new();
    let captured = |spans: &[otlp::Got]| {
        spans.iter().any(|s| {
            s.name == "chat m"
                && s.attr("gen_ai.output.messages")
                    .is_some_and(|m| m.contains("captured answer"))
        })
    };
    while !captured(&spans) {
        assert!(started.elapsed() < WAIT, "spans so far: {spans:#?}");
        let t = Arc::clone(&telemetry);
        tokio::task::spawn_blocking(move || t.flush())
            .await
            .unwrap();
        spans.extend(receiver.drain(Duration::from_millis(100)).await);
    }
    server.stop().await;
}
