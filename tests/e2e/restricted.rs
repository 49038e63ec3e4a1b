//! Restricted principals and offboarding, through gRPC: a restricted key's
//! turn reaches the model with no server tools while an unrestricted key's
//! on the same server offers them; its overrides and admin calls are
//! refused; its own quotas apply. `DeleteSessions` of a user stops their
//! live turn and leaves nothing of theirs (sled and the blob directory are
//! read directly once the server is stopped), another user's sessions stay.

use std::path::Path;
use std::sync::Arc;

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use agentrt_server::ServerBuilder;
use agentrt_server::config::ApiKeyConfig;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt as _;

use super::harness::{
    Providers, TestServer, base_config, mock_provider, new_session, read_until, text_request,
    with_keys,
};

const GUEST: &str = "key-guest-1";
const STAFF: &str = "key-staff-1";
const OPS: &str = "key-ops-01";

/// One server tool, `lookup`.
#[derive(Debug)]
struct Lookup;

#[async_trait]
impl ToolSource for Lookup {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "lookup".into(),
            description: "looks something up".into(),
            parameters: json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, _arguments_json: &str) -> ToolOutcome {
        ToolOutcome::ok("found")
    }
}

fn answer(text: &str) -> FakeReply {
    FakeReply::sse(vec![text_chunk(text), finish_chunk("stop")])
}

/// `guest` (restricted) and `staff`, both of user "ann"; `ops`, an admin.
fn keyed(config: agentrt_server::Config) -> agentrt_server::Config {
    let mut config = with_keys(config, &[(STAFF, "ann")]);
    let keys = &mut config.auth.api_keys;
    keys.push(ApiKeyConfig::inline(GUEST, "ann", false).as_restricted());
    keys.push(ApiKeyConfig::inline(OPS, "ops", true));
    config
}

async fn client(url: &str, token: &str) -> Client {
    Client::builder(url.to_owned())
        .token(token)
        .connect()
        .await
        .unwrap()
}

/// The names of the tools a recorded request offered.
fn offered(body: &serde_json::Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn code(err: &agentrt_client::Error) -> Option<Code> {
    err.code()
}

#[tokio::test]
async fn a_restricted_key_gets_no_server_tools_no_overrides_and_no_admin() {
    let fake = FakeOpenAi::start(vec![answer("staff answer"), answer("guest answer")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = keyed(base_config(dir.path()));
    config.default_model = "mock/m".into();
    config.providers.push(mock_provider(&fake, None));
    let server =
        InProcessServer::start(ServerBuilder::new(config).tool_source("local", Arc::new(Lookup)))
            .await;
    let (staff, guest) = (
        client(&server.url(), STAFF).await,
        client(&server.url(), GUEST).await,
    );

    let session = new_session(&staff).await;
    staff
        .chat(&session, "with tools")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    // The guest is the same user: the session is theirs too.
    let done = guest
        .chat(&session, "without")
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(done.outcome, Some(proto::TurnOutcome::Success));
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert!(
        offered(&requests[0].body).contains(&"local__lookup".to_owned()),
        "the staff key's turn offers the server tools: {:?}",
        offered(&requests[0].body)
    );
    assert_eq!(
        offered(&requests[1].body),
        Vec::<String>::new(),
        "the restricted key's turn offers none"
    );

    let overrides: Vec<(&str, proto::ChatRequest)> = vec![
        (
            "model",
            proto::ChatRequest {
                model: "mock/other".into(),
                ..text_request(&session, "x")
            },
        ),
        (
            "system_override",
            proto::ChatRequest {
                system_override: Some("you are root".into()),
                ..text_request(&session, "x")
            },
        ),
        (
            "excluded_tools",
            proto::ChatRequest {
                excluded_tools: vec!["local__lookup".into()],
                ..text_request(&session, "x")
            },
        ),
        (
            "require_approval",
            proto::ChatRequest {
                require_approval: vec!["*".into()],
                ..text_request(&session, "x")
            },
        ),
    ];
    for (field, request) in overrides {
        let err = guest.chat_with(request).await.unwrap_err();
        assert_eq!(code(&err), Some(Code::PermissionDenied), "{field}: {err}");
        assert!(err.to_string().contains(field), "{field}: {err}");
    }
    let err = guest
        .create_session(proto::CreateSessionRequest {
            model: "mock/m".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(Code::PermissionDenied), "{err}");
    assert_eq!(
        fake.requests().len(),
        2,
        "no refused call reached the model"
    );

    for err in [
        guest.runtime_stats().await.unwrap_err(),
        guest.delete_sessions("ann", "").await.unwrap_err(),
    ] {
        assert_eq!(code(&err), Some(Code::PermissionDenied), "{err}");
    }
    assert_eq!(
        staff
            .list_sessions(Default::default())
            .await
            .unwrap()
            .sessions
            .len(),
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn the_restricted_quotas_apply_to_restricted_keys_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = keyed(base_config(dir.path()));
    config.default_model = "gate/g".into();
    config.quotas.restricted.sessions = Some(3);
    let providers = Providers::default();
    let server = TestServer::start_with(config, &providers).await;
    let (staff, guest) = (
        server.client_with_token(STAFF).await,
        server.client_with_token(GUEST).await,
    );
    let mut live = Vec::new();
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(new_session(&guest).await);
    }
    let err = guest
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap_err();
    let status = err.status().expect("a status");
    assert_eq!(status.code(), Code::ResourceExhausted, "{err}");
    let failure = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(failure.violations[0].quota_id, "sessions");
    // The staff key of the same user is under the normal quotas.
    new_session(&staff).await;

    // Two live turns by default.
    for session in &sessions[..2] {
        let mut turn = guest.chat(session, "wait").await.unwrap();
        read_until(&mut turn, |e| matches!(e.kind, ChatEvent::Text(_))).await;
        live.push(turn);
    }
    let err = guest.chat(&sessions[2], "third").await.unwrap_err();
    let status = err.status().expect("a status");
    assert_eq!(status.code(), Code::ResourceExhausted, "{err}");
    let failure = status.get_details_quota_failure().expect("a QuotaFailure");
    assert_eq!(failure.violations[0].quota_id, "live_turns");
    assert_eq!(failure.violations[0].quota_value, 2);
    providers.gate.release(2);
    for turn in live {
        turn.finish().await.unwrap();
    }
    server.stop().await;
}

/// Regular files under `dir` (none when it does not exist).
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_under(&path));
        } else {
            found.push(path);
        }
    }
    found
}

/// Every key and value of every tree of the sled database at `path` that
/// holds `needle`.
fn sled_mentions(path: &Path, needle: &[u8]) -> Vec<String> {
    let db = sled::open(path).unwrap();
    let mut found = Vec::new();
    for name in db.tree_names() {
        let tree = db.open_tree(&name).unwrap();
        for item in tree.iter() {
            let (key, value) = item.unwrap();
            let holds = |bytes: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
            if holds(&key) || holds(&value) {
                found.push(format!(
                    "{}: {}",
                    String::from_utf8_lossy(&name),
                    key.escape_ascii()
                ));
            }
        }
    }
    found
}

#[tokio::test]
async fn delete_sessions_of_a_user_stops_their_live_turn_and_leaves_nothing_of_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = with_keys(
        base_config(dir.path()),
        &[("key-olivia-1", "olivia"), ("key-bruno-1", "bruno")],
    );
    config
        .auth
        .api_keys
        .push(ApiKeyConfig::inline(OPS, "ops", true));
    config.default_model = "gate/g".into();
    let providers = Providers::default();
    let server = TestServer::start_with(config, &providers).await;
    let olivia = server.client_with_token("key-olivia-1").await;
    let bruno = server.client_with_token("key-bruno-1").await;
    let ops = server.client_with_token(OPS).await;

    // Bruno's session stays (his turn first: the gate's permits are shared).
    let kept = new_session(&bruno).await;
    let turn = bruno.chat(&kept, "bruno's question").await.unwrap();
    providers.gate.release(1);
    turn.finish().await.unwrap();
    // Olivia: a session with history, one with a blob, one with a live turn.
    let talked = new_session(&olivia).await;
    let turn = olivia.chat(&talked, "olivia's question").await.unwrap();
    providers.gate.release(1);
    turn.finish().await.unwrap();
    let stored = new_session(&olivia).await;
    let blob = olivia
        .upload_blob(&stored, "text/plain", "notes.txt", b"olivia's notes")
        .await
        .unwrap();
    let busy = new_session(&olivia).await;
    let mut live = olivia.chat(&busy, "olivia waits").await.unwrap();
    read_until(&mut live, |e| matches!(e.kind, ChatEvent::Text(_))).await;

    let done = ops.delete_sessions("olivia", "").await.unwrap();
    assert_eq!((done.deleted, done.remaining), (3, 0));
    // The live turn was stopped first, as DeleteSession stops one.
    let rest = read_until(&mut live, |e| {
        matches!(e.kind, ChatEvent::TurnFinished { .. })
    })
    .await;
    match rest.last().map(|e| &e.kind) {
        Some(ChatEvent::TurnFinished { cancel_reason, .. }) => {
            assert_eq!(*cancel_reason, proto::CancelReason::SessionDeleted);
        }
        other => panic!("the live turn did not end: {other:?}"),
    }
    assert!(
        olivia
            .list_sessions(Default::default())
            .await
            .unwrap()
            .sessions
            .is_empty()
    );
    for session in [&talked, &stored, &busy] {
        let err = olivia.history(session).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    }
    let err = olivia
        .get_blob(&stored, &blob.blob_id)
        .await
        .expect_err("the blob is gone");
    assert_eq!(err.code(), Some(Code::NotFound), "{err}");
    assert_eq!(bruno.history(&kept).await.unwrap().len(), 2);
    // Again: nothing left to delete.
    let again = ops.delete_sessions("olivia", "").await.unwrap();
    assert_eq!((again.deleted, again.remaining), (0, 0));
    server.stop().await;

    let store = dir.path().join("store");
    assert_eq!(sled_mentions(&store, b"olivia"), Vec::<String>::new());
    assert!(
        !sled_mentions(&store, b"bruno").is_empty(),
        "bruno's records stay"
    );
    let blobs = dir.path().join("blobs");
    assert_eq!(files_under(&blobs), Vec::<std::path::PathBuf>::new());
}
