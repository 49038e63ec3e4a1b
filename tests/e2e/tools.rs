//! The agent loop with caller-executed tools, against the OpenAI-compatible
//! provider talking to a scripted fake.

use std::time::Duration;

use agentrt_client::{ChatEvent, Client, Event, proto};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use serde_json::json;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, read_until,
};

/// One streamed tool-call fragment.
fn tool_fragment(index: usize, id: Option<&str>, name: Option<&str>, arguments: &str) -> Vec<u8> {
    let mut call = json!({"index": index, "function": {"arguments": arguments}});
    if let Some(id) = id {
        call["id"] = json!(id);
        call["type"] = json!("function");
    }
    if let Some(name) = name {
        call["function"]["name"] = json!(name);
    }
    sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}))
}

/// Two parallel calls, ids and names first, arguments split across chunks.
fn two_calls() -> FakeReply {
    FakeReply::sse(vec![
        tool_fragment(0, Some("call_1"), Some("get_weather"), ""),
        tool_fragment(1, Some("call_2"), Some("get_time"), ""),
        tool_fragment(0, None, None, "{\"city\":"),
        tool_fragment(1, None, None, "{\"tz\":\"CET\"}"),
        tool_fragment(0, None, None, "\"Oslo\"}"),
        finish_chunk("tool_calls"),
        usage_chunk(20, 10),
    ])
}

fn answer() -> FakeReply {
    FakeReply::sse(vec![
        text_chunk("Sunny at noon."),
        finish_chunk("stop"),
        usage_chunk(40, 5),
    ])
}

fn tool(name: &str) -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: name.into(),
        description: format!("{name} for the test"),
        parameters_json_schema: r#"{"type":"object","properties":{}}"#.into(),
    }
}

fn request(session: &str) -> proto::ChatRequest {
    let mut req = super::harness::text_request(session, "weather and time?");
    req.extra_tools = vec![tool("get_weather"), tool("get_time")];
    req
}

async fn server(fake: &FakeOpenAi, dir: &std::path::Path) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    TestServer::start_with(config, &Providers::default()).await
}

fn tool_calls(events: &[Event]) -> Vec<(String, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::ToolCall { call_id, name, .. } => Some((call_id.clone(), name.clone())),
            _ => None,
        })
        .collect()
}

/// A compact name for each event, to compare orders.
fn label(e: &Event) -> String {
    match &e.kind {
        ChatEvent::TurnStarted(_) => "started".into(),
        ChatEvent::Text(_) => "text".into(),
        ChatEvent::Reasoning(_) => "reasoning".into(),
        ChatEvent::Step { kind, index } => format!(
            "step{index}:{}",
            kind.as_str_name().trim_start_matches("STEP_KIND_")
        ),
        ChatEvent::MessageStored { role, .. } => {
            format!("stored:{}", role.as_str_name().trim_start_matches("ROLE_"))
        }
        ChatEvent::Usage { .. } => "usage".into(),
        ChatEvent::ToolUse(t) => format!(
            "tool_use:{}:{}",
            t.call_id,
            t.status().as_str_name().trim_start_matches("TOOL_STATUS_")
        ),
        ChatEvent::ToolCall { call_id, .. } => format!("tool_call:{call_id}"),
        ChatEvent::Heartbeat { .. } => "heartbeat".into(),
        ChatEvent::ReplayGap { .. } => "gap".into(),
        ChatEvent::Compaction(c) => format!(
            "compaction:{}",
            c.status()
                .as_str_name()
                .trim_start_matches("COMPACTION_STATUS_")
        ),
        ChatEvent::Error { .. } => "error".into(),
        ChatEvent::TurnFinished { outcome, .. } => format!(
            "finished:{}",
            outcome.as_str_name().trim_start_matches("TURN_OUTCOME_")
        ),
        _ => "unknown".into(),
    }
}

#[tokio::test]
async fn parallel_caller_tools_run_across_steps_in_the_exact_order() {
    let fake = FakeOpenAi::start(vec![two_calls(), answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;

    let mut chat = client.chat_with(request(&session)).await.unwrap();
    let mut seen = Vec::new();
    while tool_calls(&seen).len() < 2 {
        let more = read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
        seen.extend(more);
    }
    let turn_id = seen[0].turn_id.clone();
    // Answer out of order: results are still stored in call order.
    client
        .submit_tool_result(&session, &turn_id, "call_2", "12:00 CET", false)
        .await
        .unwrap();
    let again = client
        .submit_tool_result(&session, &turn_id, "call_2", "x", false)
        .await
        .unwrap_err();
    assert!(again.code() == Some(Code::AlreadyExists));
    let unknown = client
        .submit_tool_result(&session, &turn_id, "call_9", "x", false)
        .await
        .unwrap_err();
    assert!(unknown.code() == Some(Code::FailedPrecondition));
    client
        .submit_tool_result(&session, &turn_id, "call_1", "sunny\nwindy", false)
        .await
        .unwrap();
    let rest = chat.finish().await.unwrap();
    assert!(rest.status.is_none(), "{:?}", rest.status);
    seen.extend(rest.events);

    let order: Vec<String> = seen.iter().map(label).collect();
    let expected = [
        "started",
        "stored:USER",
        "step1:START",
        "usage",
        "stored:ASSISTANT",
        "tool_use:call_1:RUNNING",
        "tool_call:call_1",
        "tool_use:call_2:RUNNING",
        "tool_call:call_2",
        "stored:TOOL",
        "tool_use:call_1:DONE",
        "stored:TOOL",
        "tool_use:call_2:DONE",
        "step1:FINISH",
        "step2:START",
        "text",
        "usage",
        "stored:ASSISTANT",
        "step2:FINISH",
        "finished:SUCCESS",
    ];
    assert_eq!(order, expected);
    let seqs: Vec<u64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    let ChatEvent::TurnFinished { usage, .. } = &seen.last().unwrap().kind else {
        panic!()
    };
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (60, 15),
        "usage summed over steps"
    );
    let record = client.get_turn(&session, &turn_id).await.unwrap();
    assert_eq!(record.steps, 2, "two model steps");
    let summed = record.usage.map(|u| (u.input_tokens, u.output_tokens));
    assert_eq!(summed, Some((60, 15)), "the record sums the steps too");
    assert_eq!(record.cost, None, "mock/m has no [prices] entry");
    let done = seen.iter().find_map(|e| match &e.kind {
        ChatEvent::ToolUse(t) if t.call_id == "call_1" && t.status() == proto::ToolStatus::Done => {
            Some(t.clone())
        }
        _ => None,
    });
    let done = done.unwrap();
    assert_eq!(done.arguments_json, r#"{"city":"Oslo"}"#);
    assert_eq!(done.content, "sunny\nwindy");
    assert_eq!(done.detail, "sunny (2 lines)");

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
    let calls: Vec<_> = history[1]
        .content
        .iter()
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::ToolCall(c)) => Some(c.id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(calls, ["call_1", "call_2"]);
    let result_of = |m: &proto::Message| match &m.content[0].block {
        Some(proto::content_block::Block::ToolResult(r)) => (r.call_id.clone(), r.content.clone()),
        other => panic!("not a tool result: {other:?}"),
    };
    assert_eq!(
        result_of(&history[2]),
        ("call_1".into(), "sunny\nwindy".into())
    );
    assert_eq!(
        result_of(&history[3]),
        ("call_2".into(), "12:00 CET".into())
    );
    assert_eq!(message_text(&history[4]), "Sunny at noon.");

    // The model saw the tools, then its own calls and their results.
    let requests = fake.requests();
    let offered: Vec<_> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(offered, ["get_weather", "get_time"]);
    let second = requests[1].body["messages"].as_array().unwrap();
    let n = second.len();
    assert_eq!(second[n - 3]["tool_calls"][0]["id"], "call_1");
    assert_eq!(second[n - 2]["tool_call_id"], "call_1");
    assert_eq!(second[n - 1]["tool_call_id"], "call_2");
    assert_eq!(second[n - 1]["content"], "12:00 CET");

    let late = client
        .submit_tool_result(&session, &turn_id, "call_1", "x", false)
        .await
        .unwrap_err();
    assert!(late.code() == Some(Code::FailedPrecondition));
    let nowhere = client
        .submit_tool_result("no-such-session", &turn_id, "call_1", "x", false)
        .await
        .unwrap_err();
    assert!(nowhere.code() == Some(Code::NotFound));
    server.stop().await;
}

#[tokio::test]
async fn excluded_tools_are_absent_from_the_model_request() {
    let fake = FakeOpenAi::start(vec![answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = request(&session);
    req.excluded_tools = vec!["get_weather".into()];
    client.chat_with(req).await.unwrap().finish().await.unwrap();
    // A later call without extra tools offers none: they do not leak.
    client
        .chat(&session, "plain")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let requests = fake.requests();
    let offered = requests[0].body["tools"].as_array().unwrap();
    assert_eq!(offered.len(), 1);
    assert_eq!(offered[0]["function"]["name"], "get_time");
    assert!(requests[1].body.get("tools").is_none());
    server.stop().await;
}

async fn unanswered(client: &Client, req: proto::ChatRequest) -> agentrt_client::EventStream {
    let mut chat = client.chat_with(req).await.unwrap();
    let mut calls = 0;
    while calls < 2 {
        read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
        calls += 1;
    }
    chat
}

#[tokio::test]
async fn the_deadline_and_stop_end_a_tool_wait_with_every_call_answered_in_history() {
    let fake = FakeOpenAi::start(vec![two_calls()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = server.client().await;

    let timed = new_session(&client).await;
    let mut req = request(&timed);
    req.timeout = Some(prost_types::Duration {
        seconds: 0,
        nanos: 300_000_000,
    });
    let chat = unanswered(&client, req).await;
    let rest = chat.finish().await.unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::TimedOut));
    let history = client.history(&timed).await.unwrap();
    let roles: Vec<_> = history.iter().map(|m| m.role()).collect();
    assert_eq!(
        roles,
        [
            proto::Role::User,
            proto::Role::Assistant,
            proto::Role::Tool,
            proto::Role::Tool,
            proto::Role::Notice
        ]
    );
    for m in &history[2..4] {
        let Some(proto::content_block::Block::ToolResult(r)) = &m.content[0].block else {
            panic!()
        };
        assert!(r.is_error && r.content.contains("time limit"), "{r:?}");
        // Handed to the caller, who may have run it.
        assert_eq!(
            r.interrupted(),
            proto::ToolCallInterrupted::OutcomeUnknown,
            "{r:?}"
        );
    }

    let stopped = new_session(&client).await;
    let chat = unanswered(&client, request(&stopped)).await;
    assert!(
        tokio::time::timeout(Duration::from_secs(5), client.stop_session(&stopped))
            .await
            .unwrap()
            .unwrap()
    );
    let rest = chat.finish().await.unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Canceled));
    let history = client.history(&stopped).await.unwrap();
    assert_eq!(
        history.len(),
        4,
        "user, assistant with calls, one error result per call"
    );
    server.stop().await;
}

#[tokio::test]
async fn bad_tool_declarations_are_invalid_arguments() {
    let fake = FakeOpenAi::start(vec![answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut bad_name = request(&session);
    bad_name.extra_tools[0].name = "has space".into();
    let mut bad_schema = request(&session);
    bad_schema.extra_tools[0].parameters_json_schema = "{not json".into();
    let mut zero_steps = request(&session);
    zero_steps.max_steps = Some(0);
    for req in [bad_name, bad_schema, zero_steps] {
        let err = client.chat_with(req).await.unwrap_err();
        assert!(err.code() == Some(Code::InvalidArgument));
    }
    assert!(client.history(&session).await.unwrap().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn a_turn_that_keeps_calling_tools_stops_at_max_steps() {
    let fake = FakeOpenAi::start(vec![two_calls()]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = request(&session);
    req.max_steps = Some(1);
    let mut chat = unanswered(&client, req).await;
    let turn_id = client.session_status(&session).await.unwrap().turn_id;
    for call in ["call_1", "call_2"] {
        client
            .submit_tool_result(&session, &turn_id, call, "ok", false)
            .await
            .unwrap();
    }
    let rest = read_until(&mut chat, |e| {
        matches!(e.kind, ChatEvent::TurnFinished { .. })
    })
    .await;
    assert_eq!(label(rest.last().unwrap()), "finished:ERROR");
    let code = rest.iter().find_map(|e| match e.kind {
        ChatEvent::Error { code, .. } => Some(code),
        _ => None,
    });
    assert_eq!(code, Some(proto::ErrorCode::ResourceExhausted));
    assert_eq!(fake.requests().len(), 1, "no second model step");
    assert_eq!(client.history(&session).await.unwrap().len(), 4);
    server.stop().await;
}

#[tokio::test]
async fn another_users_tool_result_is_not_found() {
    let fake = FakeOpenAi::start(vec![two_calls(), answer()]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = super::harness::with_keys(
        base_config(dir.path()),
        &[("key-alice-1", "alice"), ("key-bob-12", "bob")],
    );
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    let server = TestServer::start_with(config, &Providers::default()).await;
    let alice = server.client_with_token("key-alice-1").await;
    let bob = server.client_with_token("key-bob-12").await;
    let session = new_session(&alice).await;
    let mut chat = unanswered(&alice, request(&session)).await;
    let turn_id = alice.session_status(&session).await.unwrap().turn_id;
    let stolen = bob
        .submit_tool_result(&session, &turn_id, "call_1", "x", false)
        .await
        .unwrap_err();
    assert!(stolen.code() == Some(Code::NotFound));
    for call in ["call_1", "call_2"] {
        alice
            .submit_tool_result(&session, &turn_id, call, "ok", false)
            .await
            .unwrap();
    }
    let rest = read_until(&mut chat, |e| {
        matches!(e.kind, ChatEvent::TurnFinished { .. })
    })
    .await;
    assert_eq!(label(rest.last().unwrap()), "finished:SUCCESS");
    server.stop().await;
}
