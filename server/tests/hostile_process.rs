//! Denial of service without credentials, against the real
//! `agentrt-server` binary as a child process, whose memory (VmRSS) and CPU
//! time (utime + stime) are read from /proc. The attacker uses 127.0.0.2
//! (loopback too); the legitimate client 127.0.0.1.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::net::{TcpSocket, TcpStream};
use tokio::process::{Child, Command};

const KEY: &str = "legit-key-0001";

struct Server {
    _child: Child,
    addr: std::net::SocketAddr,
    pid: u32,
}

fn write_config(dir: &Path, extra: &str) -> std::path::PathBuf {
    let path = dir.join("agentrt.toml");
    let text = format!(
        "default_model = \"builtin/echo\"\n{extra}\n[[auth.api_keys]]\nkey = \"{KEY}\"\nuser = \"alice\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts the binary, optionally under `prlimit --nofile=N:N`, and waits
/// for the address line on stdout.
async fn start(dir: &Path, config: &Path, nofile: Option<u64>) -> Server {
    let bin = env!("CARGO_BIN_EXE_agentrt-server");
    let mut command = match nofile {
        Some(n) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--nofile={n}:{n}")).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    let mut child = command
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.join("data"))
        .arg("--config")
        .arg(config)
        .env("AGENTRT_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
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
        pid,
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/PID/status")
}

/// utime + stime of the process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name (field 2) may hold spaces; fields after it are
    // counted from its closing parenthesis.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_second() -> u64 {
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The server's CPU use over `window`, in percent of one core.
async fn cpu_percent(pid: u32, window: Duration) -> f64 {
    let hz = clock_ticks_per_second() as f64;
    let before = cpu_ticks(pid);
    let start = Instant::now();
    tokio::time::sleep(window).await;
    let ticks = cpu_ticks(pid) - before;
    ticks as f64 / hz / start.elapsed().as_secs_f64() * 100.0
}

async fn attacker_socket(addr: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind("127.0.0.2:0".parse().unwrap())?;
    socket.connect(addr).await
}

/// A Chat of the legitimate, authenticated client; its answer.
async fn legit_chat(addr: std::net::SocketAddr) -> String {
    let client = Client::builder(format!("http://{addr}"))
        .token(KEY)
        .connect()
        .await
        .unwrap();
    let session = client
        .create_session(proto::CreateSessionRequest::default())
        .await
        .unwrap()
        .session_id;
    let events = client.chat(&session, "still there?").await.unwrap();
    let done = events.finish().await.unwrap();
    assert_eq!(done.outcome, Some(proto::TurnOutcome::Success));
    done.events
        .iter()
        .filter_map(|e| match &e.kind {
            ChatEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

/// Opens streams with HEADERS only (the request body never comes) on
/// Health/Check, which needs no credentials, as fast as the server lets
/// it; counts them in `opened`. Keeps everything open until dropped.
async fn half_open_streams(
    addr: std::net::SocketAddr,
    streams: usize,
    opened: Arc<AtomicUsize>,
) -> Vec<Box<dyn std::any::Any + Send>> {
    let mut held: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    let Ok(tcp) = attacker_socket(addr).await else {
        return held;
    };
    let Ok((mut send, connection)) = h2::client::handshake(tcp).await else {
        return held;
    };
    held.push(Box::new(tokio::spawn(connection).abort_handle()));
    for _ in 0..streams {
        send = match send.clone().ready().await {
            Ok(s) => s,
            Err(_) => break,
        };
        let req = http::Request::builder()
            .method("POST")
            .uri("http://127.0.0.1/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        match send.send_request(req, false) {
            Ok((response, body)) => {
                held.push(Box::new((response, body)));
                opened.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => break,
        }
    }
    held.push(Box::new(send));
    held
}

#[tokio::test]
async fn unauthenticated_floods_leave_chat_working_memory_bounded_and_cpu_idle_after() {
    agentrt_server::transport::raise_fd_limit();
    const CONNECTIONS: usize = 10;
    const STREAMS: usize = 10_000;
    const IDLE: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "");
    let server = start(dir.path(), &config, None).await;
    let addr = server.addr;
    // Warm up (allocator arenas, the runner) before the baseline.
    legit_chat(addr).await;
    let baseline = rss_kib(server.pid);

    // 10k half-open streams over 10 connections.
    let opened = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut attackers = Vec::new();
    for _ in 0..CONNECTIONS {
        let opened = Arc::clone(&opened);
        let mut stop = stop_rx.clone();
        attackers.push(tokio::spawn(async move {
            let held = tokio::select! {
                held = half_open_streams(addr, STREAMS / CONNECTIONS, opened) => held,
                _ = stop.wait_for(|s| *s) => Vec::new(),
            };
            let _ = stop.wait_for(|s| *s).await;
            drop(held);
        }));
    }
    // Until the attackers stop making progress (all streams open, or the
    // server's limits hold them back).
    let ticks_at_start = cpu_ticks(server.pid);
    let attack_start = Instant::now();
    let mut peak = rss_kib(server.pid);
    let mut last = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        peak = peak.max(rss_kib(server.pid));
        let now = opened.load(Ordering::Relaxed);
        if now >= STREAMS {
            break;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > Duration::from_millis(750) {
            break;
        }
    }
    let streams_open = opened.load(Ordering::Relaxed);

    // 2,000 idle TCP connections that never send a byte.
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        if let Ok(s) = attacker_socket(addr).await {
            idle.push(s);
        }
    }
    peak = peak.max(rss_kib(server.pid));

    // The legitimate client is served meanwhile.
    let answer = tokio::time::timeout(Duration::from_secs(20), legit_chat(addr))
        .await
        .expect("a normal Chat completes during the attack");
    assert!(answer.contains("still there?"), "{answer:?}");
    peak = peak.max(rss_kib(server.pid));
    let hz = clock_ticks_per_second() as f64;
    let during =
        (cpu_ticks(server.pid) - ticks_at_start) as f64 / hz / attack_start.elapsed().as_secs_f64()
            * 100.0;

    // The clients go away.
    let _ = stop_tx.send(true);
    for a in attackers {
        a.await.unwrap();
    }
    drop(idle);
    // Let the server notice the closed connections, then measure.
    legit_chat(addr).await;
    let after = cpu_percent(server.pid, Duration::from_secs(2)).await;
    let rss_after = rss_kib(server.pid);
    println!(
        "half-open streams sent: {streams_open} of {STREAMS}; idle connections made: {IDLE}; \
         RSS baseline {baseline} KiB, peak {peak} KiB (+{} KiB), after {rss_after} KiB; \
         CPU during the attack {during:.1} %, after {after:.1} %",
        peak.saturating_sub(baseline)
    );
    let growth_mib = peak.saturating_sub(baseline) / 1024;
    assert!(
        growth_mib < 32,
        "the attack grew the server by {growth_mib} MiB ({streams_open} half-open streams)"
    );
    assert!(after < 5.0, "CPU after the clients left: {after:.1} %");
}

#[tokio::test]
async fn at_the_fd_limit_the_server_backs_off_and_recovers_when_idle_connections_time_out() {
    agentrt_server::transport::raise_fd_limit();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "[transport]\nhandshake_timeout = \"3s\"\nmax_connections_per_ip = 0\n",
    );
    // 128 descriptors: a few hundred idle connections exhaust them.
    let server = start(dir.path(), &config, Some(128)).await;
    let addr = server.addr;
    let mut idle = Vec::new();
    for _ in 0..400 {
        // Once the listen backlog is full too, a connect waits for SYN
        // retries: stop there.
        match tokio::time::timeout(Duration::from_secs(1), attacker_socket(addr)).await {
            Ok(Ok(s)) => idle.push(s),
            _ if idle.len() >= 150 => break,
            _ => {}
        }
    }
    // Until the server has accepted up to its limit.
    let fd_count = || {
        std::fs::read_dir(format!("/proc/{}/fd", server.pid))
            .unwrap()
            .count()
    };
    let waiting = Instant::now();
    while fd_count() < 120 {
        assert!(
            waiting.elapsed() < Duration::from_secs(20),
            "the server never reached its fd limit (it has {} of 128 open)",
            fd_count()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fds = fd_count();
    // The kernel completes handshakes into the backlog; the server meets
    // EMFILE while accepting them.
    let at_limit = cpu_percent(server.pid, Duration::from_secs(1)).await;
    println!(
        "CPU at the fd limit ({fds} fds open, {} connections made): {at_limit:.1} %",
        idle.len()
    );
    assert!(
        at_limit < 30.0,
        "the accept loop spins at the fd limit: {at_limit:.1} % CPU"
    );
    // Idle connections are closed after the handshake timeout, so the
    // legitimate client gets in although the attacker keeps its sockets.
    let answer = tokio::time::timeout(Duration::from_secs(30), legit_chat(addr))
        .await
        .expect("a Chat completes once idle connections have timed out");
    assert!(answer.contains("still there?"));
    drop(idle);
}
