//! Persistence-bound scenarios: S6 durable short turns with the offline
//! `builtin/echo` model, S7 idle capacity (memory per idle session, listing
//! everything, restart to readiness on the same data dir), with their
//! sections of the report.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{Client, proto};
use futures::StreamExt as _;
use serde::Serialize;

use crate::driver::{Recorder, agentrt_turn, run_loops};
use crate::load::{Load, fail_note, lat3};
use crate::markdown::{num, table};
use crate::scenarios::{Env, Measure, create_session, create_sessions};
use crate::server::{Child, ServerSpec};

const ECHO: &str = "builtin/echo";

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S7 {
    pub(crate) sessions: usize,
    /// Creating every session and running its echo turn.
    pub(crate) fill_s: f64,
    pub(crate) fill_turns_per_s: f64,
    pub(crate) rss_startup_kb: u64,
    pub(crate) rss_filled_kb: u64,
    pub(crate) kb_per_idle_session: f64,
    pub(crate) list_ms: f64,
    pub(crate) list_pages: u64,
    pub(crate) listed: u64,
    pub(crate) drain_ms: f64,
    pub(crate) drain_exit_ok: bool,
    pub(crate) restart_listening_ms: f64,
    pub(crate) restart_ready_ms: f64,
    pub(crate) rss_restarted_kb: u64,
    pub(crate) list_after_restart_ms: f64,
    pub(crate) rss_after_list_kb: u64,
    pub(crate) failures: u64,
}

/// S6: `n` sessions each running echo turns back to back.
pub(crate) async fn s6(env: &Env) -> Result<Vec<Load>, String> {
    s6_on(env, &env.spec, "S6", &env.plan.s6_levels).await
}

/// [`s6`] at `levels` against one server started as `spec` says (the P10
/// part runs it on sled and on PostgreSQL), in the run directory `name`.
pub(crate) async fn s6_on(
    env: &Env,
    spec: &ServerSpec,
    name: &str,
    levels: &[usize],
) -> Result<Vec<Load>, String> {
    let plan = &env.plan;
    let run = env.fresh_server_with(spec, name, 1).await?;
    let mut out = Vec::new();
    for &n in levels {
        let ids: Vec<String> = (0..n).map(|i| format!("s6-{n}-{i}")).collect();
        create_sessions(&run.clients, &ids).await?;
        let rec = Arc::new(Recorder::default());
        let measure = Measure::begin(run.server.pid());
        let elapsed = {
            let (rec, clients, ids, limit) = (
                Arc::clone(&rec),
                Arc::new(run.clients.clone()),
                Arc::new(ids),
                plan.turn_limit,
            );
            run_loops(
                n,
                plan.s6_window,
                Duration::ZERO,
                limit + Duration::from_secs(5),
                move |i| {
                    let (rec, clients, ids) =
                        (Arc::clone(&rec), Arc::clone(&clients), Arc::clone(&ids));
                    async move {
                        let c = &clients[i % clients.len()];
                        rec.add(agentrt_turn(c, &ids[i], None, ECHO, limit).await);
                    }
                },
            )
            .await
        };
        out.push(
            measure
                .end(
                    &format!("{name} echo turns c={n}"),
                    n,
                    &rec.take(),
                    elapsed,
                    run.rss_startup_kb,
                )
                .await,
        );
    }
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(out)
}

/// Pages through every session; returns (pages, sessions).
async fn list_all(c: &Client, expect: usize) -> Result<(u64, u64), String> {
    let mut token = String::new();
    let (mut pages, mut listed) = (0u64, 0u64);
    // Bounded: a server that never ends the paging fails the scenario.
    let max_pages = expect / 100 + 100;
    loop {
        let page = c
            .list_sessions(proto::ListSessionsRequest {
                page_size: 500,
                page_token: std::mem::take(&mut token),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("list sessions: {e}"))?;
        pages += 1;
        listed += page.sessions.len() as u64;
        if page.next_page_token.is_empty() {
            return Ok((pages, listed));
        }
        if pages as usize > max_pages {
            return Err(format!("list sessions: more than {max_pages} pages"));
        }
        token = page.next_page_token;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// S7: fill, measure, list, restart on the same data dir.
pub(crate) async fn s7(env: &Env) -> Result<S7, String> {
    let plan = &env.plan;
    let n = plan.s7_sessions;
    let run = env.fresh_server("s7", 1).await?;
    let client = run.clients[0].clone();
    let mut out = S7 {
        sessions: n,
        rss_startup_kb: run.rss_startup_kb,
        ..S7::default()
    };
    let limit = plan.turn_limit;
    let start = Instant::now();
    let failures: Vec<String> = futures::stream::iter(0..n)
        .map(|i| {
            let c = client.clone();
            async move {
                let id = format!("s7-{i}");
                create_session(&c, &id).await?;
                match agentrt_turn(&c, &id, None, ECHO, limit).await.error {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .buffer_unordered(plan.s7_concurrency.max(1))
        .filter_map(|r: Result<(), String>| async move { r.err() })
        .collect()
        .await;
    let fill = start.elapsed();
    out.failures = failures.len() as u64;
    if let Some(first) = failures.first() {
        return Err(format!(
            "S7: {} of {n} fills failed, first: {first}",
            failures.len()
        ));
    }
    out.fill_s = fill.as_secs_f64();
    out.fill_turns_per_s = n as f64 / fill.as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    out.rss_filled_kb = run.server.stats().rss_kb;
    out.kb_per_idle_session =
        out.rss_filled_kb.saturating_sub(out.rss_startup_kb) as f64 / n.max(1) as f64;

    let t = Instant::now();
    let (pages, listed) = list_all(&client, n).await?;
    out.list_ms = ms(t.elapsed());
    out.list_pages = pages;
    out.listed = listed;
    // The warm-up session is listed too.
    if (listed as usize) < n {
        return Err(format!("S7: listed {listed} of {n} sessions"));
    }

    let (drain, ok) = run.server.terminate(Duration::from_secs(30)).await;
    out.drain_ms = ms(drain);
    out.drain_exit_ok = ok;
    let dir = run.dir.clone();
    let again = Child::agentrt(&env.spec, &dir, &dir.join("data"), &env.fake.base_url()).await?;
    out.restart_listening_ms = ms(again.listening_after);
    out.restart_ready_ms = ms(again.ready_after);
    out.rss_restarted_kb = again.stats().rss_kb;
    let client = crate::driver::connect_clients(&again.url(), 1)
        .await?
        .remove(0);
    let t = Instant::now();
    let (_, relisted) = list_all(&client, n).await?;
    out.list_after_restart_ms = ms(t.elapsed());
    out.rss_after_list_kb = again.stats().rss_kb;
    if relisted != listed {
        return Err(format!(
            "S7: {listed} sessions before the restart, {relisted} after"
        ));
    }
    again.terminate(Duration::from_secs(30)).await;
    Ok(out)
}

/// The S6 section of the report.
pub(crate) fn markdown_s6(levels: &[Load]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## S6 durable short turns (builtin/echo)\n");
    let rows: Vec<_> = levels
        .iter()
        .map(|l| {
            vec![
                l.sessions.to_string(),
                format!("{}{}", l.turns, fail_note(l.failures)),
                num(l.turns_per_s),
                lat3(&l.turn),
                num(if l.turns > 0 {
                    l.server_cpu_us as f64 / l.turns as f64
                } else {
                    0.0
                }),
                format!("{:.2} / {:.2}", l.server_cores, l.bench_cores),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "sessions",
            "turns",
            "turns/s",
            "turn p50 / p99 / p99.9 ms",
            "server CPU µs/turn",
            "cores server / bench",
        ],
        &rows,
    ));
    out
}

/// The S7 section of the report.
pub(crate) fn markdown_s7(s7: &S7) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## S7 idle capacity\n");
    let rows = vec![
        vec![
            "sessions (one echo turn each)".into(),
            s7.sessions.to_string(),
        ],
        vec![
            "fill time / turns/s".into(),
            format!("{} s / {}", num(s7.fill_s), num(s7.fill_turns_per_s)),
        ],
        vec![
            "RSS start-up → filled".into(),
            format!(
                "{} → {} KB",
                num(s7.rss_startup_kb as f64),
                num(s7.rss_filled_kb as f64)
            ),
        ],
        vec!["KB per idle session".into(), num(s7.kb_per_idle_session)],
        vec![
            "ListSessions all (pages)".into(),
            format!(
                "{} ms ({} pages, {} sessions)",
                num(s7.list_ms),
                s7.list_pages,
                s7.listed
            ),
        ],
        vec![
            "SIGTERM → exit".into(),
            format!("{} ms (exit ok: {})", num(s7.drain_ms), s7.drain_exit_ok),
        ],
        vec![
            "restart: spawn → listening / → readiness SERVING".into(),
            format!(
                "{} ms / {} ms",
                num(s7.restart_listening_ms),
                num(s7.restart_ready_ms)
            ),
        ],
        vec![
            "RSS after restart / after listing all".into(),
            format!(
                "{} / {} KB",
                num(s7.rss_restarted_kb as f64),
                num(s7.rss_after_list_kb as f64)
            ),
        ],
        vec![
            "ListSessions all after restart".into(),
            format!("{} ms", num(s7.list_after_restart_ms)),
        ],
    ];
    out.push_str(&table(&["measure", "value"], &rows));
    out
}
