//! The P10 part (`--only p10`): what the shared PostgreSQL store and the
//! routing between replicas cost. S6 (durable short turns) and S2 (paced
//! streams) run on sled and on PostgreSQL back to back in one run, and a
//! forwarding scenario compares Subscribe through the replica that owns a
//! turn with Subscribe through another replica (which relays the owner's
//! events over the internal cluster service).
//!
//! PostgreSQL comes from `agentrt_testkit::pg`: a throwaway cluster from
//! the system's binaries, or the server `AGENTRT_TEST_PG_URL` names (a
//! fresh database is created on it per server). Without either the part
//! is skipped with a note; the `--smoke` run never asks for it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{Recorder, agentrt_turn_with, watch_turn};
use crate::durable;
use crate::fake::StreamParams;
use crate::latency::{self, S2Level};
use crate::load::{LOAD_HEAD, Load, fail_note, lat2, lat3, load_row};
use crate::markdown::{ms, num, table};
use crate::scenarios::{Env, create_session};
use crate::server::ServerSpec;

/// The environment variables the PostgreSQL servers read their URL and
/// cluster key from (`[store] url_env`, `[cluster] key_env`).
const URL_ENV: &str = "AGENTRT_BENCH_DATABASE_URL";
const KEY_ENV: &str = "AGENTRT_BENCH_CLUSTER_KEY";

/// Sizes of the P10 part.
#[derive(Debug, Clone)]
pub(crate) struct P10Plan {
    pub(crate) s6_levels: Vec<usize>,
    pub(crate) s2_sessions: usize,
    /// The forwarded turn's stream.
    pub(crate) fwd: StreamParams,
    /// Watchers on each path per turn.
    pub(crate) fwd_watchers: usize,
    pub(crate) fwd_turns: usize,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Forwarding {
    pub(crate) watchers_per_path: usize,
    pub(crate) turns: usize,
    pub(crate) via_owner: Load,
    pub(crate) via_other: Load,
    /// Non-owner lag p99 − owner lag p99, µs.
    pub(crate) lag_p99_overhead_us: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct P10 {
    pub(crate) s6_sled: Vec<Load>,
    pub(crate) s6_postgres: Vec<Load>,
    pub(crate) s2_sled: Option<S2Level>,
    pub(crate) s2_postgres: Option<S2Level>,
    pub(crate) forwarding: Option<Forwarding>,
}

/// The server spec for PostgreSQL at `url`: `[store] kind = "postgres"`,
/// and with `cluster_key` a `[cluster]` listener on loopback.
fn postgres_spec(base: &ServerSpec, url: &str, cluster_key: Option<&str>) -> ServerSpec {
    let mut spec = base.clone();
    let _ = write!(
        spec.config_tail,
        "\n[store]\nkind = \"postgres\"\nurl_env = \"{URL_ENV}\"\npool_size = 16\n"
    );
    spec.env.push((URL_ENV.to_owned(), url.to_owned()));
    if let Some(key) = cluster_key {
        let _ = write!(
            spec.config_tail,
            "\n[cluster]\nlisten = \"127.0.0.1:0\"\nkey_env = \"{KEY_ENV}\"\n"
        );
        spec.env.push((KEY_ENV.to_owned(), key.to_owned()));
    }
    spec
}

/// The error of a run without PostgreSQL (the part is then skipped).
pub(crate) const NO_POSTGRES: &str =
    "no PostgreSQL (install the postgresql package or set AGENTRT_TEST_PG_URL)";

/// A fresh database's URL, or [`NO_POSTGRES`].
async fn database() -> Result<String, String> {
    agentrt_testkit::pg::database()
        .await
        .map(|db| db.url)
        .ok_or_else(|| NO_POSTGRES.to_owned())
}

/// Runs the whole part.
pub(crate) async fn p10(env: &Env, plan: &P10Plan) -> Result<P10, String> {
    let mut out = P10::default();
    let pg = postgres_spec(&env.spec, &database().await?, None);
    out.s6_sled = durable::s6_on(env, &env.spec, "S6 sled", &plan.s6_levels).await?;
    out.s6_postgres = durable::s6_on(env, &pg, "S6 postgres", &plan.s6_levels).await?;
    let n = plan.s2_sessions;
    out.s2_sled = Some(latency::s2_level_on(env, &env.spec, "S2 sled", n).await?);
    let pg = postgres_spec(&env.spec, &database().await?, None);
    out.s2_postgres = Some(latency::s2_level_on(env, &pg, "S2 postgres", n).await?);
    out.forwarding = Some(forwarding(env, plan).await?);
    Ok(out)
}

/// Two replicas on one database; each turn runs on A, with watchers
/// subscribed through A (local) and through B (forwarded to A).
async fn forwarding(env: &Env, plan: &P10Plan) -> Result<Forwarding, String> {
    let key = format!("bench-cluster-key-0123456789abcdef-{}", std::process::id());
    let spec = postgres_spec(&env.spec, &database().await?, Some(&key));
    let w = plan.fwd_watchers.max(1);
    let connections = w.div_ceil(50).max(1) + 1;
    let owner = env
        .fresh_server_with(&spec, "p10-fwd-a", connections)
        .await?;
    let other = env
        .fresh_server_with(&spec, "p10-fwd-b", connections)
        .await?;
    let limit = env.plan.turn_limit;
    let (via_owner, via_other) = (Recorder::default(), Recorder::default());
    let start = Instant::now();
    for t in 0..plan.fwd_turns {
        let session = format!("p10-fwd-{t}");
        create_session(&owner.clients[0], &session).await?;
        let ticket = env.fake.ticket(plan.fwd);
        let caller = {
            let (c, s, ticket) = (owner.clients[0].clone(), session.clone(), ticket.clone());
            tokio::spawn(async move { agentrt_turn_with(&c, &s, Some(ticket), "", limit).await })
        };
        // Subscribe once the turn is live (its first token is `ttft` away),
        // so both paths replay nothing but the turn's opening events. B
        // sees it once its lease is committed (A's own slot says so a
        // little earlier); a Subscribe before that finds nothing live.
        wait_live(&owner.clients[1], &session).await?;
        wait_live(&other.clients[1], &session).await?;
        let mut watchers = tokio::task::JoinSet::new();
        for i in 0..w {
            for (path, run) in [(0usize, &owner), (1, &other)] {
                let c = &run.clients[1 + i % (run.clients.len() - 1)];
                let stream = c
                    .subscribe(&session, 0, false)
                    .await
                    .map_err(|e| format!("subscribe via {}: {e}", ["owner", "other"][path]))?;
                let ticket = ticket.clone();
                watchers.spawn(async move { (path, watch_turn(stream, ticket, limit).await) });
            }
        }
        while let Some(joined) = watchers.join_next().await {
            let (path, obs) = joined.map_err(|e| format!("watcher task: {e}"))?;
            if path == 0 {
                via_owner.add(obs);
            } else {
                via_other.add(obs);
            }
        }
        let caller = caller.await.map_err(|e| format!("caller task: {e}"))?;
        if let Some(e) = caller.error {
            return Err(format!("forwarding turn {t}: {e}"));
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let load = |label: &str, rec: &Recorder| {
        Load {
            label: label.to_owned(),
            sessions: w,
            ..Load::default()
        }
        .with_totals(&rec.take(), elapsed)
    };
    let via_owner = load("Subscribe via the owner", &via_owner);
    let via_other = load("Subscribe via another replica", &via_other);
    owner.server.terminate(Duration::from_secs(10)).await;
    other.server.terminate(Duration::from_secs(10)).await;
    Ok(Forwarding {
        watchers_per_path: w,
        turns: plan.fwd_turns,
        lag_p99_overhead_us: via_other.lag.p99_us - via_owner.lag.p99_us,
        via_owner,
        via_other,
    })
}

/// Polls GetSessionStatus (1 ms apart, at most 5 s) until a turn is live.
async fn wait_live(c: &agentrt_client::Client, session: &str) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        let status = c
            .session_status(session)
            .await
            .map_err(|e| format!("status: {e}"))?;
        if status.live {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(format!("{session}: no live turn within 5 s"))
}

/// The part's section of the report.
pub(crate) fn markdown(p: &P10) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## P10: PostgreSQL and forwarding\n");
    let _ = writeln!(
        out,
        "S6 durable short turns (builtin/echo), sled vs PostgreSQL:\n"
    );
    let rows: Vec<_> = p
        .s6_sled
        .iter()
        .zip(&p.s6_postgres)
        .flat_map(|(s, g)| [("sled", s), ("postgres", g)])
        .map(|(store, l)| {
            vec![
                store.to_owned(),
                l.sessions.to_string(),
                format!("{}{}", l.turns, fail_note(l.failures)),
                num(l.turns_per_s),
                lat3(&l.turn),
                num(if l.turns > 0 {
                    l.server_cpu_us as f64 / l.turns as f64
                } else {
                    0.0
                }),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "store",
            "sessions",
            "turns",
            "turns/s",
            "turn p50 / p99 / p99.9 ms",
            "server CPU µs/turn",
        ],
        &rows,
    ));
    let levels: Vec<(&str, &S2Level)> = [("sled", &p.s2_sled), ("postgres", &p.s2_postgres)]
        .into_iter()
        .filter_map(|(s, l)| l.as_ref().map(|l| (s, l)))
        .collect();
    if !levels.is_empty() {
        let _ = writeln!(out, "\nS2 paced streams, sled vs PostgreSQL:\n");
        let rows: Vec<_> = levels
            .iter()
            .map(|(store, l)| {
                vec![
                    (*store).to_owned(),
                    l.sessions.to_string(),
                    ms(l.ttfe_overhead_p50_us),
                    ms(l.ttfe_overhead_p99_us),
                    lat3(&l.agentrt.lag),
                    num(l.agentrt.cpu_us_per_event),
                    format!(
                        "{}{}",
                        num(l.agentrt.tokens_per_s),
                        fail_note(l.agentrt.failures)
                    ),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "store",
                "sessions",
                "TTFE overhead p50 ms",
                "p99 ms",
                "lag p50 / p99 / p99.9 ms",
                "CPU µs/event",
                "tokens/s",
            ],
            &rows,
        ));
    }
    if let Some(f) = &p.forwarding {
        let _ = writeln!(
            out,
            "\nForwarding: {} turns on replica A, {} watchers per path per turn; \
             lag p99 via another replica − via the owner: {} ms.\n",
            f.turns,
            f.watchers_per_path,
            ms(f.lag_p99_overhead_us)
        );
        let rows: Vec<_> = [("owner (A)", &f.via_owner), ("other (B → A)", &f.via_other)]
            .into_iter()
            .map(|(path, l)| {
                vec![
                    path.to_owned(),
                    format!("{}{}", l.turns, fail_note(l.failures)),
                    l.tokens.to_string(),
                    lat2(&l.first_relay),
                    lat3(&l.lag),
                    l.gaps.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "Subscribe via",
                "watches",
                "tokens",
                "first relay p50 / p99 ms",
                "lag p50 / p99 / p99.9 ms",
                "gaps",
            ],
            &rows,
        ));
    }
    let _ = writeln!(out, "\nEvery run:\n");
    let mut loads: Vec<&Load> = p.s6_sled.iter().chain(&p.s6_postgres).collect();
    for l in levels.iter().map(|(_, l)| l) {
        loads.extend([&l.agentrt, &l.direct, &l.echo]);
    }
    if let Some(f) = &p.forwarding {
        loads.extend([&f.via_owner, &f.via_other]);
    }
    let rows: Vec<_> = loads.into_iter().map(load_row).collect();
    out.push_str(&table(LOAD_HEAD, &rows));
    out
}

/// Every load of the part, for the failure notes.
pub(crate) fn loads(p: &P10) -> Vec<&Load> {
    let mut out: Vec<&Load> = p.s6_sled.iter().chain(&p.s6_postgres).collect();
    for l in [&p.s2_sled, &p.s2_postgres].into_iter().flatten() {
        out.extend([&l.agentrt, &l.direct, &l.echo]);
    }
    if let Some(f) = &p.forwarding {
        out.extend([&f.via_owner, &f.via_other]);
    }
    out
}
