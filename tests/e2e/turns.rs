//! Turns as records: ListTurns (newest first, paged) and GetTurn, with the
//! usage of every step and its cost by the `[prices]` table, against the
//! OpenAI-compatible provider talking to a fake on loopback.

use std::collections::BTreeMap;
use std::time::SystemTime;

use agentrt_client::{Client, proto};
use agentrt_runtime::prices::{Price, Prices};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk, usage_chunk};
use futures::StreamExt as _;
use tonic::Code;

use super::harness::{
    Providers, TestServer, base_config, mock_provider, new_session, text_request, with_keys,
};

const ALICE: &str = "alice-key-123";
const BOB: &str = "bob-key-456";

fn reply(text: &str) -> FakeReply {
    FakeReply::sse(vec![
        text_chunk(text),
        finish_chunk("stop"),
        usage_chunk(12, 5),
    ])
}

/// A server whose `mock/m` costs $2 / $8 per million input / output
/// tokens; `builtin/echo` has no price. Two users, alice and bob.
async fn server(fake: &FakeOpenAi, dir: &std::path::Path) -> TestServer {
    let mut config = with_keys(base_config(dir), &[(ALICE, "alice"), (BOB, "bob")]);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    let price = Price {
        input: 2.0,
        cached_input: Some(0.5),
        output: 8.0,
    };
    config.prices = Prices::new(BTreeMap::from([("mock/m".to_owned(), price)])).unwrap();
    TestServer::start_with(config, &Providers::default()).await
}

/// Runs one turn to its end; its turn id.
async fn turn(client: &Client, session: &str, request_id: &str, model: &str) -> String {
    let mut req = text_request(session, &format!("question {request_id}"));
    req.request_id = request_id.to_owned();
    req.model = model.to_owned();
    let summary = client.chat_with(req).await.unwrap().finish().await.unwrap();
    assert_eq!(
        summary.outcome,
        Some(proto::TurnOutcome::Success),
        "{:?}",
        summary.status
    );
    summary.events[0].turn_id.clone()
}

fn page(session: &str, size: u32, token: &str) -> proto::ListTurnsRequest {
    proto::ListTurnsRequest {
        session_id: session.to_owned(),
        page_size: size,
        page_token: token.to_owned(),
    }
}

fn time(t: Option<prost_types::Timestamp>) -> SystemTime {
    SystemTime::try_from(t.expect("a timestamp")).unwrap()
}

#[tokio::test]
async fn turns_are_listed_newest_first_with_steps_usage_and_cost() {
    let fake = FakeOpenAi::start(vec![reply("one"), reply("two"), reply("three")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let session = new_session(&alice).await;
    let mut ids = Vec::new();
    for rid in ["r1", "r2", "r3"] {
        ids.push(turn(&alice, &session, rid, "").await);
    }
    ids.push(turn(&alice, &session, "r4", "builtin/echo").await);

    let first = alice.list_turns(page(&session, 3, "")).await.unwrap();
    let listed: Vec<&str> = first.turns.iter().map(|t| t.turn_id.as_str()).collect();
    assert_eq!(listed, [&ids[3], &ids[2], &ids[1]], "newest first");
    assert!(!first.next_page_token.is_empty());
    let second = alice
        .list_turns(page(&session, 3, &first.next_page_token))
        .await
        .unwrap();
    let listed: Vec<&str> = second.turns.iter().map(|t| t.turn_id.as_str()).collect();
    assert_eq!(listed, [&ids[0]]);
    assert!(second.next_page_token.is_empty(), "the last page says so");

    let history = alice.history(&session).await.unwrap();
    let all: Vec<proto::Turn> = first.turns.into_iter().chain(second.turns).collect();
    for (t, rid) in all.iter().zip(["r4", "r3", "r2", "r1"]) {
        assert_eq!(t.request_id, rid);
        assert_eq!(t.outcome(), proto::TurnOutcome::Success);
        assert_eq!(t.steps, 1);
        assert!(t.error.is_empty() && t.cancel_reason.is_empty());
        assert!(time(t.started_at) <= time(t.finished_at));
        let user = history
            .iter()
            .find(|m| m.seq == t.user_message_seq)
            .unwrap();
        assert_eq!(
            (user.role(), user.turn_id.as_str()),
            (proto::Role::User, t.turn_id.as_str())
        );
        assert_eq!(alice.get_turn(&session, &t.turn_id).await.unwrap(), *t);
    }
    for t in &all[1..] {
        let usage = t.usage.unwrap();
        assert_eq!(
            (t.model.as_str(), usage.input_tokens, usage.output_tokens),
            ("mock/m", 12, 5)
        );
        // 12 × $2/M + 5 × $8/M.
        let cost = t.cost.expect("mock/m has a price");
        assert!((cost - 64e-6).abs() < 1e-12, "{cost}");
    }
    assert_eq!(all[0].model, "builtin/echo");
    assert_eq!(all[0].cost, None, "a model without a price has no cost");

    // Default page size lists them all; a bad token is refused, naming it.
    let everything = alice.list_turns(page(&session, 0, "")).await.unwrap();
    assert_eq!(everything.turns, all);
    let bad = alice
        .list_turns(page(&session, 3, "not a token!"))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Some(Code::InvalidArgument));
    assert!(bad.to_string().contains("page_token"), "{bad}");

    // Unknown turn, unknown session, another user: NOT_FOUND alike.
    let missing = alice.get_turn(&session, "no-such-turn").await.unwrap_err();
    assert_eq!(missing.code(), Some(Code::NotFound));
    let nowhere = alice
        .list_turns(page("no-such-session", 0, ""))
        .await
        .unwrap_err();
    assert_eq!(nowhere.code(), Some(Code::NotFound));
    let bob = server.client_with_token(BOB).await;
    let theirs = bob.list_turns(page(&session, 0, "")).await.unwrap_err();
    assert_eq!(theirs.code(), Some(Code::NotFound));
    let theirs = bob.get_turn(&session, &ids[0]).await.unwrap_err();
    assert_eq!(theirs.code(), Some(Code::NotFound));
    server.stop().await;
}

#[tokio::test]
async fn a_running_turn_is_listed_running_and_the_record_survives_a_restart() {
    let fake = FakeOpenAi::start(vec![reply("one")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let session = new_session(&alice).await;
    let id = turn(&alice, &session, "r1", "").await;
    let before = alice.get_turn(&session, &id).await.unwrap();
    server.stop().await;

    let server = self::server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    assert_eq!(alice.get_turn(&session, &id).await.unwrap(), before);
    // A turn held open by the gate provider is RUNNING, without an end.
    let mut req = text_request(&session, "wait");
    req.model = "gate/x".into();
    let mut chat = alice.chat_with(req).await.unwrap();
    let started = chat.next().await.unwrap().unwrap();
    let running = alice.get_turn(&session, &started.turn_id).await.unwrap();
    assert_eq!(running.outcome(), proto::TurnOutcome::Running);
    assert!(running.finished_at.is_none());
    let listed = alice.list_turns(page(&session, 1, "")).await.unwrap();
    assert_eq!(listed.turns, [running]);
    alice.stop_session(&session).await.unwrap();
    drop(chat);
    server.stop().await;
}
