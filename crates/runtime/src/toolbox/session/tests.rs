//! Session-scoped MCP servers through the runtime, with the real stdio
//! test server (`examples/mcp_test_server.rs`) and a model that calls the
//! tool its user message names.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt as _;

use crate::blobs::Blobs;
use crate::events::EventKind;
use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models};
use crate::runtime::{ChatInput, Runtime, RuntimeConfig};
use crate::store::MemoryStore;
use crate::toolbox::mcp::{McpSessionFactory, McpTarget};
use crate::toolbox::sandbox::{Launcher, Limits};
use crate::toolbox::{BlobExporter, Toolbox, WorkspaceSettings};
use crate::types::{ContentBlock, NewSession, Principal, StopReason};

/// Failure guard of every wait.
const WAIT: Duration = Duration::from_secs(20);

/// The test MCP server, next to this test binary's directory
/// (`target/<profile>/examples`); built when missing.
fn mcp_test_server() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps");
        let path = profile
            .join("examples")
            .join(format!("mcp_test_server{}", std::env::consts::EXE_SUFFIX));
        if !path.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let status = std::process::Command::new(cargo)
                .args([
                    "build",
                    "-p",
                    "agentrt-runtime",
                    "--example",
                    "mcp_test_server",
                ])
                .status()
                .expect("running cargo build");
            assert!(status.success(), "building the MCP test server failed");
        }
        path
    })
}

/// Calls the tool its user message names (`tool {json args}`), then
/// answers with the tool's result.
#[derive(Debug)]
struct CallsTheNamedTool;

#[async_trait]
impl ModelProvider for CallsTheNamedTool {
    async fn stream(&self, request: ModelRequest) -> Result<ModelStream, ModelError> {
        let last = request.messages.last().map(|m| m.body.content.clone());
        let mut events = Vec::new();
        for block in last.unwrap_or_default() {
            match block {
                ContentBlock::ToolResult { content, .. } => {
                    events.push(ModelEvent::TextDelta(content));
                    events.push(ModelEvent::Finished(StopReason::Stop));
                }
                ContentBlock::Text { text } => {
                    let (name, args) = text.split_once(' ').unwrap_or((&text, "{}"));
                    events.push(ModelEvent::ToolCall {
                        id: "call-1".to_owned(),
                        name: name.to_owned(),
                        arguments_json: args.to_owned(),
                    });
                    events.push(ModelEvent::Finished(StopReason::ToolUse));
                }
                _ => {}
            }
        }
        Ok(Box::pin(futures::stream::iter(events.into_iter().map(Ok))))
    }
}

struct Setup {
    rt: Runtime,
    dir: tempfile::TempDir,
    blobs: Arc<Blobs>,
}

impl Setup {
    async fn new(factory: McpSessionFactory) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let blobs = Arc::new(Blobs::local(&dir.path().join("blobs")).unwrap());
        let mut toolbox = Toolbox::new();
        toolbox.add_session_source("ws", Arc::new(factory)).unwrap();
        toolbox.set_workspaces(WorkspaceSettings {
            root: dir.path().join("workspaces"),
            exporter: Some(Arc::new(BlobExporter::new(Arc::clone(&blobs)))),
            ..WorkspaceSettings::default()
        });
        let mut models = Models::with_builtin();
        models.insert("caller", Arc::new(CallsTheNamedTool));
        let config = RuntimeConfig {
            default_model: "caller/m".to_owned(),
            ..RuntimeConfig::default()
        };
        let rt = Runtime::open_with_tools(
            config,
            Arc::new(MemoryStore::new()),
            models,
            Arc::new(toolbox),
        )
        .await
        .unwrap();
        Self { rt, dir, blobs }
    }

    async fn session(&self) -> String {
        let who = Principal::local();
        self.rt
            .create_session(&who, NewSession::default())
            .await
            .unwrap()
            .id
    }

    /// Runs a turn calling `tool` with `args`; the tool's result text.
    async fn call(&self, session_id: &str, tool: &str, args: &str) -> String {
        let input = ChatInput {
            session_id: session_id.to_owned(),
            content: vec![ContentBlock::text(format!("{tool} {args}"))],
            ..ChatInput::default()
        };
        let mut turn = self.rt.chat(&Principal::local(), input).await.unwrap();
        let read = async {
            let mut text = String::new();
            while let Some(event) = turn.next().await {
                match &event.kind {
                    EventKind::Text(t) => text.push_str(t),
                    EventKind::TurnFinished { .. } => return text,
                    _ => {}
                }
            }
            panic!("the turn ended without TurnFinished");
        };
        tokio::time::timeout(WAIT, read)
            .await
            .expect("the turn ended")
    }
}

fn stdio() -> McpTarget {
    McpTarget::Stdio {
        command: mcp_test_server().display().to_string(),
        args: Vec::new(),
        env: Default::default(),
    }
}

/// Whether process `pid` is running (not gone, not a zombie).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// Waits, polling at most `limit`, until `pid` is no longer running; how
/// long that took, or `None`.
async fn gone_within(pid: u32, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if !running(pid) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_get_their_own_process_and_working_directory() {
    let setup = Setup::new(McpSessionFactory::new("ws", stdio())).await;
    let (a, b) = (setup.session().await, setup.session().await);
    let dir_a = setup.call(&a, "ws__pwd", "{}").await;
    let dir_b = setup.call(&b, "ws__pwd", "{}").await;
    assert_ne!(dir_a, dir_b);
    let root = std::fs::canonicalize(setup.dir.path().join("workspaces")).unwrap();
    for (dir, id) in [(&dir_a, &a), (&dir_b, &b)] {
        assert!(Path::new(dir).starts_with(&root), "{dir} under {root:?}");
        assert!(!dir.contains(id.as_str()), "the session id is no path part");
    }
    let pid_a = setup.call(&a, "ws__pid", "{}").await;
    let pid_b = setup.call(&b, "ws__pid", "{}").await;
    assert_ne!(pid_a, pid_b);
    assert_eq!(
        setup.call(&a, "ws__pid", "{}").await,
        pid_a,
        "one process per session"
    );
    assert_eq!(setup.rt.open_session_tools(), 2);
    setup
        .rt
        .shutdown(Duration::ZERO, Duration::from_secs(5))
        .await;
    for pid in [pid_a, pid_b] {
        let pid = pid.parse().unwrap();
        assert!(!running(pid), "shutdown stopped {pid}");
    }
    assert_eq!(setup.rt.open_session_tools(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicting_a_runner_stops_its_process_and_exports_its_files() {
    let setup = Setup::new(McpSessionFactory::new("ws", stdio())).await;
    let session = setup.session().await;
    let pid: u32 = setup.call(&session, "ws__pid", "{}").await.parse().unwrap();
    let dir = setup.call(&session, "ws__pwd", "{}").await;
    let wrote = setup
        .call(
            &session,
            "ws__write_file",
            r#"{"name":"report.txt","text":"the report"}"#,
        )
        .await;
    assert!(wrote.contains("resource link"), "{wrote}");
    assert!(running(pid));

    let evicted_at = Instant::now();
    let reaped = setup
        .rt
        .reap_idle_runners(Instant::now() + Duration::from_secs(3600));
    assert_eq!(reaped, 1);
    let took = gone_within(pid, Duration::from_secs(1))
        .await
        .expect("the session's process stopped within a second of the eviction");
    eprintln!("eviction to process gone: {took:?}");

    let id = crate::blobs::digest(b"the report");
    let owner = Principal::local().user_id;
    let meta = loop {
        match setup.blobs.meta(&owner, &id).await {
            Ok(meta) => break meta,
            Err(_) if evicted_at.elapsed() < WAIT => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the reported file was never exported: {e}"),
        }
    };
    eprintln!("eviction to blob stored: {:?}", evicted_at.elapsed());
    assert_eq!(
        (meta.name.as_str(), meta.mime_type.as_str()),
        ("report.txt", "text/plain")
    );
    assert_eq!(meta.size, 10);
    // Closed: the workspace is gone, and the next turn starts afresh.
    let closed = Instant::now();
    while Path::new(&dir).exists() && closed.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!Path::new(&dir).exists(), "the workspace was removed");
    let again: u32 = setup.call(&session, "ws__pid", "{}").await.parse().unwrap();
    assert_ne!(again, pid);
    assert_ne!(setup.call(&session, "ws__pwd", "{}").await, dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_session_stops_its_process() {
    let setup = Setup::new(McpSessionFactory::new("ws", stdio())).await;
    let session = setup.session().await;
    let pid: u32 = setup.call(&session, "ws__pid", "{}").await.parse().unwrap();
    setup
        .rt
        .delete_session(&Principal::local(), &session)
        .await
        .unwrap();
    assert!(gone_within(pid, Duration::from_secs(1)).await.is_some());
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandboxed_process_runs_under_its_limits_without_network() {
    let limits = Limits {
        memory_bytes: Some(1 << 30),
        cpu_seconds: Some(100),
        open_files: Some(64),
        network: false,
    };
    let launcher = Launcher::new(mcp_test_server());
    let setup =
        Setup::new(McpSessionFactory::new("ws", stdio()).with_sandbox(launcher.clone(), limits))
            .await;
    let session = setup.session().await;
    let text = setup.call(&session, "ws__limits", "{}").await;
    let limit = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .map(|l| {
                l[name.len()..]
                    .split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    };
    assert_eq!(limit("Max open files"), ["64", "64"]);
    assert_eq!(limit("Max cpu time"), ["100", "101"]);
    assert_eq!(limit("Max data size"), ["1073741824", "1073741824"]);
    let root = std::fs::canonicalize(setup.dir.path().join("workspaces")).unwrap();
    let pwd = setup.call(&session, "ws__pwd", "{}").await;
    assert!(Path::new(&pwd).starts_with(&root), "{pwd}");

    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = format!(r#"{{"addr":"{}"}}"#, listener.local_addr().unwrap());
    let answer = setup.call(&session, "ws__connect", &addr).await;
    assert!(answer.starts_with("failed"), "{answer}");

    // The same server with the network allowed reaches the listener.
    let open =
        Setup::new(McpSessionFactory::new("ws", stdio()).with_sandbox(launcher, Limits::default()))
            .await;
    let session = open.session().await;
    assert_eq!(open.call(&session, "ws__connect", &addr).await, "connected");
}
