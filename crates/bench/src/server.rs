//! Child servers: the real `agentrt-server` binary (config in a temp dir),
//! the bare echo and the minimal relay (this binary re-run as
//! `agentrt-bench echo-server` / `relay-server`).
//! A child is killed when its handle drops; [`Child::terminate`] sends
//! SIGTERM and waits (bounded) for the exit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{ChildStdout, Command};

use crate::proc_stats::{self, ProcSample};

/// A running child server.
#[derive(Debug)]
pub(crate) struct Child {
    child: tokio::process::Child,
    pid: u32,
    addr: String,
    /// Spawn → the "listening on" line.
    pub(crate) listening_after: Duration,
    /// Spawn → readiness (agentrt: health `readiness` SERVING).
    pub(crate) ready_after: Duration,
    spawned_at: Instant,
    _stdout: BufReader<ChildStdout>,
}

/// How to start the agentrt server.
#[derive(Debug, Clone)]
pub(crate) struct ServerSpec {
    pub(crate) binary: PathBuf,
    /// `taskset -c CPUS` for the server, when set.
    pub(crate) cpus: Option<String>,
    /// `AGENTRT_LOG` for the server, when set.
    pub(crate) log_filter: Option<String>,
    /// Extra environment for the server (the telemetry comparison's
    /// `OTEL_*` variables).
    pub(crate) env: Vec<(String, String)>,
    /// TOML appended to [`server_config`] (the P10 part's `[store]` and
    /// `[cluster]` tables); empty for the default sled server.
    pub(crate) config_tail: String,
}

/// The TOML config the benches give the server.
pub(crate) fn server_config(fake_base_url: &str) -> String {
    format!(
        "default_model = \"fake/m\"\n\
         heartbeat_interval = \"1h\"\n\
         shutdown_grace = \"5s\"\n\
         \n\
         [[providers]]\n\
         name = \"fake\"\n\
         kind = \"openai\"\n\
         base_url = \"{fake_base_url}\"\n\
         idle_timeout = \"60s\"\n"
    )
}

impl Child {
    /// Starts `agentrt-server` on `127.0.0.1:0` with `data_dir` and a config
    /// pointing at `fake_base_url`, and waits until it is ready.
    pub(crate) async fn agentrt(
        spec: &ServerSpec,
        dir: &Path,
        data_dir: &Path,
        fake_base_url: &str,
    ) -> Result<Self, String> {
        let config = server_config(fake_base_url) + &spec.config_tail;
        Self::agentrt_with_config(spec, dir, data_dir, &config).await
    }

    /// Starts `agentrt-server` on `127.0.0.1:0` with `data_dir` and the
    /// TOML `config_text`, and waits until it is ready. Its log goes to
    /// `dir/server.log`.
    pub(crate) async fn agentrt_with_config(
        spec: &ServerSpec,
        dir: &Path,
        data_dir: &Path,
        config_text: &str,
    ) -> Result<Self, String> {
        let config = dir.join("agentrt.toml");
        std::fs::write(&config, config_text)
            .map_err(|e| format!("write {}: {e}", config.display()))?;
        let log = dir.join("server.log");
        let mut args: Vec<String> = vec![
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--config".into(),
            config.display().to_string(),
        ];
        let program = match &spec.cpus {
            Some(cpus) => {
                let mut wrapped = vec!["-c".to_owned(), cpus.clone()];
                wrapped.push(spec.binary.display().to_string());
                wrapped.append(&mut args);
                args = wrapped;
                PathBuf::from("taskset")
            }
            None => spec.binary.clone(),
        };
        let mut cmd = Command::new(program);
        cmd.args(&args);
        if let Some(filter) = &spec.log_filter {
            cmd.env("AGENTRT_LOG", filter);
        }
        cmd.envs(spec.env.iter().map(|(k, v)| (k, v)));
        let logfile = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("open {}: {e}", log.display()))?;
        cmd.stderr(Stdio::from(logfile));
        let mut child =
            Self::spawn(cmd, "agentrt-server listening on ", Duration::from_secs(20)).await?;
        let ready = wait_ready(&child.url(), Duration::from_secs(20)).await;
        child.ready_after = child.ready_after_spawn(ready)?;
        Ok(child)
    }

    /// Starts this binary as the bare tonic echo.
    pub(crate) async fn echo(cpus: Option<&str>) -> Result<Self, String> {
        Self::bench_child(cpus, &["echo-server"], "agentrt-bench echo listening on ").await
    }

    /// Starts this binary as the minimal relay to `upstream` (the fake's
    /// base URL).
    pub(crate) async fn relay(cpus: Option<&str>, upstream: &str) -> Result<Self, String> {
        Self::bench_child(
            cpus,
            &["relay-server", "--upstream", upstream],
            "agentrt-bench relay listening on ",
        )
        .await
    }

    /// This binary run as the internal subcommand `args` on
    /// `127.0.0.1:0`, ready once it prints `prefix` and its address.
    async fn bench_child(cpus: Option<&str>, args: &[&str], prefix: &str) -> Result<Self, String> {
        let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.arg("-c").arg(cpus).arg(me);
                c
            }
            None => Command::new(me),
        };
        cmd.args(args).args(["--listen", "127.0.0.1:0"]);
        cmd.stderr(Stdio::inherit());
        let mut child = Self::spawn(cmd, prefix, Duration::from_secs(20)).await?;
        child.ready_after = child.listening_after;
        Ok(child)
    }

    async fn spawn(mut cmd: Command, prefix: &str, limit: Duration) -> Result<Self, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
        let pid = child.id().ok_or("the child exited at once")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut stdout = BufReader::new(stdout);
        let addr = tokio::time::timeout(limit, async {
            let mut line = String::new();
            loop {
                line.clear();
                match stdout.read_line(&mut line).await {
                    Ok(0) | Err(_) => return Err("the child closed stdout before listening"),
                    Ok(_) => {
                        if let Some(a) = line.trim().strip_prefix(prefix) {
                            return Ok(a.to_owned());
                        }
                    }
                }
            }
        })
        .await
        .map_err(|_| format!("no listening line within {limit:?}"))??;
        Ok(Self {
            child,
            pid,
            addr,
            listening_after: started.elapsed(),
            ready_after: Duration::ZERO,
            spawned_at: started,
            _stdout: stdout,
        })
    }

    fn ready_after_spawn(&self, ready: Result<Instant, String>) -> Result<Duration, String> {
        Ok(ready?.saturating_duration_since(self.spawned_at))
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    pub(crate) fn stats(&self) -> ProcSample {
        proc_stats::sample(self.pid).unwrap_or_default()
    }

    /// SIGTERM, then wait for the exit (SIGKILL after `limit`). Returns the
    /// time to exit and whether the exit status was success.
    pub(crate) async fn terminate(mut self, limit: Duration) -> (Duration, bool) {
        let start = Instant::now();
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid.to_string())
            .status()
            .await;
        match tokio::time::timeout(limit, self.child.wait()).await {
            Ok(Ok(status)) => (start.elapsed(), status.success()),
            _ => {
                let _ = self.child.kill().await;
                (start.elapsed(), false)
            }
        }
    }
}

/// Polls the health service until `readiness` is SERVING; returns when.
pub(crate) async fn wait_ready(url: &str, limit: Duration) -> Result<Instant, String> {
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
            loop {
                let req = HealthCheckRequest {
                    service: "readiness".into(),
                };
                match tokio::time::timeout(Duration::from_secs(1), health.check(req)).await {
                    Ok(Ok(r)) if r.get_ref().status() == ServingStatus::Serving => {
                        return Ok(Instant::now());
                    }
                    Ok(Ok(r)) => last = format!("readiness {:?}", r.get_ref().status()),
                    Ok(Err(e)) => last = format!("health check: {e}"),
                    Err(_) => last = "health check timed out".into(),
                }
                if Instant::now() >= until {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(format!("not ready within {limit:?}: {last}"))
}
