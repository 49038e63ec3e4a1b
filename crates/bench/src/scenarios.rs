//! The shared set-up of every scenario: the run's sizes ([`Plan`]), the
//! fake and the server binary ([`Env`]), fresh server processes with warmed
//! clients, CPU/RSS measurement around a load ([`Measure`]), and the loads
//! several scenarios run: reads straight from the fake, calls to the bare
//! echo, turns through the minimal relay, paced agentrt turns.

use std::sync::Arc;
use std::time::Duration;

use agentrt_client::{Client, proto};
use futures::StreamExt as _;

use crate::driver::{
    Recorder, Totals, agentrt_turn, connect_clients, connections_for, direct_stream, echo_call,
};
use crate::fake::{FakeServer, StreamParams};
use crate::load::Load;
use crate::proc_stats::{self, ProcSample, RssSampler};
use crate::server::{Child, ServerSpec};

/// Sizes of one run (full or smoke).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) turn_limit: Duration,
    pub(crate) echo_ttfe_calls: usize,
    pub(crate) echo_sat_streams: usize,
    pub(crate) echo_sat: StreamParams,
    pub(crate) echo_sat_window: Duration,
    pub(crate) echo_unpaced_streams: usize,
    pub(crate) s1_turns: usize,
    pub(crate) s1: StreamParams,
    pub(crate) s2_levels: Vec<usize>,
    pub(crate) s2: StreamParams,
    pub(crate) s2_window: Duration,
    pub(crate) s2_side_window: Duration,
    /// The streams of the S2 bursts (see [`crate::burst`]).
    pub(crate) burst: StreamParams,
    /// Chats measured per burst level (rounds of N at once), about.
    pub(crate) burst_samples: usize,
    pub(crate) burst_max_rounds: usize,
    pub(crate) s3_levels: Vec<usize>,
    pub(crate) s3_tokens: u32,
    pub(crate) s3_window: Duration,
    pub(crate) s4_watchers: Vec<usize>,
    pub(crate) s4: StreamParams,
    pub(crate) s6_levels: Vec<usize>,
    pub(crate) s6_window: Duration,
    pub(crate) s7_sessions: usize,
    pub(crate) s7_concurrency: usize,
}

/// Everything a scenario needs.
#[derive(Debug)]
pub(crate) struct Env {
    pub(crate) plan: Plan,
    pub(crate) spec: ServerSpec,
    pub(crate) fake: Arc<FakeServer>,
    pub(crate) http: reqwest::Client,
    pub(crate) root: tempfile::TempDir,
}

/// A fresh server (agentrt with its own data dir, or the minimal relay),
/// plus warmed client connections.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) server: Child,
    pub(crate) clients: Vec<Client>,
    pub(crate) dir: std::path::PathBuf,
    /// `VmRSS` after start-up and a warm-up turn.
    pub(crate) rss_startup_kb: u64,
}

impl Env {
    /// Starts a server in a new directory under the run's temp root,
    /// connects `connections` clients and runs one short turn on each.
    pub(crate) async fn fresh_server(
        &self,
        name: &str,
        connections: usize,
    ) -> Result<Running, String> {
        self.fresh_server_with(&self.spec, name, connections).await
    }

    /// [`Env::fresh_server`] started as `spec` says.
    pub(crate) async fn fresh_server_with(
        &self,
        spec: &ServerSpec,
        name: &str,
        connections: usize,
    ) -> Result<Running, String> {
        let dir = self.root.path().join(name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let server = Child::agentrt(spec, &dir, &dir.join("data"), &self.fake.base_url()).await?;
        let clients = connect_clients(&server.url(), connections).await?;
        let warm = StreamParams {
            ttft: Duration::ZERO,
            tokens: 5,
            rate: 0.0,
        };
        for (i, c) in clients.iter().enumerate() {
            let id = format!("warm-{i}");
            create_session(c, &id).await?;
            let obs =
                agentrt_turn(c, &id, Some((&self.fake, warm)), "", self.plan.turn_limit).await;
            if let Some(e) = obs.error {
                return Err(format!("warm-up turn: {e}"));
            }
        }
        let rss_startup_kb = server.stats().rss_kb;
        Ok(Running {
            server,
            clients,
            dir,
            rss_startup_kb,
        })
    }
}

impl Env {
    /// Starts the minimal relay (baseline c) on the run's fake, connects
    /// `connections` clients and runs one short turn on each (`dir` is the
    /// run's temp root: the relay writes nothing).
    pub(crate) async fn fresh_relay(&self, connections: usize) -> Result<Running, String> {
        let server = Child::relay(self.spec.cpus.as_deref(), &self.fake.base_url()).await?;
        let clients = connect_clients(&server.url(), connections).await?;
        let warm = StreamParams {
            ttft: Duration::ZERO,
            tokens: 5,
            rate: 0.0,
        };
        for (i, c) in clients.iter().enumerate() {
            let id = format!("warm-{i}");
            let obs =
                agentrt_turn(c, &id, Some((&self.fake, warm)), "", self.plan.turn_limit).await;
            if let Some(e) = obs.error {
                return Err(format!("relay warm-up turn: {e}"));
            }
        }
        let rss_startup_kb = server.stats().rss_kb;
        Ok(Running {
            server,
            clients,
            dir: self.root.path().to_owned(),
            rss_startup_kb,
        })
    }
}

pub(crate) async fn create_session(c: &Client, id: &str) -> Result<(), String> {
    c.create_session(proto::CreateSessionRequest {
        session_id: id.to_owned(),
        ..Default::default()
    })
    .await
    .map(drop)
    .map_err(|e| format!("create session {id}: {e}"))
}

/// Creates `ids` (32 at a time).
pub(crate) async fn create_sessions(clients: &[Client], ids: &[String]) -> Result<(), String> {
    let results: Vec<Result<(), String>> = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| create_session(&clients[i % clients.len()], id))
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// CPU and memory of a server around a load: one process, or a process
/// tree summed (LangGraph's server and its workers).
#[derive(Debug)]
pub(crate) struct Measure {
    pids: Vec<u32>,
    start: ProcSample,
    bench_start: ProcSample,
    rss: RssSampler,
}

impl Measure {
    pub(crate) fn begin(pid: u32) -> Self {
        Self::begin_tree(vec![pid])
    }

    pub(crate) fn begin_tree(pids: Vec<u32>) -> Self {
        Self {
            start: proc_stats::sample_all(&pids),
            bench_start: proc_stats::sample_self(),
            rss: RssSampler::start(pids.clone(), Duration::from_millis(50)),
            pids,
        }
    }

    /// Builds the [`Load`] of the run: `elapsed` wall time, `rss_startup_kb`
    /// subtracted from the peak before dividing by `sessions`.
    pub(crate) async fn end(
        self,
        label: &str,
        sessions: usize,
        totals: &Totals,
        elapsed: Duration,
        rss_startup_kb: u64,
    ) -> Load {
        let end = proc_stats::sample_all(&self.pids);
        let bench_end = proc_stats::sample_self();
        let (peak, threads) = self.rss.stop().await;
        let peak = peak.max(end.rss_kb);
        let wall_us = elapsed.as_secs_f64() * 1e6;
        let cpu_us = end.cpu_us.saturating_sub(self.start.cpu_us);
        let bench_us = bench_end.cpu_us.saturating_sub(self.bench_start.cpu_us);
        let load = Load {
            label: label.to_owned(),
            sessions,
            server_cpu_us: cpu_us,
            cpu_us_per_event: if totals.events > 0 {
                cpu_us as f64 / totals.events as f64
            } else {
                0.0
            },
            cpu_us_per_token: if totals.tokens > 0 {
                cpu_us as f64 / totals.tokens as f64
            } else {
                0.0
            },
            server_cores: cpu_us as f64 / wall_us,
            bench_cores: bench_us as f64 / wall_us,
            rss_startup_kb,
            rss_peak_kb: peak,
            rss_hwm_kb: end.hwm_kb,
            threads_peak: threads.max(end.threads),
            rss_per_session_kb: peak.saturating_sub(rss_startup_kb) as f64 / sessions.max(1) as f64,
            ..Load::default()
        };
        load.with_totals(totals, elapsed.as_secs_f64())
    }
}

/// Bench-process-only load (direct reads of the fake): no server process.
pub(crate) fn bench_only(
    label: &str,
    sessions: usize,
    totals: &Totals,
    elapsed: Duration,
    bench0: ProcSample,
) -> Load {
    let bench_us = proc_stats::sample_self()
        .cpu_us
        .saturating_sub(bench0.cpu_us);
    Load {
        label: label.to_owned(),
        sessions,
        bench_cores: bench_us as f64 / (elapsed.as_secs_f64() * 1e6),
        ..Load::default()
    }
    .with_totals(totals, elapsed.as_secs_f64())
}

/// Turn duration of `p` at the nominal rate (for staggering starts).
pub(crate) fn nominal(p: StreamParams) -> Duration {
    let stream = if p.rate > 0.0 {
        Duration::from_secs_f64(f64::from(p.tokens) / p.rate)
    } else {
        Duration::ZERO
    };
    p.ttft + stream
}

/// `sessions` loops reading paced streams `p` straight from the fake (no
/// server process) for `window`, their starts spread over `stagger`.
pub(crate) async fn direct_load(
    env: &Env,
    label: &str,
    sessions: usize,
    p: StreamParams,
    (window, stagger): (Duration, Duration),
) -> Load {
    let limit = env.plan.turn_limit;
    let grace = limit + Duration::from_secs(5);
    let rec = Arc::new(Recorder::default());
    let bench0 = proc_stats::sample_self();
    let elapsed = {
        let (rec, fake, http) = (Arc::clone(&rec), Arc::clone(&env.fake), env.http.clone());
        crate::driver::run_loops(sessions, window, stagger, grace, move |_| {
            let (rec, fake, http) = (Arc::clone(&rec), Arc::clone(&fake), http.clone());
            async move { rec.add(direct_stream(&http, &fake, p, limit).await) }
        })
        .await
    };
    bench_only(label, sessions, &rec.take(), elapsed, bench0)
}

/// `sessions` loops of calls to a fresh bare echo process for `window`.
pub(crate) async fn echo_load(
    env: &Env,
    label: &str,
    sessions: usize,
    p: StreamParams,
    window: Duration,
) -> Result<Load, String> {
    let echo = Child::echo(env.spec.cpus.as_deref()).await?;
    let clients = Arc::new(connect_clients(&echo.url(), connections_for(sessions)).await?);
    // Warm every connection once.
    let warm = StreamParams {
        ttft: Duration::ZERO,
        tokens: 5,
        rate: 0.0,
    };
    for c in clients.iter() {
        if let Some(e) = echo_call(c, warm, env.plan.turn_limit).await.error {
            return Err(format!("echo warm-up: {e}"));
        }
    }
    let rss_startup_kb = echo.stats().rss_kb;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(echo.pid());
    let limit = env.plan.turn_limit;
    let elapsed = {
        let rec = Arc::clone(&rec);
        crate::driver::run_loops(
            sessions,
            window,
            nominal(p),
            limit + Duration::from_secs(5),
            move |i| {
                let (rec, clients) = (Arc::clone(&rec), Arc::clone(&clients));
                async move { rec.add(echo_call(&clients[i % clients.len()], p, limit).await) }
            },
        )
        .await
    };
    let load = measure
        .end(label, sessions, &rec.take(), elapsed, rss_startup_kb)
        .await;
    echo.terminate(Duration::from_secs(5)).await;
    Ok(load)
}

/// `sessions` loops of turns through a fresh minimal relay (baseline c)
/// for `window`, their starts spread over `stagger`: the same driver and
/// the same fake streams as [`agentrt_loops`].
pub(crate) async fn relay_load(
    env: &Env,
    label: &str,
    sessions: usize,
    p: StreamParams,
    (window, stagger): (Duration, Duration),
) -> Result<Load, String> {
    let run = env.fresh_relay(connections_for(sessions)).await?;
    let ids: Vec<String> = (0..sessions).map(|i| format!("relay-{i}")).collect();
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let grace = env.plan.turn_limit + Duration::from_secs(5);
    let elapsed = agentrt_loops(env, &run.clients, ids, &rec, p, (window, stagger, grace)).await;
    let load = measure
        .end(label, sessions, &rec.take(), elapsed, run.rss_startup_kb)
        .await;
    run.server.terminate(Duration::from_secs(5)).await;
    Ok(load)
}

/// Loops of paced agentrt turns through the timed fake: loop `i` runs turns
/// in session `ids[i]` on client `i % clients.len()` for `window`, each
/// recorded in `rec`. Returns the elapsed time.
pub(crate) async fn agentrt_loops(
    env: &Env,
    clients: &[Client],
    ids: Vec<String>,
    rec: &Arc<Recorder>,
    p: StreamParams,
    (window, stagger, grace): (Duration, Duration, Duration),
) -> Duration {
    let (rec, fake, clients, limit) = (
        Arc::clone(rec),
        Arc::clone(&env.fake),
        Arc::new(clients.to_vec()),
        env.plan.turn_limit,
    );
    let (n, ids) = (ids.len(), Arc::new(ids));
    crate::driver::run_loops(n, window, stagger, grace, move |i| {
        let (rec, fake, clients, ids) = (
            Arc::clone(&rec),
            Arc::clone(&fake),
            Arc::clone(&clients),
            Arc::clone(&ids),
        );
        async move {
            let c = &clients[i % clients.len()];
            rec.add(agentrt_turn(c, &ids[i], Some((&fake, p)), "", limit).await);
        }
    })
    .await
}
