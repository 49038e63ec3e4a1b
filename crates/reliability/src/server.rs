//! The server under test: the real `agentrt-server` binary as a child
//! process on `127.0.0.1:0`, its config written to the run directory, its
//! log appended to `server.log` there. [`Server::kill9`] is the crash;
//! dropping a [`Server`] kills it too. [`Health`] polls its health service.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{ChildStdout, Command};

/// How to start the server.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) binary: PathBuf,
    /// The run directory (config, log); the data dir is `dir/data` unless
    /// `data_dir` says otherwise.
    pub(crate) dir: PathBuf,
    /// The whole TOML config.
    pub(crate) config: String,
    /// Extra environment (the PostgreSQL URL).
    pub(crate) env: Vec<(String, String)>,
    /// The data dir when not `dir/data` (the disk battery's is on a small
    /// tmpfs, its log is not).
    pub(crate) data_dir: Option<PathBuf>,
    /// Extra command-line flags.
    pub(crate) args: Vec<String>,
}

impl Spec {
    /// `dir/data` unless `data_dir` is set.
    pub(crate) fn data_dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| self.dir.join("data"))
    }
}

/// The config every battery server runs with: the fake upstream as
/// provider `fake`, optionally the MCP test server as tool source `test`,
/// plus `tail` (a `[store]` table, `[transport]` settings).
pub(crate) fn config(fake_url: &str, mcp: Option<&Path>, tail: &str) -> String {
    let mut out = format!(
        "default_model = \"fake/m\"\n\
         heartbeat_interval = \"1h\"\n\
         shutdown_grace = \"2s\"\n\
         \n\
         [[providers]]\n\
         name = \"fake\"\n\
         kind = \"openai\"\n\
         base_url = \"{fake_url}\"\n\
         idle_timeout = \"60s\"\n"
    );
    if let Some(mcp) = mcp {
        out.push_str(&format!(
            "\n[[mcp_servers]]\nname = \"test\"\ncommand = {:?}\n",
            mcp.display().to_string()
        ));
    }
    out.push_str(tail);
    out
}

/// A running server.
#[derive(Debug)]
pub(crate) struct Server {
    child: tokio::process::Child,
    pid: u32,
    url: String,
    /// Spawn → readiness SERVING.
    pub(crate) ready_after: Duration,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    /// Starts the server and waits until its `readiness` is SERVING.
    pub(crate) async fn start(spec: &Spec) -> Result<Self, String> {
        let config = spec.dir.join("agentrt.toml");
        std::fs::write(&config, &spec.config)
            .map_err(|e| format!("write {}: {e}", config.display()))?;
        let log = spec.dir.join("server.log");
        let logfile = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        let mut cmd = Command::new(&spec.binary);
        cmd.arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(spec.data_dir())
            .arg("--config")
            .arg(&config)
            .args(&spec.args)
            .env("AGENTRT_LOG", "warn")
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(logfile))
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", spec.binary.display()))?;
        let pid = child.id().ok_or("the server exited at once")?;
        let mut stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let limit = Duration::from_secs(30);
        let addr = tokio::time::timeout(limit, async {
            let mut line = String::new();
            loop {
                line.clear();
                match stdout.read_line(&mut line).await {
                    Ok(0) | Err(_) => return Err("the server closed stdout before listening"),
                    Ok(_) => {
                        if let Some(a) = line.trim().strip_prefix("agentrt-server listening on ") {
                            return Ok(a.to_owned());
                        }
                    }
                }
            }
        })
        .await
        .map_err(|_| format!("no listening line within {limit:?} (see {})", log.display()))?
        .map_err(|e| format!("{e} (see {})", log.display()))?;
        let url = format!("http://{addr}");
        wait_ready(&url, limit).await?;
        Ok(Self {
            child,
            pid,
            url,
            ready_after: started.elapsed(),
            _stdout: stdout,
        })
    }

    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Resident set size in KiB (from /proc), 0 when unreadable.
    pub(crate) fn rss_kb(&self) -> u64 {
        rss_kb(self.pid)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still running.
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, then reap it.
    pub(crate) async fn kill9(mut self) -> Result<(), String> {
        self.child
            .start_kill()
            .map_err(|e| format!("kill -9 {}: {e}", self.pid))?;
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .map_err(|_| format!("server {} did not die within 10 s of SIGKILL", self.pid))?
            .map_err(|e| format!("wait for {}: {e}", self.pid))?;
        Ok(())
    }
}

/// The last `n` lines of the server's log (start-up recovery's one line
/// per interrupted turn left out), joined with ` | `.
pub(crate) fn log_tail(spec: &Spec, n: usize) -> String {
    let log = std::fs::read_to_string(spec.dir.join("server.log")).unwrap_or_default();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| !l.contains("turn interrupted by a previous shutdown"))
        .collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// The resident set size of process `pid` in KiB (from /proc), 0 when
/// unreadable.
pub(crate) fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Polls the health service until `readiness` is SERVING.
async fn wait_ready(url: &str, limit: Duration) -> Result<(), String> {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let until = Instant::now() + limit;
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
        .map_err(|e| format!("url {url}: {e}"))?
        .connect_timeout(Duration::from_secs(1));
    let mut last = String::from("no attempt");
    while Instant::now() < until {
        if let Ok(channel) = endpoint.connect().await {
            let mut health = HealthClient::new(channel);
            while Instant::now() < until {
                let req = HealthCheckRequest {
                    service: "readiness".into(),
                };
                match tokio::time::timeout(Duration::from_secs(1), health.check(req)).await {
                    Ok(Ok(r)) if r.get_ref().status() == ServingStatus::Serving => return Ok(()),
                    Ok(Ok(r)) => last = format!("readiness {:?}", r.get_ref().status()),
                    Ok(Err(e)) => last = format!("health check: {e}"),
                    Err(_) => last = "health check timed out".into(),
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Err(format!("not ready within {limit:?}: {last}"))
}

/// The server's gRPC health service on one connection.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    client: tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
}

/// A health service's answer: SERVING, NOT_SERVING, ...
pub(crate) type Serving = tonic_health::pb::health_check_response::ServingStatus;

impl Health {
    pub(crate) async fn connect(url: &str) -> Result<Self, String> {
        let channel = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|e| format!("url {url}: {e}"))?
            .connect_timeout(Duration::from_secs(1))
            .connect()
            .await
            .map_err(|e| format!("health: connect {url}: {e}"))?;
        Ok(Self {
            client: tonic_health::pb::health_client::HealthClient::new(channel),
        })
    }

    /// What `service` reports now.
    pub(crate) async fn check(&self, service: &str) -> Result<Serving, String> {
        let req = tonic_health::pb::HealthCheckRequest {
            service: service.to_owned(),
        };
        let mut client = self.client.clone();
        match tokio::time::timeout(Duration::from_secs(1), client.check(req)).await {
            Ok(Ok(r)) => Ok(r.get_ref().status()),
            Ok(Err(e)) => Err(format!("health check {service:?}: {e}")),
            Err(_) => Err(format!("health check {service:?} timed out")),
        }
    }

    /// Polls `service` (every 20 ms) until it reports `want`; the time it
    /// took, or what it last said when `limit` passed.
    pub(crate) async fn wait(
        &self,
        service: &str,
        want: Serving,
        limit: Duration,
    ) -> Result<Duration, String> {
        let start = Instant::now();
        loop {
            let last = match self.check(service).await {
                Ok(s) if s == want => return Ok(start.elapsed()),
                Ok(s) => format!("{s:?}"),
                Err(e) => e,
            };
            if start.elapsed() >= limit {
                return Err(format!(
                    "health {service:?} not {want:?} within {limit:?}: {last}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// `n` clients, each on its own connection.
pub(crate) async fn clients(url: &str, n: usize) -> Result<Vec<agentrt_client::Client>, String> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            agentrt_client::Client::builder(url)
                .connect_timeout(Duration::from_secs(10))
                .connect()
                .await
                .map_err(|e| format!("connect {url}: {e}"))?,
        );
    }
    Ok(out)
}
