//! The real `agentrt-server` binary behind Debian's nginx (`grpc_pass`)
//! with a short stream read timeout (`grpc_read_timeout 3s`): heartbeat
//! events are what keeps a quiet turn alive through a proxy that cuts
//! silent streams. The model upstream is a fake OpenAI-compatible server on
//! loopback that holds its answer until the test releases it, so the turn
//! stays quiet exactly as long as the test needs.
//!
//! Behind the proxy every caller has the proxy's address: one client
//! without credentials holding half-open streams and idle connections
//! must not lock out another client's calls (the per-address caps are off,
//! as the mesh overlays set them).
//!
//! nginx comes from PATH or /usr/sbin/nginx (`.ci/run` installs it); when
//! it is missing the tests skip with a message, except under `CI=true`,
//! where they fail. nginx runs with its own prefix, config, pid and logs in
//! a temporary directory, as a single process (`master_process off`), so
//! killing the child leaves nothing behind.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_testkit::fake_openai::{finish_chunk, text_chunk, usage_chunk};
use futures::StreamExt as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

/// nginx's `grpc_read_timeout`: the longest silence it allows from the
/// server on a response stream.
const PROXY_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound on anything the tests wait for (a hang fails, not stalls).
const GUARD: Duration = Duration::from_secs(60);
const ANSWER: &str = "held back, then sent";

/// Where nginx is, or why the test does not run.
fn nginx_binary() -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("nginx"))
            .find(|p| p.is_file())
    });
    let found = on_path.or_else(|| {
        let sbin = PathBuf::from("/usr/sbin/nginx");
        sbin.is_file().then_some(sbin)
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "nginx is not installed (PATH, /usr/sbin/nginx); .ci/run installs nginx-light"
        );
        eprintln!(
            "behind_nginx: SKIPPED: nginx not found on PATH or at /usr/sbin/nginx (apt-get install nginx-light)"
        );
    }
    found
}

/// A fake OpenAI-compatible upstream: every request is announced on
/// `arrived`, then answered (a short text, finish, usage, `[DONE]`) only
/// once the test calls [`HeldUpstream::release`].
struct HeldUpstream {
    addr: SocketAddr,
    arrived: mpsc::Receiver<()>,
    release: watch::Sender<bool>,
    _task: tokio::task::JoinHandle<()>,
}

impl HeldUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (arrived_tx, arrived) = mpsc::channel(8);
        let (release, released) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(answer_when_released(
                    socket,
                    arrived_tx.clone(),
                    released.clone(),
                ));
            }
        });
        Self {
            addr,
            arrived,
            release,
            _task: task,
        }
    }

    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn release(&self) {
        self.release.send_replace(true);
    }
}

async fn answer_when_released(
    mut socket: TcpStream,
    arrived: mpsc::Sender<()>,
    mut released: watch::Receiver<bool>,
) {
    if !read_request(&mut socket).await {
        return;
    }
    let _ = arrived.send(()).await;
    if released.wait_for(|r| *r).await.is_err() {
        return;
    }
    let mut body = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n",
    )
    .into_bytes();
    for chunk in [
        text_chunk(ANSWER),
        finish_chunk("stop"),
        usage_chunk(5, 4),
        b"data: [DONE]\n\n".to_vec(),
    ] {
        body.extend_from_slice(&chunk);
    }
    let _ = socket.write_all(&body).await;
    let _ = socket.shutdown().await;
}

/// Reads one HTTP/1.1 request (head and `Content-Length` body).
async fn read_request(socket: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 1 << 20 {
            return false;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    true
}

/// The agentrt-server child, on a loopback port it chose.
struct Server {
    _child: Child,
    addr: SocketAddr,
}

async fn start_server(dir: &Path, upstream: &HeldUpstream, heartbeat: &str) -> Server {
    start_server_with(dir, upstream, heartbeat, "").await
}

/// The server with `extra` TOML appended to its config.
async fn start_server_with(
    dir: &Path,
    upstream: &HeldUpstream,
    heartbeat: &str,
    extra: &str,
) -> Server {
    let config = dir.join("agentrt.toml");
    std::fs::write(
        &config,
        format!(
            "default_model = \"held/m\"\nheartbeat_interval = \"{heartbeat}\"\n\n\
             [[providers]]\nname = \"held\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n{extra}",
            upstream.base_url()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(&config)
        .env("AGENTRT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let line = tokio::time::timeout(GUARD, BufReader::new(stdout).lines().next_line())
        .await
        .expect("the server announced its address")
        .unwrap()
        .expect("a line on stdout");
    let addr = line
        .strip_prefix("agentrt-server listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    Server {
        _child: child,
        addr,
    }
}

/// nginx proxying gRPC on a loopback port to `upstream`.
struct Nginx {
    _child: Child,
    port: u16,
    error_log: PathBuf,
}

impl Nginx {
    /// nginx's error log so far.
    fn log(&self) -> String {
        std::fs::read_to_string(&self.error_log).unwrap_or_default()
    }
}

fn nginx_conf(dir: &Path, port: u16, upstream: SocketAddr, proxy_timeout: Duration) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\nerror_log {d}/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         server {{\n    listen 127.0.0.1:{port} http2;\n    location / {{\n\
               grpc_pass grpc://{upstream};\n      grpc_read_timeout {secs}s;\n      grpc_send_timeout {secs}s;\n\
             }}\n  }}\n}}\n",
        secs = proxy_timeout.as_secs()
    )
}

/// Starts nginx on a free port: binds 127.0.0.1:0 to pick one, releases it
/// and starts nginx there, again with a new port if nginx could not bind.
async fn start_nginx(
    bin: &Path,
    dir: &Path,
    upstream: SocketAddr,
    proxy_timeout: Duration,
) -> Nginx {
    for _attempt in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir, port, upstream, proxy_timeout)).unwrap();
        let error_log = dir.join("error.log");
        let mut child = Command::new(bin)
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(&error_log)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("nginx starts");
        let started = Instant::now();
        // Up once it accepts connections; gone if it could not bind.
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let log = std::fs::read_to_string(&error_log).unwrap_or_default();
                assert!(
                    log.contains("Address already in use"),
                    "nginx exited with {status}:\n{log}"
                );
                break;
            }
            if TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Nginx {
                    _child: child,
                    port,
                    error_log,
                };
            }
            assert!(
                started.elapsed() < GUARD,
                "nginx did not listen on {port} within {GUARD:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    panic!("nginx could not bind a free port in 5 attempts");
}

struct Setup {
    _dir: tempfile::TempDir,
    upstream: HeldUpstream,
    _server: Server,
    nginx: Nginx,
    client: Client,
    session: String,
}

async fn setup(nginx: &Path, heartbeat: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let upstream = HeldUpstream::start().await;
    let server = start_server(dir.path(), &upstream, heartbeat).await;
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir(&nginx_dir).unwrap();
    let proxy = start_nginx(nginx, &nginx_dir, server.addr, PROXY_TIMEOUT).await;
    let client = Client::builder(format!("http://127.0.0.1:{}", proxy.port))
        .connect()
        .await
        .unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest {
            title: "behind nginx".to_owned(),
            ..Default::default()
        })
        .await
        .expect("a unary call through nginx")
        .session_id;
    Setup {
        _dir: dir,
        upstream,
        _server: server,
        nginx: proxy,
        client,
        session,
    }
}

#[tokio::test]
async fn heartbeats_carry_a_quiet_turn_through_nginx_read_timeout() {
    let Some(nginx) = nginx_binary() else { return };
    let mut s = setup(&nginx, "1s").await;
    let mut events = s.client.chat(&s.session, "take your time").await.unwrap();
    tokio::time::timeout(GUARD, s.upstream.arrived.recv())
        .await
        .expect("the model request reached the upstream")
        .unwrap();
    // The turn is now waiting for the held upstream: only heartbeats flow.
    let quiet_since = Instant::now();
    let mut heartbeats = 0;
    // Six at a 1 s interval: at least 5 s without model output, well past
    // the proxy's 3 s.
    while heartbeats < 6 {
        let event = tokio::time::timeout(GUARD, events.next())
            .await
            .expect("an event within the guard")
            .expect("the stream is still open")
            .expect("no error through nginx");
        match event.kind {
            ChatEvent::Heartbeat { .. } => heartbeats += 1,
            ChatEvent::Text(_) | ChatEvent::TurnFinished { .. } => {
                panic!("the upstream answered before it was released: {event:?}")
            }
            _ => {}
        }
    }
    let quiet = quiet_since.elapsed();
    assert!(
        quiet > PROXY_TIMEOUT,
        "the turn was quiet for {quiet:?}, not longer than nginx's {PROXY_TIMEOUT:?}"
    );
    s.upstream.release();
    let rest = tokio::time::timeout(GUARD, events.finish())
        .await
        .expect("the turn finished within the guard")
        .expect("the stream ended cleanly through nginx");
    assert_eq!(rest.outcome, Some(proto::TurnOutcome::Success), "{rest:?}");
    assert_eq!(rest.text, ANSWER);
    let log = s.nginx.log();
    assert!(
        !log.contains("upstream timed out"),
        "nginx timed the stream out:\n{log}"
    );
}

#[tokio::test]
async fn without_heartbeats_nginx_cuts_the_same_quiet_turn() {
    let Some(nginx) = nginx_binary() else { return };
    let mut s = setup(&nginx, "60s").await;
    let mut events = s.client.chat(&s.session, "take your time").await.unwrap();
    tokio::time::timeout(GUARD, s.upstream.arrived.recv())
        .await
        .expect("the model request reached the upstream")
        .unwrap();
    let ended = loop {
        match tokio::time::timeout(GUARD, events.next())
            .await
            .expect("nginx cut the quiet stream within the guard")
        {
            Some(Ok(event)) => match event.kind {
                ChatEvent::Heartbeat { .. } => panic!("a heartbeat at a 60 s interval"),
                ChatEvent::Text(_) | ChatEvent::TurnFinished { .. } => {
                    panic!("the upstream answered before it was released: {event:?}")
                }
                _ => {}
            },
            Some(Err(err)) => break Some(err),
            None => break None,
        }
    };
    let err = ended.expect("the cut stream ends with an error, not a clean end");
    // It was nginx's read timeout that cut it, nothing else.
    let log = s.nginx.log();
    assert!(
        log.contains("upstream timed out"),
        "the stream ended ({err}) but nginx logged no read timeout:\n{log}"
    );
    s.upstream.release();
}

const USER_KEY: &str = "abuse-test-user-key-0001";

/// A raw HTTP/2 client connection (it sends what a gRPC client would not).
async fn raw_h2(port: u16) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
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
async fn grpc_code(response: h2::client::ResponseFuture) -> Option<String> {
    let response = response.await.ok()?;
    if let Some(code) = response.headers().get("grpc-status") {
        return Some(code.to_str().ok()?.to_owned());
    }
    let mut body = response.into_body();
    while let Some(Ok(_)) = body.data().await {}
    let trailers = body.trailers().await.ok()??;
    Some(trailers.get("grpc-status")?.to_str().ok()?.to_owned())
}

#[tokio::test]
async fn one_client_without_credentials_cannot_lock_out_another_behind_nginx() {
    let Some(nginx) = nginx_binary() else { return };
    // The limits as a mesh overlay sets them: no per-address caps (every
    // caller has the proxy's address); the rest at their defaults except
    // the anonymous pool, kept small so the test stays light.
    const POOL: usize = 32;
    let dir = tempfile::tempdir().unwrap();
    let upstream = HeldUpstream::start().await;
    let server = start_server_with(
        dir.path(),
        &upstream,
        "15s",
        &format!(
            "\n[[auth.api_keys]]\nkey = \"{USER_KEY}\"\nuser = \"alice\"\n\n\
             [transport]\nmax_connections_per_ip = 0\nmax_pending_requests_per_ip = 0\n\
             max_pending_anonymous_requests = {POOL}\nmax_unauthenticated_connections = 256\n"
        ),
    )
    .await;
    let nginx_dir = dir.path().join("nginx");
    std::fs::create_dir(&nginx_dir).unwrap();
    let proxy = start_nginx(&nginx, &nginx_dir, server.addr, Duration::from_secs(60)).await;

    // The abuser, through nginx: 8 connections x 120 half-open streams
    // (HEADERS, no request) on health, which needs no credentials (nginx
    // opens one upstream connection per stream), plus 40 on an
    // authenticated method without credentials.
    let mut health_calls = Vec::new();
    let mut unauthenticated_calls = Vec::new();
    let mut keep = Vec::new();
    for conn in 0..8 {
        let mut h2 = raw_h2(proxy.port).await;
        for i in 0..120 {
            if conn == 0 && i == 40 {
                // Without credentials, refused at once — read before the
                // flood, which makes the pool evict the oldest upstream
                // connections (these calls' among them, were they still
                // unanswered).
                for response in unauthenticated_calls.drain(..) {
                    let code = tokio::time::timeout(GUARD, grpc_code(response))
                        .await
                        .expect("an unauthenticated call is answered");
                    assert_eq!(code.as_deref(), Some("16"), "UNAUTHENTICATED expected");
                }
            }
            h2 = h2.ready().await.unwrap();
            let path = if conn == 0 && i < 40 {
                "/agentrt.v1.SessionService/ListSessions"
            } else {
                "/grpc.health.v1.Health/Check"
            };
            let (response, body) = h2.send_request(grpc_post(path), false).unwrap();
            keep.push(body);
            if conn == 0 && i < 40 {
                unauthenticated_calls.push(response);
            } else {
                health_calls.push(response);
            }
        }
    }
    let abusive_streams = health_calls.len();
    // ... and 600 idle connections straight to the server, from the
    // proxy's address (as a sidecar's would be): the HTTP/2 preface and
    // SETTINGS, then nothing.
    let mut idle = Vec::new();
    for _ in 0..600 {
        let mut c = TcpStream::connect(server.addr).await.unwrap();
        c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
            .await
            .unwrap();
        idle.push(c);
    }

    // The other client: 22 calls through nginx, each within a 5 s
    // deadline, and a health probe without credentials.
    let client = Client::builder(format!("http://127.0.0.1:{}", proxy.port))
        .token(USER_KEY)
        .connect()
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..22 {
        tokio::time::timeout(
            Duration::from_secs(5),
            client.create_session(proto::CreateSessionRequest {
                title: format!("call {i}"),
                ..Default::default()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("call {i} did not finish within its 5 s deadline"))
        .unwrap_or_else(|err| panic!("call {i} failed: {err}"));
    }
    let probe_channel =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", proxy.port))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let probe = tokio::time::timeout(
        Duration::from_secs(5),
        tonic_health::pb::health_client::HealthClient::new(probe_channel).check(
            tonic_health::pb::HealthCheckRequest {
                service: "liveness".into(),
            },
        ),
    )
    .await
    .expect("the probe finished within 5 s")
    .expect("the probe passed");
    assert_eq!(
        probe.into_inner().status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    let took = started.elapsed();

    // The abuse is bounded in count: all but the pool's worth of the
    // half-open health calls were ended, oldest first: RESOURCE_EXHAUSTED
    // from the pool of pending anonymous calls, or their upstream
    // connection closed by the pool of unauthenticated connections (nginx
    // then ends the stream without a gRPC status).
    let mut exhausted = 0;
    let mut cut = 0;
    let mut held = 0;
    for response in health_calls {
        match tokio::time::timeout(Duration::from_millis(200), grpc_code(response)).await {
            Ok(Some(code)) if code == "8" => exhausted += 1,
            Ok(Some(code)) => panic!("a half-open health call ended with grpc-status {code}"),
            Ok(None) => cut += 1,
            Err(_) => held += 1,
        }
    }
    assert!(
        held <= POOL,
        "{held} of {abusive_streams} half-open calls still held"
    );
    assert!(
        exhausted + cut >= abusive_streams - POOL,
        "{exhausted} exhausted, {cut} cut"
    );
    // ... and the idle connections beyond the unauthenticated pool were
    // closed, oldest first.
    let mut closed = 0;
    for c in &mut idle {
        let mut buf = [0u8; 256];
        loop {
            match tokio::time::timeout(Duration::from_millis(50), c.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => {
                    closed += 1;
                    break;
                }
                Ok(Ok(_)) => {}
                Err(_) => break,
            }
        }
    }
    assert!(
        closed >= 600 - 256,
        "only {closed} of 600 idle connections closed"
    );
    eprintln!(
        "22 calls and a probe took {took:?} while the abuser held {held} half-open calls \
         ({exhausted} ended RESOURCE_EXHAUSTED, {cut} cut with their connection) and {} idle \
         connections ({closed} closed)",
        600 - closed
    );
    drop(keep);
}
