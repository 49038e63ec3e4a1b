//! The A2A binding (`lf.a2a.v1.A2AService`) in process, through the
//! generated Rust client: the mapping of a turn onto a task, the A2A
//! errors (status code + `google.rpc.ErrorInfo` in the `a2a-protocol.org`
//! domain), the version header, auth, reflection, and a task that is still
//! there after a restart (it lives in the store, not beside it).

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::{
    FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk, usage_chunk,
};
use agentrt_testkit::server::InProcessServer;
use futures::StreamExt as _;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use tonic_types::StatusExt as _;

const KEY: &str = "a2a-test-key";
const OTHER_KEY: &str = "a2a-other-key";

fn config(fake: &FakeOpenAi, dir: &std::path::Path) -> Config {
    let mut config = Config::parse_toml(&format!(
        "default_model = \"mock/m\"\n[[providers]]\nname = \"mock\"\nkind = \"openai\"\n\
         base_url = \"{}\"\nmax_retries = 0\n\
         [[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n\
         [[auth.api_keys]]\nkey = \"{OTHER_KEY}\"\nuser = \"bob\"\n",
        fake.base_url()
    ))
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.to_path_buf();
    config
}

fn answer(parts: &[&str]) -> FakeReply {
    let mut chunks: Vec<Vec<u8>> = parts.iter().map(|p| text_chunk(p)).collect();
    chunks.push(finish_chunk("stop"));
    chunks.push(usage_chunk(10, 3));
    FakeReply::sse(chunks)
}

/// An answer that starts and then never ends (until the client goes).
fn hang() -> FakeReply {
    FakeReply::Sse {
        chunks: vec![text_chunk("working")],
        done: false,
        then_hang: true,
    }
}

async fn client(server: &InProcessServer) -> A2aServiceClient<Channel> {
    A2aServiceClient::connect(server.url()).await.unwrap()
}

fn authed<T>(message: T, key: &str) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {key}").parse().unwrap());
    req.metadata_mut()
        .insert("a2a-version", "1.0".parse().unwrap());
    req
}

fn send(text: &str, context_id: &str) -> a2a::SendMessageRequest {
    a2a::SendMessageRequest {
        message: Some(a2a::Message {
            message_id: uuid_like(text),
            context_id: context_id.to_owned(),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text(text.to_owned())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A message id unique per call.
fn uuid_like(text: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("m-{}-{}", N.fetch_add(1, Ordering::Relaxed), text.len())
}

/// The A2A reason and domain of a status's ErrorInfo.
fn reason(status: &Status) -> (String, String) {
    let info = status
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"));
    (info.reason, info.domain)
}

fn assert_a2a(status: &Status, code: Code, expected: &str) {
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        reason(status),
        (expected.to_owned(), "a2a-protocol.org".to_owned()),
        "{status:?}"
    );
}

fn state(task: &a2a::Task) -> a2a::TaskState {
    a2a::TaskState::try_from(task.status.as_ref().unwrap().state).unwrap()
}

#[tokio::test]
async fn a_streamed_turn_is_a_task_from_submitted_to_completed() {
    let fake = FakeOpenAi::start(vec![answer(&["echo", ": ", "hi"])]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let mut c = client(&server).await;
    let mut stream = c
        .send_streaming_message(authed(send("hi", ""), KEY))
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().payload.unwrap());
    }
    use a2a::stream_response::Payload;
    let Payload::Task(task) = &events[0] else {
        panic!("the Task first, got {:?}", events[0])
    };
    assert_eq!(state(task), a2a::TaskState::Submitted);
    assert_eq!(
        task.id,
        format!("{}/{}", task.context_id, task.id.split('/').nth(1).unwrap())
    );
    let chunks: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Payload::ArtifactUpdate(a) => Some((a.append, a.last_chunk)),
            _ => None,
        })
        .collect();
    // One chunk per delta, sent at once, then an empty closing chunk.
    assert_eq!(
        chunks,
        [(false, false), (true, false), (true, false), (true, true)]
    );
    let Some(Payload::StatusUpdate(last)) = events.last() else {
        panic!("a terminal status last")
    };
    assert_eq!(
        last.status.as_ref().unwrap().state,
        a2a::TaskState::Completed as i32
    );

    // GetTask reads the same task from the store.
    let stored = c
        .get_task(authed(
            a2a::GetTaskRequest {
                id: task.id.clone(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&stored), a2a::TaskState::Completed);
    assert_eq!(stored.context_id, task.context_id);
    assert_eq!(
        stored.artifacts[0].parts[0].content,
        Some(a2a::part::Content::Text("echo: hi".into()))
    );
    assert_eq!(stored.history.len(), 2);
    // history_length keeps the most recent messages.
    let short = c
        .get_task(authed(
            a2a::GetTaskRequest {
                id: task.id.clone(),
                history_length: Some(1),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(short.history.len(), 1);
    assert_eq!(short.history[0].role, a2a::Role::Agent as i32);

    // The context's session: its user message came through A2A, sent by
    // the key's user.
    let agentrt = agentrt_client::Client::builder(server.url())
        .token(KEY)
        .connect()
        .await
        .unwrap();
    let history = agentrt.history(&task.context_id).await.unwrap();
    let actor = history[0].input_actor.clone().expect("an input actor");
    assert_eq!(
        (actor.kind(), actor.id.as_str(), actor.admin),
        (agentrt_proto::v1::InputActorKind::A2a, "alice", false)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_finished_task_survives_a_restart() {
    let fake = FakeOpenAi::start(vec![answer(&["kept"])]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let sent = client(&server)
        .await
        .send_message(authed(send("keep me", ""), KEY))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("a task")
    };
    assert_eq!(state(&task), a2a::TaskState::Completed);
    server.stop().await;

    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let again = client(&server)
        .await
        .get_task(authed(
            a2a::GetTaskRequest {
                id: task.id.clone(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, task);
    server.stop().await;
}

#[tokio::test]
async fn the_a2a_errors_carry_the_reasons_the_sdks_decode() {
    let fake = FakeOpenAi::start(vec![hang(), answer(&["x"])]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let mut c = client(&server).await;

    let get = |id: &str| a2a::GetTaskRequest {
        id: id.to_owned(),
        ..Default::default()
    };
    for id in ["", "nope", "no-such-context/0190", "a/b/c"] {
        let err = c.get_task(authed(get(id), KEY)).await.unwrap_err();
        assert_a2a(&err, Code::NotFound, "TASK_NOT_FOUND");
    }

    // A working task: a second message to its context waits in the inbox
    // (SUBMITTED), and a second user cannot see either.
    let mut live = c
        .send_streaming_message(authed(send("hang on", ""), KEY))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a::stream_response::Payload::Task(task)) =
        live.next().await.unwrap().unwrap().payload
    else {
        panic!("the Task first")
    };
    let mut waiting = send("me too", &task.context_id);
    waiting.configuration = Some(a2a::SendMessageConfiguration {
        return_immediately: true,
        ..Default::default()
    });
    let sent = c
        .send_message(authed(waiting, KEY))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a::send_message_response::Payload::Task(queued)) = sent.payload else {
        panic!("a task")
    };
    assert_eq!(state(&queued), a2a::TaskState::Submitted);
    assert_ne!(queued.id, task.id);
    let got = c
        .get_task(authed(get(&queued.id), KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&got), a2a::TaskState::Submitted);
    let err = c
        .get_task(authed(get(&queued.id), OTHER_KEY))
        .await
        .unwrap_err();
    assert_a2a(&err, Code::NotFound, "TASK_NOT_FOUND");
    // Cancelled before it ran: taken out of the inbox.
    let canceled = c
        .cancel_task(authed(
            a2a::CancelTaskRequest {
                id: queued.id.clone(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&canceled), a2a::TaskState::Canceled);
    let err = c.get_task(authed(get(&queued.id), KEY)).await.unwrap_err();
    assert_a2a(&err, Code::NotFound, "TASK_NOT_FOUND");
    let err = c
        .get_task(authed(get(&task.id), OTHER_KEY))
        .await
        .unwrap_err();
    assert_a2a(&err, Code::NotFound, "TASK_NOT_FOUND");

    // Cancel it; cancelling again is "not cancelable"; subscribing to it,
    // or sending a message to it, is an unsupported operation.
    let cancel = a2a::CancelTaskRequest {
        id: task.id.clone(),
        ..Default::default()
    };
    let canceled = c
        .cancel_task(authed(cancel.clone(), KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state(&canceled), a2a::TaskState::Canceled);
    let err = c.cancel_task(authed(cancel, KEY)).await.unwrap_err();
    assert_a2a(&err, Code::FailedPrecondition, "TASK_NOT_CANCELABLE");
    let err = c
        .subscribe_to_task(authed(
            a2a::SubscribeToTaskRequest {
                id: task.id.clone(),
                ..Default::default()
            },
            KEY,
        ))
        .await
        .unwrap_err();
    assert_a2a(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    let mut to_task = send("more", "");
    to_task.message.as_mut().unwrap().task_id = task.id.clone();
    let err = c.send_message(authed(to_task, KEY)).await.unwrap_err();
    assert_a2a(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");

    // Parts other than text; push notifications; ListTasks without a context; QuerySkill.
    let mut data = send("", "");
    data.message.as_mut().unwrap().parts = vec![a2a::Part {
        content: Some(a2a::part::Content::Url("https://example.invalid/f".into())),
        ..Default::default()
    }];
    let err = c.send_message(authed(data, KEY)).await.unwrap_err();
    assert_a2a(&err, Code::InvalidArgument, "CONTENT_TYPE_NOT_SUPPORTED");
    let mut empty = send("", "");
    empty.message.as_mut().unwrap().parts.clear();
    let err = c.send_message(authed(empty, KEY)).await.unwrap_err();
    assert_a2a(&err, Code::InvalidArgument, "INVALID_PARAMS");
    let err = c
        .get_task_push_notification_config(authed(Default::default(), KEY))
        .await
        .unwrap_err();
    assert_a2a(
        &err,
        Code::FailedPrecondition,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    );
    let mut pushed = send("push me", "");
    pushed.configuration = Some(a2a::SendMessageConfiguration {
        task_push_notification_config: Some(Default::default()),
        ..Default::default()
    });
    let err = c.send_message(authed(pushed, KEY)).await.unwrap_err();
    assert_a2a(
        &err,
        Code::FailedPrecondition,
        "PUSH_NOTIFICATION_NOT_SUPPORTED",
    );
    // ListTasks lists one context's tasks: without one it says so.
    let err = c
        .list_tasks(authed(Default::default(), KEY))
        .await
        .unwrap_err();
    assert_a2a(&err, Code::InvalidArgument, "INVALID_PARAMS");
    assert!(err.message().contains("context_id"), "{err:?}");
    let err = c
        .query_skill(authed(Default::default(), KEY))
        .await
        .unwrap_err();
    assert_a2a(&err, Code::FailedPrecondition, "UNSUPPORTED_OPERATION");
    server.stop().await;
}

fn json_value(v: serde_json::Value) -> prost_types::Value {
    agentrt_server::a2a::caller_tools::from_json(&v)
}

#[tokio::test]
async fn a_caller_tool_call_is_input_required_and_its_result_resumes_the_task() {
    let call = serde_json::json!({
        "index": 0, "id": "call_1", "type": "function",
        "function": {"name": "lookup", "arguments": "{\"q\":\"x\"}"}
    });
    let fake = FakeOpenAi::start(vec![
        FakeReply::sse(vec![
            text_chunk("let me look"),
            sse_data(
                &serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}),
            ),
            finish_chunk("tool_calls"),
            usage_chunk(10, 3),
        ]),
        answer(&["found ", "42"]),
    ])
    .await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let mut c = client(&server).await;
    let mut request = send("look it up", "");
    let prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(metadata)),
    } = json_value(serde_json::json!({"agentrt_extra_tools": [
        {"name": "lookup", "description": "looks up", "parameters": {"type": "object"}}
    ]}))
    else {
        panic!("a struct")
    };
    request.metadata = Some(metadata);
    let sent = c
        .send_message(authed(request, KEY))
        .await
        .unwrap()
        .into_inner();
    let Some(a2a::send_message_response::Payload::Task(task)) = sent.payload else {
        panic!("a task")
    };
    assert_eq!(state(&task), a2a::TaskState::InputRequired);
    let part = &task
        .status
        .as_ref()
        .unwrap()
        .message
        .as_ref()
        .unwrap()
        .parts[0];
    let Some(a2a::part::Content::Data(data)) = &part.content else {
        panic!("a data part, got {part:?}")
    };
    assert_eq!(
        agentrt_server::a2a::caller_tools::to_json(data),
        serde_json::json!({"tool_call": {"call_id": "call_1", "name": "lookup", "arguments": {"q": "x"}}})
    );

    // The result, as a data part in a message to the task, streamed.
    let mut result = send("", "");
    let m = result.message.as_mut().unwrap();
    m.task_id = task.id.clone();
    m.parts = vec![a2a::Part {
        content: Some(a2a::part::Content::Data(json_value(
            serde_json::json!({"call_id": "call_1", "content": "42"}),
        ))),
        ..Default::default()
    }];
    let mut stream = c
        .send_streaming_message(authed(result, KEY))
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        events.push(item.unwrap().payload.unwrap());
    }
    use a2a::stream_response::Payload;
    assert!(matches!(&events[0], Payload::Task(t) if t.id == task.id));
    let text: String = events
        .iter()
        .filter_map(|e| match e {
            Payload::ArtifactUpdate(a) => {
                assert!(a.append, "the answer goes on from the first stream");
                match &a.artifact.as_ref().unwrap().parts[0].content {
                    Some(a2a::part::Content::Text(t)) => Some(t.clone()),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    assert_eq!(text, "found 42");
    let Some(Payload::StatusUpdate(last)) = events.last() else {
        panic!("a terminal status")
    };
    let status = last.status.as_ref().unwrap();
    assert_eq!(status.state, a2a::TaskState::Completed as i32);
    // The model got the result as the tool's answer.
    let messages = fake.requests()[1].body["messages"].clone();
    let tool = messages
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("no tool message in {messages}"));
    assert_eq!(tool["content"], "42");
    server.stop().await;
}

#[tokio::test]
async fn the_version_header_and_the_key_are_checked() {
    let fake = FakeOpenAi::start(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let mut c = client(&server).await;
    let card_req = || a2a::GetExtendedAgentCardRequest::default();

    for (version, ok) in [
        (None, true),
        (Some("1.0"), true),
        (Some("1.1"), true),
        (Some("0.3"), false),
        (Some("2.0"), false),
    ] {
        let mut req = authed(card_req(), KEY);
        req.metadata_mut().remove("a2a-version");
        if let Some(v) = version {
            req.metadata_mut().insert("a2a-version", v.parse().unwrap());
        }
        match c.get_extended_agent_card(req).await {
            Ok(_) => assert!(ok, "{version:?} was accepted"),
            Err(err) => {
                assert!(!ok, "{version:?}: {err:?}");
                assert_a2a(&err, Code::FailedPrecondition, "VERSION_NOT_SUPPORTED");
            }
        }
    }
    let err = c
        .get_extended_agent_card(Request::new(card_req()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = c
        .send_message(authed(send("hi", ""), "wrong"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);

    let card = c
        .get_extended_agent_card(authed(card_req(), KEY))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(card.supported_interfaces[0].url, server.addr().to_string());
    assert_eq!(card.supported_interfaces[0].protocol_binding, "GRPC");
    let caps = card.capabilities.unwrap();
    assert_eq!(
        (caps.streaming, caps.push_notifications),
        (Some(true), Some(false))
    );
    assert!(card.security_schemes.contains_key("bearer"));
    assert!(!card.security_schemes.contains_key("mtls"));
    server.stop().await;
}

#[tokio::test]
async fn the_card_advertises_the_configured_public_url_instead_of_the_bound_address() {
    let fake = FakeOpenAi::start(vec![]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(&fake, dir.path());
    config.a2a.public_url = Some("agent.example.com:443".to_owned());
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    let card = client(&server)
        .await
        .get_extended_agent_card(authed(a2a::GetExtendedAgentCardRequest::default(), KEY))
        .await
        .unwrap()
        .into_inner();
    let urls: Vec<&str> = card
        .supported_interfaces
        .iter()
        .map(|i| i.url.as_str())
        .collect();
    assert_eq!(urls, ["agent.example.com:443"]);
    assert_eq!(card.supported_interfaces[0].protocol_binding, "GRPC");
    server.stop().await;
}

#[tokio::test]
async fn reflection_lists_the_a2a_service_with_its_options() {
    use prost::Message as _;
    let fds = prost_types::FileDescriptorSet::decode(agentrt_proto::FILE_DESCRIPTOR_SET).unwrap();
    let file = fds
        .file
        .iter()
        .find(|f| f.name() == "lf/a2a/v1/a2a.proto")
        .expect("the A2A file is in the public descriptor set");
    assert_eq!(file.service[0].name(), "A2AService");
    // The extension options (google.api.field_behavior = 1052) are kept in
    // the encoded set, unlike in a prost_types round trip.
    let raw = agentrt_proto::FILE_DESCRIPTOR_SET;
    let needle = [0xe2u8, 0x41, 0x01, 0x02]; // field 1052, length 1, REQUIRED
    assert!(raw.windows(needle.len()).any(|w| w == needle));
}

#[tokio::test]
async fn a_refused_first_message_leaves_no_context_behind() {
    let fake = FakeOpenAi::start(vec![answer(&["x"])]).await;
    let dir = tempfile::tempdir().unwrap();
    let server = InProcessServer::start(ServerBuilder::new(config(&fake, dir.path()))).await;
    let mut c = client(&server).await;
    // A tool name the runtime refuses at admission (after the handler has
    // made the new context's session).
    let mut request = send("look it up", "");
    let prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(metadata)),
    } = json_value(serde_json::json!({"agentrt_extra_tools": [
        {"name": "not a valid name!", "parameters": {"type": "object"}}
    ]}))
    else {
        panic!("a struct")
    };
    request.metadata = Some(metadata);
    let err = c.send_message(authed(request, KEY)).await.unwrap_err();
    assert_a2a(&err, Code::InvalidArgument, "INVALID_PARAMS");

    let mut sessions =
        agentrt_proto::v1::session_service_client::SessionServiceClient::connect(server.url())
            .await
            .unwrap();
    let listed = sessions
        .list_sessions(authed(
            agentrt_proto::v1::ListSessionsRequest::default(),
            KEY,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.sessions.is_empty(),
        "the refused message left sessions behind: {:?}",
        listed.sessions
    );
    assert!(fake.requests().is_empty(), "nothing reached the model");
}
