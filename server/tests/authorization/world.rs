//! The server the authorization table runs against: two API-key users and
//! an admin, a scripted model (`script/quick` answers at once,
//! `script/tool` calls the caller's `lookup` tool and answers after its
//! result) and the testkit's gate (`gate/*` holds a turn live, admitted,
//! until the test stops it) — and alice's sessions in each state.

use std::sync::Arc;
use std::time::Duration;

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_client::AgentRuntimeClient;
use agentrt_proto::v1::session_service_client::SessionServiceClient;
use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use agentrt_runtime::types::{ContentBlock, StopReason};
use agentrt_server::config::{ApiKeyConfig, AuthConfig};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::gate::GateProvider;
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use futures::StreamExt as _;
use tonic::Request;
use tonic::transport::Channel;

/// Bound on every wait, so a regression fails instead of hanging.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// Who calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum User {
    /// Owns every fixture.
    Alice,
    /// Another API-key user: alice's resources must look nonexistent to him.
    Bob,
    /// An admin key.
    Admin,
}

impl User {
    fn key(self) -> &'static str {
        match self {
            Self::Alice => "authz-key-one-0001",
            Self::Bob => "authz-key-two-0002",
            Self::Admin => "authz-key-adm-0003",
        }
    }
}

/// `message` with `user`'s bearer key and the A2A version header.
pub(crate) fn authed<T>(message: T, user: User) -> Request<T> {
    let mut req = Request::new(message);
    let bearer = format!("Bearer {}", user.key());
    req.metadata_mut()
        .insert("authorization", bearer.parse().expect("ascii"));
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().expect("ascii"));
    req.set_timeout(WAIT);
    req
}

/// The state of alice's session a case runs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// One finished turn, nothing live.
    Idle,
    /// A turn admitted and held at the gate.
    Live,
    /// A turn waiting for the result of a caller-executed tool call.
    Paused,
    /// One finished turn, then archived.
    Archived,
}

/// Every state.
pub(crate) const STATES: [State; 4] = [State::Idle, State::Live, State::Paused, State::Archived];

/// What a call names: a session, one of its turns (with the A2A task id
/// `<session>/<turn>`), the request id that started that turn and a tool
/// call id.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) session: String,
    pub(crate) turn: String,
    pub(crate) request_id: String,
    pub(crate) call_id: String,
    /// A blob alice uploaded to the session.
    pub(crate) blob: String,
}

impl Target {
    /// The A2A task id of the turn.
    pub(crate) fn task(&self) -> String {
        format!("{}/{}", self.session, self.turn)
    }
}

/// Uploads `data` (text) to `session` in one message, as `user`.
pub(crate) async fn upload(
    mut sessions: pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    session: &str,
    upload_id: &str,
    data: &[u8],
    user: User,
) -> Result<tonic::Response<pb::UploadBlobResponse>, tonic::Status> {
    let message = pb::UploadBlobRequest {
        session_id: session.to_owned(),
        upload_id: upload_id.to_owned(),
        size: data.len() as u64,
        sha256: agentrt_client::sha256_hex(data),
        mime_type: "text/plain".to_owned(),
        name: "notes.txt".to_owned(),
        write_offset: 0,
        data: data.to_vec(),
    };
    sessions
        .upload_blob(authed(futures::stream::iter([message]), user))
        .await
}

/// One of alice's sessions in a state; `hold` keeps a live turn's Chat
/// call open.
pub(crate) struct Fixture {
    pub(crate) target: Target,
    hold: Option<tonic::Streaming<pb::ChatEvent>>,
}

/// The scripted model: `quick` answers at once; `tool` calls the caller's
/// `lookup` tool, then answers once the result is in the conversation.
#[derive(Debug, Default)]
struct Script;

#[async_trait]
impl ModelProvider for Script {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let answered = request.messages.last().is_some_and(|m| {
            m.body
                .content
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolResult { .. }))
        });
        let events = if request.model == "tool" && !answered {
            vec![
                ModelEvent::ToolCall {
                    id: "call_1".into(),
                    name: "lookup".into(),
                    arguments_json: "{}".into(),
                },
                ModelEvent::Finished(StopReason::ToolUse),
            ]
        } else {
            vec![
                ModelEvent::TextDelta("done".into()),
                ModelEvent::Finished(StopReason::Stop),
            ]
        };
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

/// The running server and a channel to it.
pub(crate) struct World {
    server: InProcessServer,
    pub(crate) channel: Channel,
    _dir: tempfile::TempDir,
}

impl World {
    pub(crate) async fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary data dir");
        let config = Config {
            listen: "127.0.0.1:0".parse().expect("an address"),
            data_dir: dir.path().to_path_buf(),
            default_model: "script/quick".into(),
            auth: AuthConfig {
                api_keys: vec![
                    ApiKeyConfig::inline(User::Alice.key(), "alice", false),
                    ApiKeyConfig::inline(User::Bob.key(), "bob", false),
                    ApiKeyConfig::inline(User::Admin.key(), "root", true),
                ],
                ..AuthConfig::default()
            },
            agents: vec![agentrt_server::config::AgentConfig {
                id: "helper".into(),
                system_prompt: "You help {{ user }}.".into(),
                ..Default::default()
            }],
            ..Config::default()
        };
        let builder = ServerBuilder::new(config)
            .model_provider("script", Arc::new(Script))
            .model_provider("gate", Arc::new(GateProvider::default()));
        let server = InProcessServer::start(builder).await;
        let channel = Channel::from_shared(server.url())
            .expect("a url")
            .connect()
            .await
            .expect("connect to the test server");
        Self {
            server,
            channel,
            _dir: dir,
        }
    }

    pub(crate) async fn stop(self) {
        drop(self.channel);
        self.server.stop().await;
    }

    pub(crate) fn sessions(&self) -> SessionServiceClient<Channel> {
        SessionServiceClient::new(self.channel.clone())
    }

    pub(crate) fn runtime(&self) -> AgentRuntimeClient<Channel> {
        AgentRuntimeClient::new(self.channel.clone())
    }

    /// One of alice's sessions in `state`, its turn started with a fresh
    /// request id and a user message only alice sent.
    pub(crate) async fn fixture(&self, state: State, n: usize) -> Fixture {
        let session = self
            .sessions()
            .create_session(authed(
                // Titled, so no title job changes it under the test.
                pb::CreateSessionRequest {
                    title: "fixture".into(),
                    ..Default::default()
                },
                User::Alice,
            ))
            .await
            .expect("alice creates a session")
            .into_inner()
            .session_id;
        let blob = upload(
            self.sessions(),
            &session,
            &format!("up-{n}"),
            format!("alice's file {n}").as_bytes(),
            User::Alice,
        )
        .await
        .expect("alice uploads a file")
        .into_inner()
        .blob
        .expect("the upload completes")
        .blob_id;
        let request_id = format!("rid-{n:04}-{state:?}");
        let (model, tools) = match state {
            State::Idle | State::Archived => ("script/quick", vec![]),
            State::Live => ("gate/held", vec![]),
            State::Paused => ("script/tool", vec![lookup_tool()]),
        };
        let mut chat = chat_request(&session, "alice's secret question", model);
        chat.request_id.clone_from(&request_id);
        chat.extra_tools = tools;
        let mut stream = self
            .runtime()
            .chat(authed(chat, User::Alice))
            .await
            .expect("alice's turn is admitted")
            .into_inner();
        let mut turn = String::new();
        let mut call_id = "call_1".to_owned();
        let until = |kind: &pb::chat_event::Kind| {
            matches!(
                (state, kind),
                (
                    State::Idle | State::Archived,
                    pb::chat_event::Kind::TurnFinished(_)
                ) | (State::Live, pb::chat_event::Kind::Text(_))
                    | (State::Paused, pb::chat_event::Kind::ToolCall(_))
            )
        };
        loop {
            let event = tokio::time::timeout(WAIT, stream.next())
                .await
                .expect("alice's turn makes progress")
                .expect("alice's turn has not ended")
                .expect("an event");
            turn.clone_from(&event.turn_id);
            let Some(kind) = event.kind else { continue };
            if let pb::chat_event::Kind::ToolCall(call) = &kind {
                call_id.clone_from(&call.call_id);
            }
            if until(&kind) {
                break;
            }
        }
        if state == State::Archived {
            self.sessions()
                .update_session(authed(
                    pb::UpdateSessionRequest {
                        session_id: session.clone(),
                        archived: Some(true),
                        ..Default::default()
                    },
                    User::Alice,
                ))
                .await
                .expect("alice archives her session");
        }
        let hold = matches!(state, State::Live | State::Paused).then_some(stream);
        Fixture {
            target: Target {
                session,
                turn,
                request_id,
                call_id,
                blob,
            },
            hold,
        }
    }

    /// Ends a fixture's live turn (if its case left one) and lets go of it.
    pub(crate) async fn release(&self, fixture: Fixture) {
        let stop = pb::StopSessionRequest {
            session_id: fixture.target.session.clone(),
            clear_inbox: false,
        };
        // The case may have deleted or stopped it already: either is fine.
        let _ = self.runtime().stop_session(authed(stop, User::Alice)).await;
        drop(fixture.hold);
    }

    /// What alice sees of her session: whether a turn is live (and which),
    /// its message count, archived flag, title and last turn. A call by
    /// another user must change none of it.
    pub(crate) async fn snapshot(&self, session: &str) -> String {
        let status = self
            .runtime()
            .get_session_status(authed(
                pb::GetSessionStatusRequest {
                    session_id: session.to_owned(),
                },
                User::Alice,
            ))
            .await
            .expect("alice reads her session's status")
            .into_inner();
        let stored = self
            .sessions()
            .get_session(authed(
                pb::GetSessionRequest {
                    session_id: session.to_owned(),
                },
                User::Alice,
            ))
            .await
            .expect("alice reads her session")
            .into_inner();
        let last = stored.last_turn.map(|t| (t.turn_id, t.outcome));
        format!(
            "live={} turn={} messages={} archived={} title={:?} last={last:?}",
            status.live, status.turn_id, stored.message_count, stored.archived, stored.title
        )
    }
}

/// The caller-executed tool of the paused fixtures.
pub(crate) fn lookup_tool() -> pb::ToolDefinition {
    pb::ToolDefinition {
        name: "lookup".into(),
        description: "looks something up".into(),
        parameters_json_schema: r#"{"type":"object"}"#.into(),
    }
}

/// A Chat of one text block with `model`.
pub(crate) fn chat_request(session: &str, text: &str, model: &str) -> pb::ChatRequest {
    pb::ChatRequest {
        session_id: session.to_owned(),
        content: vec![pb::ContentBlock {
            block: Some(pb::content_block::Block::Text(pb::TextBlock {
                text: text.to_owned(),
            })),
        }],
        model: model.to_owned(),
        ..Default::default()
    }
}
