//! Careless and hostile clients, in process: the auth scheme's case, an
//! oversized request, a handler that panics, and requests whose body never
//! finishes arriving (raw HTTP/2 with the `h2` crate, which can send what a
//! gRPC client cannot).

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::proto;
use agentrt_client::proto::runtime_admin_client::RuntimeAdminClient;
use agentrt_client::proto::session_service_client::SessionServiceClient;
use agentrt_runtime::store::{
    CreateOutcome, HistoryQuery, Leases, ListQuery, MemoryStore, MessagePage, SessionPage, Store,
    StoreError,
};
use agentrt_runtime::types::{Message, NewMessage, NewSession, Session, SessionUpdate, TurnRecord};
use agentrt_server::config::{ApiKeyConfig, AuthConfig};
use agentrt_server::{Config, ServerBuilder};
use agentrt_testkit::server::InProcessServer;
use async_trait::async_trait;
use bytes::Bytes;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic_types::StatusExt as _;

const USER_KEY: &str = "user-key-0001";
const ADMIN_KEY: &str = "admin-key-0001";

struct Running {
    addr: std::net::SocketAddr,
    _server: InProcessServer,
    _dir: tempfile::TempDir,
}

fn config(dir: &std::path::Path, keys: bool) -> Config {
    let mut c = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    if keys {
        c.auth = AuthConfig {
            api_keys: vec![
                ApiKeyConfig::inline(USER_KEY, "alice", false),
                ApiKeyConfig::inline(ADMIN_KEY, "root", true),
            ],
            ..AuthConfig::default()
        };
    }
    c
}

async fn start(edit: impl FnOnce(&mut Config), store: Option<Arc<dyn Store>>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), true);
    edit(&mut c);
    let mut builder = ServerBuilder::new(c);
    if let Some(store) = store {
        builder = builder.store(store);
    }
    let server = InProcessServer::start(builder).await;
    Running {
        addr: server.addr(),
        _server: server,
        _dir: dir,
    }
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

fn with_auth<T>(message: T, value: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert("authorization", MetadataValue::try_from(value).unwrap());
    req
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive_and_a_wrong_key_still_fails() {
    let server = start(|_| {}, None).await;
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let listed = sessions
            .list_sessions(with_auth(
                proto::ListSessionsRequest::default(),
                &format!("{scheme} {USER_KEY}"),
            ))
            .await;
        assert!(listed.is_ok(), "{scheme}: {listed:?}");
    }
    for value in [
        "BEARER wrong-key-0001".to_owned(),
        format!("bEaReR {USER_KEY}x"),
        format!("Basic {USER_KEY}"),
        format!("Bearer{USER_KEY}"),
    ] {
        let err = sessions
            .list_sessions(with_auth(proto::ListSessionsRequest::default(), &value))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{value}: {err:?}");
    }
}

#[tokio::test]
async fn an_oversized_request_is_invalid_argument_naming_the_limit() {
    // The default limit: 4 MiB.
    let server = start(|_| {}, None).await;
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    let huge = proto::CreateSessionRequest {
        title: "x".repeat(5 << 20),
        ..Default::default()
    };
    let err = sessions
        .create_session(with_auth(huge, &format!("Bearer {USER_KEY}")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("4194304") && err.message().contains("transport.max_request_bytes"),
        "{}",
        err.message()
    );
    let violations = err
        .get_details_bad_request()
        .expect("google.rpc.BadRequest")
        .field_violations;
    assert_eq!(violations[0].field, "request");
    // The connection is still usable.
    sessions
        .list_sessions(with_auth(
            proto::ListSessionsRequest::default(),
            &format!("Bearer {USER_KEY}"),
        ))
        .await
        .unwrap();

    // A configured limit.
    let server = start(|c| c.transport.max_request_bytes = 64 << 10, None).await;
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    let over = proto::GetSessionRequest {
        session_id: "y".repeat(70 << 10),
    };
    let err = sessions
        .get_session(with_auth(over, &format!("Bearer {USER_KEY}")))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("65536"), "{}", err.message());
    let under = proto::GetSessionRequest {
        session_id: "y".repeat(60 << 10),
    };
    let err = sessions
        .get_session(with_auth(under, &format!("Bearer {USER_KEY}")))
        .await
        .unwrap_err();
    assert!(
        !err.message().contains("max_request_bytes"),
        "a request under the limit reaches the handler: {err:?}"
    );
}

/// A store whose `get_session` panics for the id `boom`.
#[derive(Debug, Default)]
struct PanickyStore(MemoryStore);

#[async_trait]
impl Store for PanickyStore {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.0.create_session(new).await
    }
    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        assert_ne!(id, "boom", "test double: get_session(\"boom\") panics");
        self.0.get_session(id).await
    }
    async fn list_sessions(&self, owner: &str, q: &ListQuery) -> Result<SessionPage, StoreError> {
        self.0.list_sessions(owner, q).await
    }
    async fn update_session(&self, id: &str, u: SessionUpdate) -> Result<Session, StoreError> {
        self.0.update_session(id, u).await
    }
    async fn delete_session(&self, id: &str, i: Option<&str>) -> Result<bool, StoreError> {
        self.0.delete_session(id, i).await
    }
    async fn begin_turn(&self, t: TurnRecord, m: NewMessage) -> Result<Message, StoreError> {
        self.0.begin_turn(t, m).await
    }
    async fn append_message(&self, s: &str, i: &str, m: NewMessage) -> Result<Message, StoreError> {
        self.0.append_message(s, i, m).await
    }
    async fn finish_turn(&self, t: TurnRecord) -> Result<(), StoreError> {
        self.0.finish_turn(t).await
    }
    async fn expired_pauses(
        &self,
        now: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<agentrt_runtime::types::TurnRecord>, StoreError> {
        self.0.expired_pauses(now, limit).await
    }
    async fn daily_spent(
        &self,
        owner: &str,
        day: u64,
    ) -> Result<agentrt_runtime::quota::DailySpent, StoreError> {
        self.0.daily_spent(owner, day).await
    }
    async fn update_turn(&self, t: TurnRecord) -> Result<(), StoreError> {
        self.0.update_turn(t).await
    }
    async fn resume_turn(&self, s: &str, i: &str, t: &str) -> Result<TurnRecord, StoreError> {
        self.0.resume_turn(s, i, t).await
    }
    async fn get_turn(&self, s: &str, t: &str) -> Result<Option<TurnRecord>, StoreError> {
        self.0.get_turn(s, t).await
    }
    fn inbox(&self) -> &dyn agentrt_runtime::store::Inbox {
        self.0.inbox()
    }
    fn agents(&self) -> &dyn agentrt_runtime::store::AgentStore {
        self.0.agents()
    }
    async fn list_turns(
        &self,
        s: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.0.list_turns(s, before, limit).await
    }
    async fn count_turns(&self, s: &str) -> Result<u64, StoreError> {
        self.0.count_turns(s).await
    }
    async fn find_turn_by_request(
        &self,
        s: &str,
        r: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.0.find_turn_by_request(s, r).await
    }
    async fn history_page(&self, s: &str, q: &HistoryQuery) -> Result<MessagePage, StoreError> {
        self.0.history_page(s, q).await
    }
    async fn store_compaction(
        &self,
        s: &str,
        i: &str,
        summary: NewMessage,
        through: u64,
    ) -> Result<Message, StoreError> {
        self.0.store_compaction(s, i, summary, through).await
    }
    async fn set_title_if_empty(&self, s: &str, i: &str, title: &str) -> Result<bool, StoreError> {
        self.0.set_title_if_empty(s, i, title).await
    }
    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        self.0.recover_interrupted().await
    }
    async fn count_sessions(&self) -> Result<u64, StoreError> {
        self.0.count_sessions().await
    }
    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<agentrt_runtime::store::AgentSessions, StoreError> {
        self.0.sessions_of_agent(agent_id, after, limit).await
    }
    async fn forget_owner(&self, owner: &str) -> Result<(), StoreError> {
        self.0.forget_owner(owner).await
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.0.flush().await
    }
    fn leases(&self) -> Option<&dyn Leases> {
        None
    }
    fn cluster(&self) -> Option<&dyn agentrt_runtime::store::Cluster> {
        None
    }
}

#[tokio::test]
async fn a_panicking_handler_answers_internal_and_the_server_keeps_serving() {
    let server = start(|_| {}, Some(Arc::new(PanickyStore::default()))).await;
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    let auth = format!("Bearer {USER_KEY}");
    let created = sessions
        .create_session(with_auth(
            proto::CreateSessionRequest {
                session_id: "fine".into(),
                ..Default::default()
            },
            &auth,
        ))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        let err = sessions
            .get_session(with_auth(
                proto::GetSessionRequest {
                    session_id: "boom".into(),
                },
                &auth,
            ))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Internal, "{err:?}");
        assert!(
            err.message().contains("internal error") && !err.message().contains("test double"),
            "the panic message is not leaked: {}",
            err.message()
        );
        // The same connection serves the next call.
        let got = sessions
            .get_session(with_auth(
                proto::GetSessionRequest {
                    session_id: created.session_id.clone(),
                },
                &auth,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.session_id, "fine");
    }
}

/// An HTTP/2 connection that sends what it likes.
async fn raw_h2(addr: std::net::SocketAddr) -> h2::client::SendRequest<Bytes> {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

fn grpc_post(path: &str) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://127.0.0.1{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap()
}

/// The grpc-status of a response (trailers-only or in the trailers).
async fn grpc_status(response: h2::client::ResponseFuture) -> (String, String) {
    let response = response.await.expect("a response");
    let from = |h: &http::HeaderMap| {
        h.get("grpc-status").map(|v| {
            (
                v.to_str().unwrap().to_owned(),
                h.get("grpc-message")
                    .map(|m| m.to_str().unwrap().to_owned())
                    .unwrap_or_default(),
            )
        })
    };
    if let Some(status) = from(response.headers()) {
        return status;
    }
    let mut body = response.into_body();
    while body.data().await.is_some() {}
    let trailers = body.trailers().await.unwrap().expect("trailers");
    from(&trailers).expect("grpc-status in the trailers")
}

#[tokio::test]
async fn a_request_that_never_finishes_arriving_is_answered_deadline_exceeded() {
    let server = start(
        |c| c.transport.request_timeout = Duration::from_millis(300),
        None,
    )
    .await;
    let mut h2 = raw_h2(server.addr).await;

    // HEADERS only, on a method that needs no credentials.
    h2 = h2.ready().await.unwrap();
    let (headers_only, _keep_a) = h2
        .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
        .unwrap();
    // Part of a message: 3 bytes of a 5-byte prefix.
    h2 = h2.ready().await.unwrap();
    let (partial, mut keep_b) = h2
        .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
        .unwrap();
    keep_b
        .send_data(Bytes::from_static(&[0, 0, 0]), false)
        .unwrap();
    // A whole message whose stream is never ended.
    h2 = h2.ready().await.unwrap();
    let (unended, mut keep_c) = h2
        .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
        .unwrap();
    keep_c
        .send_data(Bytes::from_static(&[0, 0, 0, 0, 0]), false)
        .unwrap();

    for (what, response) in [
        ("headers only", headers_only),
        ("partial message", partial),
        ("unended stream", unended),
    ] {
        let (code, message) = tokio::time::timeout(Duration::from_secs(10), grpc_status(response))
            .await
            .unwrap_or_else(|_| panic!("{what}: no answer 10 s after HEADERS"));
        assert_eq!(
            code, "4",
            "{what}: DEADLINE_EXCEEDED expected, got {code} {message}"
        );
        assert!(message.contains("request_timeout"), "{what}: {message}");
    }
}

#[tokio::test]
async fn the_request_timeout_does_not_cut_a_long_response_stream() {
    let server = start(
        |c| c.transport.request_timeout = Duration::from_millis(200),
        None,
    )
    .await;
    let channel = channel(server.addr).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let mut watch = health
        .watch(tonic_health::pb::HealthCheckRequest {
            service: "readiness".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving;
    assert_eq!(watch.message().await.unwrap().unwrap().status(), serving);
    // Well past the request timeout, the stream still delivers.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut admin = RuntimeAdminClient::new(channel);
    admin
        .drain(with_auth(
            proto::DrainRequest {
                timeout: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
            },
            &format!("Bearer {ADMIN_KEY}"),
        ))
        .await
        .unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the watch is alive")
        .expect("no error")
        .expect("an update");
    assert_eq!(
        next.status(),
        tonic_health::pb::health_check_response::ServingStatus::NotServing
    );
}

#[tokio::test]
async fn a_silent_reflection_stream_is_ended_after_the_request_timeout() {
    // Reflection streams its requests, so its limit is on silence: a
    // client may keep the stream as long as it keeps talking.
    let server = start(
        |c| c.transport.request_timeout = Duration::from_millis(300),
        None,
    )
    .await;
    let h2 = raw_h2(server.addr).await;
    let mut h2 = h2.ready().await.unwrap();
    let (response, _keep) = h2
        .send_request(
            grpc_post("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"),
            false,
        )
        .unwrap();
    // The reflection service ends its response when its request stream
    // fails (with OK: it has nothing more to say); what matters is that
    // the stream, and what it holds, is gone.
    let ended = tokio::time::timeout(Duration::from_secs(10), grpc_status(response)).await;
    assert!(
        ended.is_ok(),
        "a reflection stream that sends nothing is still open 10 s later"
    );
}

async fn connect_from(
    local: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(format!("{local}:0").parse().unwrap())?;
    socket.connect(addr).await
}

/// Whether the server closes `stream` within `within` (EOF or reset).
async fn closed_within(stream: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn a_connection_that_never_starts_http2_is_closed_after_the_handshake_timeout() {
    let server = start(
        |c| c.transport.handshake_timeout = Duration::from_millis(300),
        None,
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(10)).await,
        "a connection that sent nothing is still open 10 s later"
    );
    let mut garbage = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut garbage, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut garbage, Duration::from_secs(10)).await);
    // A real client is served.
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    sessions
        .list_sessions(with_auth(
            proto::ListSessionsRequest::default(),
            &format!("Bearer {USER_KEY}"),
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn connections_over_the_per_address_cap_are_closed_and_other_addresses_are_served() {
    let server = start(|c| c.transport.max_connections_per_ip = 4, None).await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect_from("127.0.0.2", server.addr).await.unwrap());
    }
    let mut extra = connect_from("127.0.0.2", server.addr).await.unwrap();
    assert!(
        closed_within(&mut extra, Duration::from_secs(10)).await,
        "the fifth connection from 127.0.0.2 is still open"
    );
    let mut sessions = SessionServiceClient::new(channel(server.addr).await);
    sessions
        .list_sessions(with_auth(
            proto::ListSessionsRequest::default(),
            &format!("Bearer {USER_KEY}"),
        ))
        .await
        .unwrap();
    // A slot given back is usable again (once the server has seen the
    // close).
    drop(held.pop());
    let since = std::time::Instant::now();
    loop {
        let mut again = connect_from("127.0.0.2", server.addr).await.unwrap();
        if !closed_within(&mut again, Duration::from_millis(300)).await {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "the slot of a closed connection was never given back"
        );
    }
}

/// An h2 client connection whose end (and how it ended) is reported.
async fn raw_h2_watched(
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<Bytes>,
    tokio::sync::oneshot::Receiver<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    let (done_tx, done) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let _ = done_tx.send(connection.await);
    });
    (send, done)
}

/// A gRPC message: the 5-byte prefix and `body`.
fn grpc_frame(body: &[u8]) -> Bytes {
    let mut framed = vec![0u8];
    framed.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    framed.extend_from_slice(body);
    Bytes::from(framed)
}

#[tokio::test]
async fn at_its_max_age_a_connection_gets_goaway_serves_its_calls_in_flight_and_closes_after_the_grace()
 {
    let age = Duration::from_secs(1);
    let grace = Duration::from_secs(2);
    let server = start(
        |c| {
            c.transport.max_connection_age = age;
            c.transport.max_connection_age_grace = grace;
        },
        None,
    )
    .await;
    let accepted = std::time::Instant::now();
    let (h2, mut ended) = raw_h2_watched(server.addr).await;
    // In flight across the GOAWAY: a Check whose request is not sent yet,
    // and a Watch, whose response never ends by itself.
    let mut h2 = h2.ready().await.unwrap();
    let (check, mut check_body) = h2
        .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
        .unwrap();
    h2 = h2.ready().await.unwrap();
    let (watch, mut watch_body) = h2
        .send_request(grpc_post("/grpc.health.v1.Health/Watch"), false)
        .unwrap();
    watch_body.send_data(grpc_frame(&[]), true).unwrap();
    let mut watch = watch.await.unwrap().into_body();
    watch.data().await.expect("the first status").unwrap();

    // The GOAWAY: new streams on this connection are refused.
    let refused = loop {
        assert!(
            accepted.elapsed() < age + grace,
            "no GOAWAY before the grace ended"
        );
        let ready = match h2.clone().ready().await {
            Ok(ready) => ready,
            Err(err) => break err,
        };
        let mut ready = ready;
        match ready.send_request(grpc_post("/grpc.health.v1.Health/Check"), true) {
            Err(err) => break err,
            Ok((response, _)) => match response.await {
                Err(err) => break err,
                // Served before the GOAWAY arrived: try again shortly.
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    };
    assert!(
        refused.is_go_away() || refused.reason() == Some(h2::Reason::REFUSED_STREAM),
        "{refused:?}"
    );
    assert!(accepted.elapsed() >= age, "GOAWAY before the maximum age");

    // The call in flight is still served during the grace.
    check_body.send_data(grpc_frame(&[]), true).unwrap();
    let (code, message) = grpc_status(check).await;
    assert_eq!(code, "0", "{message}");

    // After the grace the connection is closed, Watch and all.
    let end = tokio::time::timeout(Duration::from_secs(20), &mut ended)
        .await
        .expect("the connection was closed after the grace");
    let closed_at = accepted.elapsed();
    assert!(
        closed_at >= age + grace,
        "closed after {closed_at:?}, before age + grace ({:?}): {end:?}",
        age + grace
    );
    while let Some(Ok(_)) = watch.data().await {}
}

#[tokio::test]
async fn an_idle_connection_is_closed_and_a_connection_with_an_open_call_is_not() {
    let server = start(
        |c| c.transport.idle_timeout = Duration::from_millis(500),
        None,
    )
    .await;
    let (_idle, idle_ended) = raw_h2_watched(server.addr).await;
    let (busy, _busy_ended) = raw_h2_watched(server.addr).await;
    let mut busy = busy.ready().await.unwrap();
    let (watch, mut watch_body) = busy
        .send_request(grpc_post("/grpc.health.v1.Health/Watch"), false)
        .unwrap();
    watch_body.send_data(grpc_frame(&[]), true).unwrap();
    let mut watch = watch.await.unwrap().into_body();
    watch.data().await.expect("the first status").unwrap();

    let since = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(20), idle_ended)
        .await
        .expect("the idle connection was closed")
        .unwrap()
        .ok();
    assert!(since.elapsed() >= Duration::from_millis(400));
    // The one with a Watch open outlived it, and still serves calls.
    let mut busy = busy.ready().await.unwrap();
    let (check, mut body) = busy
        .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
        .unwrap();
    body.send_data(grpc_frame(&[]), true).unwrap();
    let (code, message) = grpc_status(check).await;
    assert_eq!(code, "0", "{message}");
}

#[tokio::test]
async fn half_open_health_calls_are_bounded_by_evicting_the_oldest_so_a_probe_still_passes() {
    let server = start(|c| c.transport.max_pending_anonymous_requests = 8, None).await;
    let mut abuser = raw_h2(server.addr).await;
    let mut held = Vec::new();
    for _ in 0..40 {
        abuser = abuser.ready().await.unwrap();
        let (response, body) = abuser
            .send_request(grpc_post("/grpc.health.v1.Health/Check"), false)
            .unwrap();
        held.push((response, body));
    }
    // A prober on another connection is answered at once.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(server.addr).await);
    let status = tokio::time::timeout(
        Duration::from_secs(5),
        health.check(tonic_health::pb::HealthCheckRequest {
            service: "liveness".into(),
        }),
    )
    .await
    .expect("the probe is answered while 40 half-open calls were made")
    .unwrap();
    assert_eq!(
        status.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    // Every half-open call beyond the pool (and the prober's place) was
    // ended RESOURCE_EXHAUSTED naming the limit; at most 8 are held.
    let mut evicted = 0;
    let mut still_held = 0;
    for (response, _body) in held {
        match tokio::time::timeout(Duration::from_millis(300), grpc_status(response)).await {
            Ok((code, message)) => {
                assert_eq!(code, "8", "{message}");
                assert!(
                    message.contains("max_pending_anonymous_requests"),
                    "{message}"
                );
                evicted += 1;
            }
            Err(_) => still_held += 1,
        }
    }
    assert!(still_held <= 8, "{still_held} half-open calls held");
    assert!(evicted >= 32, "only {evicted} evicted");
}

#[tokio::test]
async fn a_principal_over_its_stream_limit_gets_resource_exhausted_with_a_quota_failure() {
    let server = start(|c| c.transport.max_streams_per_principal = 2, None).await;
    let channel = channel(server.addr).await;
    let mut agent =
        agentrt_client::proto::agent_runtime_client::AgentRuntimeClient::new(channel.clone());
    let mut sessions = SessionServiceClient::new(channel);
    let auth = format!("Bearer {USER_KEY}");
    let session = sessions
        .create_session(with_auth(proto::CreateSessionRequest::default(), &auth))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    // Two Subscribe streams stay open.
    let mut open = Vec::new();
    for _ in 0..2 {
        open.push(
            agent
                .subscribe(with_auth(
                    proto::SubscribeRequest {
                        session_id: session.clone(),
                        wait_for_turn: true,
                        ..Default::default()
                    },
                    &auth,
                ))
                .await
                .unwrap()
                .into_inner(),
        );
    }
    let err = sessions
        .list_sessions(with_auth(proto::ListSessionsRequest::default(), &auth))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let quota = err.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(
        quota.violations[0].subject,
        "transport.max_streams_per_principal"
    );
    // Another principal is not affected.
    sessions
        .list_sessions(with_auth(
            proto::ListSessionsRequest::default(),
            &format!("Bearer {ADMIN_KEY}"),
        ))
        .await
        .unwrap();
    // A stream that ends gives its place back.
    drop(open.pop());
    let since = std::time::Instant::now();
    loop {
        match sessions
            .list_sessions(with_auth(proto::ListSessionsRequest::default(), &auth))
            .await
        {
            Ok(_) => break,
            Err(err) => {
                assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
                assert!(
                    since.elapsed() < Duration::from_secs(10),
                    "the place of an ended stream was never given back"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}
