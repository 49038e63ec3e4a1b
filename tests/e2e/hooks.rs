//! Operator hooks (`[[hooks]]`, `agentrt.hooks.v1.HookService`): a fake
//! gRPC hook service and an HTTP JSON hook (the fake upstream answering
//! JSON) guard turns, model calls and tool calls of a real server whose
//! provider has an API key the hooks must never see.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{Client, proto};
use agentrt_proto::hooks::v1 as pb;
use agentrt_proto::hooks::v1::hook_service_server::{HookService, HookServiceServer};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::config::HookConfig;
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::{Code, Request, Response, Status};
use tonic_types::StatusExt as _;

use super::harness::{base_config, message_text, mock_provider, new_session, text_request};

const WAIT: Duration = Duration::from_secs(30);
/// The provider's API key: sent upstream, never to a hook.
const PROVIDER_KEY: &str = "sk-provider-secret-4f9a1c";
const KEY_VAR: &str = "HOOKS_TEST_PROVIDER_KEY";

/// What the fake hook service does.
#[derive(Debug, Clone, Copy)]
enum Mode {
    /// Denies every server tool call; allows the rest.
    DenyTools,
    /// Refuses turns whose text says "forbidden".
    RefuseTurns,
    /// Refuses every model call.
    RefuseModelCalls,
    /// Never answers.
    Silent,
}

/// One call the fake received: its RPC, and everything it was sent (the
/// encoded message and the metadata) as text.
#[derive(Debug)]
struct Seen {
    rpc: &'static str,
    sent: String,
}

#[derive(Debug, Clone)]
struct FakeHook {
    mode: Mode,
    seen: mpsc::UnboundedSender<Seen>,
}

impl FakeHook {
    async fn record<T: prost::Message>(&self, rpc: &'static str, request: &Request<T>) {
        let sent = format!(
            "{:?} {}",
            request.metadata(),
            String::from_utf8_lossy(&request.get_ref().encode_to_vec())
        );
        let _ = self.seen.send(Seen { rpc, sent });
        if matches!(self.mode, Mode::Silent) {
            std::future::pending::<()>().await;
        }
    }
}

#[tonic::async_trait]
impl HookService for FakeHook {
    async fn before_turn(
        &self,
        request: Request<pb::BeforeTurnRequest>,
    ) -> Result<Response<pb::BeforeTurnResponse>, Status> {
        self.record("BeforeTurn", &request).await;
        use pb::before_turn_response::{Decision, Refuse};
        let refuse = matches!(self.mode, Mode::RefuseTurns)
            && request.get_ref().user_text.contains("forbidden");
        Ok(Response::new(pb::BeforeTurnResponse {
            decision: refuse.then(|| {
                Decision::Refuse(Refuse {
                    reason: "this topic is off limits here".into(),
                })
            }),
        }))
    }

    async fn before_model_call(
        &self,
        request: Request<pb::BeforeModelCallRequest>,
    ) -> Result<Response<pb::BeforeModelCallResponse>, Status> {
        self.record("BeforeModelCall", &request).await;
        use pb::before_model_call_response::{Decision, Refuse};
        Ok(Response::new(pb::BeforeModelCallResponse {
            decision: matches!(self.mode, Mode::RefuseModelCalls).then(|| {
                Decision::Refuse(Refuse {
                    reason: "the model budget is closed".into(),
                })
            }),
        }))
    }

    async fn after_step(
        &self,
        request: Request<pb::AfterStepRequest>,
    ) -> Result<Response<pb::AfterStepResponse>, Status> {
        self.record("AfterStep", &request).await;
        Ok(Response::new(pb::AfterStepResponse {}))
    }

    async fn before_tool_call(
        &self,
        request: Request<pb::BeforeToolCallRequest>,
    ) -> Result<Response<pb::BeforeToolCallResponse>, Status> {
        self.record("BeforeToolCall", &request).await;
        use pb::before_tool_call_response::{Decision, Deny};
        Ok(Response::new(pb::BeforeToolCallResponse {
            decision: matches!(self.mode, Mode::DenyTools).then(|| {
                Decision::Deny(Deny {
                    reason: "writes are not allowed today".into(),
                })
            }),
        }))
    }

    async fn after_tool_call(
        &self,
        request: Request<pb::AfterToolCallRequest>,
    ) -> Result<Response<pb::AfterToolCallResponse>, Status> {
        self.record("AfterToolCall", &request).await;
        Ok(Response::new(pb::AfterToolCallResponse { decision: None }))
    }
}

/// Serves a fake hook on a loopback port: its `grpc://` URL and what it
/// receives.
async fn start_hook(mode: Mode) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, rx) = mpsc::unbounded_channel();
    let service = HookServiceServer::new(FakeHook { mode, seen });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    (format!("grpc://{addr}"), rx)
}

fn hook(
    name: &str,
    url: &str,
    points: Option<&[&str]>,
    timeout: Duration,
    open: bool,
) -> HookConfig {
    HookConfig {
        name: name.into(),
        url: url.into(),
        points: points.map(|p| p.iter().map(|s| (*s).to_owned()).collect()),
        timeout,
        fail_open: open,
        bearer_env: None,
    }
}

/// `echo`: reports its arguments to the test and returns them.
#[derive(Debug)]
struct Echo(mpsc::UnboundedSender<String>);

#[async_trait]
impl ToolSource for Echo {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "echo".into(),
            description: "echoes its arguments".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, arguments_json: &str) -> ToolOutcome {
        let _ = self.0.send(arguments_json.to_owned());
        ToolOutcome::ok(format!("the secret plan is {arguments_json}"))
    }
}

/// The fake upstream's script: a call of `local__echo` with `{"x":1}`,
/// then the answer "done".
async fn tool_calling_upstream() -> FakeOpenAi {
    let call = json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "local__echo", "arguments": "{\"x\":1}"}
    });
    FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
            finish_chunk("tool_calls"),
        ]),
        FakeReply::sse(vec![text_chunk("done"), finish_chunk("stop")]),
    ])
    .await
}

/// A server whose `mock` provider (with an API key) is `fake`, with the
/// `local__echo` tool and `hooks`.
async fn server(
    dir: &std::path::Path,
    fake: &FakeOpenAi,
    hooks: Vec<HookConfig>,
) -> (InProcessServer, mpsc::UnboundedReceiver<String>) {
    let mut config: Config = base_config(dir);
    config.default_model = "mock/m".into();
    let mut provider = mock_provider(fake, None);
    provider.api_key_env = Some(KEY_VAR.into());
    config.providers.push(provider);
    config.hooks = hooks;
    let (calls, calls_rx) = mpsc::unbounded_channel();
    let builder = ServerBuilder::new(config)
        .env_lookup(|name| (name == KEY_VAR).then(|| PROVIDER_KEY.to_owned()))
        .tool_source("local", Arc::new(Echo(calls)));
    (InProcessServer::start(builder).await, calls_rx)
}

/// The content of the tool message in the model request `request`.
fn tool_result_sent(fake: &FakeOpenAi, request: usize) -> String {
    let body = &fake.requests()[request].body;
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("no tool message in {body}"))
}

fn drain(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Ok(s) = rx.try_recv() {
        seen.push(s);
    }
    seen
}

#[tokio::test]
async fn a_denying_before_tool_hook_tells_the_model_and_never_sees_the_provider_key() {
    let fake = tool_calling_upstream().await;
    let (url, mut seen) = start_hook(Mode::DenyTools).await;
    let dir = tempfile::tempdir().unwrap();
    let guard = hook("guard", &url, None, Duration::from_secs(5), false);
    let (server, mut tool_calls) = server(dir.path(), &fake, vec![guard]).await;
    let client = Client::connect(server.url()).await.unwrap();
    let session = new_session(&client).await;

    let summary = tokio::time::timeout(WAIT, async {
        client
            .chat(&session, "write it")
            .await
            .unwrap()
            .finish()
            .await
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(summary.text, "done");

    // The model got the denial as the call's result; the tool never ran.
    let result = tool_result_sent(&fake, 1);
    assert!(
        result.contains("denied") && result.contains("writes are not allowed today"),
        "{result}"
    );
    assert!(tool_calls.try_recv().is_err(), "the denied tool ran");

    // Every point was called, in the turn's order.
    let seen = drain(&mut seen);
    let rpcs: Vec<_> = seen.iter().map(|s| s.rpc).collect();
    assert_eq!(
        rpcs,
        [
            "BeforeTurn",
            "BeforeModelCall",
            "AfterStep",
            "BeforeToolCall",
            "AfterToolCall",
            "BeforeModelCall",
            "AfterStep"
        ]
    );
    assert!(seen[0].sent.contains("write it"), "{}", seen[0].sent);
    assert!(seen[3].sent.contains("local__echo"), "{}", seen[3].sent);
    // The provider was sent its key; no hook call carried it.
    let upstream_auth = fake.requests()[0]
        .header("authorization")
        .unwrap_or_default()
        .to_owned();
    assert!(upstream_auth.contains(PROVIDER_KEY), "{upstream_auth}");
    for s in &seen {
        assert!(!s.sent.contains(PROVIDER_KEY), "{} carried the key", s.rpc);
    }
    server.stop().await;
}

#[tokio::test]
async fn an_http_hook_rewrites_arguments_and_redacts_the_stored_result() {
    let fake = tool_calling_upstream().await;
    let http_hook = FakeOpenAi::start(vec![
        FakeReply::Status {
            code: 200,
            body: r#"{"rewrite":{"argumentsJson":"{\"x\":2}"}}"#.into(),
        },
        FakeReply::Status {
            code: 200,
            body: r#"{"redact":{"replacement":"[redacted by policy]"}}"#.into(),
        },
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let points: &[&str] = &["before_tool_call", "after_tool_call"];
    let guard = hook(
        "web",
        &http_hook.base_url(),
        Some(points),
        Duration::from_secs(5),
        false,
    );
    let (server, mut tool_calls) = server(dir.path(), &fake, vec![guard]).await;
    let client = Client::connect(server.url()).await.unwrap();
    let session = new_session(&client).await;

    let summary = tokio::time::timeout(WAIT, async {
        client
            .chat(&session, "run it")
            .await
            .unwrap()
            .finish()
            .await
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));

    // The tool ran with the rewritten arguments.
    assert_eq!(tool_calls.try_recv().unwrap(), r#"{"x":2}"#);
    // The replacement is what the model saw and what history keeps.
    assert_eq!(tool_result_sent(&fake, 1), "[redacted by policy]");
    let history = client.history(&session).await.unwrap();
    let stored: Vec<_> = history
        .iter()
        .filter_map(|m| match m.content.first().and_then(|b| b.block.as_ref()) {
            Some(proto::content_block::Block::ToolResult(r)) => Some(r.content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(stored, ["[redacted by policy]"]);
    // The tool's output streamed to the caller was the replacement too.
    let streamed = format!("{:?}", summary.events);
    assert!(!streamed.contains("the secret plan"), "{streamed}");

    // Proto3 JSON, one path per RPC; no provider key.
    let requests = http_hook.requests();
    let paths: Vec<_> = requests.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/v1/BeforeToolCall", "/v1/AfterToolCall"]);
    assert_eq!(requests[0].body["call"]["toolName"], "local__echo");
    assert_eq!(requests[0].body["call"]["argumentsJson"], r#"{"x":1}"#);
    assert_eq!(requests[0].body["turn"]["hookName"], "web");
    assert_eq!(requests[1].body["call"]["argumentsJson"], r#"{"x":2}"#);
    assert_eq!(requests[1].body["result"], r#"the secret plan is {"x":2}"#);
    for r in &requests {
        assert!(
            !format!("{:?} {}", r.headers, r.body).contains(PROVIDER_KEY),
            "{} carried the key",
            r.path
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_refusing_before_turn_hook_fails_the_chat_with_its_reason_and_stores_nothing() {
    let fake = tool_calling_upstream().await;
    let (url, _seen) = start_hook(Mode::RefuseTurns).await;
    let dir = tempfile::tempdir().unwrap();
    let guard = hook("topics", &url, None, Duration::from_secs(5), false);
    let (server, _tools) = server(dir.path(), &fake, vec![guard]).await;
    let client = Client::connect(server.url()).await.unwrap();
    let session = new_session(&client).await;

    let err = client
        .chat(&session, "tell me the forbidden thing")
        .await
        .unwrap_err();
    let status = err.status().expect("a status");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains("this topic is off limits here"),
        "{}",
        status.message()
    );
    let info = status.get_error_details().error_info().cloned().unwrap();
    assert_eq!(info.reason, "HOOK_REFUSED");
    assert_eq!(
        info.metadata.get("hook").map(String::as_str),
        Some("topics")
    );
    assert!(client.history(&session).await.unwrap().is_empty());
    assert!(fake.requests().is_empty(), "the model was called");

    // Nothing held: the next turn of the session runs.
    let mut req = text_request(&session, "hello");
    req.model = "builtin/echo".into();
    let summary = client.chat_with(req).await.unwrap().finish().await.unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    server.stop().await;
}

#[tokio::test]
async fn a_refusing_before_model_call_hook_ends_the_turn_before_the_model_is_called() {
    let fake = tool_calling_upstream().await;
    let (url, _seen) = start_hook(Mode::RefuseModelCalls).await;
    let dir = tempfile::tempdir().unwrap();
    let guard = hook("budget", &url, None, Duration::from_secs(5), false);
    let (server, _tools) = server(dir.path(), &fake, vec![guard]).await;
    let client = Client::connect(server.url()).await.unwrap();
    let session = new_session(&client).await;

    let summary = tokio::time::timeout(WAIT, async {
        client.chat(&session, "hi").await.unwrap().finish().await
    })
    .await
    .unwrap()
    .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    let status = summary.status.expect("a trailing status");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert!(
        status.message().contains("the model budget is closed"),
        "{}",
        status.message()
    );
    assert!(fake.requests().is_empty(), "the model was called");
    // The turn had started: its user message is stored.
    let history = client.history(&session).await.unwrap();
    assert_eq!(history.len(), 1);
    assert_eq!(message_text(&history[0]), "hi");
    server.stop().await;
}

#[tokio::test]
async fn a_silent_hook_refuses_the_turn_within_its_timeout_when_fail_closed_and_not_when_fail_open()
{
    let fake = tool_calling_upstream().await;
    let (url, mut seen) = start_hook(Mode::Silent).await;
    let timeout = Duration::from_millis(300);
    for (point, fail_open) in [
        ("before_turn", false),
        ("before_turn", true),
        ("before_model_call", false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let guard = hook("slow", &url, Some(&[point]), timeout, fail_open);
        let (server, _tools) = server(dir.path(), &fake, vec![guard]).await;
        let client = Client::connect(server.url()).await.unwrap();
        let session = new_session(&client).await;
        let mut req = text_request(&session, "anyone there?");
        req.model = "builtin/echo".into();

        let started = Instant::now();
        let chat = tokio::time::timeout(WAIT, async {
            match client.chat_with(req).await {
                Ok(stream) => Ok(stream.finish().await.unwrap()),
                Err(err) => Err(err),
            }
        })
        .await
        .expect("a silent hook hung the turn");
        // The hook was asked (and never answered).
        let asked = seen.recv().await.unwrap().rpc;
        match (point, fail_open) {
            ("before_turn", true) => {
                assert_eq!(asked, "BeforeTurn");
                let summary = chat.expect("fail-open runs the turn");
                assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
                assert_eq!(client.history(&session).await.unwrap().len(), 2);
            }
            ("before_turn", false) => {
                assert_eq!(asked, "BeforeTurn");
                let err = chat.expect_err("fail-closed refuses the turn");
                let status = err.status().expect("a status");
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.message().contains("slow"), "{}", status.message());
                let info = status.get_error_details().error_info().cloned().unwrap();
                assert_eq!(info.reason, "HOOK_UNAVAILABLE");
                assert!(client.history(&session).await.unwrap().is_empty());
            }
            _ => {
                assert_eq!(asked, "BeforeModelCall");
                // Admitted, then ended before the model was called.
                let summary = chat.expect("the turn was admitted");
                assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
                let status = summary.status.expect("a trailing status");
                assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                assert!(status.message().contains("slow"), "{}", status.message());
                let history = client.history(&session).await.unwrap();
                assert_eq!(history.len(), 1, "only the user message");
            }
        }
        // Bounded by the hook's timeout, not by the hook.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        server.stop().await;
    }
}
