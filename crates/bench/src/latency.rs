//! The latency scenarios: S1 single session (TTFE and relay lag of
//! sequential turns) and S2 concurrency sweep (the same paced load through
//! agentrt, through the bare echo, through the minimal relay and read
//! directly from the fake), with their sections of the report. The S2
//! bursts are in [`crate::burst`].

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::driver::{Recorder, agentrt_turn, connections_for, direct_stream};
use crate::load::{LOAD_HEAD, Load, VsRelay, decomposition, fail_note, lat2, lat3, load_row};
use crate::markdown::{ms, num, table};
use crate::proc_stats;
use crate::scenarios::{
    Env, Measure, agentrt_loops, bench_only, create_session, create_sessions, direct_load,
    echo_load, nominal, relay_load,
};
use crate::server::ServerSpec;

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S1 {
    pub(crate) agentrt: Load,
    pub(crate) direct: Load,
    pub(crate) ttfe_overhead_p50_us: f64,
    pub(crate) ttfe_overhead_p99_us: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S2Level {
    pub(crate) sessions: usize,
    pub(crate) agentrt: Load,
    pub(crate) direct: Load,
    pub(crate) echo: Load,
    pub(crate) ttfe_overhead_p50_us: f64,
    pub(crate) ttfe_overhead_p99_us: f64,
    /// agentrt CPU/event ÷ echo CPU/event.
    pub(crate) cpu_ratio: f64,
    /// agentrt lag p99 ÷ echo lag p99.
    pub(crate) lag_ratio: f64,
    /// agentrt KB/session ÷ echo KB/stream.
    pub(crate) mem_ratio: f64,
    /// The minimal relay (baseline c) on the same load and window as
    /// agentrt (empty in the P10 part's S2).
    pub(crate) relay: Load,
    pub(crate) vs_relay: VsRelay,
}

/// S1: one session, sequential turns, each preceded by the same stream read
/// directly from the fake (interleaved, so drift hits both alike).
pub(crate) async fn s1(env: &Env) -> Result<S1, String> {
    let p = env.plan.s1;
    let run = env.fresh_server("s1", 1).await?;
    let client = &run.clients[0];
    create_session(client, "s1").await?;
    let agentrt = Recorder::default();
    let direct = Recorder::default();
    let measure = Measure::begin(run.server.pid());
    let bench0 = proc_stats::sample_self();
    let start = Instant::now();
    for _ in 0..env.plan.s1_turns {
        direct.add(direct_stream(&env.http, &env.fake, p, env.plan.turn_limit).await);
        agentrt
            .add(agentrt_turn(client, "s1", Some((&env.fake, p)), "", env.plan.turn_limit).await);
    }
    let elapsed = start.elapsed();
    let (a, d) = (agentrt.take(), direct.take());
    let agentrt = measure
        .end("S1 agentrt", 1, &a, elapsed, run.rss_startup_kb)
        .await;
    let direct = bench_only("S1 direct (fake via reqwest)", 1, &d, elapsed, bench0);
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(S1 {
        ttfe_overhead_p50_us: agentrt.ttfe.p50_us - direct.ttfe.p50_us,
        ttfe_overhead_p99_us: agentrt.ttfe.p99_us - direct.ttfe.p99_us,
        agentrt,
        direct,
    })
}

/// S2 at one concurrency: the same paced load read directly from the fake,
/// through the bare echo, and through agentrt (fresh processes each).
pub(crate) async fn s2_level(env: &Env, sessions: usize) -> Result<S2Level, String> {
    let mut level = s2_level_on(env, &env.spec, "S2", sessions).await?;
    let p = env.plan.s2;
    let label = format!("S2 relay c={sessions}");
    let windows = (env.plan.s2_window, nominal(p));
    level.relay = relay_load(env, &label, sessions, p, windows).await?;
    level.vs_relay = VsRelay::of(&level.agentrt, &level.relay);
    Ok(level)
}

/// [`s2_level`] with the agentrt server started as `spec` says (the P10
/// part runs it on sled and on PostgreSQL); `name` labels its runs.
pub(crate) async fn s2_level_on(
    env: &Env,
    spec: &ServerSpec,
    name: &str,
    sessions: usize,
) -> Result<S2Level, String> {
    let p = env.plan.s2;
    let stagger = nominal(p);
    let grace = env.plan.turn_limit + Duration::from_secs(5);
    let side = env.plan.s2_side_window;

    // Direct from the fake at the same concurrency.
    let label = format!("{name} direct c={sessions}");
    let direct = direct_load(env, &label, sessions, p, (side, stagger)).await;

    // The bare echo with the same pacing.
    let echo = echo_load(env, &format!("{name} echo c={sessions}"), sessions, p, side).await?;

    // agentrt.
    let run = env
        .fresh_server_with(
            spec,
            &format!("{name}-{sessions}"),
            connections_for(sessions),
        )
        .await?;
    let ids: Vec<String> = (0..sessions).map(|i| format!("s2-{i}")).collect();
    create_sessions(&run.clients, &ids).await?;
    let rec = Arc::new(Recorder::default());
    let measure = Measure::begin(run.server.pid());
    let windows = (env.plan.s2_window, stagger, grace);
    let elapsed = agentrt_loops(env, &run.clients, ids, &rec, p, windows).await;
    let agentrt = measure
        .end(
            &format!("{name} agentrt c={sessions}"),
            sessions,
            &rec.take(),
            elapsed,
            run.rss_startup_kb,
        )
        .await;
    run.server.terminate(Duration::from_secs(10)).await;
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    Ok(S2Level {
        sessions,
        ttfe_overhead_p50_us: agentrt.ttfe.p50_us - direct.ttfe.p50_us,
        ttfe_overhead_p99_us: agentrt.ttfe.p99_us - direct.ttfe.p99_us,
        cpu_ratio: div(agentrt.cpu_us_per_event, echo.cpu_us_per_event),
        lag_ratio: div(agentrt.lag.p99_us, echo.lag.p99_us),
        mem_ratio: div(agentrt.rss_per_session_kb, echo.rss_per_session_kb),
        relay: Load::default(),
        vs_relay: VsRelay::default(),
        agentrt,
        direct,
        echo,
    })
}

/// The S1 section of the report.
pub(crate) fn markdown_s1(s1: &S1) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## S1 single session\n\nTTFE overhead p50 {} ms, p99 {} ms (agentrt quantile − direct quantile).\n",
        ms(s1.ttfe_overhead_p50_us),
        ms(s1.ttfe_overhead_p99_us)
    );
    out.push_str(&table(
        LOAD_HEAD,
        &[load_row(&s1.agentrt), load_row(&s1.direct)],
    ));
    out.push_str(&decomposition(&[&s1.agentrt, &s1.direct]));
    out
}

/// The S2 section of the report.
pub(crate) fn markdown_s2(levels: &[S2Level]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## S2 concurrency sweep\n");
    let rows: Vec<_> = levels
        .iter()
        .map(|l| {
            vec![
                l.sessions.to_string(),
                ms(l.ttfe_overhead_p50_us),
                ms(l.ttfe_overhead_p99_us),
                lat3(&l.agentrt.lag),
                lat2(&l.echo.lag),
                num(l.agentrt.cpu_us_per_event),
                num(l.echo.cpu_us_per_event),
                format!("{:.2}", l.cpu_ratio),
                num(l.agentrt.rss_per_session_kb),
                num(l.echo.rss_per_session_kb),
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
            "sessions",
            "TTFE overhead p50 ms",
            "p99 ms",
            "lag p50 / p99 / p99.9 ms",
            "echo lag p50 / p99 ms",
            "CPU µs/event",
            "echo µs/event",
            "cpu ratio",
            "RSS KB/session",
            "echo KB/stream",
            "tokens/s",
        ],
        &rows,
    ));
    let _ = writeln!(out, "\nEvery run:\n");
    let rows: Vec<_> = levels
        .iter()
        .flat_map(|l| [&l.agentrt, &l.direct, &l.echo, &l.relay])
        .filter(|l| l.turns > 0)
        .map(load_row)
        .collect();
    out.push_str(&table(LOAD_HEAD, &rows));
    let loads: Vec<&Load> = levels.iter().flat_map(|l| [&l.agentrt, &l.relay]).collect();
    out.push_str(&decomposition(&loads));
    out
}
