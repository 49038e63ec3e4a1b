//! Agent profiles end to end against the fake OpenAI upstream: the rendered
//! template, the profile's tools and model; versions pinned or followed,
//! a live turn keeping its snapshot; memory written by the model's tool in
//! one session shown in the next session's prompt of the same user only.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_server::config::{AgentConfig, ApiKeyConfig, AuthConfig};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, RecordedRequest, finish_chunk, sse_data, text_chunk,
};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};
use tonic::Code;

use super::harness::{base_config, mock_provider, read_until, text_request};

const WAIT: Duration = Duration::from_secs(30);

/// Tools `wait` (reports its start, then waits for a permit) and `other`.
#[derive(Debug)]
struct Tools {
    started: mpsc::UnboundedSender<()>,
    release: Semaphore,
}

#[async_trait]
impl ToolSource for Tools {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(["wait", "other"]
            .map(|name| ToolSpec {
                name: name.into(),
                description: format!("the {name} tool"),
                parameters: json!({"type": "object"}),
            })
            .into())
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        let _ = self.started.send(());
        self.release.acquire().await.unwrap().forget();
        ToolOutcome::ok("released")
    }
}

pub(super) fn call_reply(id: &str, name: &str, arguments: &str) -> FakeReply {
    let call = json!({
        "index": 0, "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments}
    });
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
    ])
}

pub(super) fn text_reply(text: &str) -> FakeReply {
    FakeReply::sse(vec![text_chunk(text), finish_chunk("stop")])
}

/// The system prompt of a recorded request (empty when it has none).
pub(super) fn system(r: &RecordedRequest) -> String {
    let first = &r.body["messages"][0];
    if first["role"] == "system" {
        first["content"].as_str().unwrap_or_default().to_owned()
    } else {
        String::new()
    }
}

pub(super) fn tool_names(r: &RecordedRequest) -> Vec<String> {
    r.body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn keys() -> AuthConfig {
    AuthConfig {
        api_keys: vec![
            ApiKeyConfig::inline("key-admin", "root", true),
            ApiKeyConfig::inline("key-alice", "alice", false),
            ApiKeyConfig::inline("key-bob-1", "bob", false),
        ],
        ..AuthConfig::default()
    }
}

pub(super) async fn client(server: &InProcessServer, token: &str) -> Client {
    Client::builder(server.url())
        .token(token)
        .connect()
        .await
        .unwrap()
}

async fn session(client: &Client, agent: &str, title: &str, follow: bool) -> proto::Session {
    client
        .sessions_raw()
        .create_session(tonic::Request::new(proto::CreateSessionRequest {
            agent_id: agent.into(),
            title: title.into(),
            follow_latest_agent: follow,
            ..Default::default()
        }))
        .await
        .map(tonic::Response::into_inner)
        .unwrap()
}

/// The UTC date as the template renders it.
fn today() -> String {
    let days = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400;
    // Days since the epoch to a civil date (the proleptic Gregorian
    // calendar), computed independently of the server's code.
    let mut y = 1970;
    let mut d = days;
    loop {
        let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let len = if leap { 366 } else { 365 };
        if d < len {
            let months = [
                31,
                if leap { 29 } else { 28 },
                31,
                30,
                31,
                30,
                31,
                31,
                30,
                31,
                30,
                31,
            ];
            let mut m = 0;
            while d >= months[m] {
                d -= months[m];
                m += 1;
            }
            return format!("{y:04}-{:02}-{:02}", m + 1, d + 1);
        }
        d -= len;
        y += 1;
    }
}

#[tokio::test]
async fn an_agent_session_sends_its_rendered_template_tools_and_model_and_keeps_its_version() {
    let fake = FakeOpenAi::start(vec![
        // Turn 1 (config agent): one answer.
        text_reply("hello"),
        // Turn 2 (API agent, follows the latest): a tool call that waits
        // while the agent is updated, then its second step.
        call_reply("call_1", "local__wait", "{}"),
        text_reply("done"),
        // Later turns.
        text_reply("again"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.auth = keys();
    config.providers.push(mock_provider(&fake, None));
    config.agents.push(AgentConfig {
        id: "helper".into(),
        system_prompt: "Hi {{ user }} | {{ session.title }} | {{ date }} | {{ memory.notes }}"
            .into(),
        model: "mock/helper-model".into(),
        tools: Some(vec!["local__other".into(), "memory_read".into()]),
        ..AgentConfig::default()
    });
    let (started, mut starts) = mpsc::unbounded_channel();
    let tools = Arc::new(Tools {
        started,
        release: Semaphore::new(0),
    });
    let server = InProcessServer::start_prepared(
        ServerBuilder::new(config).tool_source("local", tools.clone()),
    )
    .await;
    let admin = client(&server, "key-admin").await;
    let alice = client(&server, "key-alice").await;

    // The config's agent: the template with the user, title, date and a
    // memory block; only the profile's tools; the profile's model.
    alice
        .set_memory("helper", "notes", "likes tea")
        .await
        .unwrap();
    let s = session(&alice, "helper", "Plans", false).await;
    assert_eq!(s.agent_version, 1);
    alice
        .chat_with(text_request(&s.session_id, "hi"))
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    let first = &fake.requests()[0];
    assert_eq!(first.body["model"], "helper-model");
    assert_eq!(
        system(first),
        format!("Hi alice | Plans | {} | likes tea", today())
    );
    assert_eq!(tool_names(first), ["local__other", "memory_read"]);
    // Read-only through the API.
    let err = admin
        .update_agent("helper", proto::AgentSpec::default(), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(Code::FailedPrecondition), "{err}");

    // An API agent: v1, a session pinned to it and one following it.
    let v1 = proto::AgentSpec {
        system_prompt: "v1 for {{ user }}".into(),
        model: "mock/m".into(),
        tools: Some(proto::ToolList {
            names: vec!["local__wait".into()],
        }),
        ..Default::default()
    };
    let created = admin.create_agent("writer", v1.clone()).await.unwrap();
    assert_eq!(created.version, 1);
    let err = admin.create_agent("writer", v1.clone()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::AlreadyExists), "{err}");
    let err = alice.create_agent("mine", v1.clone()).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
    let pinned = session(&alice, "writer", "", false).await;
    let follows = session(&alice, "writer", "", true).await;
    assert_eq!((pinned.agent_version, follows.agent_version), (1, 0));

    // A live turn of the following session waits in its tool while the
    // agent is updated: its second step keeps v1.
    let chat = alice
        .chat_with(text_request(&follows.session_id, "write"))
        .await
        .unwrap();
    tokio::time::timeout(WAIT, starts.recv())
        .await
        .unwrap()
        .unwrap();
    let v2 = proto::AgentSpec {
        system_prompt: "v2 for {{ user }}".into(),
        ..v1.clone()
    };
    let updated = admin.update_agent("writer", v2, Some(1)).await.unwrap();
    assert_eq!(updated.version, 2);
    tools.release.add_permits(1);
    let rest = tokio::time::timeout(WAIT, chat.finish())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Success));
    let requests = fake.requests();
    assert_eq!(system(&requests[1]), "v1 for alice");
    assert_eq!(
        system(&requests[2]),
        "v1 for alice",
        "the live turn kept v1"
    );

    // The next turns: the following session takes v2, the pinned one
    // keeps v1.
    for id in [&follows.session_id, &pinned.session_id] {
        alice
            .chat_with(text_request(id, "more"))
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
    }
    let requests = fake.requests();
    assert_eq!(system(&requests[3]), "v2 for alice");
    assert_eq!(system(&requests[4]), "v1 for alice");
    assert_eq!(admin.agent("writer", Some(1)).await.unwrap().spec, Some(v1));
    let listed: Vec<_> = alice
        .agents()
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.agent_id, a.version))
        .collect();
    assert_eq!(listed, [("helper".into(), 1), ("writer".into(), 2)]);
    // ListSessions filters by agent.
    let writer_sessions = alice
        .sessions_raw()
        .list_sessions(tonic::Request::new(proto::ListSessionsRequest {
            agent_id: "writer".into(),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert_eq!(writer_sessions.len(), 2);
    server.stop().await;
}

#[tokio::test]
async fn memory_the_model_writes_shows_in_the_users_next_session_and_no_one_elses() {
    let fake = FakeOpenAi::start(vec![
        call_reply(
            "call_1",
            "memory_write",
            r#"{"block": "fact", "text": "alice likes tea"}"#,
        ),
        text_reply("noted"),
        text_reply("hi"),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.auth = keys();
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    config.agents.push(AgentConfig {
        id: "mem".into(),
        system_prompt: "Memory: {{ memory.fact }}".into(),
        tools: Some(vec!["memory_read".into(), "memory_write".into()]),
        ..AgentConfig::default()
    });
    let server = InProcessServer::start_prepared(ServerBuilder::new(config)).await;
    let alice = client(&server, "key-alice").await;
    let bob = client(&server, "key-bob-1").await;

    let first = session(&alice, "mem", "", false).await;
    let mut chat = alice
        .chat_with(text_request(&first.session_id, "remember: I like tea"))
        .await
        .unwrap();
    let seen = read_until(&mut chat, |e| {
        matches!(&e.kind, ChatEvent::TurnFinished { .. })
    })
    .await;
    assert!(
        seen.iter()
            .any(|e| matches!(&e.kind, ChatEvent::ToolUse(t) if t.tool_name == "memory_write")),
        "{seen:?}"
    );
    let memory = alice.memory("mem", None).await.unwrap();
    assert_eq!(memory.blocks["fact"], "alice likes tea");
    assert_eq!(memory.version, 1);

    // The same user's next session shows it; another user's does not.
    let second = session(&alice, "mem", "", false).await;
    let theirs = session(&bob, "mem", "", false).await;
    for (c, s) in [(&alice, &second), (&bob, &theirs)] {
        c.chat_with(text_request(&s.session_id, "hello"))
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
    }
    let requests = fake.requests();
    assert_eq!(system(&requests[0]), "Memory: ");
    assert_eq!(system(&requests[2]), "Memory: alice likes tea");
    assert_eq!(system(&requests[3]), "Memory: ");
    assert!(bob.memory("mem", None).await.unwrap().blocks.is_empty());
    // Another user's memory is for admins only.
    let err = bob.memory("mem", Some("alice")).await.unwrap_err();
    assert_eq!(err.code(), Some(Code::PermissionDenied), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn an_agent_with_auto_title_off_leaves_its_sessions_untitled() {
    let fake = FakeOpenAi::start(vec![text_reply("fine")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    config.auth = keys();
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    for (id, auto_title) in [("quiet", Some(false)), ("loud", None)] {
        config.agents.push(AgentConfig {
            id: id.into(),
            auto_title,
            ..AgentConfig::default()
        });
    }
    let server = InProcessServer::start_prepared(ServerBuilder::new(config.clone())).await;
    let alice = client(&server, "key-alice").await;
    let quiet = session(&alice, "quiet", "", false).await;
    let loud = session(&alice, "loud", "", false).await;
    for s in [&quiet, &loud] {
        alice
            .chat_with(text_request(&s.session_id, "Plan a trip to Japan"))
            .await
            .unwrap()
            .finish()
            .await
            .unwrap();
    }
    // Stopping waits for the title jobs in flight: what is stored now is
    // final.
    server.stop().await;
    let server = InProcessServer::start_prepared(ServerBuilder::new(config)).await;
    let alice = client(&server, "key-alice").await;
    let title = |id: String| {
        let alice = alice.clone();
        async move { alice.get_session(&id).await.unwrap().title }
    };
    assert_eq!(title(loud.session_id).await, "Plan a trip to Japan");
    assert_eq!(title(quiet.session_id).await, "");
    server.stop().await;
}
