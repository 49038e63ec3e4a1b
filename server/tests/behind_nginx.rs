//! The real `agentrt-server` binary behind Debian's nginx (`grpc_pass`)
//! with a short stream read timeout (`grpc_read_timeout 3s`): heartbeat
//! events are what keeps a quiet turn alive through a proxy that cuts
//! silent streams. The model upstream is a fake OpenAI-compatible server on
//! loopback that holds its answer until the test releases it, so the turn
//! stays quiet exactly as long as the test needs.
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
    let config = dir.join("agentrt.toml");
    std::fs::write(
        &config,
        format!(
            "default_model = \"held/m\"\nheartbeat_interval = \"{heartbeat}\"\n\n\
             [[providers]]\nname = \"held\"\nkind = \"openai\"\nbase_url = \"{}\"\nmax_retries = 0\n",
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

fn nginx_conf(dir: &Path, port: u16, upstream: SocketAddr) -> String {
    let d = dir.display();
    format!(
        "worker_processes 1;\nmaster_process off;\ndaemon off;\nerror_log {d}/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
         server {{\n    listen 127.0.0.1:{port} http2;\n    location / {{\n\
               grpc_pass grpc://{upstream};\n      grpc_read_timeout {secs}s;\n      grpc_send_timeout {secs}s;\n\
             }}\n  }}\n}}\n",
        secs = PROXY_TIMEOUT.as_secs()
    )
}

/// Starts nginx on a free port: binds 127.0.0.1:0 to pick one, releases it
/// and starts nginx there, again with a new port if nginx could not bind.
async fn start_nginx(bin: &Path, dir: &Path, upstream: SocketAddr) -> Nginx {
    for _attempt in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, nginx_conf(dir, port, upstream)).unwrap();
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
    let proxy = start_nginx(nginx, &nginx_dir, server.addr).await;
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
