//! Server tools from an MCP server: the stdio test server of
//! `crates/runtime/examples/mcp_test_server.rs` (rmcp), configured as
//! `[[mcp_servers]] name = "test"`, against the scripted OpenAI fake.
//!
//! The MCP server reports what it sees (start, cancellations) by appending
//! lines to `MCP_TEST_RECORD`, here a FIFO the test reads: no polling.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentrt_client::{ChatEvent, Event, proto};
use agentrt_server::Config;
use agentrt_server::config::McpServerConfig;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::tools::mcp_test_server;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader, Lines};
use tokio::net::unix::pipe;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, text_request,
};

/// Failure guard for every wait.
const WAIT: Duration = Duration::from_secs(30);

/// The lines the MCP server records, read from a FIFO.
struct Record {
    path: PathBuf,
    lines: Lines<BufReader<pipe::Receiver>>,
}

impl Record {
    fn new(dir: &Path) -> Self {
        let path = dir.join("mcp-record");
        let made = std::process::Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("running mkfifo");
        assert!(made.success());
        // Read-write, so it neither sees EOF between writers nor makes
        // their opens wait.
        let rx = pipe::OpenOptions::new()
            .read_write(true)
            .open_receiver(&path)
            .unwrap();
        Self {
            path,
            lines: BufReader::new(rx).lines(),
        }
    }

    /// Reads lines until one starts with `prefix`; returns it.
    async fn until(&mut self, prefix: &str) -> String {
        self.until_all(&[prefix]).await.remove(0)
    }

    /// Reads lines until, for each prefix, one started with it (in any
    /// order); returns them in the order of `prefixes`.
    async fn until_all(&mut self, prefixes: &[&str]) -> Vec<String> {
        let mut found: Vec<Option<String>> = vec![None; prefixes.len()];
        let read = async {
            while found.iter().any(Option::is_none) {
                let line = self.lines.next_line().await.unwrap().unwrap();
                if let Some(i) = prefixes.iter().position(|p| line.starts_with(p)) {
                    found[i].get_or_insert(line);
                }
            }
        };
        if tokio::time::timeout(WAIT, read).await.is_err() {
            panic!("the MCP server never recorded all of {prefixes:?}: {found:?}");
        }
        found.into_iter().flatten().collect()
    }
}

fn config(dir: &Path, fake: &FakeOpenAi, record: &Record) -> Config {
    let mut config = base_config(dir);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    config.mcp_servers.push(McpServerConfig {
        name: "test".into(),
        command: Some(mcp_test_server().display().to_string()),
        env: [(
            "MCP_TEST_RECORD".to_owned(),
            record.path.display().to_string(),
        )]
        .into(),
        ..McpServerConfig::default()
    });
    config
}

/// One streamed tool-call fragment carrying a whole call.
fn call_chunk(index: usize, id: &str, name: &str, arguments: &Value) -> Vec<u8> {
    let call = json!({
        "index": index, "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}
    });
    sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}

/// A model step that calls the tools `(id, name, arguments)`.
fn calls(list: &[(&str, &str, Value)]) -> FakeReply {
    let mut chunks: Vec<_> = list
        .iter()
        .enumerate()
        .map(|(i, (id, name, args))| call_chunk(i, id, name, args))
        .collect();
    chunks.push(finish_chunk("tool_calls"));
    FakeReply::sse(chunks)
}

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![text_chunk(text), finish_chunk("stop")])
}

/// The final `tool_use` event of `call_id`: (status, content).
fn tool_end(events: &[Event], call_id: &str) -> (proto::ToolStatus, String) {
    events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            ChatEvent::ToolUse(t) if t.call_id == call_id => Some((t.status(), t.content.clone())),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool_use event for {call_id}"))
}

/// The `tool` messages of a recorded model request: (call id, content).
fn tool_messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_owned(),
                m["content"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn tool_result(m: &proto::Message) -> proto::ToolResultBlock {
    match &m.content[0].block {
        Some(proto::content_block::Block::ToolResult(r)) => r.clone(),
        other => panic!("not a tool result: {other:?}"),
    }
}

async fn finish(chat: agentrt_client::EventStream) -> agentrt_client::TurnSummary {
    tokio::time::timeout(WAIT, chat.finish())
        .await
        .expect("the turn ended")
        .unwrap()
}

#[tokio::test]
async fn an_mcp_tool_is_discovered_and_called_and_its_result_reaches_the_model() {
    let fake = FakeOpenAi::start(vec![
        calls(&[
            ("call_1", "test__echo", json!({"text": "hello from mcp"})),
            ("call_2", "test__fail", json!({})),
        ]),
        answer("done"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut record = Record::new(dir.path());
    let server =
        TestServer::start_with(config(dir.path(), &fake, &record), &Providers::default()).await;
    record.until("ready ").await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let chat = client.chat(&session, "use the tools").await.unwrap();
    let summary = finish(chat).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let events = &summary.events;
    assert_eq!(
        tool_end(events, "call_1"),
        (proto::ToolStatus::Done, "hello from mcp".to_owned())
    );
    assert_eq!(
        tool_end(events, "call_2"),
        (proto::ToolStatus::Error, "the fail tool failed".to_owned())
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e.kind, ChatEvent::ToolCall { .. })),
        "server tools are not handed to the caller"
    );

    let requests = fake.requests();
    assert_eq!(
        offered(&requests[0].body),
        [
            "test__echo",
            "test__slow",
            "test__fail",
            "test__picture",
            "test__pwd",
            "test__pid",
            "test__write_file",
            "test__limits",
            "test__connect"
        ]
    );
    let echo = &requests[0].body["tools"][0]["function"];
    assert_eq!(echo["description"], "Returns its text");
    assert_eq!(echo["parameters"]["required"], json!(["text"]));
    let results = tool_messages(&requests[1].body);
    assert_eq!(results[0], ("call_1".into(), "hello from mcp".into()));
    assert_eq!(results[1].0, "call_2");
    assert!(results[1].1.contains("the fail tool failed"), "{results:?}");

    let history = client.history(&session).await.unwrap();
    let roles: Vec<_> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            proto::Role::User,
            proto::Role::Assistant,
            proto::Role::Tool,
            proto::Role::Tool,
            proto::Role::Assistant
        ]
    );
    assert!(!tool_result(&history[2]).is_error);
    assert!(tool_result(&history[3]).is_error);
    assert_eq!(message_text(&history[4]), "done");
    server.stop().await;
}

#[tokio::test]
async fn stop_during_a_slow_mcp_call_cancels_it_on_the_mcp_server() {
    // Two calls, one at a time: the stop finds the first running and the
    // second not yet started.
    let fake = FakeOpenAi::start(vec![calls(&[
        ("call_1", "test__slow", json!({"ms": 600_000})),
        ("call_2", "test__slow", json!({"ms": 600_000})),
    ])])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut record = Record::new(dir.path());
    let mut one_at_a_time = config(dir.path(), &fake, &record);
    one_at_a_time.tools.max_parallel = 1;
    let server = TestServer::start_with(one_at_a_time, &Providers::default()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut chat = client.chat(&session, "be slow").await.unwrap();
    // The MCP server got the call's id in `_meta`.
    let started = record.until("slow started").await;
    assert_eq!(started, "slow started call_1");
    assert_eq!(client.session_status(&session).await.unwrap().phase, "tool");
    assert!(client.stop_session(&session).await.unwrap());
    let mut statuses = Vec::new();
    while let Some(event) = futures::StreamExt::next(&mut chat).await {
        if let Ok(agentrt_client::Event {
            kind: agentrt_client::ChatEvent::ToolUse(t),
            ..
        }) = event
        {
            statuses.push((t.call_id.clone(), t.status()));
        }
    }
    // RUNNING each, then the record of each call the stop cut short: the
    // one running, the one that never started.
    let status = |id: &str, s| (id.to_owned(), s);
    assert_eq!(
        statuses,
        [
            status("call_1", proto::ToolStatus::Running),
            status("call_2", proto::ToolStatus::Running),
            status("call_1", proto::ToolStatus::OutcomeUnknown),
            status("call_2", proto::ToolStatus::Cancelled),
        ]
    );
    // The MCP server got `notifications/cancelled` and the call saw it.
    let seen = record.until_all(&["cancelled ", "slow cancelled"]).await;
    assert!(seen[0].contains("abandoned"), "{seen:?}");

    let history = client.history(&session).await.unwrap();
    assert_eq!(
        history.len(),
        4,
        "user, assistant with the calls, their results"
    );
    let result = tool_result(&history[2]);
    assert_eq!(result.call_id, "call_1");
    assert!(
        result.is_error && result.content.contains("outcome is unknown"),
        "{result:?}"
    );
    assert_eq!(
        result.interrupted(),
        proto::ToolCallInterrupted::OutcomeUnknown
    );
    let result = tool_result(&history[3]);
    assert_eq!(result.call_id, "call_2");
    assert!(
        result.is_error && result.content.contains("was not run"),
        "{result:?}"
    );
    assert_eq!(result.interrupted(), proto::ToolCallInterrupted::Cancelled);
    let turns = client
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(turns.turns[0].outcome(), proto::TurnOutcome::Canceled);
    server.stop().await;
}

#[tokio::test]
async fn a_killed_mcp_server_gives_an_error_result_and_is_restarted_later() {
    let fake = FakeOpenAi::start(vec![
        calls(&[("call_1", "test__slow", json!({"ms": 600_000}))]),
        answer("carried on"),
        calls(&[("call_2", "test__echo", json!({"text": "back again"}))]),
        answer("ok"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut record = Record::new(dir.path());
    let server =
        TestServer::start_with(config(dir.path(), &fake, &record), &Providers::default()).await;
    let ready = record.until("ready ").await;
    let pid = ready.trim_start_matches("ready ").to_owned();
    let client = server.client().await;
    let session = new_session(&client).await;

    let chat = client.chat(&session, "be slow").await.unwrap();
    record.until("slow started").await;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let summary = finish(chat).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let (status, content) = tool_end(&summary.events, "call_1");
    assert_eq!(status, proto::ToolStatus::Error);
    assert!(content.contains("closed the connection"), "{content}");
    let requests = fake.requests();
    assert!(
        tool_messages(&requests[1].body)[0]
            .1
            .contains("closed the connection")
    );

    // The next turn builds a new runner, which restarts the server.
    let chat = client.chat(&session, "again").await.unwrap();
    let restarted = record.until("ready ").await;
    assert_ne!(restarted, ready);
    let summary = finish(chat).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(
        tool_end(&summary.events, "call_2"),
        (proto::ToolStatus::Done, "back again".to_owned())
    );
    server.stop().await;
}

#[tokio::test]
async fn denied_colliding_and_excluded_server_tools() {
    let fake = FakeOpenAi::start(vec![
        calls(&[("call_1", "test__echo", json!({"text": "x"}))]),
        answer("denied then"),
        answer("fewer tools"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut record = Record::new(dir.path());
    let mut config = config(dir.path(), &fake, &record);
    config.tools.deny = vec!["test__echo".into()];
    let server = TestServer::start_with(config, &Providers::default()).await;
    record.until("ready ").await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let summary = finish(client.chat(&session, "echo").await.unwrap()).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let (status, content) = tool_end(&summary.events, "call_1");
    assert_eq!(status, proto::ToolStatus::Error);
    assert!(content.contains("denied"), "{content}");
    assert!(
        tool_messages(&fake.requests()[1].body)[0]
            .1
            .contains("denied")
    );

    let mut colliding = text_request(&session, "mine");
    colliding.extra_tools = vec![proto::ToolDefinition {
        name: "test__echo".into(),
        description: "the caller's echo".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }];
    let err = client.chat_with(colliding).await.unwrap_err();
    assert!(err.code() == Some(Code::InvalidArgument));

    let mut excluding = text_request(&session, "fewer");
    excluding.excluded_tools = vec!["test__slow".into()];
    finish(client.chat_with(excluding).await.unwrap()).await;
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(
        offered(&requests[2].body),
        [
            "test__echo",
            "test__fail",
            "test__picture",
            "test__pwd",
            "test__pid",
            "test__write_file",
            "test__limits",
            "test__connect"
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn an_mcp_server_that_cannot_start_leaves_the_server_running_without_its_tools() {
    let fake = FakeOpenAi::start(vec![answer("no tools")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    config.mcp_servers.push(McpServerConfig {
        name: "broken".into(),
        command: Some(dir.path().join("no-such-server").display().to_string()),
        ..McpServerConfig::default()
    });
    let server = TestServer::start_with(config, &Providers::default()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let summary = finish(client.chat(&session, "hello").await.unwrap()).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    assert!(offered(&fake.requests()[0].body).is_empty());
    server.stop().await;
}

#[tokio::test]
async fn an_mcp_tools_image_and_link_are_stored_shown_and_survive_a_restart() {
    let fake = FakeOpenAi::start(vec![
        calls(&[("call_1", "test__picture", json!({}))]),
        answer("a red dot"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut record = Record::new(dir.path());
    let server =
        TestServer::start_with(config(dir.path(), &fake, &record), &Providers::default()).await;
    record.until("ready ").await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let chat = client.chat(&session, "show me").await.unwrap();
    let summary = finish(chat).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let events = &summary.events;
    let at = |want: &dyn Fn(&ChatEvent) -> bool| {
        events
            .iter()
            .position(|e| want(&e.kind))
            .unwrap_or_else(|| panic!("no such event in {events:#?}"))
    };
    let running =
        at(&|k| matches!(k, ChatEvent::ToolUse(t) if t.status() == proto::ToolStatus::Running));
    let image = at(&|k| matches!(k, ChatEvent::Image(_)));
    let references = at(&|k| matches!(k, ChatEvent::References(_)));
    let done = at(&|k| matches!(k, ChatEvent::ToolUse(t) if t.status() == proto::ToolStatus::Done));
    assert!(running < image && image < done, "{events:#?}");
    assert!(running < references && references < done, "{events:#?}");

    let ChatEvent::Image(shown) = &events[image].kind else {
        unreachable!()
    };
    let blob = shown.blob.clone().expect("the image event names its blob");
    assert_eq!(blob.mime_type, "image/png");
    assert_eq!(shown.call_id, "call_1");
    // Small: the bytes come inline too, and GetBlob returns the same.
    assert_eq!(shown.data.len() as u64, blob.size);
    let (read, bytes) = client.get_blob(&session, &blob.blob_id).await.unwrap();
    assert_eq!(
        (read.blob_id.as_str(), &bytes),
        (blob.blob_id.as_str(), &shown.data)
    );
    let ChatEvent::References(links) = &events[references].kind else {
        unreachable!()
    };
    assert_eq!(links.references[0].uri, "https://example.invalid/report");
    assert_eq!(links.references[0].title, "The report");
    let ChatEvent::ToolUse(done) = &events[done].kind else {
        unreachable!()
    };
    let kinds: Vec<&str> = done.references.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["blob", "uri"]);

    // The model got the image (an OpenAI tool message is text, so the
    // image follows the tool messages as a user message).
    let second = &fake.requests()[1].body;
    let messages = second["messages"].as_array().unwrap();
    let media = messages.last().unwrap();
    assert_eq!(media["role"], "user");
    let url = media["content"][1]["image_url"]["url"].as_str().unwrap();
    assert!(url.starts_with("data:image/png;base64,"), "{url}");

    // History keeps the reference (never the bytes) across a restart.
    server.stop().await;
    let server =
        TestServer::start_with(config(dir.path(), &fake, &record), &Providers::default()).await;
    let client = server.client().await;
    let history = client.history(&session).await.unwrap();
    let result = history
        .iter()
        .find(|m| m.role() == proto::Role::Tool)
        .map(tool_result)
        .unwrap();
    assert_eq!(result.media, vec![blob.clone()]);
    assert!(result.content.contains("here is the picture"));
    let (_, again) = client.get_blob(&session, &blob.blob_id).await.unwrap();
    assert_eq!(again, bytes);
    server.stop().await;
}
