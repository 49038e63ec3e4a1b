//! Turns against the real OpenAI-compatible HTTP provider, talking to a fake
//! SSE server on loopback.

use agentrt_client::{ChatEvent, proto};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, reasoning_chunk, slice_bytes, text_chunk, usage_chunk,
};
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, message_text, mock_provider, new_session,
};

async fn server_for(fake: &FakeOpenAi, dir: &std::path::Path) -> TestServer {
    server_with_idle(fake, dir, None).await
}

async fn server_with_idle(
    fake: &FakeOpenAi,
    dir: &std::path::Path,
    idle: Option<std::time::Duration>,
) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = "mock/test-model".into();
    config.providers.push(mock_provider(fake, idle));
    TestServer::start_with(config, &Providers::default()).await
}

fn full_stream() -> Vec<Vec<u8>> {
    vec![
        reasoning_chunk("Let me think. "),
        text_chunk("Hello"),
        text_chunk(", wörld"),
        finish_chunk("stop"),
        usage_chunk(12, 5),
    ]
}

async fn run_turn(
    fake_reply: FakeReply,
) -> (agentrt_client::TurnSummary, Vec<proto::Message>, FakeOpenAi) {
    let fake = FakeOpenAi::start(vec![fake_reply]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_for(&fake, dir.path()).await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let summary = client
        .chat(&session, "hi model")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let history = client.history(&session).await.unwrap();
    server.stop().await;
    (summary, history, fake)
}

#[tokio::test]
async fn text_reasoning_and_usage_are_relayed_and_stored() {
    let (summary, history, fake) = run_turn(FakeReply::sse(full_stream())).await;
    assert_eq!(
        summary.outcome,
        Some(proto::TurnOutcome::Success),
        "{:?}",
        summary.status
    );
    assert_eq!(summary.text, "Hello, wörld");
    assert_eq!(summary.reasoning, "Let me think. ");
    let usage = summary.events.iter().find_map(|e| match &e.kind {
        ChatEvent::Usage { usage, model } => Some((*usage, model.clone())),
        _ => None,
    });
    let (usage, model) = usage.expect("a usage event");
    assert_eq!((usage.input_tokens, usage.output_tokens), (12, 5));
    assert_eq!(model, "mock/test-model");
    let ChatEvent::TurnFinished { usage: total, .. } = &summary.events.last().unwrap().kind else {
        panic!("last event is not turn_finished")
    };
    assert_eq!(total.output_tokens, 5);

    assert_eq!(history.len(), 2);
    assert_eq!(message_text(&history[1]), "Hello, wörld");
    let thinking = history[1].content.iter().any(|b| {
        matches!(&b.block, Some(proto::content_block::Block::Thinking(t)) if t.thinking == "Let me think. ")
    });
    assert!(thinking, "the reasoning is stored as a thinking block");
    assert_eq!(history[1].model, "mock/test-model");

    let request = &fake.requests()[0];
    assert_eq!(request.body["model"], "test-model");
    assert_eq!(request.body["stream"], true);
    let last = request.body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "user");
    assert_eq!(last["content"], "hi model");
}

#[tokio::test]
async fn one_byte_slices_give_the_same_turn_as_whole_chunks() {
    let whole: Vec<u8> = full_stream().concat();
    let (sliced, sliced_history, _) = run_turn(FakeReply::sse(slice_bytes(&whole, 1))).await;
    let (chunked, chunked_history, _) = run_turn(FakeReply::sse(full_stream())).await;
    assert_eq!(sliced.outcome, Some(proto::TurnOutcome::Success));
    assert_eq!(sliced.text, chunked.text);
    assert_eq!(sliced.reasoning, chunked.reasoning);
    assert_eq!(
        message_text(&sliced_history[1]),
        message_text(&chunked_history[1])
    );
}

#[tokio::test]
async fn a_stream_cut_before_done_ends_error_with_the_partial_text_stored() {
    let reply = FakeReply::Sse {
        chunks: vec![text_chunk("partial "), text_chunk("answer")],
        done: false,
        then_hang: false,
    };
    let (summary, history, _) = run_turn(reply).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    assert_eq!(summary.text, "partial answer");
    let status = summary.status.expect("a trailing status");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(history.len(), 2, "user message and partial answer");
    assert_eq!(message_text(&history[0]), "hi model");
    assert_eq!(message_text(&history[1]), "partial answer");
    assert_eq!(history[1].stop_reason, "error");
}

#[tokio::test]
async fn http_500_before_the_first_byte_ends_error_with_unavailable() {
    let reply = FakeReply::Status {
        code: 500,
        body: r#"{"error":{"message":"upstream secret detail"}}"#.into(),
    };
    let (summary, history, _) = run_turn(reply).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    let status = summary.status.expect("a trailing status");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        !status.message().contains("secret"),
        "upstream body leaked: {}",
        status.message()
    );
    let error = summary.events.iter().find_map(|e| match &e.kind {
        ChatEvent::Error { code, .. } => Some(*code),
        _ => None,
    });
    assert_eq!(error, Some(proto::ErrorCode::Unavailable));
    assert_eq!(history.len(), 1, "only the user message");
}

#[tokio::test]
async fn an_upstream_silent_past_its_idle_timeout_ends_the_turn_error() {
    let reply = FakeReply::Sse {
        chunks: vec![text_chunk("then ")],
        done: false,
        then_hang: true,
    };
    let fake = FakeOpenAi::start(vec![reply]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server_with_idle(
        &fake,
        dir.path(),
        Some(std::time::Duration::from_millis(200)),
    )
    .await;
    let client = server.client().await;
    let session = new_session(&client).await;
    let summary = client
        .chat(&session, "hi")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Error));
    assert_eq!(summary.status.map(|s| s.code()), Some(Code::Unavailable));
    let history = client.history(&session).await.unwrap();
    assert_eq!(message_text(&history[1]), "then ");
    assert_eq!(history[1].stop_reason, "error");
    fake.wait_clients_gone(1).await;
    server.stop().await;
}

#[tokio::test]
async fn events_far_larger_than_the_encode_buffer_arrive_whole() {
    // The stubs encode with a 1 KiB buffer per stream; a 200 KiB delta and
    // the answer message in history must still arrive intact.
    let big: String = (0..200 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let stream = vec![
        text_chunk("small, "),
        text_chunk(&big),
        text_chunk(" end"),
        finish_chunk("stop"),
    ];
    let (summary, history, _fake) = run_turn(FakeReply::sse(stream)).await;
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
    let expected = format!("small, {big} end");
    assert_eq!(summary.text, expected);
    assert_eq!(message_text(&history[1]), expected);
}
