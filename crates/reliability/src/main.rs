//! `agentrt-reliability`: the reliability battery. Drives the real
//! `agentrt-server` binary (a child process) over loopback against a fake
//! OpenAI-compatible upstream in this process, and checks what it survives:
//!
//! - `crash`: `kill -9` at seeded points of progress while 16 sessions
//!   stream turns with caller-executed and server (MCP) tools, restart on
//!   the same data, check every acknowledged message, seqs, tool results
//!   and that no session is wedged — on sled and on PostgreSQL;
//! - `races`: N connections send `Chat` on the same idle session at once,
//!   round after round: exactly one admitted, the rest `SESSION_BUSY`,
//!   nothing else stored;
//! - `abuse`: callers that stop reading, callers that vanish mid-turn and
//!   one connection opening many streams, next to victim sessions whose
//!   relay lag is measured; the server's RSS as a figure;
//! - `disk`: the sled store on a small tmpfs filled under it — refused at
//!   admission below `store_min_free_mb` with readiness NOT_SERVING and
//!   back without a restart, running turns ended ERROR when even their
//!   writes are refused, liveness NOT_SERVING once the disk is full to the
//!   last page, and every acknowledged message there after a restart
//!   (needs root, to mount the tmpfs).
//!
//! ```text
//! cargo build -p agentrt-server -p agentrt-reliability
//! cargo build -p agentrt-runtime --example mcp_test_server   # server tools
//! target/debug/agentrt-reliability --short            # CI: a few minutes
//! target/debug/agentrt-reliability --seed 42          # full: 2,000 cycles ...
//! ```
//!
//! Verdicts are deterministic: any violation exits 1 after printing it
//! with the seed and cycle that reproduce it. Timing figures (lag, RSS,
//! restart time) are reported; only the RSS bound (and, when asked for,
//! `--lag-p99-ms`) is a verdict, besides the disk battery's bounds on how
//! long the health service may take to say the disk is full or free (10 s,
//! ten times the server's poll).

mod abuse;
mod crash;
mod disk;
mod fake;
mod mirror;
mod races;
mod report;
mod rng;
mod server;
mod tmpfs;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;

use crate::fake::Fake;
use crate::server::{Server, Spec};

#[derive(Debug, Parser)]
#[command(
    name = "agentrt-reliability",
    about = "Reliability battery: kill -9 cycles, admission races, abusive clients, a full disk"
)]
struct Cli {
    /// The agentrt-server binary [default: `agentrt-server` next to this
    /// executable].
    #[arg(long)]
    server: Option<PathBuf>,
    /// The MCP test server for server tools [default:
    /// `examples/mcp_test_server` next to the server binary, when built].
    #[arg(long)]
    mcp: Option<PathBuf>,
    /// No server tools in the crash cycles (caller-executed tools only).
    #[arg(long)]
    no_server_tools: bool,
    /// CI sizes (200 crash cycles on sled, 100 on PostgreSQL, 1,000 races,
    /// 50+50+100 abusers, 4 sessions on the full disk).
    #[arg(long)]
    short: bool,
    /// The seed of every random choice [default: from the clock; printed].
    #[arg(long, env = "AGENTRT_RELIABILITY_SEED")]
    seed: Option<u64>,
    /// Only these parts, comma-separated: crash,races,abuse,disk (disk
    /// needs root: it mounts a tmpfs).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Stores of the crash cycles, comma-separated: sled,postgres.
    #[arg(long, value_delimiter = ',', default_value = "sled,postgres")]
    stores: Vec<String>,
    /// Crash cycles per store [default: 200 short, 2,000 full].
    #[arg(long)]
    cycles: Option<usize>,
    /// Admission race rounds [default: 1,000 short, 10,000 full].
    #[arg(long)]
    rounds: Option<usize>,
    /// Connections racing per round.
    #[arg(long, default_value_t = 8)]
    racers: usize,
    /// Abuse verdict: the server's peak RSS bound in MB.
    #[arg(long, default_value_t = 1024)]
    rss_limit_mb: u64,
    /// Abuse verdict (off by default): victims' relay lag p99 bound in ms.
    #[arg(long)]
    lag_p99_ms: Option<f64>,
    /// Also writes the markdown report here.
    #[arg(long)]
    markdown: Option<PathBuf>,
}

fn default_server() -> Result<PathBuf, String> {
    let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let path = me.with_file_name("agentrt-server");
    if path.exists() {
        Ok(path)
    } else {
        Err(format!(
            "no server binary at {} (build it: cargo build -p agentrt-server, or pass --server)",
            path.display()
        ))
    }
}

fn default_mcp(server: &Path) -> Option<PathBuf> {
    let path = server.parent()?.join("examples").join("mcp_test_server");
    path.exists().then_some(path)
}

fn wants(cli: &Cli, part: &str) -> bool {
    cli.only.is_empty() || cli.only.iter().any(|p| p == part)
}

fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| format!("temp dir: {e}"))
}

/// The `[store]` table and environment for PostgreSQL (a fresh database on
/// the testkit's throwaway cluster).
async fn postgres_store() -> Result<(String, Vec<(String, String)>), String> {
    let db = agentrt_testkit::pg::database().await.ok_or(
        "no PostgreSQL: install the postgresql package (or set AGENTRT_TEST_PG_URL), or pass --stores sled",
    )?;
    let tail = "\n[store]\nkind = \"postgres\"\nurl_env = \"AGENTRT_RELIABILITY_PG_URL\"\n\
                lease_ttl_ms = 1000\n"
        .to_owned();
    Ok((
        tail,
        vec![("AGENTRT_RELIABILITY_PG_URL".to_owned(), db.url)],
    ))
}

async fn run(cli: &Cli, seed: u64, out: &mut report::Report) -> Result<(), String> {
    let binary = match &cli.server {
        Some(p) => p.clone(),
        None => default_server()?,
    };
    let mcp = if cli.no_server_tools {
        None
    } else {
        cli.mcp.clone().or_else(|| default_mcp(&binary))
    };
    if mcp.is_none() && !cli.no_server_tools && wants(cli, "crash") {
        eprintln!(
            "agentrt-reliability: no MCP test server (cargo build -p agentrt-runtime --example mcp_test_server); crash cycles use caller-executed tools only"
        );
    }
    let fake = Arc::new(Fake::start(Duration::from_millis(1)).await?);
    if wants(cli, "crash") {
        for store in &cli.stores {
            let dir = temp_dir(&format!("agentrt-crash-{store}-"))?;
            let (tail, env) = match store.as_str() {
                "sled" => (String::new(), Vec::new()),
                "postgres" => postgres_store().await?,
                other => return Err(format!("unknown store {other:?} (sled, postgres)")),
            };
            let spec = Spec {
                binary: binary.clone(),
                dir: dir.path().to_owned(),
                config: server::config(&fake.base_url(), mcp.as_deref(), &tail),
                env,
                data_dir: None,
                args: Vec::new(),
            };
            let plan = crash::Plan {
                // A PostgreSQL cycle waits for the dead process's lease (1 s,
                // the shortest TTL allowed) before its sessions take turns
                // again: CI's short run does half as many there.
                cycles: cli.cycles.unwrap_or(match (cli.short, store.as_str()) {
                    (true, "postgres") => 100,
                    (true, _) => 200,
                    (false, _) => 2_000,
                }),
                sessions: 16,
                connections: 4,
                max_kill_events: 400,
                full_check_every: 50,
                // The dead process's PostgreSQL leases (1 s) must expire.
                settle: Duration::from_secs(if store == "postgres" { 10 } else { 5 }),
                server_tools: mcp.is_some(),
                strict_outcomes: store != "postgres",
            };
            eprintln!(
                "agentrt-reliability: crash on {store}: {} cycles, seed {seed}",
                plan.cycles
            );
            let result = crash::run(&spec, &plan, seed, store).await;
            let failed = result.as_ref().map_or(true, |f| !f.violations.is_empty());
            if failed {
                let kept = dir.keep();
                eprintln!("agentrt-reliability: kept {} (server.log)", kept.display());
            }
            out.crash(&result?, &plan);
        }
    }
    if wants(cli, "races") {
        let dir = temp_dir("agentrt-races-")?;
        let spec = Spec {
            binary: binary.clone(),
            dir: dir.path().to_owned(),
            config: server::config(&fake.base_url(), None, ""),
            env: Vec::new(),
            data_dir: None,
            args: Vec::new(),
        };
        let server = Server::start(&spec).await?;
        let plan = races::Plan {
            rounds: cli.rounds.unwrap_or(if cli.short { 1_000 } else { 10_000 }),
            racers: cli.racers.max(2),
            lanes: 4,
            sessions_per_lane: 25,
        };
        eprintln!(
            "agentrt-reliability: races: {} rounds x {} connections",
            plan.rounds, plan.racers
        );
        let fig = races::run(&server, &plan, seed).await?;
        out.races(&fig);
        server.kill9().await?;
    }
    if wants(cli, "abuse") {
        let dir = temp_dir("agentrt-abuse-")?;
        let spec = Spec {
            binary: binary.clone(),
            dir: dir.path().to_owned(),
            config: server::config(&fake.base_url(), None, ""),
            env: Vec::new(),
            data_dir: None,
            args: Vec::new(),
        };
        let mut server = Server::start(&spec).await?;
        let plan = if cli.short {
            abuse::Plan {
                victims: 8,
                stop_readers: 50,
                vanishers: 50,
                one_conn_streams: 100,
                victim_tokens: 50,
                long_tokens: 4_000,
                window: Duration::from_secs(3),
                rss_limit_mb: cli.rss_limit_mb,
                lag_p99_limit: cli.lag_p99_ms.map(|ms| Duration::from_secs_f64(ms / 1e3)),
            }
        } else {
            abuse::Plan {
                victims: 16,
                stop_readers: 500,
                vanishers: 500,
                one_conn_streams: 1_000,
                victim_tokens: 100,
                long_tokens: 20_000,
                window: Duration::from_secs(10),
                rss_limit_mb: cli.rss_limit_mb,
                lag_p99_limit: cli.lag_p99_ms.map(|ms| Duration::from_secs_f64(ms / 1e3)),
            }
        };
        eprintln!(
            "agentrt-reliability: abuse: {} stop reading, {} vanish, {} streams on one connection",
            plan.stop_readers, plan.vanishers, plan.one_conn_streams
        );
        let fig = abuse::run(&mut server, &fake, &plan, seed).await?;
        out.abuse(&fig, &plan);
        server.kill9().await?;
    }
    if wants(cli, "disk") {
        let dir = temp_dir("agentrt-disk-")?;
        let plan = disk::Plan {
            size_mb: 64,
            min_free_mb: 16,
            sessions: if cli.short { 4 } else { 8 },
            turns_before: 2,
            big_bytes: (150_000, 250_000),
            answer_tokens: 400,
            health_limit: Duration::from_secs(10),
            turn_limit: Duration::from_secs(60),
        };
        eprintln!(
            "agentrt-reliability: disk: a {} MiB tmpfs, store_min_free_mb {}, {} sessions",
            plan.size_mb, plan.min_free_mb, plan.sessions
        );
        let result = disk::run(&binary, &fake, dir.path(), &plan, seed).await;
        if result.as_ref().map_or(true, |f| !f.violations.is_empty()) {
            let kept = dir.keep();
            eprintln!("agentrt-reliability: kept {} (server.log)", kept.display());
        }
        out.disk(&result?, &plan);
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let seed = cli.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agentrt-reliability: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = report::Report::new(seed, &std::env::args().collect::<Vec<_>>());
    let result = runtime.block_on(run(&cli, seed, &mut out));
    let text = out.markdown();
    println!("{text}");
    if let Some(path) = &cli.markdown
        && let Err(e) = std::fs::write(path, &text)
    {
        eprintln!("agentrt-reliability: write {}: {e}", path.display());
    }
    if let Err(e) = result {
        eprintln!("agentrt-reliability: ERROR (seed {seed}): {e}");
        return ExitCode::FAILURE;
    }
    if !out.violations.is_empty() {
        for v in &out.violations {
            eprintln!("agentrt-reliability: VIOLATION: {v}");
        }
        eprintln!(
            "agentrt-reliability: {} violation(s); reproduce with --seed {seed} (and the same size flags)",
            out.violations.len()
        );
        return ExitCode::FAILURE;
    }
    eprintln!("agentrt-reliability: no violation (seed {seed})");
    ExitCode::SUCCESS
}
