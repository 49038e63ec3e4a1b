//! The table: every RPC of every public service, how to call it against a
//! [`Target`], and what kind of resource it names. [`call`] is the one
//! place that knows each method; a method the descriptors list and the
//! table does not is a failure of the test.

use std::collections::BTreeMap;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_service_client::AgentServiceClient;
use agentrt_proto::v1::runtime_admin_client::RuntimeAdminClient;
use prost_types::value::Kind;

use super::outcome::{Outcome, streamed, unary};
use super::world::{Target, User, World, authed, chat_request, lookup_tool};

/// What a case's call names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A session, a turn of it or an A2A task/context: another user's must
    /// answer exactly as a nonexistent one; `distinct` says that the owner's
    /// own answer differs from the nonexistent one's (false for calls that
    /// are refused whatever they name, e.g. push notifications).
    Owned { distinct: bool },
    /// Nothing of anyone's (a listing of the caller's own, the agent
    /// card): nothing of another user may show in the answer.
    Caller,
    /// An admin call: PERMISSION_DENIED for any non-admin, whatever it names.
    Admin,
}

/// One row of the table: a method (full gRPC name), a variant of calling
/// it, and its scope.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Case {
    pub(crate) method: &'static str,
    pub(crate) variant: &'static str,
    pub(crate) scope: Scope,
}

const fn owned(method: &'static str, variant: &'static str) -> Case {
    Case {
        method,
        variant,
        scope: Scope::Owned { distinct: true },
    }
}

const fn refused(method: &'static str) -> Case {
    Case {
        method,
        variant: "",
        scope: Scope::Owned { distinct: false },
    }
}

const fn caller(method: &'static str) -> Case {
    Case {
        method,
        variant: "",
        scope: Scope::Caller,
    }
}

const fn admin(method: &'static str) -> Case {
    Case {
        method,
        variant: "",
        scope: Scope::Admin,
    }
}

/// The table.
pub(crate) const CASES: &[Case] = &[
    owned("agentrt.v1.SessionService/CreateSession", ""),
    owned("agentrt.v1.SessionService/GetSession", ""),
    caller("agentrt.v1.SessionService/ListSessions"),
    owned("agentrt.v1.SessionService/UpdateSession", "title"),
    owned("agentrt.v1.SessionService/UpdateSession", "unarchive"),
    owned("agentrt.v1.SessionService/DeleteSession", ""),
    owned("agentrt.v1.SessionService/GetHistory", ""),
    owned("agentrt.v1.SessionService/ListTurns", ""),
    owned("agentrt.v1.SessionService/GetTurn", ""),
    owned("agentrt.v1.SessionService/UploadBlob", ""),
    owned("agentrt.v1.SessionService/GetUploadStatus", ""),
    owned("agentrt.v1.SessionService/GetBlob", ""),
    owned("agentrt.v1.SessionService/ListBlobs", ""),
    // Bob reuses alice's request id on her session (his own session with
    // it is checked beside the table).
    owned("agentrt.v1.AgentRuntime/Chat", "replay"),
    owned("agentrt.v1.AgentRuntime/Chat", "fresh"),
    owned("agentrt.v1.AgentRuntime/Subscribe", "now"),
    owned("agentrt.v1.AgentRuntime/Subscribe", "wait"),
    owned("agentrt.v1.AgentRuntime/StopSession", ""),
    owned("agentrt.v1.AgentRuntime/GetSessionStatus", ""),
    owned("agentrt.v1.AgentRuntime/CloseSession", "soft"),
    owned("agentrt.v1.AgentRuntime/CloseSession", "force"),
    owned("agentrt.v1.AgentRuntime/SubmitToolResult", ""),
    owned("agentrt.v1.AgentRuntime/SubmitToolApproval", ""),
    owned("agentrt.v1.AgentRuntime/CompactSession", ""),
    admin("agentrt.v1.RuntimeAdmin/ResetRunners"),
    admin("agentrt.v1.RuntimeAdmin/SetDefaultModel"),
    admin("agentrt.v1.RuntimeAdmin/InvalidateRunners"),
    admin("agentrt.v1.RuntimeAdmin/Drain"),
    admin("agentrt.v1.RuntimeAdmin/Undrain"),
    admin("agentrt.v1.RuntimeAdmin/GetRuntimeStats"),
    admin("agentrt.v1.RuntimeAdmin/GetUserUsage"),
    admin("agentrt.v1.AgentService/CreateAgent"),
    admin("agentrt.v1.AgentService/UpdateAgent"),
    caller("agentrt.v1.AgentService/GetAgent"),
    caller("agentrt.v1.AgentService/ListAgents"),
    caller("agentrt.v1.AgentService/GetMemory"),
    caller("agentrt.v1.AgentService/UpdateMemory"),
    admin("agentrt.v1.RuntimeAdmin/DeleteSessions"),
    admin("agentrt.v1.RuntimeAdmin/ListReplicas"),
    owned("lf.a2a.v1.A2AService/SendMessage", "context"),
    owned("lf.a2a.v1.A2AService/SendMessage", "task"),
    owned("lf.a2a.v1.A2AService/SendStreamingMessage", "context"),
    owned("lf.a2a.v1.A2AService/SendStreamingMessage", "task"),
    owned("lf.a2a.v1.A2AService/GetTask", ""),
    owned("lf.a2a.v1.A2AService/ListTasks", ""),
    owned("lf.a2a.v1.A2AService/CancelTask", ""),
    owned("lf.a2a.v1.A2AService/SubscribeToTask", ""),
    refused("lf.a2a.v1.A2AService/CreateTaskPushNotificationConfig"),
    refused("lf.a2a.v1.A2AService/GetTaskPushNotificationConfig"),
    refused("lf.a2a.v1.A2AService/ListTaskPushNotificationConfigs"),
    caller("lf.a2a.v1.A2AService/GetExtendedAgentCard"),
    refused("lf.a2a.v1.A2AService/QuerySkill"),
    refused("lf.a2a.v1.A2AService/DeleteTaskPushNotificationConfig"),
];

fn ok<T>(_: &T) -> String {
    "ok".into()
}

/// A session as compared: who owns it and what it holds (not its times).
fn session_summary(s: &pb::Session) -> String {
    format!(
        "session {} owner={} messages={} archived={} last_turn={}",
        s.session_id,
        s.owner,
        s.message_count,
        s.archived,
        s.last_turn.is_some()
    )
}

fn event_summary(e: &pb::ChatEvent) -> String {
    let kind = format!("{:?}", e.kind);
    let name = kind.split('(').nth(1).unwrap_or("none").to_owned();
    format!("event {name} session={} turn={}", e.session_id, e.turn_id)
}

fn task_summary(t: &a2a::Task) -> String {
    let state = t.status.as_ref().map(|s| s.state);
    format!("task {} context={} state={state:?}", t.id, t.context_id)
}

fn stream_summary(r: &a2a::StreamResponse) -> String {
    use a2a::stream_response::Payload;
    match &r.payload {
        Some(Payload::Task(t)) => task_summary(t),
        Some(Payload::Message(m)) => format!("message context={}", m.context_id),
        Some(Payload::StatusUpdate(u)) => format!("status {} {}", u.task_id, u.context_id),
        Some(Payload::ArtifactUpdate(u)) => format!("artifact {} {}", u.task_id, u.context_id),
        None => "nothing".into(),
    }
}

/// An A2A message with `text`, and (for a message to a task) the tool
/// result of `target`'s call as a data part.
fn a2a_message(target: &Target, to_task: bool, user: User) -> a2a::SendMessageRequest {
    let mut parts = vec![a2a::Part {
        content: Some(a2a::part::Content::Text(format!("{user:?} asks"))),
        ..Default::default()
    }];
    let mut message = a2a::Message {
        // The request id of alice's turn: a replay if it were hers.
        message_id: target.request_id.clone(),
        role: a2a::Role::User as i32,
        ..Default::default()
    };
    if to_task {
        message.task_id = target.task();
        let fields = BTreeMap::from([
            ("call_id".to_owned(), string_value(&target.call_id)),
            ("content".to_owned(), string_value("42")),
        ]);
        parts = vec![a2a::Part {
            content: Some(a2a::part::Content::Data(prost_types::Value {
                kind: Some(Kind::StructValue(prost_types::Struct { fields })),
            })),
            ..Default::default()
        }];
    } else {
        message.context_id.clone_from(&target.session);
    }
    message.parts = parts;
    a2a::SendMessageRequest {
        message: Some(message),
        ..Default::default()
    }
}

fn string_value(s: &str) -> prost_types::Value {
    prost_types::Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

/// Calls `case` as `user` against `target`. A stream's first item is read
/// unless `user` is the owner (whose stream may rightly wait).
pub(crate) async fn call(world: &World, case: &Case, user: User, target: &Target) -> Outcome {
    let read = user != User::Alice;
    let id = || target.session.clone();
    let mut sessions = world.sessions();
    let mut runtime = world.runtime();
    let mut admin = RuntimeAdminClient::new(world.channel.clone());
    let mut agents = AgentServiceClient::new(world.channel.clone());
    let mut a2a = A2aServiceClient::new(world.channel.clone());
    let task = target.task();
    match (case.method, case.variant) {
        ("agentrt.v1.SessionService/CreateSession", _) => {
            let r = pb::CreateSessionRequest {
                session_id: id(),
                ..Default::default()
            };
            unary(
                sessions.create_session(authed(r, user)).await,
                session_summary,
            )
        }
        ("agentrt.v1.SessionService/GetSession", _) => {
            let r = pb::GetSessionRequest { session_id: id() };
            unary(sessions.get_session(authed(r, user)).await, session_summary)
        }
        ("agentrt.v1.SessionService/ListSessions", _) => {
            let r = pb::ListSessionsRequest {
                include_archived: true,
                page_size: 1000,
                ..Default::default()
            };
            unary(sessions.list_sessions(authed(r, user)).await, |l| {
                format!("{} sessions", l.sessions.len())
            })
        }
        ("agentrt.v1.SessionService/UpdateSession", variant) => {
            let mut r = pb::UpdateSessionRequest {
                session_id: id(),
                ..Default::default()
            };
            if variant == "title" {
                r.title = Some(format!("renamed by {user:?}"));
            } else {
                r.archived = Some(false);
            }
            unary(
                sessions.update_session(authed(r, user)).await,
                session_summary,
            )
        }
        ("agentrt.v1.SessionService/DeleteSession", _) => {
            let r = pb::DeleteSessionRequest { session_id: id() };
            unary(sessions.delete_session(authed(r, user)).await, |d| {
                format!("deleted={}", d.deleted)
            })
        }
        ("agentrt.v1.SessionService/ListTurns", _) => {
            let r = pb::ListTurnsRequest {
                session_id: id(),
                ..Default::default()
            };
            unary(sessions.list_turns(authed(r, user)).await, |l| {
                let ids: Vec<&str> = l.turns.iter().map(|t| t.turn_id.as_str()).collect();
                format!("turns {ids:?}")
            })
        }
        ("agentrt.v1.SessionService/GetTurn", _) => {
            let r = pb::GetTurnRequest {
                session_id: id(),
                turn_id: target.turn.clone(),
            };
            unary(sessions.get_turn(authed(r, user)).await, |t| {
                format!("turn {} outcome {}", t.turn_id, t.outcome)
            })
        }
        ("agentrt.v1.SessionService/UploadBlob", _) => {
            let data = format!("{user:?}'s upload");
            let answer =
                super::world::upload(sessions, &id(), "auth-up", data.as_bytes(), user).await;
            unary(answer, |r| {
                format!(
                    "committed {} blob {:?}",
                    r.committed_size,
                    r.blob.as_ref().map(|b| &b.blob_id)
                )
            })
        }
        ("agentrt.v1.SessionService/GetUploadStatus", _) => {
            let r = pb::GetUploadStatusRequest {
                session_id: id(),
                upload_id: "up-0".into(),
                sha256: target.blob.clone(),
            };
            unary(sessions.get_upload_status(authed(r, user)).await, |r| {
                format!("committed {} blob {}", r.committed_size, r.blob.is_some())
            })
        }
        ("agentrt.v1.SessionService/GetBlob", _) => {
            let r = pb::GetBlobRequest {
                session_id: id(),
                blob_id: target.blob.clone(),
                read_offset: 0,
            };
            streamed(sessions.get_blob(authed(r, user)).await, true, |c| {
                format!("{} bytes", c.data.len())
            })
            .await
        }
        ("agentrt.v1.SessionService/ListBlobs", _) => {
            let r = pb::ListBlobsRequest {
                session_id: id(),
                ..Default::default()
            };
            unary(sessions.list_blobs(authed(r, user)).await, |l| {
                format!("{} blobs", l.blobs.len())
            })
        }
        ("agentrt.v1.SessionService/GetHistory", _) => {
            let r = pb::GetHistoryRequest {
                session_id: id(),
                ..Default::default()
            };
            unary(sessions.get_history(authed(r, user)).await, |h| {
                format!("{} messages", h.messages.len())
            })
        }
        ("agentrt.v1.AgentRuntime/Chat", variant) => {
            let mut r = chat_request(&id(), &format!("{user:?} asks"), "script/quick");
            if variant == "replay" {
                r.request_id.clone_from(&target.request_id);
            }
            r.extra_tools = vec![lookup_tool()];
            streamed(runtime.chat(authed(r, user)).await, read, event_summary).await
        }
        ("agentrt.v1.AgentRuntime/Subscribe", variant) => {
            let r = pb::SubscribeRequest {
                session_id: id(),
                after_seq: 0,
                wait_for_turn: variant == "wait",
            };
            streamed(
                runtime.subscribe(authed(r, user)).await,
                read,
                event_summary,
            )
            .await
        }
        ("agentrt.v1.AgentRuntime/StopSession", _) => {
            let r = pb::StopSessionRequest {
                session_id: id(),
                clear_inbox: false,
            };
            unary(runtime.stop_session(authed(r, user)).await, |s| {
                format!("stopped={}", s.stopped)
            })
        }
        ("agentrt.v1.AgentRuntime/GetSessionStatus", _) => {
            let r = pb::GetSessionStatusRequest { session_id: id() };
            unary(runtime.get_session_status(authed(r, user)).await, |s| {
                format!("live={} turn={}", s.live, s.turn_id)
            })
        }
        ("agentrt.v1.AgentRuntime/CloseSession", variant) => {
            let r = pb::CloseSessionRequest {
                session_id: id(),
                force: variant == "force",
            };
            unary(runtime.close_session(authed(r, user)).await, |c| {
                format!("closed={}", c.closed)
            })
        }
        ("agentrt.v1.AgentRuntime/SubmitToolResult", _) => {
            let r = pb::SubmitToolResultRequest {
                session_id: id(),
                turn_id: target.turn.clone(),
                call_id: target.call_id.clone(),
                content: "42".into(),
                is_error: false,
                media: Vec::new(),
            };
            unary(runtime.submit_tool_result(authed(r, user)).await, ok)
        }
        ("agentrt.v1.AgentRuntime/SubmitToolApproval", _) => {
            let r = pb::SubmitToolApprovalRequest {
                session_id: id(),
                call_id: target.call_id.clone(),
                approved: true,
                reason: String::new(),
            };
            unary(runtime.submit_tool_approval(authed(r, user)).await, ok)
        }
        ("agentrt.v1.AgentRuntime/CompactSession", _) => {
            let r = pb::CompactSessionRequest { session_id: id() };
            unary(runtime.compact_session(authed(r, user)).await, |c| {
                format!("compacted={}", c.compacted)
            })
        }
        ("agentrt.v1.RuntimeAdmin/ResetRunners", _) => {
            // The target names a user here: the owner, another, nobody.
            let r = pb::ResetRunnersRequest {
                user_id: target.session.clone(),
            };
            unary(admin.reset_runners(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/SetDefaultModel", _) => {
            let r = pb::SetDefaultModelRequest {
                model: "script/quick".into(),
                ..Default::default()
            };
            unary(admin.set_default_model(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/InvalidateRunners", _) => {
            let r = pb::InvalidateRunnersRequest {};
            unary(admin.invalidate_runners(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/Drain", _) => {
            let r = pb::DrainRequest {
                timeout: Some(prost_types::Duration {
                    seconds: 5,
                    nanos: 0,
                }),
            };
            unary(admin.drain(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/Undrain", _) => {
            let r = pb::UndrainRequest {};
            unary(admin.undrain(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/GetRuntimeStats", _) => {
            let r = pb::GetRuntimeStatsRequest {};
            unary(admin.get_runtime_stats(authed(r, user)).await, ok)
        }
        ("agentrt.v1.RuntimeAdmin/GetUserUsage", _) => {
            let r = pb::GetUserUsageRequest {
                user_id: "alice".into(),
            };
            unary(admin.get_user_usage(authed(r, user)).await, ok)
        }
        ("agentrt.v1.AgentService/CreateAgent", _) => {
            let r = pb::CreateAgentRequest {
                agent_id: "writer".into(),
                spec: Some(pb::AgentSpec::default()),
            };
            unary(agents.create_agent(authed(r, user)).await, ok)
        }
        ("agentrt.v1.AgentService/UpdateAgent", _) => {
            let r = pb::UpdateAgentRequest {
                agent_id: "writer".into(),
                spec: Some(pb::AgentSpec::default()),
                expected_version: 0,
            };
            unary(agents.update_agent(authed(r, user)).await, ok)
        }
        ("agentrt.v1.AgentService/GetAgent", _) => {
            let r = pb::GetAgentRequest {
                agent_id: "helper".into(),
                version: 0,
            };
            unary(agents.get_agent(authed(r, user)).await, |a| {
                format!("{:?}", a.agent.as_ref().map(|a| a.version))
            })
        }
        ("agentrt.v1.AgentService/ListAgents", _) => {
            let r = pb::ListAgentsRequest::default();
            unary(agents.list_agents(authed(r, user)).await, |l| {
                format!("{} agents", l.agents.len())
            })
        }
        ("agentrt.v1.AgentService/GetMemory", _) => {
            let r = pb::GetMemoryRequest {
                agent_id: "helper".into(),
                user_id: String::new(),
            };
            unary(agents.get_memory(authed(r, user)).await, |m| {
                format!("{} blocks", m.blocks.len())
            })
        }
        ("agentrt.v1.AgentService/UpdateMemory", _) => {
            let r = pb::UpdateMemoryRequest {
                agent_id: "helper".into(),
                edits: vec![pb::MemoryEdit {
                    block: "note".into(),
                    change: Some(pb::memory_edit::Change::Set("x".into())),
                }],
                ..Default::default()
            };
            unary(agents.update_memory(authed(r, user)).await, |m| {
                format!("{} blocks", m.blocks.len())
            })
        }
        ("agentrt.v1.RuntimeAdmin/DeleteSessions", _) => {
            // A user nobody else's rows use: the admin's call succeeds
            // without taking the fixtures' sessions.
            let r = pb::DeleteSessionsRequest {
                owner: "retired-user".into(),
                agent_id: String::new(),
            };
            unary(admin.delete_sessions(authed(r, user)).await, |a| {
                format!("deleted {} remaining {}", a.deleted, a.remaining)
            })
        }
        ("agentrt.v1.RuntimeAdmin/ListReplicas", _) => {
            let r = pb::ListReplicasRequest::default();
            unary(admin.list_replicas(authed(r, user)).await, |a| {
                format!("{} replicas", a.replicas.len())
            })
        }
        ("lf.a2a.v1.A2AService/SendMessage", variant) => {
            let mut r = a2a_message(target, variant == "task", user);
            // Alice's replay of her live turn would wait for its end.
            r.configuration = Some(a2a::SendMessageConfiguration {
                return_immediately: true,
                ..Default::default()
            });
            unary(a2a.send_message(authed(r, user)).await, |s| {
                match &s.payload {
                    Some(a2a::send_message_response::Payload::Task(t)) => task_summary(t),
                    other => format!("{other:?}"),
                }
            })
        }
        ("lf.a2a.v1.A2AService/SendStreamingMessage", variant) => {
            let r = a2a_message(target, variant == "task", user);
            let answer = a2a.send_streaming_message(authed(r, user)).await;
            streamed(answer, read, stream_summary).await
        }
        ("lf.a2a.v1.A2AService/GetTask", _) => {
            let r = a2a::GetTaskRequest {
                id: task,
                ..Default::default()
            };
            unary(a2a.get_task(authed(r, user)).await, task_summary)
        }
        ("lf.a2a.v1.A2AService/ListTasks", _) => {
            let r = a2a::ListTasksRequest {
                context_id: id(),
                ..Default::default()
            };
            unary(a2a.list_tasks(authed(r, user)).await, |l| {
                format!("{} tasks", l.tasks.len())
            })
        }
        ("lf.a2a.v1.A2AService/CancelTask", _) => {
            let r = a2a::CancelTaskRequest {
                id: task,
                ..Default::default()
            };
            unary(a2a.cancel_task(authed(r, user)).await, task_summary)
        }
        ("lf.a2a.v1.A2AService/SubscribeToTask", _) => {
            let r = a2a::SubscribeToTaskRequest {
                id: task,
                ..Default::default()
            };
            let answer = a2a.subscribe_to_task(authed(r, user)).await;
            streamed(answer, read, stream_summary).await
        }
        ("lf.a2a.v1.A2AService/CreateTaskPushNotificationConfig", _) => {
            let r = a2a::TaskPushNotificationConfig {
                task_id: task,
                url: "https://example.invalid/hook".into(),
                ..Default::default()
            };
            unary(
                a2a.create_task_push_notification_config(authed(r, user))
                    .await,
                ok,
            )
        }
        ("lf.a2a.v1.A2AService/GetTaskPushNotificationConfig", _) => {
            let r = a2a::GetTaskPushNotificationConfigRequest {
                task_id: task,
                id: "cfg-1".into(),
                ..Default::default()
            };
            unary(
                a2a.get_task_push_notification_config(authed(r, user)).await,
                ok,
            )
        }
        ("lf.a2a.v1.A2AService/ListTaskPushNotificationConfigs", _) => {
            let r = a2a::ListTaskPushNotificationConfigsRequest {
                task_id: task,
                ..Default::default()
            };
            unary(
                a2a.list_task_push_notification_configs(authed(r, user))
                    .await,
                ok,
            )
        }
        ("lf.a2a.v1.A2AService/GetExtendedAgentCard", _) => {
            let r = a2a::GetExtendedAgentCardRequest::default();
            unary(a2a.get_extended_agent_card(authed(r, user)).await, ok)
        }
        ("lf.a2a.v1.A2AService/QuerySkill", _) => {
            let r = a2a::SkillQueryRequest {
                skill_id: task,
                ..Default::default()
            };
            unary(a2a.query_skill(authed(r, user)).await, ok)
        }
        ("lf.a2a.v1.A2AService/DeleteTaskPushNotificationConfig", _) => {
            let r = a2a::DeleteTaskPushNotificationConfigRequest {
                task_id: task,
                id: "cfg-1".into(),
                ..Default::default()
            };
            unary(
                a2a.delete_task_push_notification_config(authed(r, user))
                    .await,
                ok,
            )
        }
        (method, variant) => panic!("no call for {method} ({variant:?}): add it to the table"),
    }
}
