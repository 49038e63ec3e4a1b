//! Session-scoped MCP servers with the `agentrt-server` binary as a child
//! process: a process per session in its own working directory, stopped
//! when the session's runner is evicted (its reported files kept as
//! blobs), and no tool process left behind by SIGTERM or SIGKILL of the
//! server. The tool server is `crates/runtime/examples/mcp_test_server.rs`;
//! each of its processes records `ready <pid>` in `MCP_TEST_RECORD`, and
//! ignores the end of its stdin (`MCP_TEST_LINGER`): only a signal stops
//! it, so a server that merely closed its pipes (or died) would leave it
//! running.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use agentrt_runtime::blobs::digest;
use agentrt_testkit::fake_openai::{FakeOpenAi, FakeReply, finish_chunk, sse_data, text_chunk};
use agentrt_testkit::tools::mcp_test_server;
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};

/// Failure guard of every wait.
const WAIT: Duration = Duration::from_secs(30);

struct Server {
    child: Child,
    client: Client,
    dir: tempfile::TempDir,
}

impl Server {
    /// The server with a session-scoped (`ws`, under limits) and a global
    /// (`g`) instance of the test MCP server.
    async fn start(fake: &FakeOpenAi) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("agentrt.toml");
        let bin = mcp_test_server().display();
        let record = |name: &str| dir.path().join(name).display().to_string();
        let text = format!(
            r#"default_model = "mock/m"
shutdown_grace = "1s"

[[providers]]
name = "mock"
kind = "openai"
base_url = "{}"

[[mcp_servers]]
name = "ws"
command = "{bin}"
scope = "session"
open_files_limit = 256
env = {{ MCP_TEST_RECORD = "{}", MCP_TEST_LINGER = "1" }}

[[mcp_servers]]
name = "g"
command = "{bin}"
env = {{ MCP_TEST_RECORD = "{}", MCP_TEST_LINGER = "1" }}
"#,
            fake.base_url(),
            record("session-record"),
            record("global-record"),
        );
        std::fs::write(&config, text).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_agentrt-server"))
            .args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--config")
            .arg(&config)
            .env("AGENTRT_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = tokio::time::timeout(WAIT, lines.next_line())
            .await
            .expect("the server announced its address")
            .unwrap()
            .expect("a line on stdout");
        let addr = line
            .strip_prefix("agentrt-server listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let client = Client::connect(format!("http://{addr}")).await.unwrap();
        Self { child, client, dir }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// The pids the `record` file lists (`ready <pid>` lines).
    fn recorded(&self, record: &str) -> Vec<u32> {
        std::fs::read_to_string(self.dir.path().join(record))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("ready ")?.parse().ok())
            .collect()
    }

    async fn session(&self) -> String {
        self.client
            .create_session(proto::CreateSessionRequest::default())
            .await
            .unwrap()
            .session_id
    }

    /// A turn; the content of its tool results.
    async fn turn(&self, session: &str) -> Vec<String> {
        let events = self.client.chat(session, "go").await.unwrap();
        let summary = tokio::time::timeout(WAIT, events.finish())
            .await
            .expect("the turn ended")
            .unwrap();
        summary
            .events
            .iter()
            .filter_map(|e| match &e.kind {
                ChatEvent::ToolUse(t) if t.status() == proto::ToolStatus::Done => {
                    Some(t.content.clone())
                }
                _ => None,
            })
            .collect()
    }

    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([signal, &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// A model step calling `name` with `arguments`.
fn call(name: &str, arguments: serde_json::Value) -> FakeReply {
    let call = json!({
        "index": 0, "id": "call-1", "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}
    });
    FakeReply::sse(vec![
        sse_data(&json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})),
        finish_chunk("tool_calls"),
    ])
}

fn answer() -> FakeReply {
    FakeReply::sse(vec![text_chunk("done"), finish_chunk("stop")])
}

/// Whether `pid` runs (not gone, not a zombie), and its parent's pid.
fn process(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
    let state = rest.next()?;
    if state.starts_with(['Z', 'X']) {
        return None;
    }
    rest.next()?.parse().ok()
}

/// Polls, at most `limit`, until none of `pids` runs; how long it took.
async fn all_gone(pids: &[u32], limit: Duration) -> Result<Duration, Vec<u32>> {
    let started = Instant::now();
    loop {
        let running: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| process(*p).is_some())
            .collect();
        if running.is_empty() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            return Err(running);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn evicting_runners_stops_session_processes_and_keeps_their_files_as_blobs() {
    let fake = FakeOpenAi::start(vec![
        call("ws__pwd", json!({})),
        answer(),
        call("ws__pwd", json!({})),
        answer(),
        call(
            "ws__write_file",
            json!({"name": "notes.md", "text": "# kept"}),
        ),
        answer(),
    ])
    .await;
    let server = Server::start(&fake).await;
    let (a, b) = (server.session().await, server.session().await);
    let dir_a = server.turn(&a).await;
    let dir_b = server.turn(&b).await;
    assert_eq!((dir_a.len(), dir_b.len()), (1, 1), "{dir_a:?} {dir_b:?}");
    assert_ne!(dir_a, dir_b, "two sessions, two working directories");
    let workspaces = std::fs::canonicalize(server.dir.path().join("data/workspaces")).unwrap();
    assert!(Path::new(&dir_a[0]).starts_with(&workspaces), "{dir_a:?}");
    let wrote = server.turn(&a).await;
    assert!(wrote[0].contains("resource link"), "{wrote:?}");

    let pids = server.recorded("session-record");
    assert_eq!(pids.len(), 2, "one process per session: {pids:?}");
    for pid in &pids {
        // Started through the launcher, which became the tool in place.
        assert_eq!(process(*pid), Some(server.pid()), "a child of the server");
    }
    let evicted = server.client.reset_runners("").await.unwrap();
    assert_eq!(evicted, 2);
    let took = all_gone(&pids, Duration::from_secs(1))
        .await
        .unwrap_or_else(|left| panic!("still running a second after eviction: {left:?}"));
    eprintln!("eviction to processes gone: {took:?}");

    // The reported file is a blob of the session: listed, and read
    // through the API.
    let id = digest(b"# kept");
    let started = Instant::now();
    loop {
        let listed = server.client.list_blobs(&a).await.unwrap();
        if listed
            .iter()
            .any(|b| b.blob_id == id && b.name == "notes.md")
        {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "the reported file never became a blob: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (blob, bytes) = server.client.get_blob(&a, &id).await.unwrap();
    assert_eq!((blob.name.as_str(), blob.size), ("notes.md", 6));
    assert_eq!(bytes, b"# kept");
    assert!(server.client.get_blob(&b, &id).await.is_err(), "not b's");
    let global = server.recorded("global-record");
    assert_eq!(global.len(), 1);
    assert!(process(global[0]).is_some(), "the global server stays");
}

#[tokio::test]
async fn sigterm_leaves_no_tool_process_behind() {
    let fake = FakeOpenAi::start(vec![answer(), answer()]).await;
    let mut server = Server::start(&fake).await;
    for _ in 0..2 {
        let session = server.session().await;
        server.turn(&session).await;
    }
    let mut pids = server.recorded("session-record");
    pids.extend(server.recorded("global-record"));
    assert_eq!(pids.len(), 3, "{pids:?}");
    assert!(pids.iter().all(|p| process(*p).is_some()));

    server.signal("-TERM");
    let status = tokio::time::timeout(WAIT, server.child.wait())
        .await
        .expect("the server exited")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let left: Vec<u32> = pids
        .iter()
        .copied()
        .filter(|p| process(*p).is_some())
        .collect();
    assert!(
        left.is_empty(),
        "tool processes outlived the server: {left:?}"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_killed_server_takes_its_tool_processes_with_it() {
    let fake = FakeOpenAi::start(vec![answer()]).await;
    let mut server = Server::start(&fake).await;
    let session = server.session().await;
    server.turn(&session).await;
    let mut pids = server.recorded("session-record");
    pids.extend(server.recorded("global-record"));
    assert_eq!(pids.len(), 2, "{pids:?}");

    server.signal("-KILL");
    server.child.wait().await.unwrap();
    let took = all_gone(&pids, Duration::from_secs(1))
        .await
        .unwrap_or_else(|left| panic!("outlived a SIGKILL of the server: {left:?}"));
    eprintln!("server killed to tool processes gone: {took:?}");
}
