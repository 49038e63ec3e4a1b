//! Side by side with LangGraph (`--only langgraph`): LangGraph's in-memory
//! Agent Server (`langgraph dev` from `langgraph-cli[inmem]`, pinned in
//! `crates/bench/langgraph/`) serving a one-node graph whose chat model
//! streams from the same timed fake upstream as agentrt, measured through
//! its HTTP/SSE API beside agentrt in the same run, with the same
//! statistics: TTFE (and its part after the upstream's first token),
//! per-token lag, tokens/s, server CPU per event and per token, RSS per
//! live and per idle thread, what a second run on a busy thread gets, and
//! how long a cancelled run's stream takes to close.
//!
//! ```text
//! cargo build --release -p agentrt-server -p agentrt-bench
//! target/release/agentrt-bench --only langgraph --json target/langgraph.json
//! cargo run --release -p agentrt-bench -- --only langgraph   # the same
//! ```
//!
//! The first run creates a venv (`--langgraph-venv`, default
//! `target/langgraph-venv`) with `python3 -m venv` and installs the pins
//! into it with pip (PyPI); later runs reuse it while the pins are
//! unchanged. Without `python3` 3.11+ the part is skipped with a note.
//! `--smoke` runs it only when named (`--smoke --only langgraph`), so CI's
//! smoke run needs neither Python nor PyPI.
//!
//! Each LangGraph server runs offline (see [`peer::ENV_SET`] and
//! [`peer::ENV_REMOVED`]) in a fresh temporary working directory, where it
//! pickles its state to `.langgraph_api/` every 10 s; the directory is
//! removed when the server has exited. The bench asks for a free port and
//! then reads the one the server printed, since it binds another one
//! silently when the asked one is taken. The run stream has no terminal
//! event: a turn ends when the server closes the stream.
//!
//! Two LangGraph configurations run: stock (`langgraph dev` runs one job
//! at a time when `--n-jobs-per-worker` is not given) and with
//! `--n-jobs-per-worker` raised (`--langgraph-jobs`, default 100); never
//! lower than stock. Its queue looks for new runs every 0.5 s when idle:
//! that wait is part of what its users see, so it is measured, not
//! avoided. With one job, turns queue behind each other: a turn still
//! waiting when the drain time after the window ends counts as
//! *unfinished* (not in the latency quantiles, shown in its own column).

mod client;
mod peer;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client};
use futures::StreamExt as _;
use serde::Serialize;

use crate::driver::{Recorder, Totals, agentrt_turn, chat_request, connections_for};
use crate::fake::StreamParams;
use crate::load::{Lat, Load, fail_note, lat2};
use crate::markdown::{ms, num, table};
use crate::proc_stats::{self, ProcSample};
use crate::scenarios::{
    Env, Measure, agentrt_loops, create_session, create_sessions, direct_load, nominal,
};

use self::client::{Item, LgClient, RunStream, TurnEnd};
use self::peer::{Peer, PeerSpec, TreeSampler, Venv, process_tree, sample_all};
pub(crate) use self::peer::{Unavailable, ensure_venv};

/// Sizes of the part.
#[derive(Debug, Clone)]
pub(crate) struct LgPlan {
    /// Concurrent sessions (threads) of the paced load.
    pub(crate) levels: Vec<usize>,
    /// The paced turns (S2's).
    pub(crate) paced: StreamParams,
    pub(crate) window: Duration,
    /// The direct reads of the fake (TTFE baseline) per level.
    pub(crate) side_window: Duration,
    /// How long turns started in the window may still take.
    pub(crate) drain: Duration,
    /// `--n-jobs-per-worker` of the raised configuration.
    pub(crate) jobs: usize,
    /// Threads (sessions) given one short turn each for the idle memory.
    pub(crate) idle_threads: usize,
    /// Samples of the busy and the cancel probes.
    pub(crate) probes: usize,
    /// The turn that gets cancelled (long enough never to end by itself).
    pub(crate) cancel: StreamParams,
    pub(crate) sat_sessions: usize,
    /// Unpaced turns of the saturation load.
    pub(crate) sat: StreamParams,
    pub(crate) sat_window: Duration,
    pub(crate) turn_limit: Duration,
}

/// The part's sizes for a full or smoke run, with S2's paced turns.
pub(crate) fn plan(smoke: bool, env: &crate::scenarios::Plan, jobs: usize) -> LgPlan {
    let p = |ttft_ms: u64, tokens: u32, rate: f64| StreamParams {
        ttft: Duration::from_millis(ttft_ms),
        tokens,
        rate,
    };
    if smoke {
        return LgPlan {
            levels: vec![1, 2],
            paced: env.s2,
            window: env.s2_window,
            side_window: env.s2_side_window,
            drain: Duration::from_secs(10),
            jobs,
            idle_threads: 5,
            probes: 2,
            cancel: p(0, 400, 100.0),
            sat_sessions: 2,
            sat: p(0, 20, 0.0),
            sat_window: Duration::from_millis(300),
            turn_limit: env.turn_limit,
        };
    }
    LgPlan {
        levels: vec![1, 10, 100],
        paced: env.s2,
        window: env.s2_window,
        side_window: env.s2_side_window,
        drain: Duration::from_secs(30),
        jobs,
        idle_threads: 500,
        probes: 10,
        cancel: p(0, 1000, 50.0),
        sat_sessions: 16,
        sat: p(0, 500, 0.0),
        sat_window: Duration::from_secs(5),
        turn_limit: env.turn_limit,
    }
}

/// A fake stream's settings, as reported.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Params {
    pub(crate) ttft_ms: f64,
    pub(crate) tokens: u32,
    /// Tokens/s; 0 is unpaced.
    pub(crate) rate: f64,
}

impl From<StreamParams> for Params {
    fn from(p: StreamParams) -> Self {
        Self {
            ttft_ms: p.ttft.as_secs_f64() * 1e3,
            tokens: p.tokens,
            rate: p.rate,
        }
    }
}

/// One LangGraph configuration.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct PeerConfig {
    pub(crate) label: String,
    /// The command (run in the venv, in a fresh working directory).
    pub(crate) command: String,
    /// `--n-jobs-per-worker`, when given.
    pub(crate) jobs_flag: Option<usize>,
    /// The job count the server logged ("Starting N background workers").
    pub(crate) jobs_logged: Option<u64>,
}

/// One runtime's paced load at one level.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Run {
    pub(crate) runtime: String,
    pub(crate) load: Load,
    /// Turns still running when the drain time ran out.
    pub(crate) unfinished: u64,
}

/// The paced load at one concurrency: the fake read directly, agentrt,
/// then each LangGraph configuration.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Level {
    pub(crate) sessions: usize,
    pub(crate) direct: Load,
    pub(crate) runs: Vec<Run>,
}

/// A probe repeated a few times.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Probe {
    pub(crate) samples: u64,
    /// Busy: second run sent → its answer. Cancel: cancel sent → the
    /// cancelled run's stream closed.
    pub(crate) latency: Lat,
    /// What came back, with counts (e.g. `HTTP 409 ×10`).
    pub(crate) outcome: String,
}

/// One runtime's probes: idle memory, busy thread, cancel, saturation.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Probes {
    pub(crate) runtime: String,
    pub(crate) idle_threads: usize,
    pub(crate) kb_per_idle_thread: f64,
    pub(crate) busy: Probe,
    pub(crate) cancel: Probe,
    pub(crate) saturation: Load,
    pub(crate) saturation_unfinished: u64,
}

/// The part's record in the report.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct LangGraphPart {
    pub(crate) python: String,
    /// Versions of the server's packages in the venv.
    pub(crate) versions: BTreeMap<String, String>,
    pub(crate) venv: String,
    pub(crate) configs: Vec<PeerConfig>,
    /// Environment set for every LangGraph server.
    pub(crate) env_set: Vec<String>,
    /// Environment taken out.
    pub(crate) env_removed: Vec<String>,
    pub(crate) paced: Params,
    pub(crate) saturation: Params,
    pub(crate) cancel: Params,
    pub(crate) window_s: f64,
    pub(crate) drain_s: f64,
    pub(crate) levels: Vec<Level>,
    pub(crate) probes: Vec<Probes>,
    /// Ports the servers moved away from, start-up times.
    pub(crate) notes: Vec<String>,
}

const WARM: StreamParams = StreamParams {
    ttft: Duration::ZERO,
    tokens: 5,
    rate: 0.0,
};

/// Runs the part: for each level the direct read, agentrt and each
/// LangGraph configuration (fresh servers each), then each runtime's
/// probes on a fresh server.
pub(crate) async fn langgraph(
    env: &Env,
    venv: &Venv,
    plan: &LgPlan,
) -> Result<LangGraphPart, String> {
    let (python, versions) = peer::versions(venv).await?;
    let specs: Vec<(String, PeerSpec)> = [None, Some(plan.jobs)]
        .into_iter()
        .map(|jobs| {
            let label = match jobs {
                None => "LangGraph stock".to_owned(),
                Some(n) => format!("LangGraph {n} jobs"),
            };
            let spec = PeerSpec {
                venv: venv.clone(),
                jobs,
                fake_url: env.fake.base_url(),
                cpus: env.spec.cpus.clone(),
            };
            (label, spec)
        })
        .collect();
    let mut part = LangGraphPart {
        python,
        versions,
        venv: venv.dir.display().to_string(),
        configs: specs
            .iter()
            .map(|(label, spec)| PeerConfig {
                label: label.clone(),
                command: spec.command(),
                jobs_flag: spec.jobs,
                jobs_logged: None,
            })
            .collect(),
        env_set: peer::ENV_SET
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .chain(std::iter::once(
                "AGENTRT_BENCH_FAKE_URL=<the fake's /v1 URL>".to_owned(),
            ))
            .collect(),
        env_removed: peer::ENV_REMOVED.iter().map(|s| (*s).to_owned()).collect(),
        paced: plan.paced.into(),
        saturation: plan.sat.into(),
        cancel: plan.cancel.into(),
        window_s: plan.window.as_secs_f64(),
        drain_s: plan.drain.as_secs_f64(),
        ..LangGraphPart::default()
    };
    for &c in &plan.levels {
        let stagger = nominal(plan.paced);
        let direct = direct_load(
            env,
            &format!("direct c={c}"),
            c,
            plan.paced,
            (plan.side_window, stagger),
        )
        .await;
        let mut runs = vec![agentrt_level(env, plan, c).await?];
        for (i, (label, spec)) in specs.iter().enumerate() {
            eprintln!("agentrt-bench: langgraph: {label}, {c} sessions");
            let name = format!("lg{i}-c{c}");
            let peer = start_peer(spec, env, &name, &mut part).await?;
            let run = peer_level(env, &peer, plan, label, c).await;
            note_jobs(&mut part, i, &peer);
            peer.stop().await;
            runs.push(run?);
        }
        part.levels.push(Level {
            sessions: c,
            direct,
            runs,
        });
    }
    part.probes.push(agentrt_probes(env, plan).await?);
    for (i, (label, spec)) in specs.iter().enumerate() {
        eprintln!("agentrt-bench: langgraph: {label}, probes");
        let peer = start_peer(spec, env, &format!("lg{i}-probes"), &mut part).await?;
        let probes = peer_probes(env, &peer, plan, label).await;
        note_jobs(&mut part, i, &peer);
        peer.stop().await;
        part.probes.push(probes?);
    }
    Ok(part)
}

/// Records the job count a server of configuration `config` logged.
fn note_jobs(part: &mut LangGraphPart, config: usize, peer: &Peer) {
    if let Some(c) = part.configs.get_mut(config) {
        c.jobs_logged = c.jobs_logged.or(peer.jobs_logged());
    }
}

async fn start_peer(
    spec: &PeerSpec,
    env: &Env,
    name: &str,
    part: &mut LangGraphPart,
) -> Result<Peer, String> {
    let peer = Peer::start(spec, env.root.path(), name).await?;
    if let Some(from) = peer.moved_from {
        part.notes.push(format!(
            "{name}: asked for port {from}, the server bound {}",
            peer.url()
        ));
    }
    part.notes.push(format!(
        "{name}: ready (GET /ok) {:.2} s after spawn",
        peer.ready_after.as_secs_f64()
    ));
    Ok(peer)
}

/// CPU and memory of a process tree around a load (as
/// [`Measure`] for one process).
struct TreeMeasure {
    pids: Vec<u32>,
    start: ProcSample,
    bench_start: ProcSample,
    sampler: TreeSampler,
}

impl TreeMeasure {
    fn begin(pids: Vec<u32>) -> Self {
        Self {
            start: sample_all(&pids),
            bench_start: proc_stats::sample_self(),
            sampler: TreeSampler::start(pids.clone(), Duration::from_millis(50)),
            pids,
        }
    }

    async fn end(
        self,
        label: &str,
        sessions: usize,
        totals: &Totals,
        elapsed: Duration,
        rss_startup_kb: u64,
    ) -> Load {
        let end = sample_all(&self.pids);
        let bench_end = proc_stats::sample_self();
        let (peak, threads) = self.sampler.stop().await;
        let peak = peak.max(end.rss_kb);
        let wall_us = elapsed.as_secs_f64() * 1e6;
        let cpu_us = end.cpu_us.saturating_sub(self.start.cpu_us);
        let bench_us = bench_end.cpu_us.saturating_sub(self.bench_start.cpu_us);
        Load {
            label: label.to_owned(),
            sessions,
            server_cpu_us: cpu_us,
            cpu_us_per_event: if totals.events > 0 {
                cpu_us as f64 / totals.events as f64
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
        }
        .with_totals(totals, elapsed.as_secs_f64())
    }
}

/// agentrt's paced load at `c` sessions (S2's agentrt pass, same params).
async fn agentrt_level(env: &Env, plan: &LgPlan, c: usize) -> Result<Run, String> {
    let run = env
        .fresh_server(&format!("lg-agentrt-c{c}"), connections_for(c))
        .await?;
    let ids: Vec<String> = (0..c).map(|i| format!("lg-{i}")).collect();
    create_sessions(&run.clients, &ids).await?;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let grace = plan.drain + Duration::from_secs(5);
    let windows = (plan.window, nominal(plan.paced), grace);
    let elapsed = agentrt_loops(env, &run.clients, ids, &rec, plan.paced, windows).await;
    let label = format!("agentrt c={c}");
    let load = measure
        .end(&label, c, &rec.take(), elapsed, run.rss_startup_kb)
        .await;
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(Run {
        runtime: "agentrt".into(),
        load,
        unfinished: 0,
    })
}

/// One short turn on a new thread, so the graph, its model client and the
/// server's paths are loaded before anything is measured.
async fn warm(env: &Env, client: &LgClient, plan: &LgPlan) -> Result<(), String> {
    let thread = client.create_thread().await?;
    let deadline = Instant::now() + plan.turn_limit;
    match client
        .turn(&thread, env.fake.ticket(WARM), WARM.tokens, deadline)
        .await
    {
        TurnEnd::Done(obs) => obs.error.map_or(Ok(()), |e| Err(format!("warm-up: {e}"))),
        TurnEnd::Unfinished => Err("warm-up turn did not finish".into()),
    }
}

/// Creates `n` threads, 16 at a time.
async fn create_threads(client: &LgClient, n: usize) -> Result<Vec<String>, String> {
    futures::stream::iter(0..n)
        .map(|_| client.create_thread())
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect()
}

/// Loops of turns, one per thread, each running turns back to back until
/// `window` has passed (starts staggered over one nominal turn); every
/// turn must end by `window + drain` or counts as unfinished. A loop stops
/// at its first failed turn (a refused run answers at once; retrying it
/// would only spin). Returns the totals, the unfinished count and the
/// wall time.
async fn peer_loops(
    env: &Env,
    client: &LgClient,
    threads: Vec<String>,
    p: StreamParams,
    window: Duration,
    drain: Duration,
) -> (Totals, u64, Duration) {
    let rec = Arc::new(Recorder::default());
    let unfinished = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let (end, stagger) = (start + window, nominal(p));
    let deadline = end + drain;
    let n = threads.len().max(1);
    let mut set = tokio::task::JoinSet::new();
    for (i, thread) in threads.into_iter().enumerate() {
        let (rec, unfinished) = (Arc::clone(&rec), Arc::clone(&unfinished));
        let (fake, client) = (Arc::clone(&env.fake), client.clone());
        let offset = stagger.mul_f64(i as f64 / n as f64);
        set.spawn(async move {
            tokio::time::sleep_until((start + offset).into()).await;
            while Instant::now() < end {
                match client
                    .turn(&thread, fake.ticket(p), p.tokens, deadline)
                    .await
                {
                    TurnEnd::Done(obs) => {
                        let failed = obs.error.is_some();
                        rec.add(obs);
                        if failed {
                            break;
                        }
                    }
                    TurnEnd::Unfinished => {
                        unfinished.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                }
            }
        });
    }
    while set.join_next().await.is_some() {}
    (
        rec.take(),
        unfinished.load(Ordering::Relaxed),
        start.elapsed(),
    )
}

/// A LangGraph server's paced load at `c` sessions.
async fn peer_level(
    env: &Env,
    peer: &Peer,
    plan: &LgPlan,
    label: &str,
    c: usize,
) -> Result<Run, String> {
    let client = LgClient::new(peer.url())?;
    warm(env, &client, plan).await?;
    let tree = process_tree(peer.pid());
    let rss_startup_kb = sample_all(&tree).rss_kb;
    let threads = create_threads(&client, c).await?;
    let measure = TreeMeasure::begin(tree);
    let (totals, unfinished, elapsed) =
        peer_loops(env, &client, threads, plan.paced, plan.window, plan.drain).await;
    let load = measure
        .end(
            &format!("{label} c={c}"),
            c,
            &totals,
            elapsed,
            rss_startup_kb,
        )
        .await;
    Ok(Run {
        runtime: label.to_owned(),
        load,
        unfinished,
    })
}

/// Latencies and outcomes of a probe's samples.
#[derive(Default)]
struct ProbeRec {
    hist: Option<crate::driver::Hist>,
    outcomes: BTreeMap<String, u64>,
    samples: u64,
}

impl ProbeRec {
    fn add(&mut self, latency: Duration, outcome: String) {
        let h = self.hist.get_or_insert_with(crate::driver::new_hist);
        h.saturating_record(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1));
        *self.outcomes.entry(outcome).or_default() += 1;
        self.samples += 1;
    }

    fn probe(self) -> Probe {
        Probe {
            samples: self.samples,
            latency: self.hist.as_ref().map(Lat::from_hist).unwrap_or_default(),
            outcome: self
                .outcomes
                .iter()
                .map(|(o, n)| format!("{o} ×{n}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// Reads a run's stream until its first token (bounded).
async fn first_token(stream: &mut RunStream, limit: Duration) -> Result<(), String> {
    let read = async {
        loop {
            match stream.next().await? {
                Some(Item::Text(t)) if !t.is_empty() => return Ok(()),
                Some(Item::Error(e)) => return Err(format!("error event: {e}")),
                Some(_) => {}
                None => return Err("the stream closed before its first token".to_owned()),
            }
        }
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("no first token within {limit:?}"))?
}

/// Reads a run's stream to its end (bounded).
async fn drain_stream(stream: &mut RunStream, limit: Duration) -> Result<(), String> {
    let read = async {
        while let Some(item) = stream.next().await? {
            if let Item::Error(e) = item {
                return Err(format!("error event: {e}"));
            }
        }
        Ok(())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("the stream did not close within {limit:?}"))?
}

/// A LangGraph server's probes: idle threads, busy thread, cancel,
/// saturation.
async fn peer_probes(env: &Env, peer: &Peer, plan: &LgPlan, label: &str) -> Result<Probes, String> {
    let client = LgClient::new(peer.url())?;
    warm(env, &client, plan).await?;
    let tree = process_tree(peer.pid());
    let limit = plan.turn_limit;

    // Idle: threads that each had one short turn.
    let rss0 = sample_all(&tree).rss_kb;
    let idle: Vec<Result<(), String>> = futures::stream::iter(0..plan.idle_threads)
        .map(|_| {
            let client = client.clone();
            async move {
                let thread = client.create_thread().await?;
                let ticket = env.fake.ticket(WARM);
                match client
                    .turn(&thread, ticket, WARM.tokens, Instant::now() + limit)
                    .await
                {
                    TurnEnd::Done(obs) => obs.error.map_or(Ok(()), Err),
                    TurnEnd::Unfinished => Err("idle turn did not finish".to_owned()),
                }
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    idle.into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map_err(|e| format!("idle threads: {e}"))?;
    let rss1 = sample_all(&tree).rss_kb;

    // Busy: a second run on a thread whose run is streaming.
    let mut busy = ProbeRec::default();
    for _ in 0..plan.probes {
        let thread = client.create_thread().await?;
        let first = env.fake.ticket(plan.paced);
        let mut a = client
            .start_run(&thread, &first.key)
            .await?
            .map_err(|(s, b)| format!("busy probe: first run refused: {s}: {b}"))?;
        first_token(&mut a, limit).await?;
        let second = env.fake.ticket(WARM);
        let t0 = Instant::now();
        let outcome = match client.start_run(&thread, &second.key).await? {
            Err((status, _)) => format!("HTTP {status}"),
            Ok(mut b) => {
                drain_stream(&mut b, limit).await?;
                "accepted".to_owned()
            }
        };
        busy.add(t0.elapsed(), outcome);
        drain_stream(&mut a, limit).await?;
    }

    // Cancel: the time from the cancel request to the stream's close.
    let mut cancel = ProbeRec::default();
    for _ in 0..plan.probes {
        let thread = client.create_thread().await?;
        let ticket = env.fake.ticket(plan.cancel);
        let mut run = client
            .start_run(&thread, &ticket.key)
            .await?
            .map_err(|(s, b)| format!("cancel probe: run refused: {s}: {b}"))?;
        if run.run_id.is_empty() {
            return Err("cancel probe: the run stream named no run".into());
        }
        first_token(&mut run, limit).await?;
        let t0 = Instant::now();
        let canceller = {
            let (client, thread, id) = (client.clone(), thread.clone(), run.run_id.clone());
            tokio::spawn(async move { client.cancel(&thread, &id).await })
        };
        drain_stream(&mut run, limit).await?;
        let latency = t0.elapsed();
        canceller.await.map_err(|e| format!("cancel task: {e}"))??;
        let status = client.run_status(&thread, &run.run_id).await?;
        cancel.add(latency, format!("run {status}"));
    }

    // Saturation: unpaced turns.
    let threads = create_threads(&client, plan.sat_sessions).await?;
    let rss_sat = sample_all(&tree).rss_kb;
    let measure = TreeMeasure::begin(tree);
    let (totals, unfinished, elapsed) =
        peer_loops(env, &client, threads, plan.sat, plan.sat_window, plan.drain).await;
    let saturation = measure
        .end(
            &format!("{label} saturation"),
            plan.sat_sessions,
            &totals,
            elapsed,
            rss_sat,
        )
        .await;
    Ok(Probes {
        runtime: label.to_owned(),
        idle_threads: plan.idle_threads,
        kb_per_idle_thread: rss1.saturating_sub(rss0) as f64 / plan.idle_threads.max(1) as f64,
        busy: busy.probe(),
        cancel: cancel.probe(),
        saturation,
        saturation_unfinished: unfinished,
    })
}

/// Reads an agentrt turn's stream until its first text event (bounded).
async fn agentrt_first_text(
    stream: &mut agentrt_client::EventStream,
    limit: Duration,
) -> Result<(), String> {
    let read = async {
        while let Some(item) = stream.next().await {
            if let ChatEvent::Text(_) = item.map_err(|e| format!("stream: {e}"))?.kind {
                return Ok(());
            }
        }
        Err("the stream ended before its first text".to_owned())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("no first text within {limit:?}"))?
}

/// Reads an agentrt turn's stream to its end: the turn's outcome. A turn
/// that did not succeed ends its stream with an error status after its
/// `turn_finished` (e.g. CANCELLED for a stopped turn): that is its end.
async fn agentrt_drain(
    stream: &mut agentrt_client::EventStream,
    limit: Duration,
) -> Result<String, String> {
    let read = async {
        let mut outcome = None;
        while let Some(item) = stream.next().await {
            match item {
                Ok(e) => {
                    if let ChatEvent::TurnFinished { outcome: o, .. } = e.kind {
                        outcome = Some(format!("{o:?}"));
                    }
                }
                Err(e) if outcome.is_none() => return Err(format!("stream: {e}")),
                Err(_) => break,
            }
        }
        outcome.ok_or_else(|| "the stream ended without turn_finished".to_owned())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| format!("the stream did not end within {limit:?}"))?
}

/// The outcome of a Chat sent to a busy session: its error, or what its
/// stream started with.
async fn agentrt_second_chat(client: &Client, id: &str, key: &str, limit: Duration) -> String {
    let describe = |e: agentrt_client::Error| match (e.code(), e.is_busy()) {
        (Some(code), true) => format!("{code:?} (SESSION_BUSY)"),
        (Some(code), false) => format!("{code:?}"),
        (None, _) => format!("client error: {e}"),
    };
    match client.chat_with(chat_request(id, key, "")).await {
        Err(e) => describe(e),
        Ok(mut s) => match tokio::time::timeout(limit, s.next()).await {
            Ok(Some(Err(e))) => describe(e),
            Ok(Some(Ok(_))) => {
                let _ = agentrt_drain(&mut s, limit).await;
                "accepted".to_owned()
            }
            Ok(None) => "empty stream".to_owned(),
            Err(_) => "no answer".to_owned(),
        },
    }
}

/// agentrt's probes on a fresh server, as [`peer_probes`].
async fn agentrt_probes(env: &Env, plan: &LgPlan) -> Result<Probes, String> {
    let run = env.fresh_server("lg-agentrt-probes", 1).await?;
    let client = &run.clients[0];
    let limit = plan.turn_limit;

    let rss0 = run.server.stats().rss_kb;
    let idle: Vec<Result<(), String>> = futures::stream::iter(0..plan.idle_threads)
        .map(|i| async move {
            let id = format!("idle-{i}");
            create_session(client, &id).await?;
            let obs = agentrt_turn(client, &id, Some((&env.fake, WARM)), "", limit).await;
            obs.error.map_or(Ok(()), Err)
        })
        .buffer_unordered(16)
        .collect()
        .await;
    idle.into_iter()
        .collect::<Result<Vec<()>, String>>()
        .map_err(|e| format!("idle sessions: {e}"))?;
    let rss1 = run.server.stats().rss_kb;

    let mut busy = ProbeRec::default();
    for i in 0..plan.probes {
        let id = format!("busy-{i}");
        create_session(client, &id).await?;
        let first = env.fake.ticket(plan.paced);
        let mut a = client
            .chat_with(chat_request(&id, &first.key, ""))
            .await
            .map_err(|e| format!("busy probe: {e}"))?;
        agentrt_first_text(&mut a, limit).await?;
        let second = env.fake.ticket(WARM);
        let t0 = Instant::now();
        let outcome = agentrt_second_chat(client, &id, &second.key, limit).await;
        busy.add(t0.elapsed(), outcome);
        agentrt_drain(&mut a, limit).await?;
    }

    let mut cancel = ProbeRec::default();
    for i in 0..plan.probes {
        let id = format!("cancel-{i}");
        create_session(client, &id).await?;
        let ticket = env.fake.ticket(plan.cancel);
        let mut s = client
            .chat_with(chat_request(&id, &ticket.key, ""))
            .await
            .map_err(|e| format!("cancel probe: {e}"))?;
        agentrt_first_text(&mut s, limit).await?;
        let t0 = Instant::now();
        let stopper = {
            let (client, id) = (client.clone(), id.clone());
            tokio::spawn(async move { client.stop_session(&id).await })
        };
        let outcome = agentrt_drain(&mut s, limit).await?;
        let latency = t0.elapsed();
        stopper
            .await
            .map_err(|e| format!("stop task: {e}"))?
            .map_err(|e| format!("stop session: {e}"))?;
        cancel.add(latency, format!("turn {outcome}"));
    }

    let ids: Vec<String> = (0..plan.sat_sessions).map(|i| format!("sat-{i}")).collect();
    create_sessions(&run.clients, &ids).await?;
    let rss_sat = run.server.stats().rss_kb;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let windows = (
        plan.sat_window,
        Duration::ZERO,
        plan.drain + Duration::from_secs(5),
    );
    let elapsed = agentrt_loops(env, &run.clients, ids, &rec, plan.sat, windows).await;
    let saturation = measure
        .end(
            "agentrt saturation",
            plan.sat_sessions,
            &rec.take(),
            elapsed,
            rss_sat,
        )
        .await;
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(Probes {
        runtime: "agentrt".into(),
        idle_threads: plan.idle_threads,
        kb_per_idle_thread: rss1.saturating_sub(rss0) as f64 / plan.idle_threads.max(1) as f64,
        busy: busy.probe(),
        cancel: cancel.probe(),
        saturation,
        saturation_unfinished: 0,
    })
}

/// Every load of the part, for the report's failure notes.
pub(crate) fn loads(p: &LangGraphPart) -> Vec<&Load> {
    p.levels
        .iter()
        .flat_map(|l| std::iter::once(&l.direct).chain(l.runs.iter().map(|r| &r.load)))
        .chain(p.probes.iter().map(|p| &p.saturation))
        .collect()
}

/// `a ÷ b`, NaN when `b` is not positive (shown as "–").
fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 && a.is_finite() {
        a / b
    } else {
        f64::NAN
    }
}

fn times(r: f64) -> String {
    if r.is_finite() {
        format!("{}×", num(r))
    } else {
        "–".into()
    }
}

/// Server CPU per text token (µs).
fn cpu_per_token(l: &Load) -> f64 {
    if l.tokens > 0 {
        l.server_cpu_us as f64 / l.tokens as f64
    } else {
        f64::NAN
    }
}

/// A latency quantile pair as "p50 / p99" ms, or "–".
fn pair(p50_us: f64, p99_us: f64) -> String {
    format!("{} / {}", ms(p50_us), ms(p99_us))
}

/// The part's section of the report.
pub(crate) fn markdown(p: &LangGraphPart) -> String {
    let mut out = String::new();
    let v = |k: &str| p.versions.get(k).map_or("?", String::as_str);
    let _ = writeln!(
        out,
        "\n## Side by side with LangGraph\n\n\
         LangGraph's in-memory Agent Server: langgraph-cli {}, langgraph-api {}, \
         langgraph-runtime-inmem {}, langgraph {}, langchain-openai {}, Python {} (venv `{}`). \
         Its graph streams from the same fake upstream as agentrt; paced turns: \
         first token after {} ms, {} tokens at {} tokens/s, back to back for {} s \
         (+ up to {} s to finish). Configurations:\n",
        v("langgraph-cli"),
        v("langgraph-api"),
        v("langgraph-runtime-inmem"),
        v("langgraph"),
        v("langchain-openai"),
        p.python,
        p.venv,
        num(p.paced.ttft_ms),
        p.paced.tokens,
        num(p.paced.rate),
        num(p.window_s),
        num(p.drain_s),
    );
    for c in &p.configs {
        let _ = writeln!(
            out,
            "- {}: `{}` (jobs the server logged: {})",
            c.label,
            c.command,
            c.jobs_logged.map_or("?".to_owned(), |n| n.to_string())
        );
    }
    let _ = writeln!(
        out,
        "\nEnvironment: {}; removed: {}.\n",
        p.env_set
            .iter()
            .map(|e| format!("`{e}`"))
            .collect::<Vec<_>>()
            .join(", "),
        p.env_removed.join(", ")
    );
    let rows: Vec<Vec<String>> = p
        .levels
        .iter()
        .flat_map(|l| {
            let d = &l.direct;
            let direct = vec![
                l.sessions.to_string(),
                "fake read directly".into(),
                format!("{}{}", d.turns, fail_note(d.failures)),
                "–".into(),
                lat2(&d.ttfe),
                "–".into(),
                "–".into(),
                lat2(&d.lag),
                num(d.tokens_per_s),
                "–".into(),
                "–".into(),
                "–".into(),
            ];
            let runs = l.runs.iter().map(move |r| {
                let a = &r.load;
                vec![
                    l.sessions.to_string(),
                    r.runtime.clone(),
                    format!("{}{}", a.turns, fail_note(a.failures)),
                    r.unfinished.to_string(),
                    lat2(&a.ttfe),
                    pair(a.ttfe.p50_us - d.ttfe.p50_us, a.ttfe.p99_us - d.ttfe.p99_us),
                    lat2(&a.admission),
                    lat2(&a.first_relay),
                    lat2(&a.lag),
                    num(a.tokens_per_s),
                    format!("{} / {}", num(a.cpu_us_per_event), num(cpu_per_token(a))),
                    num(a.rss_per_session_kb),
                ]
            });
            std::iter::once(direct).chain(runs)
        })
        .collect();
    out.push_str(&table(
        &[
            "sessions",
            "runtime",
            "turns",
            "unfinished",
            "TTFE p50 / p99 ms",
            "TTFE overhead p50 / p99 ms",
            "send → upstream request p50 / p99 ms",
            "upstream first token → first event p50 / p99 ms",
            "lag p50 / p99 ms",
            "tokens/s",
            "server CPU µs/event / µs/token",
            "RSS KB/live session",
        ],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nRatios, LangGraph ÷ agentrt (how many times LangGraph's cost; tokens/s: agentrt ÷ LangGraph):\n"
    );
    let rows: Vec<Vec<String>> = p
        .levels
        .iter()
        .flat_map(|l| {
            let agentrt = l.runs.iter().find(|r| r.runtime == "agentrt");
            l.runs
                .iter()
                .filter(|r| r.runtime != "agentrt")
                .filter_map(move |r| {
                    let (a, g, d) = (&agentrt?.load, &r.load, &l.direct);
                    Some(vec![
                        l.sessions.to_string(),
                        r.runtime.clone(),
                        times(ratio(
                            g.ttfe.p50_us - d.ttfe.p50_us,
                            a.ttfe.p50_us - d.ttfe.p50_us,
                        )),
                        times(ratio(g.admission.p50_us, a.admission.p50_us)),
                        format!(
                            "{} / {}",
                            times(ratio(g.first_relay.p50_us, a.first_relay.p50_us)),
                            times(ratio(g.first_relay.p99_us, a.first_relay.p99_us))
                        ),
                        times(ratio(g.lag.p99_us, a.lag.p99_us)),
                        times(ratio(cpu_per_token(g), cpu_per_token(a))),
                        times(ratio(g.rss_per_session_kb, a.rss_per_session_kb)),
                        times(ratio(a.tokens_per_s, g.tokens_per_s)),
                    ])
                })
        })
        .collect();
    out.push_str(&table(
        &[
            "sessions",
            "LangGraph",
            "TTFE overhead p50",
            "send → upstream request p50",
            "first token → first event p50 / p99",
            "lag p99",
            "CPU per token",
            "RSS per live session",
            "tokens/s (agentrt ÷ LangGraph)",
        ],
        &rows,
    ));
    let _ = writeln!(
        out,
        "\nProbes (fresh server each): memory per idle thread/session (each had one short turn); \
         a second run on a thread whose run is streaming (`multitask_strategy: \"reject\"`; \
         agentrt: a second Chat, `on_busy` REJECT); cancelling a streaming run \
         (LangGraph: `POST …/cancel?action=interrupt`; agentrt: `StopSession`), timed to the \
         stream's close; saturation: unpaced turns of {} tokens.\n",
        p.saturation.tokens
    );
    let rows: Vec<Vec<String>> = p
        .probes
        .iter()
        .map(|q| {
            let s = &q.saturation;
            vec![
                q.runtime.clone(),
                format!("{} ({})", num(q.kb_per_idle_thread), q.idle_threads),
                format!("{}: {}", q.busy.outcome, lat2(&q.busy.latency)),
                format!("{}: {}", q.cancel.outcome, lat2(&q.cancel.latency)),
                format!(
                    "{}{}{}",
                    s.sessions,
                    fail_note(s.failures),
                    if q.saturation_unfinished > 0 {
                        format!(" ({} unfinished)", q.saturation_unfinished)
                    } else {
                        String::new()
                    }
                ),
                num(s.tokens_per_s),
                num(s.events_per_s),
                format!("{} / {}", num(s.cpu_us_per_event), num(cpu_per_token(s))),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "runtime",
            "KB per idle thread (threads)",
            "busy: answer: p50 / p99 ms",
            "cancel → stream closed: p50 / p99 ms",
            "saturation sessions",
            "tokens/s",
            "events/s",
            "CPU µs/event / µs/token",
        ],
        &rows,
    ));
    if let Some(a) = p.probes.iter().find(|q| q.runtime == "agentrt") {
        let rows: Vec<Vec<String>> = p
            .probes
            .iter()
            .filter(|q| q.runtime != "agentrt")
            .map(|g| {
                vec![
                    g.runtime.clone(),
                    times(ratio(g.kb_per_idle_thread, a.kb_per_idle_thread)),
                    times(ratio(g.busy.latency.p50_us, a.busy.latency.p50_us)),
                    times(ratio(g.cancel.latency.p50_us, a.cancel.latency.p50_us)),
                    times(ratio(a.saturation.tokens_per_s, g.saturation.tokens_per_s)),
                    times(ratio(
                        cpu_per_token(&g.saturation),
                        cpu_per_token(&a.saturation),
                    )),
                ]
            })
            .collect();
        let _ = writeln!(out, "\nProbe ratios, LangGraph ÷ agentrt:\n");
        out.push_str(&table(
            &[
                "LangGraph",
                "KB per idle thread",
                "busy answer p50",
                "cancel → closed p50",
                "saturation tokens/s (agentrt ÷ LangGraph)",
                "CPU per token at saturation",
            ],
            &rows,
        ));
    }
    if !p.notes.is_empty() {
        let _ = writeln!(out, "\nServers: {}.", p.notes.join("; "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_read_as_times_and_refuse_nonsense() {
        assert_eq!(times(ratio(30.0, 10.0)), "3.00×");
        assert_eq!(times(ratio(1.0, 0.0)), "–");
        assert_eq!(times(ratio(1.0, -2.0)), "–");
        assert_eq!(times(ratio(f64::NAN, 2.0)), "–");
    }

    #[test]
    fn probes_count_outcomes() {
        let mut r = ProbeRec::default();
        r.add(Duration::from_millis(2), "HTTP 409".into());
        r.add(Duration::from_millis(4), "HTTP 409".into());
        r.add(Duration::from_millis(3), "accepted".into());
        let p = r.probe();
        assert_eq!(p.samples, 3);
        assert_eq!(p.outcome, "HTTP 409 ×2, accepted ×1");
        assert!((p.latency.p50_us - 3_000.0).abs() < 10.0, "{:?}", p.latency);
        assert_eq!(ProbeRec::default().probe().latency, Lat::default());
    }

    #[test]
    fn the_section_shows_levels_ratios_and_probes() {
        let load = |label: &str, ttfe: f64, tokens_per_s: f64| Load {
            label: label.into(),
            sessions: 10,
            turns: 20,
            tokens: 1000,
            server_cpu_us: 50_000,
            tokens_per_s,
            ttfe: Lat {
                count: 20,
                p50_us: ttfe,
                p99_us: ttfe * 2.0,
                ..Lat::default()
            },
            ..Load::default()
        };
        let part = LangGraphPart {
            python: "3.11.7".into(),
            versions: [("langgraph-cli".to_owned(), "0.4.40".to_owned())].into(),
            configs: vec![PeerConfig {
                label: "LangGraph stock".into(),
                command: "langgraph dev".into(),
                jobs_flag: None,
                jobs_logged: Some(1),
            }],
            levels: vec![Level {
                sessions: 10,
                direct: load("direct", 20_000.0, 500.0),
                runs: vec![
                    Run {
                        runtime: "agentrt".into(),
                        load: load("agentrt", 21_000.0, 500.0),
                        unfinished: 0,
                    },
                    Run {
                        runtime: "LangGraph stock".into(),
                        load: load("lg", 520_000.0, 50.0),
                        unfinished: 7,
                    },
                ],
            }],
            ..LangGraphPart::default()
        };
        let md = markdown(&part);
        assert!(md.contains("## Side by side with LangGraph"), "{md}");
        assert!(md.contains("langgraph-cli 0.4.40"), "{md}");
        assert!(md.contains("(jobs the server logged: 1)"), "{md}");
        // TTFE overhead 500 ms vs 1 ms: 500×; tokens/s 500 vs 50: 10×.
        assert!(md.contains("| 10 | LangGraph stock | 500× |"), "{md}");
        assert!(md.contains("| 10.0× |"), "{md}");
        assert!(md.contains("| 10 | LangGraph stock | 20 | 7 |"), "{md}");
    }
}
