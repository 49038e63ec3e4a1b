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
mod markdown;
mod peer;
mod probes;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::Serialize;

use crate::driver::{Recorder, Totals, connections_for};
use crate::fake::StreamParams;
use crate::load::{Lat, Load};
use crate::scenarios::{Env, Measure, agentrt_loops, create_sessions, direct_load, nominal};

use self::client::{LgClient, TurnEnd};
pub(crate) use self::markdown::section as markdown;
use self::peer::{Peer, PeerSpec, process_tree};
pub(crate) use self::peer::{default_venv, ensure_venv};
use crate::proc_stats::sample_all;
use crate::venv::Venv;

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
        idle_threads: 300,
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
    part.probes.push(probes::agentrt_probes(env, plan).await?);
    for (i, (label, spec)) in specs.iter().enumerate() {
        eprintln!("agentrt-bench: langgraph: {label}, probes");
        let peer = start_peer(spec, env, &format!("lg{i}-probes"), &mut part).await?;
        let probes = probes::peer_probes(env, &peer, plan, label).await;
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
    let measure = Measure::begin_tree(tree);
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

/// Every load of the part, for the report's failure notes.
pub(crate) fn loads(p: &LangGraphPart) -> Vec<&Load> {
    p.levels
        .iter()
        .flat_map(|l| std::iter::once(&l.direct).chain(l.runs.iter().map(|r| &r.load)))
        .chain(p.probes.iter().map(|p| &p.saturation))
        .collect()
}
