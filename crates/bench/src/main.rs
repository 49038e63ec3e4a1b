//! `agentrt-bench`: drives the real `agentrt-server` binary (a child
//! process) over loopback through the Rust client, against a timed fake
//! OpenAI-compatible upstream running in this process, next to three
//! baselines measured in the same run: a bare tonic echo of the same
//! `ChatEvent`s (the transport limit), the fake read directly with
//! reqwest (the upstream limit) and a minimal relay (a tonic Chat relaying
//! the fake's SSE with no storage: the floor every agentrt ratio is quoted
//! against). Prints markdown tables; `--json FILE` writes every number.
//!
//! ```text
//! cargo build --release -p agentrt-server -p agentrt-bench
//! target/release/agentrt-bench --json target/bench.json --plots docs/bench   # full, ~13 min
//! target/release/agentrt-bench --smoke                      # seconds, for CI
//! target/release/agentrt-bench --only p10                   # PostgreSQL vs sled, forwarding
//! target/release/agentrt-bench --only agents                # agent sessions beside plain ones
//! target/release/agentrt-bench --only langgraph             # beside LangGraph's Agent Server
//! target/release/agentrt-bench --only baselines,s2,s3       # against the minimal relay
//! ```
//!
//! The `p10` part needs PostgreSQL (the system's binaries, or
//! `AGENTRT_TEST_PG_URL`); without it the part is skipped with a note, and
//! `--smoke` runs it only when asked for with `--only p10`. The same holds
//! for the `langgraph` part (Python 3.11+, PyPI for its venv's first fill;
//! see [`langgraph`]).

mod agents;
mod baseline;
mod burst;
mod context;
mod driver;
mod durable;
mod fake;
mod langgraph;
mod latency;
mod load;
mod local;
mod markdown;
mod otel;
mod plots;
mod proc_stats;
mod relay;
mod report;
mod saturation;
mod scenarios;
mod server;
mod shared_store;
mod venv;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use crate::fake::{FakeServer, StreamParams};
use crate::load::Load;
use crate::report::{Report, Target};
use crate::scenarios::{Env, Plan};
use crate::server::ServerSpec;

#[derive(Debug, Parser)]
#[command(
    name = "agentrt-bench",
    about = "Benchmarks agentrt-server against a timed fake upstream and bare baselines"
)]
struct Cli {
    /// The agentrt-server binary [default: `agentrt-server` next to this
    /// executable].
    #[arg(long)]
    server: Option<PathBuf>,
    /// Writes every result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also writes the markdown tables here.
    #[arg(long)]
    markdown: Option<PathBuf>,
    /// Draws the run's scaling curves as PNG files into this directory
    /// (`crates/bench/plot/plot.py`, from the run's JSON; matplotlib pinned
    /// in a venv of its own, see `--plot-venv`).
    #[arg(long)]
    plots: Option<PathBuf>,
    /// The venv `--plots` draws with [default: `target/plot-venv`, beside
    /// this executable's directory; created and filled on first use].
    #[arg(long)]
    plot_venv: Option<PathBuf>,
    /// Every scenario at tiny sizes (seconds); fails only if something breaks.
    #[arg(long)]
    smoke: bool,
    /// Only these parts, comma-separated:
    /// baselines,s1,agents,s2,s3,s4,s6,s7,s9,local,otel,p10,langgraph.
    /// `s2` includes the bursts (N Chats at once, new and warm sessions)
    /// beside the minimal relay;
    /// `otel` runs S2 at `--otel-sessions` with telemetry off, then on;
    /// `p10` runs S6 and S2 on sled and PostgreSQL and the forwarding
    /// scenario (needs PostgreSQL; see `shared_store`); `langgraph` runs
    /// LangGraph's Agent Server beside agentrt (needs python3; see
    /// `langgraph`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Runs the server (and the echo baseline) under `taskset -c CPUS`.
    #[arg(long)]
    server_cpus: Option<String>,
    /// `AGENTRT_LOG` for the server [default: the server's own, info].
    #[arg(long)]
    server_log: Option<String>,
    /// Sessions of the telemetry off/on comparison [default: 100; smoke: 4].
    #[arg(long)]
    otel_sessions: Option<usize>,
    /// Replaces the S2 concurrency levels, bursts included (e.g.
    /// `--s2-sessions 1000`).
    #[arg(long, value_delimiter = ',')]
    s2_sessions: Vec<usize>,
    /// The local model's GGUF for the `local` part [default:
    /// .ci/models/ or agentrt-data/models/SmolLM2-135M-Instruct.Q4_1.gguf;
    /// the part is skipped when there is none].
    #[arg(long)]
    local_model: Option<PathBuf>,
    /// The venv of the `langgraph` part, created and filled when missing
    /// [default: `langgraph-venv` in the target dir of this executable].
    #[arg(long)]
    langgraph_venv: Option<PathBuf>,
    /// `--n-jobs-per-worker` of LangGraph's raised configuration (its stock
    /// one runs too).
    #[arg(long, default_value_t = 100)]
    langgraph_jobs: usize,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// (internal) Serves the bare tonic echo baseline.
    #[command(hide = true)]
    EchoServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
    },
    /// (internal) Serves the minimal relay baseline to `--upstream`.
    #[command(hide = true)]
    RelayServer {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The upstream's OpenAI-compatible base URL (`http://HOST:PORT/v1`).
        #[arg(long)]
        upstream: String,
    },
}

fn params(ttft_ms: u64, tokens: u32, rate: f64) -> StreamParams {
    StreamParams {
        ttft: Duration::from_millis(ttft_ms),
        tokens,
        rate,
    }
}

fn p10_plan(smoke: bool) -> shared_store::P10Plan {
    if smoke {
        return shared_store::P10Plan {
            s6_levels: vec![2],
            s2_sessions: 2,
            fwd: params(200, 10, 200.0),
            fwd_watchers: 1,
            fwd_turns: 1,
        };
    }
    shared_store::P10Plan {
        s6_levels: vec![8, 64],
        s2_sessions: 100,
        fwd: params(300, 500, 200.0),
        fwd_watchers: 10,
        fwd_turns: 5,
    }
}

fn plan(smoke: bool) -> Plan {
    let secs = Duration::from_secs_f64;
    if smoke {
        return Plan {
            turn_limit: secs(20.0),
            echo_ttfe_calls: 20,
            echo_sat_streams: 20,
            echo_sat: params(0, 20, 200.0),
            echo_sat_window: secs(0.3),
            echo_unpaced_streams: 2,
            s1_turns: 5,
            s1: params(1, 5, 1000.0),
            s2_levels: vec![1, 4],
            s2: params(1, 5, 500.0),
            s2_window: secs(0.3),
            s2_side_window: secs(0.2),
            burst: params(1, 5, 500.0),
            burst_samples: 8,
            burst_max_rounds: 2,
            s3_levels: vec![2],
            s3_tokens: 200,
            s3_window: secs(0.3),
            s4_watchers: vec![1, 3],
            s4: params(50, 20, 500.0),
            s6_levels: vec![1, 4],
            s6_window: secs(0.3),
            s7_sessions: 50,
            s7_concurrency: 8,
        };
    }
    Plan {
        turn_limit: secs(60.0),
        echo_ttfe_calls: 2000,
        echo_sat_streams: 2000,
        echo_sat: params(0, 400, 200.0),
        echo_sat_window: secs(6.0),
        echo_unpaced_streams: 16,
        s1_turns: 200,
        s1: params(5, 20, 400.0),
        s2_levels: vec![1, 10, 100, 1000],
        s2: params(20, 50, 50.0),
        s2_window: secs(10.0),
        s2_side_window: secs(4.0),
        burst: params(20, 20, 100.0),
        burst_samples: 300,
        burst_max_rounds: 30,
        s3_levels: vec![8, 16, 32],
        s3_tokens: 2000,
        s3_window: secs(4.0),
        s4_watchers: vec![1, 10, 100],
        s4: params(100, 1000, 500.0),
        s6_levels: vec![1, 8, 64, 256],
        s6_window: secs(5.0),
        s7_sessions: 10_000,
        s7_concurrency: 64,
    }
}

fn run_cmd(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn machine() -> report::Machine {
    let lscpu = run_cmd("lscpu", &[]);
    let cpu_model = lscpu
        .lines()
        .find_map(|l| l.strip_prefix("Model name:"))
        .map_or("unknown".into(), |m| m.trim().to_owned());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| proc_stats::parse_status_kb(&m, "MemTotal"))
        .map_or("unknown".into(), |kb| {
            format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0)
        });
    report::Machine {
        nproc: run_cmd("nproc", &[]),
        cpu_model,
        memory,
        kernel: run_cmd("uname", &["-sr"]),
        rustc: run_cmd("rustc", &["--version"]),
    }
}

/// The S2 level nearest to `n` sessions.
fn s2_near(r: &Report, n: usize) -> Option<&latency::S2Level> {
    r.s2.iter().min_by_key(|l| l.sessions.abs_diff(n))
}

fn targets(r: &Report) -> Vec<Target> {
    let mut t = Vec::new();
    for n in [100, 1000] {
        let Some(l) = s2_near(r, n).filter(|l| n == 100 || l.sessions >= 1000) else {
            continue;
        };
        let c = l.sessions;
        if n == 100 {
            t.push(Target::at_most(
                &format!("TTFE overhead p50, S2 {c} sessions"),
                0.5,
                l.ttfe_overhead_p50_us / 1e3,
                "ms",
            ));
            t.push(Target::at_most(
                &format!("TTFE overhead p99, S2 {c} sessions"),
                1.5,
                l.ttfe_overhead_p99_us / 1e3,
                "ms",
            ));
        } else {
            t.push(Target::at_most(
                &format!("TTFE overhead p99, S2 {c} sessions (B5)"),
                5.0,
                l.ttfe_overhead_p99_us / 1e3,
                "ms",
            ));
        }
    }
    if let Some(s1) = &r.s1 {
        t.push(Target::at_most(
            "relay lag p99, S1 1 session",
            1.0,
            s1.agentrt.lag.p99_us / 1e3,
            "ms",
        ));
    }
    let mut seen = Vec::new();
    for n in [100, 1000] {
        if let Some(l) = s2_near(r, n).filter(|l| !seen.contains(&l.sessions)) {
            seen.push(l.sessions);
            let c = l.sessions;
            t.push(Target::at_most(
                &format!("relay lag p99, S2 {c} sessions"),
                1.0,
                l.agentrt.lag.p99_us / 1e3,
                "ms",
            ));
            t.push(Target::at_most(
                &format!("CPU per relayed event ÷ bare echo, S2 {c} sessions"),
                2.0,
                l.cpu_ratio,
                "×",
            ));
            t.push(Target::at_most(
                &format!("memory per active streaming session, S2 {c} sessions"),
                64.0,
                l.agentrt.rss_per_session_kb,
                "KB",
            ));
        }
    }
    if let Some(s3) = &r.s3 {
        t.push(Target::at_least(
            "end-to-end events/s, S3 unpaced",
            60_000.0,
            s3.max_tokens_per_s,
            "ev/s",
        ));
        t.push(Target::at_least(
            "S3 throughput ÷ min(echo, direct) (B5)",
            0.5,
            s3.throughput_ratio,
            "×",
        ));
    }
    if let Some(s7) = &r.s7 {
        t.push(Target::at_most(
            "memory per idle session, S7",
            4.0,
            s7.kb_per_idle_session,
            "KB",
        ));
        t.push(Target::at_most(
            &format!(
                "restart to readiness SERVING, {} sessions (B5 cold start)",
                s7.sessions
            ),
            1000.0,
            s7.restart_ready_ms,
            "ms",
        ));
    }
    // Every level with 8+ sessions (2+ in smoke runs) gets its own row.
    let durable =
        r.s6.iter()
            .filter(|l| l.sessions >= 8 || (r.mode == "smoke" && l.sessions > 1));
    for l in durable {
        t.push(Target::at_least(
            &format!("durable short turns/s, S6 {} sessions", l.sessions),
            1000.0,
            l.turns_per_s,
            "turns/s",
        ));
    }
    t.extend(report::relay_targets(r));
    t
}

fn note_failures(part: &str, loads: &[&Load], failures: &mut Vec<String>) {
    for l in loads {
        if l.failures > 0 {
            failures.push(format!(
                "{part} {}: {} of {} turns failed; first: {}",
                l.label,
                l.failures,
                l.turns,
                l.first_failures.join(" | ")
            ));
        }
    }
}

async fn bounded<T>(
    part: &str,
    limit: Duration,
    fut: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    eprintln!("agentrt-bench: {part} ...");
    let start = Instant::now();
    let r = match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(format!("took longer than {limit:?}")),
    };
    eprintln!(
        "agentrt-bench: {part} {} in {:.1} s",
        if r.is_ok() { "done" } else { "FAILED" },
        start.elapsed().as_secs_f64()
    );
    r.map_err(|e| format!("{part}: {e}"))
}

async fn run(cli: Cli) -> Result<bool, String> {
    let started = Instant::now();
    let binary = match cli.server.clone() {
        Some(p) => p,
        None => std::env::current_exe()
            .map_err(|e| format!("current_exe: {e}"))?
            .with_file_name("agentrt-server"),
    };
    if !binary.is_file() {
        return Err(format!(
            "no server binary at {} (build it: cargo build --release -p agentrt-server, or pass --server)",
            binary.display()
        ));
    }
    let mut plan = plan(cli.smoke);
    if !cli.s2_sessions.is_empty() {
        plan.s2_levels.clone_from(&cli.s2_sessions);
    }
    let want = |part: &str| cli.only.is_empty() || cli.only.iter().any(|o| o == part);
    let env = Env {
        spec: ServerSpec {
            binary,
            cpus: cli.server_cpus.clone(),
            log_filter: cli.server_log.clone(),
            env: Vec::new(),
            config_tail: String::new(),
        },
        fake: Arc::new(
            FakeServer::start()
                .await
                .map_err(|e| format!("fake: {e}"))?,
        ),
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .map_err(|e| format!("reqwest: {e}"))?,
        root: tempfile::Builder::new()
            .prefix("agentrt-bench-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?,
        plan,
    };
    let limit = Duration::from_secs(if cli.smoke { 60 } else { 300 });
    let mut r = Report {
        mode: if cli.smoke { "smoke" } else { "full" }.into(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        machine: machine(),
        server_cpus: cli.server_cpus.clone(),
        server_binary: env.spec.binary.display().to_string(),
        git_commit: run_cmd("git", &["rev-parse", "--short", "HEAD"]),
        ..Report::default()
    };
    let mut failures = Vec::new();
    if want("baselines") {
        match bounded("baselines", limit, saturation::baselines(&env)).await {
            Ok(b) => {
                note_failures(
                    "baselines",
                    &[&b.echo_ttfe, &b.echo_saturation, &b.echo_unpaced],
                    &mut failures,
                );
                r.baselines = b;
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s1") {
        match bounded("S1", limit, latency::s1(&env)).await {
            Ok(s) => {
                note_failures("S1", &[&s.agentrt, &s.direct], &mut failures);
                r.s1 = Some(s);
            }
            Err(e) => failures.push(e),
        }
    }
    if want("agents") {
        let turns = env.plan.s1_turns;
        match bounded("agents", limit, agents::agents(&env, turns)).await {
            Ok(a) => {
                note_failures("agents", &[&a.plain, &a.agent], &mut failures);
                r.agents = Some(a);
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s2") {
        for &c in &env.plan.s2_levels {
            match bounded(&format!("S2 c={c}"), limit, latency::s2_level(&env, c)).await {
                Ok(l) => {
                    let loads = [&l.agentrt, &l.direct, &l.echo, &l.relay];
                    note_failures("S2", &loads, &mut failures);
                    r.s2.push(l);
                }
                Err(e) => failures.push(e),
            }
        }
        for &c in &env.plan.s2_levels {
            for kind in [burst::Sessions::New, burst::Sessions::Warm] {
                let part = format!("S2 burst c={c} ({} sessions)", kind.name());
                match bounded(&part, limit, burst::burst_level(&env, c, kind)).await {
                    Ok(b) => {
                        note_failures("S2 burst", &[&b.agentrt, &b.relay], &mut failures);
                        r.s2_burst.push(b);
                    }
                    Err(e) => failures.push(e),
                }
            }
        }
    }
    if want("otel") {
        let n = cli.otel_sessions.unwrap_or(if cli.smoke { 4 } else { 100 });
        match bounded(
            &format!("telemetry off/on c={n}"),
            limit * 2,
            otel::compare(&env, n),
        )
        .await
        {
            Ok(o) => {
                note_failures("otel", &[&o.off, &o.on], &mut failures);
                if o.spans == 0 {
                    failures.push("otel: telemetry on exported no span".into());
                }
                r.otel = Some(o);
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s3") {
        let echo = r.baselines.echo_saturation.tokens_per_s;
        let unpaced = r.baselines.echo_unpaced.tokens_per_s;
        match bounded("S3", limit, saturation::s3(&env, echo, unpaced)).await {
            Ok(s) => {
                let loads: Vec<&Load> = [&s.agentrt, &s.direct, &s.new_session, &s.relay]
                    .into_iter()
                    .flatten()
                    .collect();
                note_failures("S3", &loads, &mut failures);
                r.s3 = Some(s);
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s4") {
        match bounded("S4", limit, saturation::s4(&env)).await {
            Ok(levels) => {
                for l in &levels {
                    note_failures("S4", &[&l.watch, &l.caller], &mut failures);
                }
                r.s4 = levels;
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s6") {
        match bounded("S6", limit, durable::s6(&env)).await {
            Ok(levels) => {
                note_failures("S6", &levels.iter().collect::<Vec<_>>(), &mut failures);
                r.s6 = levels;
            }
            Err(e) => failures.push(e),
        }
    }
    if want("s7") {
        match bounded("S7", limit, durable::s7(&env)).await {
            Ok(s) => r.s7 = Some(s),
            Err(e) => failures.push(e),
        }
    }
    if want("s9") {
        let sizes: &[u64] = if cli.smoke { &[50, 500] } else { &[50, 50_000] };
        match bounded("S9", limit, context::s9(env.root.path(), sizes)).await {
            Ok(rows) => r.s9 = rows,
            Err(e) => failures.push(e),
        }
    }
    if want("local") {
        let model = cli.local_model.clone().or_else(|| {
            local::default_candidates()
                .into_iter()
                .find(|p| p.is_file())
        });
        match model {
            Some(model) => {
                let (runs, tokens) = if cli.smoke { (1, 8) } else { (5, 100) };
                match bounded("local", limit, local::local(&env, &model, runs, tokens)).await {
                    Ok(l) => r.local = Some(l),
                    Err(e) => failures.push(e),
                }
            }
            None => {
                let why = "skipped: no local model file (pass --local-model PATH, or provision it with `agentrt-server fetch-model`)";
                eprintln!("agentrt-bench: local {why}");
                r.local_skipped = Some(why.to_owned());
            }
        }
    }
    // The smoke run (CI's bench stage) must not need PostgreSQL.
    let asked = |part: &str| cli.only.iter().any(|o| o == part);
    if want("p10") && (!cli.smoke || asked("p10")) {
        match bounded(
            "P10",
            limit * 3,
            shared_store::p10(&env, &p10_plan(cli.smoke)),
        )
        .await
        {
            Ok(p) => {
                note_failures("P10", &shared_store::loads(&p), &mut failures);
                r.p10 = Some(p);
            }
            Err(e) if e.ends_with(shared_store::NO_POSTGRES) => {
                eprintln!("agentrt-bench: P10 skipped: {e}");
                r.p10_skipped = Some(e);
            }
            Err(e) => failures.push(e),
        }
    }
    if want("langgraph") && (!cli.smoke || asked("langgraph")) {
        let venv = cli
            .langgraph_venv
            .clone()
            .unwrap_or_else(langgraph::default_venv);
        match langgraph::ensure_venv(&venv).await {
            Ok(venv) => {
                let plan = langgraph::plan(cli.smoke, &env.plan, cli.langgraph_jobs);
                match bounded(
                    "langgraph",
                    limit * 4,
                    langgraph::langgraph(&env, &venv, &plan),
                )
                .await
                {
                    Ok(p) => {
                        note_failures("langgraph", &langgraph::loads(&p), &mut failures);
                        r.langgraph = Some(p);
                    }
                    Err(e) => failures.push(e),
                }
            }
            Err(venv::Unavailable::Skip(why)) => {
                eprintln!("agentrt-bench: langgraph skipped: {why}");
                r.langgraph_skipped = Some(why);
            }
            Err(venv::Unavailable::Failed(e)) => failures.push(format!("langgraph: {e}")),
        }
    }
    let unknown = env
        .fake
        .counters()
        .unknown_keys
        .load(std::sync::atomic::Ordering::Relaxed);
    if unknown > 0 {
        failures.push(format!(
            "the fake got {unknown} requests without a known ticket"
        ));
    }
    r.failures = failures;
    r.targets = targets(&r);
    r.duration_s = started.elapsed().as_secs_f64();
    let md = report::markdown(&r);
    println!("{md}");
    if let Some(path) = &cli.markdown {
        std::fs::write(path, &md).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    if let Some(path) = &cli.json {
        let json = serde_json::to_string_pretty(&r).map_err(|e| format!("json: {e}"))?;
        std::fs::write(path, json).map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    if let Some(dir) = &cli.plots {
        draw_plots(&r, &cli, dir).await?;
    }
    let c = env.fake.counters();
    eprintln!(
        "agentrt-bench: {:.1} s; fake: {} connections for {} requests ({} compaction summaries)",
        r.duration_s,
        c.connections.load(std::sync::atomic::Ordering::Relaxed),
        c.requests.load(std::sync::atomic::Ordering::Relaxed),
        c.summaries.load(std::sync::atomic::Ordering::Relaxed),
    );
    Ok(r.failures.is_empty())
}

/// `--plots DIR`: the run's JSON (the `--json` file, or `DIR/bench.json`)
/// drawn into `DIR`.
async fn draw_plots(r: &report::Report, cli: &Cli, dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let json = match &cli.json {
        Some(path) => path.clone(),
        None => {
            let path = dir.join("bench.json");
            let text = serde_json::to_string_pretty(r).map_err(|e| format!("json: {e}"))?;
            std::fs::write(&path, text).map_err(|e| format!("write {}: {e}", path.display()))?;
            path
        }
    };
    let venv = cli.plot_venv.clone().unwrap_or_else(plots::default_venv);
    for file in plots::draw(&json, dir, &venv).await? {
        eprintln!("agentrt-bench: plot {}", file.display());
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::EchoServer { listen }) => {
            return match baseline::run_echo_server(listen).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("agentrt-bench echo-server: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::RelayServer { listen, upstream }) => {
            return match relay::run_relay_server(listen, &upstream).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("agentrt-bench relay-server: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        None => {}
    }
    match run(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("agentrt-bench: some parts failed (see Failures)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agentrt-bench: {e}");
            ExitCode::from(2)
        }
    }
}
