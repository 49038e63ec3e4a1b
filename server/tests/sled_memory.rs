//! The resident memory of `agentrt-server` on its embedded store (sled):
//! the binary as a child process whose `VmRSS` (`/proc/<pid>/status`) is
//! read while 1 MiB turns (the built-in echo model, which answers
//! `You said: <text>`) are written and while every history is read back
//! after a restart. RELIABILITY.md ("Memory on the embedded store") gives
//! the bound and the figures.
//!
//! `the_resident_set_stays_bounded_while_writing_and_reading_10x_the_cache`
//! runs in CI (debug build, well under a minute). The full run of the
//! figures is ignored by default and configured through the environment:
//!
//! ```text
//! cargo build --release -p agentrt-server
//! AGENTRT_SERVER_BIN=$CARGO_TARGET_DIR/release/agentrt-server SLED_MEMORY_SECS=60 \
//!   cargo test -p agentrt-server --test sled_memory -- --ignored --nocapture
//! ```

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentrt_client::{Client, proto};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

const MIB: u64 = 1 << 20;

/// The growth bound of RELIABILITY.md: over a warmed-up server, the
/// resident set grows by at most the page cache plus this much, whatever
/// the amount stored (measured: +36 to +50 MiB, most of it glibc's malloc
/// keeping freed 1 MiB buffers; before bodies left sled, +214 MiB for the
/// 96 MiB of turns here, growing with every byte).
const FIXED_BOUND_MIB: u64 = 96;

struct Server {
    child: Child,
    url: String,
    pid: u32,
}

impl Server {
    async fn start(data_dir: &Path, cache_mb: u64) -> Self {
        let bin = std::env::var_os("AGENTRT_SERVER_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_agentrt-server").into());
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--store-cache-mb"])
            .arg(cache_mb.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .env("AGENTRT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the server announced its address")
            .unwrap()
            .expect("a line on stdout");
        let addr = line
            .strip_prefix("agentrt-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Self {
            child,
            url: format!("http://{addr}"),
            pid,
        }
    }

    /// `VmRSS` in MiB (fractional).
    fn rss_mib(&self) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .expect("VmRSS in /proc/<pid>/status");
        kb as f64 / 1024.0
    }

    async fn client(&self) -> Client {
        Client::connect(self.url.clone()).await.unwrap()
    }

    async fn stop(mut self) {
        let pid = self.pid.to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(sent.success());
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("the server stopped")
            .unwrap();
        assert!(status.success(), "{status:?}");
    }
}

/// A turn's text: `bytes` of one word (the echo model answers in one delta
/// per word, so no spaces), different for every turn.
fn turn_text(bytes: usize, n: u64) -> String {
    let mut text = format!("t{n}-");
    let fill = b"abcdefghijklmnopqrstuvwxyz0123456789";
    while text.len() < bytes {
        text.push(fill[(text.len() + n as usize) % fill.len()] as char);
    }
    text
}

/// Runs turns of `turn_bytes` on `clients` connections, a new session every
/// `per_session` turns, until `done` says stop. Returns the turns run.
async fn write_turns(
    url: String,
    clients: usize,
    turn_bytes: usize,
    per_session: u64,
    done: impl Fn(u64) -> bool + Clone + Send + 'static,
) -> u64 {
    let turns = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (url, turns, done) = (url.clone(), turns.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let client = Client::connect(url).await.unwrap();
            let mut session = String::new();
            let mut in_session = per_session;
            loop {
                let n = turns.fetch_add(1, Ordering::Relaxed);
                if done(n) {
                    return;
                }
                if in_session == per_session {
                    session = client
                        .create_session(proto::CreateSessionRequest::default())
                        .await
                        .unwrap()
                        .session_id;
                    in_session = 0;
                }
                in_session += 1;
                let text = turn_text(turn_bytes, n);
                let summary = client
                    .chat(&session, text.as_str())
                    .await
                    .unwrap()
                    .finish()
                    .await
                    .unwrap();
                assert_eq!(summary.text.len(), "You said: ".len() + text.len());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    turns.load(Ordering::Relaxed)
}

/// Reads every session's whole history; returns the bytes of text read.
async fn read_everything(client: &Client) -> u64 {
    let mut bytes = 0;
    let mut page_token = String::new();
    loop {
        let page = client
            .list_sessions(proto::ListSessionsRequest {
                page_size: 100,
                page_token: std::mem::take(&mut page_token),
                ..Default::default()
            })
            .await
            .unwrap();
        for session in &page.sessions {
            for message in client.history(&session.session_id).await.unwrap() {
                for block in message.content {
                    if let Some(proto::content_block::Block::Text(t)) = block.block {
                        bytes += t.text.len() as u64;
                    }
                }
            }
        }
        if page.next_page_token.is_empty() {
            return bytes;
        }
        page_token = page.next_page_token;
    }
}

/// The bytes under `dir`, recursively.
fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| match e.metadata() {
                Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                Ok(m) => m.len(),
                Err(_) => 0,
            })
            .sum()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_resident_set_stays_bounded_while_writing_and_reading_10x_the_cache() {
    const CACHE_MB: u64 = 4;
    const TURN_BYTES: usize = 1 << 20;
    // Each turn stores its text twice (the question and the echo): 48
    // turns store 24x the page cache.
    const TURNS: u64 = 48;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, CACHE_MB).await;
    // A first turn warms everything up that does not grow with the data.
    write_turns(server.url.clone(), 1, TURN_BYTES, 4, |n| n >= 1).await;
    let warm = server.rss_mib();
    let bound = warm + (CACHE_MB + FIXED_BOUND_MIB) as f64;
    write_turns(server.url.clone(), 4, TURN_BYTES, 4, |n| n >= TURNS).await;
    let written = server.rss_mib();
    let stored = dir_bytes(&data) as f64 / MIB as f64;
    eprintln!(
        "write: warm {warm:.1} MiB, after {TURNS} turns {written:.1} MiB; {stored:.0} MiB on disk"
    );
    assert!(stored >= (10 * CACHE_MB) as f64, "{stored} MiB stored");
    assert!(
        written < bound,
        "writing {stored:.0} MiB took the resident set to {written:.1} MiB (bound {bound} MiB)"
    );
    server.stop().await;

    let server = Server::start(&data, CACHE_MB).await;
    let client = server.client().await;
    let before = server.rss_mib();
    let read = read_everything(&client).await;
    let after = server.rss_mib();
    let bound = before + (CACHE_MB + FIXED_BOUND_MIB) as f64;
    eprintln!(
        "read: {before:.1} MiB before, {after:.1} MiB after reading {} MiB",
        read / MIB
    );
    assert!(
        read >= (TURNS + 1) * 2 * TURN_BYTES as u64,
        "{read} bytes read"
    );
    assert!(
        after < bound,
        "reading {} MiB took the resident set to {after:.1} MiB (bound {bound} MiB)",
        read / MIB
    );
    server.stop().await;
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The run behind RELIABILITY.md's figures: `SLED_MEMORY_SECS` (60) of
/// `SLED_MEMORY_CLIENTS` (4) clients writing `SLED_MEMORY_TURN_KIB` (1024)
/// turns, a new session every 4 turns, on a `SLED_MEMORY_CACHE_MB` (16)
/// page cache; then 20 s idle; then a restart and every history read.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "minutes long; run with --ignored for RELIABILITY.md's figures"]
async fn figures_for_reliability_md() {
    let secs = env_or("SLED_MEMORY_SECS", 60);
    let clients = usize::try_from(env_or("SLED_MEMORY_CLIENTS", 4)).unwrap();
    let turn_bytes = usize::try_from(env_or("SLED_MEMORY_TURN_KIB", 1024) << 10).unwrap();
    let cache_mb = env_or("SLED_MEMORY_CACHE_MB", 16);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start(&data, cache_mb).await;
    let bound = server.rss_mib() + (cache_mb + FIXED_BOUND_MIB) as f64;
    let started = Instant::now();
    eprintln!("{:>6} {:>10} {:>10}", "s", "RSS MiB", "disk MiB");
    let sample = |server: &Server, at: Instant| {
        let rss = server.rss_mib();
        let disk = dir_bytes(&data) as f64 / MIB as f64;
        eprintln!(
            "{:>6.0} {rss:>10.1} {disk:>10.0}",
            at.elapsed().as_secs_f64()
        );
        rss
    };
    let mut peak = sample(&server, started);
    let deadline = started + Duration::from_secs(secs);
    let writing = tokio::spawn(write_turns(
        server.url.clone(),
        clients,
        turn_bytes,
        4,
        move |_| Instant::now() >= deadline,
    ));
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    tick.tick().await;
    while !writing.is_finished() {
        tick.tick().await;
        peak = peak.max(sample(&server, started));
    }
    let turns = writing.await.unwrap();
    eprintln!("{turns} turns of {} KiB", turn_bytes >> 10);
    for _ in 0..4 {
        tick.tick().await;
        peak = peak.max(sample(&server, started));
    }
    server.stop().await;

    let server = Server::start(&data, cache_mb).await;
    let client = server.client().await;
    let before = server.rss_mib();
    let read_started = Instant::now();
    let read = read_everything(&client).await;
    let after = server.rss_mib();
    eprintln!(
        "after a restart: {before:.1} MiB; every history read ({} MiB of text, {:.1} s): {after:.1} MiB",
        read / MIB,
        read_started.elapsed().as_secs_f64()
    );
    server.stop().await;
    assert!(peak < bound, "peak {peak:.1} MiB (bound {bound} MiB)");
    assert!(
        after < bound,
        "after reading {after:.1} MiB (bound {bound} MiB)"
    );
}
