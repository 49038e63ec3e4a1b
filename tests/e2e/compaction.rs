//! Compaction (docs/contract.md §3.6) and titles, end to end: a scripted fake
//! OpenAI-compatible upstream serves both the session's model and the fast
//! model, so every request body the turn sends can be inspected.

use std::time::Duration;

use agentrt_client::{ChatEvent, Client, Error, Event, proto};
use agentrt_server::Config;
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use serde_json::{Value, json};
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, read_until,
    text_request,
};

/// About 300 estimated tokens of user text, tagged so requests can be
/// searched for it.
fn question(n: usize) -> String {
    format!("q{n}: {}", "x".repeat(1_200))
}

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![
        text_chunk(text),
        finish_chunk("stop"),
        usage_chunk(10, 2),
    ])
}

fn tool_call_reply() -> FakeReply {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "lookup", "arguments": "{}"}});
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
        usage_chunk(10, 2),
    ])
}

fn config(fake: &FakeOpenAi, dir: &std::path::Path) -> Config {
    let mut config = base_config(dir);
    config.default_model = "mock/main".into();
    config.fast_model = Some("mock/fast".into());
    config.providers.push(mock_provider(fake, None));
    config.compaction.max_tokens = 1_000;
    config.compaction.keep_tail = 2;
    config
}

/// A session with a title, so no title request reaches the fake.
async fn titled_session(client: &Client) -> String {
    client
        .create_session(proto::CreateSessionRequest {
            title: "compaction test".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .session_id
}

async fn turn(client: &Client, session: &str, text: &str) -> Vec<Event> {
    let done = client
        .chat_with(text_request(session, text))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert!(done.status.is_none(), "{:?}", done.status);
    done.events
}

/// A compact name for the events that matter here.
fn labels(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::TurnStarted(_) => Some("started".to_owned()),
            ChatEvent::MessageStored { role, .. } => Some(format!(
                "stored:{}",
                role.as_str_name().trim_start_matches("ROLE_")
            )),
            ChatEvent::Compaction(c) => Some(format!(
                "compaction:{}",
                c.status()
                    .as_str_name()
                    .trim_start_matches("COMPACTION_STATUS_")
            )),
            ChatEvent::TurnFinished { outcome, .. } => Some(format!(
                "finished:{}",
                outcome.as_str_name().trim_start_matches("TURN_OUTCOME_")
            )),
            _ => None,
        })
        .collect()
}

fn compaction(events: &[Event], status: proto::CompactionStatus) -> proto::Compaction {
    events
        .iter()
        .find_map(|e| match &e.kind {
            ChatEvent::Compaction(c) if c.status() == status => Some(c.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {status:?} compaction event in {:?}", labels(events)))
}

/// Every message's text in a recorded request body, in order.
fn body_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].to_string())
        .collect()
}

fn mentions(texts: &[String], tag: &str) -> bool {
    texts.iter().any(|t| t.contains(tag))
}

#[tokio::test]
async fn a_session_past_the_budget_compacts_into_summary_and_tail() {
    let fake = FakeOpenAi::start(vec![
        answer("a1"),
        answer("a2"),
        tool_call_reply(),
        answer("a3"),
        answer("SUMMARY-OF-EARLIER"),
        answer("a4"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(config(&fake, dir.path()), &Providers::default()).await;
    let client = server.client().await;
    let session = titled_session(&client).await;

    for n in 1..=2 {
        let events = turn(&client, &session, &question(n)).await;
        assert!(!labels(&events).iter().any(|l| l.starts_with("compaction")));
    }
    // Turn 3 calls a caller-executed tool: its call and result stay together.
    let mut req = text_request(&session, &question(3));
    req.extra_tools = vec![proto::ToolDefinition {
        name: "lookup".into(),
        description: "looks things up".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }];
    let mut chat = client.chat_with(req).await.unwrap();
    let seen = read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
    client
        .submit_tool_result(&session, &seen[0].turn_id, "call_1", "looked up", false)
        .await
        .unwrap();
    assert!(chat.finish().await.unwrap().status.is_none());

    // Turn 4 is over the budget: summarise turns 1-2, keep turns 3-4.
    let events = turn(&client, &session, &question(4)).await;
    assert_eq!(
        labels(&events),
        [
            "started",
            "stored:USER",
            "compaction:STARTED",
            "stored:SUMMARY",
            "compaction:COMPLETED",
            "stored:ASSISTANT",
            "finished:SUCCESS"
        ]
    );
    let done = compaction(&events, proto::CompactionStatus::Completed);
    assert!(done.tokens_after < done.tokens_before, "{done:?}");
    assert!(done.tokens_before > 1_000, "{done:?}");
    assert_eq!(
        done.messages_compacted, 4,
        "user+assistant of turns 1 and 2"
    );

    let requests = fake.requests();
    assert_eq!(requests.len(), 6);
    let summariser = &requests[4].body;
    assert_eq!(summariser["model"], "fast");
    assert!(
        summariser.get("tools").is_none(),
        "no tools for the summariser"
    );
    let transcript = body_texts(summariser).join("\n");
    assert!(transcript.contains("q1:") && transcript.contains("q2:"));
    assert!(
        !transcript.contains("q3:"),
        "the kept tail is not summarised"
    );

    let main = &requests[5].body;
    assert_eq!(main["model"], "main");
    let texts = body_texts(main);
    assert!(mentions(&texts, "SUMMARY-OF-EARLIER"));
    assert!(
        !mentions(&texts, "q1:") && !mentions(&texts, "q2:"),
        "{texts:?}"
    );
    assert!(mentions(&texts, "q3:") && mentions(&texts, "q4:"));
    // The tool call and its result reach the model together, in order.
    let roles: Vec<&str> = main["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "user"],
        "summary, then turn 3 (with its tool pair) and turn 4"
    );

    // History keeps every message, flagged.
    let all = client.history(&session).await.unwrap();
    assert_eq!(all.len(), 4 + 4 + 2 + 1, "4 turns + tool pair + summary");
    let flagged: Vec<(String, bool)> = all
        .iter()
        .map(|m| (message_text(m).chars().take(3).collect(), m.compacted))
        .collect();
    let compacted: Vec<&str> = flagged
        .iter()
        .filter(|(_, c)| *c)
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(compacted, ["q1:", "a1", "q2:", "a2"]);
    let summary = all
        .iter()
        .find(|m| m.role() == proto::Role::Summary)
        .unwrap();
    assert_eq!(summary.seq, done.summary_seq);
    assert_eq!(message_text(summary), "SUMMARY-OF-EARLIER");
    let visible = client
        .history_page(proto::GetHistoryRequest {
            session_id: session.clone(),
            page_size: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .messages;
    assert_eq!(visible.len(), all.len() - 4);
    assert!(visible.iter().all(|m| !m.compacted));
    server.stop().await;
}

async fn failing_summariser(reply: FakeReply, timeout: Duration) {
    let fake = FakeOpenAi::start(vec![
        answer("a1"),
        answer("a2"),
        answer("a3"),
        reply,
        answer("a4"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&fake, dir.path());
    cfg.compaction.timeout = timeout;
    cfg.providers[0].max_retries = Some(0);
    let server = TestServer::start_with(cfg, &Providers::default()).await;
    let client = server.client().await;
    let session = titled_session(&client).await;
    for n in 1..=3 {
        turn(&client, &session, &question(n)).await;
    }
    let events = turn(&client, &session, &question(4)).await;
    assert_eq!(
        labels(&events),
        [
            "started",
            "stored:USER",
            "compaction:STARTED",
            "compaction:FAILED",
            "stored:ASSISTANT",
            "finished:SUCCESS"
        ]
    );
    let failed = compaction(&events, proto::CompactionStatus::Failed);
    assert!(failed.message.contains("truncated"), "{failed:?}");
    assert!(failed.tokens_after <= 1_000, "{failed:?}");
    // The turn ran on the newest turns that fit the budget.
    let requests = fake.requests();
    let texts = body_texts(&requests.last().unwrap().body);
    assert!(!mentions(&texts, "q1:"), "{texts:?}");
    assert!(mentions(&texts, "q3:") && mentions(&texts, "q4:"));
    // Nothing was marked or added.
    let all = client.history(&session).await.unwrap();
    assert_eq!(all.len(), 8);
    assert!(all.iter().all(|m| !m.compacted));
    server.stop().await;
}

#[tokio::test]
async fn a_failing_summariser_gives_a_truncated_context_not_a_failed_turn() {
    let reply = FakeReply::Status {
        code: 400,
        body: r#"{"error":{"message":"nope"}}"#.into(),
    };
    failing_summariser(reply, Duration::from_secs(120)).await;
}

#[tokio::test]
async fn a_hanging_summariser_times_out_into_truncation() {
    let reply = FakeReply::Sse {
        chunks: vec![],
        done: false,
        then_hang: true,
    };
    let started = std::time::Instant::now();
    failing_summariser(reply, Duration::from_secs(1)).await;
    assert!(started.elapsed() >= Duration::from_secs(1));
}

fn code(err: Error) -> Code {
    match err {
        e if e.status().is_some() => e.code().expect("a status"),
        other => panic!("expected a status, got {other:?}"),
    }
}

#[tokio::test]
async fn compact_session_summarises_now_and_refuses_busy_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let providers = Providers::default();
    let server = TestServer::start_with(base_config(dir.path()), &providers).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    turn(&client, &session, "only turn").await;
    let nothing = client.compact_session(&session).await.unwrap();
    assert!(!nothing.compacted, "one user turn: nothing to summarise");
    assert_eq!(nothing.tokens_before, nothing.tokens_after);

    for text in ["second turn", "third turn"] {
        turn(&client, &session, text).await;
    }
    let report = client.compact_session(&session).await.unwrap();
    assert!(report.compacted);
    assert_eq!(report.summary_seq, 7);
    // keep_tail (6) is more than the session has: all but the newest turn
    // that leaves something to summarise are kept (turns 2 and 3).
    assert_eq!(report.messages_compacted, 2);
    let all = client.history(&session).await.unwrap();
    assert_eq!(all.len(), 7);
    assert_eq!(
        all.iter().map(|m| m.compacted).collect::<Vec<_>>(),
        [true, true, false, false, false, false, false]
    );
    assert_eq!(all[6].role(), proto::Role::Summary);
    // The next turn runs on summary + tail and compacts nothing itself.
    let events = turn(&client, &session, "fourth turn").await;
    assert!(!labels(&events).iter().any(|l| l.starts_with("compaction")));

    // A live turn makes the session busy.
    let mut req = text_request(&session, "hold");
    req.model = "gate/x".into();
    let mut live = client.chat_with(req).await.unwrap();
    read_until(&mut live, |e| matches!(e.kind, ChatEvent::Text(_))).await;
    assert_eq!(
        code(client.compact_session(&session).await.unwrap_err()),
        Code::Aborted
    );
    providers.gate.release(1);
    live.finish().await.unwrap();
    assert_eq!(
        code(client.compact_session("no-such-session").await.unwrap_err()),
        Code::NotFound
    );
    assert_eq!(
        code(client.compact_session("").await.unwrap_err()),
        Code::InvalidArgument
    );
    server.stop().await;
}

/// Polls until the session has a title (set in the background after the
/// turn), up to 10 s.
async fn title_of(client: &Client, session: &str) -> String {
    for _ in 0..400 {
        let title = client.get_session(session).await.unwrap().title;
        if !title.is_empty() {
            return title;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no title was set");
}

#[tokio::test]
async fn the_first_turn_titles_the_session_and_titles_are_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start(dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    turn(&client, &session, "  Plan a   trip to\nJapan ").await;
    assert_eq!(title_of(&client, &session).await, "Plan a trip to Japan");
    turn(&client, &session, "something else entirely").await;
    let second = new_session(&client).await;
    // A waited-for title from a later session shows the first session's
    // background work is done too; it still has its first title.
    turn(&client, &second, &"word ".repeat(40)).await;
    let long = title_of(&client, &second).await;
    assert!(long.chars().count() <= 60 && long.ends_with('…'), "{long}");
    assert_eq!(title_of(&client, &session).await, "Plan a trip to Japan");

    // A caller's title is kept.
    let named = client
        .create_session(proto::CreateSessionRequest {
            title: "Mine".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .session_id;
    turn(&client, &named, "hello").await;
    assert_eq!(client.get_session(&named).await.unwrap().title, "Mine");
    server.stop().await;
}

#[tokio::test]
async fn the_fast_model_writes_the_title_when_configured() {
    let fake = FakeOpenAi::start(vec![
        answer("Sure."),
        answer("\"Trip planning.\""),
        answer("ok"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = TestServer::start_with(config(&fake, dir.path()), &Providers::default()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    turn(&client, &session, "help me plan a trip").await;
    assert_eq!(title_of(&client, &session).await, "Trip planning");
    let requests = fake.requests();
    assert_eq!(requests[1].body["model"], "fast");
    let prompt = body_texts(&requests[1].body).join("\n");
    assert!(prompt.contains("help me plan a trip") && prompt.contains("Sure."));
    turn(&client, &session, "next").await;
    assert_eq!(fake.requests().len(), 3, "no second title request");
    assert_eq!(
        client.get_session(&session).await.unwrap().title,
        "Trip planning"
    );
    server.stop().await;
}
