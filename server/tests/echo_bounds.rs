//! Every echo bounded, measured on the wire: errors about huge caller
//! strings (ids, names, headers, field values) on both APIs keep
//! `grpc-message` under 1 KiB and the whole trailer block small — read
//! with a raw HTTP/2 client, byte for byte — and a 4 MiB A2A task id is
//! `NOT_FOUND` to a standard client, not `RESOURCE_EXHAUSTED`.

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::v1 as pb;
use agentrt_proto::v1::session_service_client::SessionServiceClient;
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, text_chunk, usage_chunk};
use agentrt_testkit::server::InProcessServer;
use bytes::Bytes;
use futures::StreamExt as _;
use prost::Message as _;
use tonic::{Code, Request};
use tonic_types::StatusExt as _;

const KEY: &str = "echo-test-key";
/// The default `transport.max_request_bytes`.
const MAX_REQUEST: usize = 4 << 20;

async fn start() -> (InProcessServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse_toml(&format!(
        "default_model = \"builtin/echo\"\n[[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n"
    ))
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().to_path_buf();
    assert_eq!(config.transport.max_request_bytes, MAX_REQUEST);
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    (server, dir)
}

/// What a raw HTTP/2 client got back for one gRPC call.
struct Answer {
    status: String,
    /// The `grpc-message` as sent (percent-encoded).
    message: String,
    /// Bytes of the header block that carried `grpc-status` (names and
    /// values: the trailers, or the headers of a trailers-only response).
    block: usize,
}

/// Sends `message` to `path` as one gRPC frame over a fresh HTTP/2
/// connection (waiting for flow-control credit as it goes) and reads the
/// status wherever it comes.
async fn raw_call(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    message: &[u8],
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, connection) = h2::client::Builder::new()
        .max_header_list_size(64 << 20)
        .handshake::<_, Bytes>(tcp)
        .await
        .unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut req = http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    send = send.ready().await.unwrap();
    let (response, mut stream) = send.send_request(req.body(()).unwrap(), false).unwrap();
    let mut frame = Vec::with_capacity(message.len() + 5);
    frame.push(0);
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message);
    let mut body = Bytes::from(frame);
    // The server may answer (and reset the stream) before it has read it
    // all: stop sending then.
    while !body.is_empty() {
        stream.reserve_capacity(body.len());
        let Some(Ok(n)) = futures::future::poll_fn(|cx| stream.poll_capacity(cx)).await else {
            break;
        };
        let chunk = body.split_to(n.min(body.len()));
        if stream.send_data(chunk, body.is_empty()).is_err() {
            break;
        }
    }
    let response = response.await.expect("a response");
    let read = |h: &http::HeaderMap| {
        let status = h.get("grpc-status")?.to_str().unwrap().to_owned();
        let message = h
            .get("grpc-message")
            .map(|m| m.to_str().unwrap().to_owned())
            .unwrap_or_default();
        let block = h.iter().map(|(k, v)| k.as_str().len() + v.len()).sum();
        Some(Answer {
            status,
            message,
            block,
        })
    };
    if let Some(answer) = read(response.headers()) {
        return answer;
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        let data = data.unwrap();
        let _ = body.flow_control().release_capacity(data.len());
    }
    let trailers = body.trailers().await.unwrap().expect("trailers");
    read(&trailers).expect("grpc-status in the trailers")
}

fn auth() -> (&'static str, String) {
    ("authorization", format!("Bearer {KEY}"))
}

/// A task id that makes a `GetTaskRequest` of exactly `size` bytes.
fn a_task_id_filling(size: usize) -> String {
    // tag + varint length + the id.
    let varint = |n: usize| if n < 1 << 21 { 3 } else { 4 };
    let mut len = size - 1 - 4;
    while 1 + varint(len) + len > size {
        len -= 1;
    }
    let id = format!("s/{}", "t".repeat(len - 2));
    assert_eq!(
        a2a::GetTaskRequest {
            id: id.clone(),
            ..Default::default()
        }
        .encoded_len(),
        size
    );
    id
}

#[tokio::test]
async fn a_4_mib_task_id_is_not_found_with_trailers_under_4_kib() {
    let (server, _dir) = start().await;
    // The largest request the default limit takes (exactly 4 MiB), which
    // is how a 4 MiB id gets this far.
    let id = a_task_id_filling(MAX_REQUEST);
    let (name, value) = auth();
    let headers = [(name, value.as_str())];
    let get = a2a::GetTaskRequest {
        id: id.clone(),
        ..Default::default()
    }
    .encode_to_vec();
    let answer = raw_call(
        server.addr(),
        "/lf.a2a.v1.A2AService/GetTask",
        &headers,
        &get,
    )
    .await;
    assert_eq!(answer.status, "5", "NOT_FOUND: {}", answer.message);
    assert!(answer.block < 1024, "trailers of {} bytes", answer.block);
    let cancel = a2a::CancelTaskRequest {
        id: id.clone(),
        ..Default::default()
    }
    .encode_to_vec();
    let answer = raw_call(
        server.addr(),
        "/lf.a2a.v1.A2AService/CancelTask",
        &headers,
        &cancel,
    )
    .await;
    assert_eq!(answer.status, "5", "{}", answer.message);
    assert!(answer.block < 1024, "trailers of {} bytes", answer.block);

    // A standard client (tonic's defaults: 4 MiB to decode) reads the
    // error as TaskNotFound.
    let mut client = A2aServiceClient::connect(server.url()).await.unwrap();
    let mut req = Request::new(a2a::GetTaskRequest {
        id: id.clone(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("authorization", value.parse().unwrap());
    let status = client.get_task(req).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "TASK_NOT_FOUND");
    assert!(status.message().len() < 512, "{}", status.message().len());

    // One byte more than the limit takes is refused by the limit, just as
    // briefly.
    let over = a2a::GetTaskRequest {
        id: format!("{id}t"),
        ..Default::default()
    }
    .encode_to_vec();
    let answer = raw_call(
        server.addr(),
        "/lf.a2a.v1.A2AService/GetTask",
        &headers,
        &over,
    )
    .await;
    assert_eq!(answer.status, "3", "{}", answer.message);
    assert!(answer.block < 1024, "trailers of {} bytes", answer.block);
    server.stop().await;
}

fn text(t: String) -> pb::ContentBlock {
    pb::ContentBlock {
        block: Some(pb::content_block::Block::Text(pb::TextBlock { text: t })),
    }
}

fn a2a_message(context_id: &str, task_id: &str, message_id: &str) -> a2a::SendMessageRequest {
    a2a::SendMessageRequest {
        message: Some(a2a::Message {
            message_id: message_id.to_owned(),
            context_id: context_id.to_owned(),
            task_id: task_id.to_owned(),
            role: a2a::Role::User as i32,
            parts: vec![a2a::Part {
                content: Some(a2a::part::Content::Text("hi".into())),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// One error case: label, path, extra headers, request body, the expected
/// `grpc-status`.
type Case<'a> = (&'a str, String, Vec<(&'a str, String)>, Vec<u8>, &'a str);

#[tokio::test]
async fn huge_caller_strings_in_any_error_keep_grpc_message_under_1_kib() {
    let (server, _dir) = start().await;
    let mib = |s: &str| s.repeat((1 << 20) / s.len());
    let ascii = mib("x");
    // Each costs three bytes percent-encoded (and two as UTF-8).
    let wide = mib("é");
    let odd = mib("% \"{}\r\n");
    let header = "9".repeat(8 << 10);
    let image = |mime: &str| pb::ContentBlock {
        block: Some(pb::content_block::Block::Image(pb::ImageBlock {
            data: vec![1, 2, 3],
            mime_type: mime.to_owned(),
            ..pb::ImageBlock::default()
        })),
    };
    let (auth_name, auth_value) = auth();
    let bad_key = format!("Bearer {}", "k".repeat(8 << 10));
    let a2a_path = |m: &str| format!("/lf.a2a.v1.A2AService/{m}");
    let sessions = |m: &str| format!("/agentrt.v1.SessionService/{m}");
    let runtime = |m: &str| format!("/agentrt.v1.AgentRuntime/{m}");
    let mut cases: Vec<Case<'_>> = Vec::new();
    for (label, s) in [("ascii", &ascii), ("wide", &wide), ("odd", &odd)] {
        let id = format!("s/{s}");
        cases.extend([
            (
                label,
                a2a_path("GetTask"),
                vec![],
                a2a::GetTaskRequest {
                    id: id.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "5",
            ),
            (
                label,
                a2a_path("SubscribeToTask"),
                vec![],
                a2a::SubscribeToTaskRequest {
                    id: id.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "5",
            ),
            (
                label,
                a2a_path("SendMessage"),
                vec![],
                a2a_message("", &id, "m-1").encode_to_vec(),
                "5",
            ),
            (
                label,
                a2a_path("SendMessage"),
                vec![],
                a2a_message("", "", s).encode_to_vec(),
                "3",
            ),
            (
                label,
                a2a_path("SendStreamingMessage"),
                vec![],
                a2a_message(s, "", "m-2").encode_to_vec(),
                "3",
            ),
            (
                label,
                sessions("GetSession"),
                vec![],
                pb::GetSessionRequest {
                    session_id: s.clone(),
                }
                .encode_to_vec(),
                "3",
            ),
            (
                label,
                sessions("GetHistory"),
                vec![],
                pb::GetHistoryRequest {
                    session_id: s.clone(),
                    page_token: s.clone(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "3",
            ),
            (
                label,
                sessions("CreateSession"),
                vec![],
                pb::CreateSessionRequest {
                    session_id: s[..1000.min(s.len())].to_owned(),
                    agent_id: s.clone(),
                    model: s[..2000].to_owned(),
                    project_id: s.clone(),
                    metadata: [(s[..3000].to_owned(), s[..3000].to_owned())].into(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "3",
            ),
            (
                label,
                runtime("Chat"),
                vec![],
                pb::ChatRequest {
                    session_id: "nope".into(),
                    content: (0..100).map(|_| image(&s[..4000])).collect(),
                    model: s[..4000].to_owned(),
                    request_id: s[..4000].to_owned(),
                    excluded_tools: vec![s[..4000].to_owned(); 100],
                    ..Default::default()
                }
                .encode_to_vec(),
                "3",
            ),
            (
                label,
                runtime("SubmitToolResult"),
                vec![],
                pb::SubmitToolResultRequest {
                    session_id: "nope".into(),
                    turn_id: s.clone(),
                    call_id: s.clone(),
                    content: s.clone(),
                    is_error: false,
                    media: Vec::new(),
                }
                .encode_to_vec(),
                "3",
            ),
            (
                label,
                runtime("Chat"),
                vec![],
                pb::ChatRequest {
                    session_id: "no-such-session".into(),
                    content: vec![text("hi".into())],
                    model: s[..200].to_owned(),
                    ..Default::default()
                }
                .encode_to_vec(),
                "",
            ),
        ]);
    }
    cases.extend([
        (
            "version",
            a2a_path("GetExtendedAgentCard"),
            vec![("a2a-version", header.clone())],
            a2a::GetExtendedAgentCardRequest::default().encode_to_vec(),
            "9",
        ),
        (
            "key",
            sessions("GetSession"),
            vec![("authorization", bad_key)],
            pb::GetSessionRequest {
                session_id: "s".into(),
            }
            .encode_to_vec(),
            "16",
        ),
    ]);
    let mut largest = (0, 0);
    for (label, path, extra, body, code) in &cases {
        let mut headers: Vec<(&str, &str)> = vec![(auth_name, auth_value.as_str())];
        for (k, v) in extra {
            headers.retain(|(name, _)| name != k);
            headers.push((*k, v.as_str()));
        }
        let answer = raw_call(server.addr(), path, &headers, body).await;
        let what = format!("{path} ({label}): {} {}", answer.status, answer.message);
        if !code.is_empty() {
            assert_eq!(answer.status.as_str(), *code, "{what}");
        }
        assert!(
            answer.message.len() < 1024,
            "{what}: {}",
            answer.message.len()
        );
        assert!(answer.block < 4096, "{what}: trailers of {}", answer.block);
        if *code != "3" {
            // Not a BadRequest: one echo at most, the whole block < 1 KiB.
            assert!(answer.block < 1024, "{what}: trailers of {}", answer.block);
        }
        largest.0 = largest.0.max(answer.message.len());
        largest.1 = largest.1.max(answer.block);
    }
    eprintln!(
        "{} error cases: largest grpc-message {} bytes, largest trailer block {} bytes",
        cases.len(),
        largest.0,
        largest.1
    );
    server.stop().await;
}

/// A server whose default model is the fake upstream's.
async fn start_with(fake: &FakeOpenAi) -> (InProcessServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::parse_toml(&format!(
        "default_model = \"mock/m\"\n[[providers]]\nname = \"mock\"\nkind = \"openai\"\n\
         base_url = \"{}\"\nmax_retries = 0\nmax_output_bytes = 4194304\n\
         [[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n",
        fake.base_url()
    ))
    .unwrap();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.data_dir = dir.path().to_path_buf();
    let server = InProcessServer::start(ServerBuilder::new(config)).await;
    (server, dir)
}

fn authed<T>(message: T) -> Request<T> {
    let mut req = Request::new(message);
    req.metadata_mut()
        .insert("authorization", auth().1.parse().unwrap());
    req
}

fn text_of(parts: &[a2a::Part]) -> &str {
    match parts.first().and_then(|p| p.content.as_ref()) {
        Some(a2a::part::Content::Text(text)) => text,
        other => panic!("a text part, got {other:?}"),
    }
}

const MARKER: &str = "[truncated by agentrt:";

#[tokio::test]
async fn a_2_mib_answer_is_readable_through_get_task_by_a_default_4_mib_client() {
    // 2 MiB of answer in 32 deltas, each distinct so a cut shows.
    let deltas: Vec<String> = (0..32)
        .map(|i| format!("{i:02}{}", "abcdefgh".repeat((64 << 10) / 8 - 1)))
        .map(|d| format!("{d}{}", "z".repeat((64 << 10) - d.len())))
        .collect();
    let whole: String = deltas.concat();
    assert_eq!(whole.len(), 2 << 20);
    let mut chunks: Vec<Vec<u8>> = deltas.iter().map(|d| text_chunk(d)).collect();
    chunks.push(finish_chunk("stop"));
    chunks.push(usage_chunk(10, 3));
    let fake = FakeOpenAi::start(vec![FakeReply::sse(chunks)]).await;
    let (server, _dir) = start_with(&fake).await;
    // tonic's defaults: 4 MiB to decode.
    let mut client = A2aServiceClient::connect(server.url()).await.unwrap();
    let mut stream = client
        .send_streaming_message(authed(a2a_message("", "", "big-1")))
        .await
        .unwrap()
        .into_inner();
    let mut streamed = String::new();
    let mut last = None;
    let mut task_id = String::new();
    while let Some(item) = stream.next().await {
        let item = item.unwrap();
        // The answer goes out once, as its deltas.
        assert!(item.encoded_len() < 128 << 10, "{}", item.encoded_len());
        match item.payload.unwrap() {
            a2a::stream_response::Payload::Task(t) => task_id = t.id,
            a2a::stream_response::Payload::ArtifactUpdate(a) => {
                streamed.push_str(text_of(&a.artifact.unwrap().parts));
            }
            a2a::stream_response::Payload::StatusUpdate(s) => last = s.status,
            a2a::stream_response::Payload::Message(_) => panic!("no bare message"),
        }
    }
    assert!(
        streamed == whole,
        "streamed {} bytes, {} of them the answer's start",
        streamed.len(),
        streamed
            .bytes()
            .zip(whole.bytes())
            .take_while(|(a, b)| a == b)
            .count()
    );
    let last = last.unwrap();
    assert_eq!(last.state, a2a::TaskState::Completed as i32);
    let final_text = text_of(&last.message.as_ref().unwrap().parts);
    assert!(final_text.len() < 20 << 10, "{}", final_text.len());
    assert!(whole.starts_with(final_text.split(MARKER).next().unwrap().trim_end()));
    assert!(
        final_text.contains(MARKER),
        "the terminal message says it was cut"
    );

    let task = client
        .get_task(authed(a2a::GetTaskRequest {
            id: task_id.clone(),
            ..Default::default()
        }))
        .await
        .expect("a default client reads a task with a 2 MiB answer")
        .into_inner();
    assert!(
        task.encoded_len() < (2 << 20) + (128 << 10),
        "{}",
        task.encoded_len()
    );
    assert_eq!(
        text_of(&task.artifacts[0].parts),
        whole,
        "the artifact is whole"
    );
    assert!(task.artifacts[0].metadata.is_none());
    let agent = task.history.last().unwrap();
    assert_eq!(agent.role, a2a::Role::Agent as i32);
    let shown = text_of(&agent.parts);
    assert!(shown.contains(MARKER), "the history's copy is cut, visibly");
    assert!(
        shown.contains(&format!("of {} bytes", whole.len())),
        "{}",
        &shown[shown.len() - 200..]
    );
    assert!(whole.starts_with(shown.split(MARKER).next().unwrap().trim_end()));
    let meta = agent.metadata.as_ref().expect("metadata says it was cut");
    assert!(meta.fields.contains_key("agentrt_truncated"));
    let status_text = text_of(
        &task
            .status
            .as_ref()
            .unwrap()
            .message
            .as_ref()
            .unwrap()
            .parts,
    );
    assert!(status_text.contains(MARKER));

    // The whole text stays readable through agentrt.v1 GetHistory.
    let mut sessions = SessionServiceClient::connect(server.url()).await.unwrap();
    let mut stored = String::new();
    let mut page_token = String::new();
    for _ in 0..16 {
        let page = sessions
            .get_history(authed(pb::GetHistoryRequest {
                session_id: task.context_id.clone(),
                page_token: page_token.clone(),
                ..Default::default()
            }))
            .await
            .unwrap()
            .into_inner();
        for m in page
            .messages
            .iter()
            .filter(|m| m.role == pb::Role::Assistant as i32)
        {
            for b in &m.content {
                if let Some(pb::content_block::Block::Text(t)) = &b.block {
                    stored.push_str(&t.text);
                }
            }
        }
        page_token = page.next_page_token;
        if page_token.is_empty() {
            break;
        }
    }
    assert!(
        stored == whole,
        "GetHistory has {} bytes of answer",
        stored.len()
    );
    server.stop().await;
}
