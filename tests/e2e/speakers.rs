//! Speakers and provenance (CONTRACT §8): a Chat's `speaker` reaches an
//! OpenAI-compatible model as the user message's `name` and comes back in
//! history; every stored user message carries the input actor its caller's
//! credentials gave — queued and steered messages their own sender's — and
//! no request field changes it, nor the session's owner.

use agentrt_client::{ChatEvent, ChatOptions, Client, OnBusy, proto};
use agentrt_server::config::{ApiKeyConfig, AuthConfig};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, RecordedRequest, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use futures::StreamExt as _;
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt as _;

use super::harness::{Providers, TestServer, base_config, message_text, mock_provider, read_until};

const ALICE: &str = "key-alice-0001";
/// Alice's admin key: the same user, another credential.
const ALICE_ADMIN: &str = "key-alice-root";
const BOB: &str = "key-bob-00001";

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![
        text_chunk(text),
        finish_chunk("stop"),
        usage_chunk(10, 2),
    ])
}

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

async fn server(fake: &FakeOpenAi, dir: &std::path::Path) -> TestServer {
    let mut config = base_config(dir);
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(fake, None));
    config.auth = AuthConfig {
        api_keys: vec![
            ApiKeyConfig::inline(ALICE, "alice", false),
            ApiKeyConfig::inline(ALICE_ADMIN, "alice", true),
            ApiKeyConfig::inline(BOB, "bob", false),
        ],
        ..AuthConfig::default()
    };
    TestServer::start_with(config, &Providers::default()).await
}

async fn session_of(client: &Client) -> String {
    client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id
}

async fn said(client: &Client, session: &str, options: ChatOptions) {
    let summary = client
        .chat(session, options)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(summary.outcome, Some(proto::TurnOutcome::Success));
}

/// The user messages of a model request: (name, content).
fn users(request: &RecordedRequest) -> Vec<(Option<String>, String)> {
    request.body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| {
            let name = m.get("name").map(|n| n.as_str().unwrap().to_owned());
            (name, m["content"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

type Provenance = (
    String,
    Option<(String, String)>,
    (proto::InputActorKind, String, bool),
);

/// Each user message of the session's history: its text, its speaker and
/// its input actor.
async fn provenance(client: &Client, session: &str) -> Vec<Provenance> {
    client
        .history(session)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.role() == proto::Role::User)
        .map(|m| {
            let speaker = m.speaker.clone().map(|s| (s.id, s.display_name));
            let a = m
                .input_actor
                .clone()
                .expect("every user message has an actor");
            (message_text(&m), speaker, (a.kind(), a.id, a.admin))
        })
        .collect()
}

/// A user message of Alice's, by her plain key or her admin key.
fn said_by(text: &str, speaker: Option<(&str, &str)>, admin: bool) -> Provenance {
    (
        text.to_owned(),
        speaker.map(|(id, name)| (id.to_owned(), name.to_owned())),
        (proto::InputActorKind::ApiKey, "alice".to_owned(), admin),
    )
}

#[tokio::test]
async fn speaker_names_reach_the_model_as_name_and_come_back_in_history() {
    let fake = FakeOpenAi::start(vec![answer("hi Bob"), answer("hi all"), answer("ok")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let root = server.client_with_token(ALICE_ADMIN).await;
    let session = session_of(&alice).await;
    said(
        &alice,
        &session,
        ChatOptions::new("hello").speaker("u-bob", "Bob Builder"),
    )
    .await;
    said(
        &root,
        &session,
        ChatOptions::new("from root").speaker("u-7", ""),
    )
    .await;
    said(&alice, &session, ChatOptions::new("no speaker")).await;

    // The name the API accepts, on every request that replays the message;
    // the text is unchanged.
    let requests = fake.requests();
    assert_eq!(
        users(&requests[0]),
        [(Some("Bob_Builder".into()), "hello".into())]
    );
    assert_eq!(
        users(&requests[2]),
        [
            (Some("Bob_Builder".into()), "hello".into()),
            (Some("u-7".into()), "from root".into()),
            (None, "no speaker".into()),
        ]
    );
    // Two credentials of one user: two actors; the speaker is the caller's
    // label beside them.
    assert_eq!(
        provenance(&alice, &session).await,
        [
            said_by("hello", Some(("u-bob", "Bob Builder")), false),
            said_by("from root", Some(("u-7", "")), true),
            said_by("no speaker", None, false),
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn a_speaker_named_like_another_user_changes_neither_owner_nor_actor() {
    let fake = FakeOpenAi::start(vec![answer("ok")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let bob = server.client_with_token(BOB).await;
    let session = session_of(&alice).await;
    said(
        &alice,
        &session,
        ChatOptions::new("I am bob").speaker("bob", "bob"),
    )
    .await;
    assert_eq!(alice.get_session(&session).await.unwrap().owner, "alice");
    assert_eq!(
        provenance(&alice, &session).await,
        [said_by("I am bob", Some(("bob", "bob")), false)]
    );
    // Bob gets nothing of it, and naming Alice as his speaker does not
    // make him her.
    let err = bob
        .chat(
            &session,
            ChatOptions::new("let me in").speaker("alice", "alice"),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert!(
        bob.list_sessions(Default::default())
            .await
            .unwrap()
            .sessions
            .is_empty()
    );
    server.stop().await;
}

#[tokio::test]
async fn an_invalid_speaker_is_invalid_argument_naming_the_field() {
    let fake = FakeOpenAi::start(Vec::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let session = session_of(&alice).await;
    for (speaker, field) in [
        (("", "Alice"), "speaker.id"),
        (("u1\n", "Alice"), "speaker.id"),
        (("u1", "x".repeat(257).as_str()), "speaker.display_name"),
    ] {
        let mut req = super::harness::text_request(&session, "hi");
        req.speaker = Some(proto::Speaker {
            id: speaker.0.to_owned(),
            display_name: speaker.1.to_owned(),
        });
        let status = alice.runtime_raw().chat(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        let fields: Vec<_> = status
            .get_error_details()
            .bad_request()
            .expect("a BadRequest")
            .field_violations
            .iter()
            .map(|v| v.field.clone())
            .collect();
        assert_eq!(fields, [field]);
    }
    assert!(alice.history(&session).await.unwrap().is_empty());
    assert!(fake.requests().is_empty());
    server.stop().await;
}

#[tokio::test]
async fn queued_and_steered_messages_keep_their_senders_provenance() {
    let fake = FakeOpenAi::start(vec![calls_wait(), answer("steered"), answer("queued")]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = server(&fake, dir.path()).await;
    let alice = server.client_with_token(ALICE).await;
    let root = server.client_with_token(ALICE_ADMIN).await;
    let session = session_of(&alice).await;

    // Alice's turn waits on a caller tool while her admin key steers one
    // message into it and queues another behind it.
    let mut req = super::harness::text_request(&session, "first");
    req.speaker = Some(proto::Speaker {
        id: "u-host".into(),
        display_name: "Host".into(),
    });
    req.extra_tools = vec![proto::ToolDefinition {
        name: "wait".into(),
        description: "waits for the caller".into(),
        parameters_json_schema: r#"{"type":"object","properties":{}}"#.into(),
    }];
    let mut first = alice.chat_with(req).await.unwrap();
    let seen = read_until(&mut first, |e| matches!(e.kind, ChatEvent::ToolCall { .. })).await;
    let turn_id = seen[0].turn_id.clone();
    let steer = ChatOptions::new("steer")
        .speaker("u-guest", "Guest")
        .on_busy(OnBusy::Steer);
    let mut steered = root.chat(&session, steer).await.unwrap();
    let queue = ChatOptions::new("later")
        .speaker("u-late", "Late")
        .on_busy(OnBusy::Enqueue);
    let mut queued = root.chat(&session, queue).await.unwrap();
    assert!(matches!(
        queued.next().await.unwrap().unwrap().kind,
        ChatEvent::Queued { position: 1 }
    ));
    // The inbox lists the queued message with its provenance.
    let inbox = alice.session_status(&session).await.unwrap().queued;
    let q = &inbox[0];
    let actor = q.input_actor.clone().unwrap();
    assert_eq!(
        (
            q.speaker.clone().map(|s| s.id),
            actor.kind(),
            actor.id.as_str(),
            actor.admin
        ),
        (
            Some("u-late".to_owned()),
            proto::InputActorKind::ApiKey,
            "alice",
            true
        )
    );
    alice
        .submit_tool_result(&session, &turn_id, "call_1", "done", false)
        .await
        .unwrap();
    for stream in [&mut first, &mut steered, &mut queued] {
        let events = read_until(stream, |e| matches!(e.kind, ChatEvent::TurnFinished { .. })).await;
        let Some(ChatEvent::TurnFinished { outcome, .. }) = events.last().map(|e| &e.kind) else {
            panic!("no turn_finished in {events:?}");
        };
        assert_eq!(*outcome, proto::TurnOutcome::Success);
    }

    let requests = fake.requests();
    assert_eq!(
        users(&requests[1]).last(),
        Some(&(Some("Guest".into()), "steer".into()))
    );
    assert_eq!(
        users(&requests[2]).last(),
        Some(&(Some("Late".into()), "later".into()))
    );
    assert_eq!(
        provenance(&alice, &session).await,
        [
            said_by("first", Some(("u-host", "Host")), false),
            said_by("steer", Some(("u-guest", "Guest")), true),
            said_by("later", Some(("u-late", "Late")), true),
        ]
    );
    server.stop().await;
}
