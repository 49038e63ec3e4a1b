//! An in-process tool source registered with `ServerBuilder::tool_source`:
//! server tools run while the turn waits for a caller-executed tool, and the
//! results are stored in call order.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

use super::harness::{base_config, mock_provider, new_session, read_until, text_request};

const WAIT: Duration = Duration::from_secs(30);

/// `wait`: reports its start, then waits for a permit from the test.
#[derive(Debug)]
struct Gate {
    started: mpsc::UnboundedSender<String>,
    release: Semaphore,
}

#[async_trait]
impl ToolSource for Gate {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "wait".into(),
            description: "waits for the test".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, arguments_json: &str) -> ToolOutcome {
        let _ = self.started.send(arguments_json.to_owned());
        self.release.acquire().await.unwrap().forget();
        ToolOutcome::ok("released")
    }
}

fn call_chunk(index: usize, id: &str, name: &str) -> Vec<u8> {
    let call = json!({
        "index": index, "id": id, "type": "function",
        "function": {"name": name, "arguments": "{}"}
    });
    sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}

#[tokio::test]
async fn server_tools_run_while_a_caller_tool_is_awaited_and_results_keep_call_order() {
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            call_chunk(0, "call_1", "local__wait"),
            call_chunk(1, "call_2", "get_time"),
            finish_chunk("tool_calls"),
        ]),
        FakeReply::sse(vec![text_chunk("both done"), finish_chunk("stop")]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    let (started, mut starts) = mpsc::unbounded_channel();
    let gate = Arc::new(Gate {
        started,
        release: Semaphore::new(0),
    });
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", gate.clone())).await;
    let url = server.url();
    let client = Client::connect(url).await.unwrap();
    let session = new_session(&client).await;

    let mut req = text_request(&session, "time?");
    req.extra_tools = vec![proto::ToolDefinition {
        name: "get_time".into(),
        description: "the caller's clock".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }];
    let mut chat = client.chat_with(req).await.unwrap();
    let seen = read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
    // The server tool is running while the caller's result is awaited.
    tokio::time::timeout(WAIT, starts.recv())
        .await
        .unwrap()
        .unwrap();
    client
        .submit_tool_result(&session, &seen[0].turn_id, "call_2", "noon", false)
        .await
        .unwrap();
    gate.release.add_permits(1);
    let rest = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Success));

    let offered: Vec<_> = fake.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(offered, ["local__wait", "get_time"]);
    let history = client.history(&session).await.unwrap();
    let results: Vec<_> = history[2..4]
        .iter()
        .map(|m| match &m.content[0].block {
            Some(proto::content_block::Block::ToolResult(r)) => {
                (r.call_id.clone(), r.content.clone())
            }
            other => panic!("not a tool result: {other:?}"),
        })
        .collect();
    assert_eq!(
        results,
        [
            ("call_1".to_owned(), "released".to_owned()),
            ("call_2".to_owned(), "noon".to_owned())
        ]
    );
    server.stop().await;
}
