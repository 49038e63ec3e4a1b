//! LangGraph's in-memory Agent Server (`langgraph dev`) as a child process:
//! the venv it runs from (created and filled from the pinned
//! `crates/bench/langgraph/requirements.txt` and `constraints.txt` when
//! missing or stale), a fresh working directory per server, the environment
//! that keeps it offline, the port it really bound, and its process tree's
//! CPU and memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;

use crate::venv::{self, Pins, Unavailable, Venv, output, tail};

/// The checked-in directory with `graph.py`, `langgraph.json` and the pins.
pub(crate) const GRAPH_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/langgraph");

/// The graph's id in `langgraph.json` (the runs' `assistant_id`).
pub(crate) const GRAPH_ID: &str = "bench";

/// The distributions whose versions the report names.
const REPORTED: &[&str] = &[
    "langgraph-cli",
    "langgraph-api",
    "langgraph-runtime-inmem",
    "langgraph",
    "langgraph-checkpoint",
    "langchain-core",
    "langchain-openai",
    "openai",
    "uvicorn",
];

/// Environment given to the server: what keeps it offline and quiet.
/// `(name, value)`; the names in [`ENV_REMOVED`] are taken out.
pub(crate) const ENV_SET: &[(&str, &str)] = &[
    // No LangSmith tracing of runs (every spelling the server reads).
    ("LANGSMITH_TRACING", "false"),
    ("LANGSMITH_TRACING_V2", "false"),
    ("LANGCHAIN_TRACING_V2", "false"),
    ("LANGCHAIN_TRACING", "false"),
    // The CLI's usage analytics.
    ("LANGGRAPH_CLI_NO_ANALYTICS", "1"),
    // The server's check for a newer langgraph-api on PyPI at start-up.
    ("LANGGRAPH_NO_VERSION_CHECK", "true"),
];

/// Taken out of the server's environment: with no license key and no
/// LangSmith key the server skips its usage-metadata loop (its "license"
/// module is a no-op without a key), and with no proxy its HTTP client
/// goes straight to the fake on loopback.
pub(crate) const ENV_REMOVED: &[&str] = &[
    "LANGGRAPH_CLOUD_LICENSE_KEY",
    "LANGSMITH_API_KEY",
    "LANGCHAIN_API_KEY",
    "LANGSMITH_CONTROL_PLANE_API_KEY",
    "LANGSMITH_ENDPOINT",
    "LANGCHAIN_ENDPOINT",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// What the server's venv is filled from.
pub(crate) const PINS: Pins = Pins {
    dir: GRAPH_DIR,
    marker: "langgraph",
    part: "langgraph",
};

/// `langgraph-venv` in the target directory of this executable
/// (`target/release/agentrt-bench` → `target/langgraph-venv`).
pub(crate) fn default_venv() -> PathBuf {
    venv::beside_target("langgraph-venv")
}

/// The venv at `dir` with the pinned server installed (see [`venv::ensure`]).
pub(crate) async fn ensure_venv(dir: &Path) -> Result<Venv, Unavailable> {
    venv::ensure(dir, PINS).await
}

/// The Python version and the [`REPORTED`] distributions' versions.
pub(crate) async fn versions(venv: &Venv) -> Result<(String, BTreeMap<String, String>), String> {
    let script = format!(
        "import importlib.metadata as m, json, sys\n\
         print(sys.version.split()[0])\n\
         print(json.dumps({{d: m.version(d) for d in {REPORTED:?}}}))"
    );
    let out = output(
        Command::new(venv.bin("python")).args(["-c", &script]),
        Duration::from_secs(60),
    )
    .await
    .map_err(|e| format!("python versions: {e}"))?;
    if !out.status.success() {
        return Err(format!("python versions: {}", tail(&out.stderr)));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let python = lines.next().unwrap_or_default().to_owned();
    let map = serde_json::from_str(lines.next().unwrap_or_default())
        .map_err(|e| format!("python versions: {e}"))?;
    Ok((python, map))
}

/// Text without ANSI escape sequences (`ESC [ ... letter`).
pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The API address from the server's banner line `- 🚀 API: http://…`.
pub(crate) fn api_url(line: &str) -> Option<String> {
    let clean = strip_ansi(line);
    let rest = clean.split_once("API:")?.1.trim();
    let url = rest.split_whitespace().next()?;
    url.starts_with("http://").then(|| url.to_owned())
}

/// N of the server's log line "Starting N background workers".
pub(crate) fn workers_started(line: &str) -> Option<u64> {
    let rest = line.split_once("Starting ")?.1;
    let (n, rest) = rest.split_once(' ')?;
    rest.starts_with("background workers")
        .then(|| n.parse().ok())
        .flatten()
}

/// Copies the lines of one of the server's pipes to the log (without
/// colours), sending the API address and noting the job count when seen.
fn spawn_copier(
    pipe: impl tokio::io::AsyncRead + Unpin + Send + 'static,
    log: Arc<tokio::sync::Mutex<tokio::fs::File>>,
    url_tx: tokio::sync::mpsc::Sender<String>,
    jobs: Arc<AtomicU64>,
) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let clean = strip_ansi(&line);
            if let Some(url) = api_url(&clean) {
                let _ = url_tx.try_send(url);
            }
            if let Some(n) = workers_started(&clean) {
                jobs.store(n, Ordering::Relaxed);
            }
            let mut log = log.lock().await;
            let _ = log.write_all(clean.as_bytes()).await;
            let _ = log.write_all(b"\n").await;
        }
    });
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// How to start one server.
#[derive(Debug, Clone)]
pub(crate) struct PeerSpec {
    pub(crate) venv: Venv,
    /// `--n-jobs-per-worker`; `None` leaves the CLI's default.
    pub(crate) jobs: Option<usize>,
    /// The fake's `http://127.0.0.1:PORT/v1`.
    pub(crate) fake_url: String,
    /// `taskset -c CPUS`, as `--server-cpus` gives the agentrt server.
    pub(crate) cpus: Option<String>,
}

impl PeerSpec {
    /// The command line (without the venv path), for the report.
    pub(crate) fn command(&self) -> String {
        let mut c = String::from(
            "langgraph dev --host 127.0.0.1 --port PORT --no-browser --no-reload --config langgraph.json",
        );
        if let Some(n) = self.jobs {
            c.push_str(&format!(" --n-jobs-per-worker {n}"));
        }
        c
    }
}

/// A running server. Killed when dropped; [`Peer::stop`] sends SIGTERM
/// first. Its working directory (where it pickles its state to
/// `.langgraph_api/`) is removed after it exits.
#[derive(Debug)]
pub(crate) struct Peer {
    child: tokio::process::Child,
    pid: u32,
    url: String,
    /// The port asked for, when the server bound another.
    pub(crate) moved_from: Option<u16>,
    /// Spawn → `GET /ok` answered 200.
    pub(crate) ready_after: Duration,
    /// N of its log line "Starting N background workers"; 0 until seen.
    jobs_logged: Arc<AtomicU64>,
    workdir: Option<tempfile::TempDir>,
}

impl Peer {
    /// Starts a server in a new working directory under `root` (its output
    /// goes to `root/NAME.log`) and waits until `GET /ok` answers.
    pub(crate) async fn start(spec: &PeerSpec, root: &Path, name: &str) -> Result<Self, String> {
        let workdir = tempfile::Builder::new()
            .prefix(&format!("{name}-"))
            .tempdir_in(root)
            .map_err(|e| format!("temp dir: {e}"))?;
        for file in ["graph.py", "langgraph.json"] {
            let from = Path::new(GRAPH_DIR).join(file);
            std::fs::copy(&from, workdir.path().join(file))
                .map_err(|e| format!("copy {}: {e}", from.display()))?;
        }
        let port = free_port()?;
        let langgraph = spec.venv.bin("langgraph");
        let mut cmd = match &spec.cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(&langgraph);
                c
            }
            None => Command::new(&langgraph),
        };
        cmd.args(["dev", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--no-browser", "--no-reload", "--config", "langgraph.json"]);
        if let Some(n) = spec.jobs {
            cmd.args(["--n-jobs-per-worker", &n.to_string()]);
        }
        cmd.current_dir(workdir.path())
            .env("AGENTRT_BENCH_FAKE_URL", &spec.fake_url)
            .envs(ENV_SET.iter().copied());
        for name in ENV_REMOVED {
            cmd.env_remove(name);
        }
        let log_path = root.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .map_err(|e| format!("create {}: {e}", log_path.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let spawned = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", langgraph.display()))?;
        let pid = child.id().ok_or("the server exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        // It logs to both (its banner with the address to stderr, the
        // rest to stdout): both are copied to the log file for as long as
        // it runs (an unread pipe would block the server once full).
        let (url_tx, url_rx) = tokio::sync::mpsc::channel(2);
        let jobs_logged = Arc::new(AtomicU64::new(0));
        let log = Arc::new(tokio::sync::Mutex::new(tokio::fs::File::from_std(log)));
        spawn_copier(
            stdout,
            Arc::clone(&log),
            url_tx.clone(),
            Arc::clone(&jobs_logged),
        );
        spawn_copier(stderr, log, url_tx, Arc::clone(&jobs_logged));
        let log_tail = || {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            tail(text.as_bytes())
        };
        let mut url_rx = url_rx;
        let url = match tokio::time::timeout(Duration::from_secs(90), url_rx.recv()).await {
            Ok(Some(url)) => url,
            _ => {
                return Err(format!(
                    "langgraph dev printed no API address within 90 s; its log ends:\n{}",
                    log_tail()
                ));
            }
        };
        let bound: Option<u16> = url.rsplit(':').next().and_then(|p| p.parse().ok());
        let moved_from = (bound != Some(port)).then_some(port);
        if moved_from.is_some() {
            eprintln!("agentrt-bench: langgraph: asked for port {port}, the server bound {url}");
        }
        let mut peer = Self {
            child,
            pid,
            url,
            moved_from,
            ready_after: Duration::ZERO,
            jobs_logged,
            workdir: Some(workdir),
        };
        peer.wait_ok(Duration::from_secs(90))
            .await
            .map_err(|e| format!("{e}; its log ends:\n{}", log_tail()))?;
        peer.ready_after = spawned.elapsed();
        Ok(peer)
    }

    async fn wait_ok(&mut self, limit: Duration) -> Result<(), String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("reqwest: {e}"))?;
        let until = Instant::now() + limit;
        let ok = format!("{}/ok", self.url);
        while Instant::now() < until {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the server exited ({status})"));
            }
            if let Ok(r) = http.get(&ok).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(format!("GET {ok} did not answer 200 within {limit:?}"))
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// The job count the server logged at start-up, once it has.
    pub(crate) fn jobs_logged(&self) -> Option<u64> {
        Some(self.jobs_logged.load(Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// SIGTERM, a bounded wait (then SIGKILL), and the working directory
    /// removed.
    pub(crate) async fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .await;
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        if let Some(dir) = self.workdir.take()
            && let Err(e) = dir.close()
        {
            eprintln!("agentrt-bench: langgraph: removing its working directory: {e}");
        }
    }
}

/// The parent pid (field 4) from the text of `/proc/<pid>/stat`.
pub(crate) fn parse_ppid(stat: &str) -> Option<u32> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `pid` and every process below it.
pub(crate) fn process_tree(pid: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(pp) = std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .as_deref()
                .and_then(parse_ppid)
            {
                parents.push((p, pp));
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let cur = tree[i];
        tree.extend(parents.iter().filter(|(_, pp)| *pp == cur).map(|(p, _)| *p));
        i += 1;
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_address_is_read_from_the_coloured_banner() {
        let line = "- \u{1f680} API: \u{1b}[36mhttp://127.0.0.1:2024\u{1b}[0m";
        assert_eq!(api_url(line).as_deref(), Some("http://127.0.0.1:2024"));
        assert_eq!(api_url("- \u{1f4da} API Docs: http://x/docs"), None);
        assert_eq!(api_url("nothing here"), None);
        assert_eq!(strip_ansi("\u{1b}[2mdim\u{1b}[0m text"), "dim text");
    }

    #[test]
    fn the_job_count_is_read_from_the_start_up_log() {
        let line = "2026-12-03T22:28:40Z [info] Starting 1 background workers [queue]";
        assert_eq!(workers_started(line), Some(1));
        assert_eq!(
            workers_started("Starting 100 background workers"),
            Some(100)
        );
        assert_eq!(workers_started("Starting queue with shared loop"), None);
        assert_eq!(workers_started("Starting cron scheduler"), None);
    }

    #[test]
    fn the_parent_pid_is_read_after_the_command_name() {
        let stat = "4242 (py (dev) x) S 4100 4242 4242 0 -1 4194560 1500 0 0 0 731 269";
        assert_eq!(parse_ppid(stat), Some(4100));
        assert_eq!(parse_ppid("garbage"), None);
    }

    #[test]
    fn this_process_tree_includes_a_child() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("spawn sleep");
        let tree = process_tree(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(tree[0], std::process::id());
        assert!(tree.contains(&child.id()), "{tree:?}");
    }

    #[test]
    fn the_pins_name_the_server_at_an_exact_version() {
        let pins = venv::pins(PINS).expect("pins readable");
        assert!(pins.contains("langgraph-cli[inmem]=="), "{pins}");
        assert!(pins.contains("langchain-openai=="), "{pins}");
        for line in pins
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            assert!(line.contains("=="), "not an exact pin: {line}");
        }
    }
}
