//! Input while a turn runs (`on_busy`): ENQUEUE (the inbox), INTERRUPT and
//! STEER, through gRPC against the scripted OpenAI-compatible fake. The
//! live turn waits on a caller-executed tool (or a model stream that never
//! ends), so every "while busy" is certain rather than timed.

use agentrt_client::{ChatEvent, Client, Event, EventStream, OnBusy, proto};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use futures::StreamExt as _;
use serde_json::json;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session, read_until,
};

/// A step that calls caller tool `wait` once.
fn calls_wait() -> FakeReply {
    let call = json!({"index": 0, "id": "call_1", "type": "function",
        "function": {"name": "wait", "arguments": "{}"}});
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
        usage_chunk(10, 5),
    ])
}

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![
        text_chunk(text),
        finish_chunk("stop"),
        usage_chunk(10, 2),
    ])
}

/// Streams `text`, then never ends.
fn hangs_after(text: &str) -> FakeReply {
    FakeReply::Sse {
        chunks: vec![text_chunk(text)],
        done: false,
        then_hang: true,
    }
}

async fn server(fake: &FakeOpenAi, dir: &std::path::Path, max_queued: u64) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = "mock/m".into();
    config.max_queued_per_session = max_queued;
    config.providers.push(mock_provider(fake, None));
    TestServer::start_with(config, &Providers::default()).await
}

/// A turn that waits on caller tool `wait`: its stream and turn id.
async fn waiting_turn(client: &Client, session: &str) -> (EventStream, String) {
    let mut req = super::harness::text_request(session, "first");
    req.extra_tools = vec![proto::ToolDefinition {
        name: "wait".into(),
        description: "waits for the caller".into(),
        parameters_json_schema: r#"{"type":"object","properties":{}}"#.into(),
    }];
    let mut chat = client.chat_with(req).await.unwrap();
    let seen = read_until(&mut chat, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
    let turn_id = seen[0].turn_id.clone();
    (chat, turn_id)
}

fn busy_request(session: &str, text: &str, on_busy: OnBusy) -> proto::ChatRequest {
    let mut req = super::harness::text_request(session, text);
    req.on_busy = on_busy as i32;
    req
}

/// Everything left on `stream`, and its trailing status.
async fn rest(stream: &mut EventStream) -> (Vec<Event>, Option<tonic::Status>) {
    let mut seen = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => seen.push(event),
            Err(err) => return (seen, err.status().cloned()),
        }
    }
    (seen, None)
}

fn finished(events: &[Event]) -> Option<(proto::TurnOutcome, proto::CancelReason)> {
    events.iter().find_map(|e| match &e.kind {
        ChatEvent::TurnFinished {
            outcome,
            cancel_reason,
            ..
        } => Some((*outcome, *cancel_reason)),
        _ => None,
    })
}

fn text_of(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// The last user message of a recorded model request.
fn last_user(request: &agentrt_testkit::fake_openai::RecordedRequest) -> String {
    let messages = request.body["messages"].as_array().unwrap();
    let last = messages.iter().rev().find(|m| m["role"] == "user").unwrap();
    match &last["content"] {
        serde_json::Value::String(s) => s.clone(),
        other => other[0]["text"].as_str().unwrap_or_default().to_owned(),
    }
}

#[tokio::test]
async fn enqueued_messages_run_after_the_live_turn_in_order_each_as_its_own_turn() {
    let fake = FakeOpenAi::start(vec![
        calls_wait(),
        answer("first done"),
        answer("one"),
        answer("two"),
        answer("three"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 3).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let (mut first, first_turn) = waiting_turn(&client, &session).await;

    let mut queued = Vec::new();
    for (i, text) in ["q1", "q2", "q3"].into_iter().enumerate() {
        let mut chat = client
            .chat_with(busy_request(&session, text, OnBusy::Enqueue))
            .await
            .unwrap();
        let event = chat.next().await.unwrap().unwrap();
        let ChatEvent::Queued { position } = event.kind else {
            panic!("expected queued, got {:?}", event.kind);
        };
        assert_eq!(position, i as u64 + 1);
        assert!(!event.turn_id.is_empty());
        queued.push((chat, event.turn_id));
    }
    // The bound: a fourth is refused, naming the inbox quota.
    let refused = client
        .chat_with(busy_request(&session, "q4", OnBusy::Enqueue))
        .await
        .expect_err("over the inbox bound");
    assert_eq!(refused.code(), Some(Code::ResourceExhausted), "{refused}");
    assert!(refused.to_string().contains("inbox"), "{refused}");
    // The default stays REJECT.
    let busy = client
        .chat_with(super::harness::text_request(&session, "q5"))
        .await
        .expect_err("busy");
    assert_eq!(busy.code(), Some(Code::Aborted));

    let status = client.session_status(&session).await.unwrap();
    assert_eq!(status.turn_id, first_turn);
    // The caller tool call the live turn waits for.
    let pending: Vec<_> = status
        .pending_calls
        .iter()
        .map(|c| {
            (
                c.call_id.as_str(),
                c.tool_name.as_str(),
                c.arguments_json.as_str(),
            )
        })
        .collect();
    assert_eq!(pending, [("call_1", "wait", "{}")]);
    let listed: Vec<_> = status.queued.iter().map(|q| q.id.clone()).collect();
    let ids: Vec<_> = queued.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(listed, ids);

    client
        .submit_tool_result(&session, &first_turn, "call_1", "ok", false)
        .await
        .unwrap();
    let (events, trailer) = rest(&mut first).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
    for ((mut chat, id), want) in queued.into_iter().zip(["one", "two", "three"]) {
        let (events, trailer) = rest(&mut chat).await;
        assert!(trailer.is_none(), "{trailer:?}");
        assert!(matches!(events[0].kind, ChatEvent::TurnStarted(_)));
        assert!(events.iter().all(|e| e.turn_id == id));
        assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
        assert_eq!(text_of(&events), want);
    }

    // Each ran once, in order: four turns, and history in seq order.
    let history = client.history(&session).await.unwrap();
    let texts: Vec<_> = history
        .iter()
        .filter(|m| m.role() == proto::Role::User || m.role() == proto::Role::Assistant)
        .map(message_text)
        .filter(|t| !t.is_empty())
        .collect();
    assert_eq!(
        texts,
        [
            "first",
            "first done",
            "q1",
            "one",
            "q2",
            "two",
            "q3",
            "three"
        ]
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 5);
    assert_eq!(last_user(&requests[2]), "q1");
    assert_eq!(last_user(&requests[4]), "q3");
    let turns = client
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(turns.turns.len(), 4);
    assert!(
        client
            .session_status(&session)
            .await
            .unwrap()
            .queued
            .is_empty()
    );
    server.stop().await;
}

#[tokio::test]
async fn stop_with_clear_inbox_drops_the_queued_messages_and_ends_their_chats() {
    let fake = FakeOpenAi::start(vec![calls_wait(), answer("never")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 4).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let (mut first, _) = waiting_turn(&client, &session).await;
    let mut chat = client
        .chat_with(busy_request(&session, "later", OnBusy::Enqueue))
        .await
        .unwrap();
    assert!(matches!(
        chat.next().await.unwrap().unwrap().kind,
        ChatEvent::Queued { position: 1 }
    ));
    let (stopped, cleared) = client.stop_session_and_clear_inbox(&session).await.unwrap();
    assert!(stopped);
    assert_eq!(cleared, 1);
    let (events, _) = rest(&mut first).await;
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Canceled);
    let (events, trailer) = rest(&mut chat).await;
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(trailer.unwrap().code(), Code::Cancelled);
    // Nothing ran it: one model request, and no "later" in history.
    assert_eq!(fake.requests().len(), 1);
    let history = client.history(&session).await.unwrap();
    assert!(history.iter().all(|m| message_text(m) != "later"));
    server.stop().await;
}

#[tokio::test]
async fn interrupt_cancels_the_live_turn_keeping_its_partial_text_then_runs() {
    let fake = FakeOpenAi::start(vec![hangs_after("half an ans"), answer("new answer")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 4).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut first = client
        .chat_with(super::harness::text_request(&session, "long question"))
        .await
        .unwrap();
    read_until(&mut first, |e| matches!(e.kind, ChatEvent::Text(_))).await;

    let mut second = client
        .chat_with(busy_request(&session, "never mind", OnBusy::Interrupt))
        .await
        .unwrap();
    let (events, _) = rest(&mut first).await;
    assert_eq!(
        finished(&events).unwrap(),
        (
            proto::TurnOutcome::Canceled,
            proto::CancelReason::Interrupted
        )
    );
    let (events, trailer) = rest(&mut second).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
    assert_eq!(text_of(&events), "new answer");

    let history = client.history(&session).await.unwrap();
    let texts: Vec<_> = history.iter().map(message_text).collect();
    assert_eq!(
        texts,
        ["long question", "half an ans", "never mind", "new answer"]
    );
    assert_eq!(last_user(&fake.requests()[1]), "never mind");
    server.stop().await;
}

#[tokio::test]
async fn steer_joins_the_live_turn_after_the_steps_tool_results() {
    let fake = FakeOpenAi::start(vec![calls_wait(), answer("steered answer")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 4).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let (mut first, turn_id) = waiting_turn(&client, &session).await;
    let mut steer = client
        .chat_with(busy_request(&session, "and in Celsius", OnBusy::Steer))
        .await
        .unwrap();
    client
        .submit_tool_result(&session, &turn_id, "call_1", "tool says 70F", false)
        .await
        .unwrap();

    let (events, trailer) = rest(&mut steer).await;
    assert!(trailer.is_none(), "{trailer:?}");
    let ChatEvent::Steered { message_seq } = events[0].kind else {
        panic!("expected steered first, got {:?}", events[0].kind);
    };
    assert!(events.iter().all(|e| e.turn_id == turn_id));
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
    assert_eq!(text_of(&events), "steered answer");
    let (events, _) = rest(&mut first).await;
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, ChatEvent::Steered { .. }))
    );

    // The next request: the tool result, then the steering message.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let messages = requests[1].body["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(messages[n - 2]["role"], "tool");
    assert_eq!(messages[n - 2]["content"], "tool says 70F");
    assert_eq!(last_user(&requests[1]), "and in Celsius");
    assert_eq!(messages[n - 1]["role"], "user");
    // Stored in seq order within the one turn.
    let history = client.history(&session).await.unwrap();
    let steered = history
        .iter()
        .find(|m| message_text(m) == "and in Celsius")
        .unwrap();
    assert_eq!(steered.seq, message_seq);
    assert_eq!(history.last().map(message_text).unwrap(), "steered answer");
    let turns = client
        .list_turns(proto::ListTurnsRequest {
            session_id: session.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(turns.turns.len(), 1);
    server.stop().await;
}

#[tokio::test]
async fn a_steer_the_turn_ends_before_taking_runs_as_the_next_turn() {
    let fake = FakeOpenAi::start(vec![hangs_after("partial"), answer("late answer")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 4).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut first = client
        .chat_with(super::harness::text_request(&session, "question"))
        .await
        .unwrap();
    let seen = read_until(&mut first, |e| matches!(e.kind, ChatEvent::Text(_))).await;
    let first_turn = seen[0].turn_id.clone();
    let mut steer = client
        .chat_with(busy_request(&session, "late thought", OnBusy::Steer))
        .await
        .unwrap();
    // Stopped mid-step: no boundary comes.
    assert!(client.stop_session(&session).await.unwrap());
    let (events, trailer) = rest(&mut steer).await;
    assert!(trailer.is_none(), "{trailer:?}");
    assert!(matches!(
        events[0].kind,
        ChatEvent::Steered { message_seq: 0 }
    ));
    assert!(matches!(events[1].kind, ChatEvent::Queued { position: 1 }));
    assert_ne!(events[2].turn_id, first_turn);
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Success);
    assert_eq!(text_of(&events), "late answer");
    let (events, _) = rest(&mut first).await;
    assert_eq!(finished(&events).unwrap().0, proto::TurnOutcome::Canceled);
    assert_eq!(last_user(&fake.requests()[1]), "late thought");
    server.stop().await;
}

#[tokio::test]
async fn an_unknown_on_busy_value_is_invalid_argument() {
    let fake = FakeOpenAi::start(vec![answer("x")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path(), 4).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let mut req = super::harness::text_request(&session, "x");
    req.on_busy = 42;
    let err = client.chat_with(req).await.expect_err("refused");
    assert_eq!(err.code(), Some(Code::InvalidArgument));
    assert!(err.to_string().contains("on_busy"), "{err}");
    server.stop().await;
}
