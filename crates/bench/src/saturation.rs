//! Throughput: the baselines (the bare echo's TTFE floor, paced saturation
//! and unpaced streams; the minimal relay's TTFE floor), S3 saturation with
//! unpaced fake streams (agentrt on one session per loop and on a new
//! session per turn, beside the relay), and S4 fan-out to Subscribe
//! watchers, with their sections of the report.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentrt_client::Client;
use serde::Serialize;

use crate::driver::{
    Recorder, TurnObs, agentrt_turn, agentrt_turn_with, connect_clients, connections_for,
    echo_call, watch_turn,
};
use crate::fake::StreamParams;
use crate::load::{LOAD_HEAD, Load, VsRelay, fail_note, lat3, load_row};
use crate::markdown::{num, table};
use crate::scenarios::{
    Env, Measure, agentrt_loops, create_session, create_sessions, direct_load, echo_load,
};
use crate::server::Child;

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Baselines {
    /// Bare echo, 1 stream, 1 token, sequential calls: tonic's own TTFE.
    pub(crate) echo_ttfe: Load,
    /// Bare echo, many paced streams: the transport limit (events/s).
    pub(crate) echo_saturation: Load,
    /// Bare echo, unpaced streams (tonic batches events): informational.
    pub(crate) echo_unpaced: Load,
    /// The minimal relay, 1 stream of 1 token from the fake, sequential
    /// calls: the TTFE floor of a relay.
    pub(crate) relay_ttfe: Load,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S3 {
    pub(crate) agentrt: Vec<Load>,
    pub(crate) direct: Vec<Load>,
    pub(crate) max_tokens_per_s: f64,
    pub(crate) direct_max_tokens_per_s: f64,
    /// ÷ the paced echo saturation (baseline a).
    pub(crate) ratio_echo: f64,
    /// ÷ the unpaced echo (same stream shape, tonic batching freely).
    pub(crate) ratio_echo_unpaced: f64,
    /// ÷ the fake read directly (baseline b).
    pub(crate) ratio_direct: f64,
    /// ÷ min(a, b).
    pub(crate) throughput_ratio: f64,
    /// Tokens per stream.
    pub(crate) tokens: u32,
    /// agentrt with a new session for every turn.
    pub(crate) new_session: Vec<Load>,
    /// The minimal relay (baseline c) at the same levels.
    pub(crate) relay: Vec<Load>,
    pub(crate) new_session_max_tokens_per_s: f64,
    pub(crate) relay_max_tokens_per_s: f64,
    /// Best agentrt tokens/s ÷ best relay tokens/s.
    pub(crate) saturation_vs_relay: f64,
    pub(crate) new_session_saturation_vs_relay: f64,
    /// Server CPU per token at agentrt's best level ÷ the relay's at the
    /// same level.
    pub(crate) cpu_vs_relay: f64,
    pub(crate) new_session_cpu_vs_relay: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct S4Level {
    pub(crate) watchers: usize,
    /// The watchers' streams merged.
    pub(crate) watch: Load,
    /// The Chat caller's stream.
    pub(crate) caller: Load,
    /// Tokens delivered to watchers per second of streaming.
    pub(crate) delivered_per_s: f64,
}

/// Baseline (a): the bare tonic echo.
pub(crate) async fn baselines(env: &Env) -> Result<Baselines, String> {
    let plan = &env.plan;
    // TTFE floor: sequential one-token calls on one warm connection.
    let echo = Child::echo(env.spec.cpus.as_deref()).await?;
    let client = connect_clients(&echo.url(), 1).await?.remove(0);
    let one = StreamParams {
        ttft: Duration::ZERO,
        tokens: 1,
        rate: 0.0,
    };
    for _ in 0..10 {
        echo_call(&client, one, plan.turn_limit).await;
    }
    let rss = echo.stats().rss_kb;
    let rec = Recorder::default();
    let measure = Measure::begin(echo.pid());
    let start = Instant::now();
    for _ in 0..plan.echo_ttfe_calls {
        rec.add(echo_call(&client, one, plan.turn_limit).await);
    }
    let echo_ttfe = measure
        .end(
            "echo TTFE, 1 stream, sequential",
            1,
            &rec.take(),
            start.elapsed(),
            rss,
        )
        .await;
    echo.terminate(Duration::from_secs(5)).await;

    let echo_saturation = echo_load(
        env,
        &format!(
            "echo paced saturation, {} ev/s per stream",
            plan.echo_sat.rate
        ),
        plan.echo_sat_streams,
        plan.echo_sat,
        plan.echo_sat_window,
    )
    .await?;
    let unpaced = StreamParams {
        ttft: Duration::ZERO,
        tokens: plan.s3_tokens,
        rate: 0.0,
    };
    let echo_unpaced = echo_load(
        env,
        "echo unpaced",
        plan.echo_unpaced_streams,
        unpaced,
        plan.s3_window,
    )
    .await?;
    // The relay's TTFE floor: the same sequential calls, each one upstream
    // request to the fake.
    let relay = env.fresh_relay(1).await?;
    for _ in 0..10 {
        agentrt_turn(
            &relay.clients[0],
            "r",
            Some((&env.fake, one)),
            "",
            plan.turn_limit,
        )
        .await;
    }
    let rec = Recorder::default();
    let measure = Measure::begin(relay.server.pid());
    let start = Instant::now();
    for _ in 0..plan.echo_ttfe_calls {
        let c = &relay.clients[0];
        rec.add(agentrt_turn(c, "r", Some((&env.fake, one)), "", plan.turn_limit).await);
    }
    let relay_ttfe = measure
        .end(
            "relay TTFE, 1 stream, sequential",
            1,
            &rec.take(),
            start.elapsed(),
            relay.rss_startup_kb,
        )
        .await;
    relay.server.terminate(Duration::from_secs(5)).await;
    Ok(Baselines {
        echo_ttfe,
        echo_saturation,
        echo_unpaced,
        relay_ttfe,
    })
}

/// S3: unpaced fake streams through agentrt and read directly.
pub(crate) async fn s3(env: &Env, echo_saturation: f64, echo_unpaced: f64) -> Result<S3, String> {
    let plan = &env.plan;
    let p = StreamParams {
        ttft: Duration::ZERO,
        tokens: plan.s3_tokens,
        rate: 0.0,
    };
    let grace = plan.turn_limit + Duration::from_secs(5);
    let mut out = S3::default();
    for &n in &plan.s3_levels {
        let label = format!("S3 direct c={n}");
        let windows = (plan.s3_window, Duration::ZERO);
        out.direct
            .push(direct_load(env, &label, n, p, windows).await);
    }
    let max_n = plan.s3_levels.iter().copied().max().unwrap_or(1);
    let run = env.fresh_server("s3", connections_for(max_n)).await?;
    for &n in &plan.s3_levels {
        let ids: Vec<String> = (0..n).map(|i| format!("s3-{n}-{i}")).collect();
        create_sessions(&run.clients, &ids).await?;
        let rec = Arc::new(Recorder::default());
        let measure = Measure::begin(run.server.pid());
        let windows = (plan.s3_window, Duration::ZERO, grace);
        let elapsed = agentrt_loops(env, &run.clients, ids, &rec, p, windows).await;
        out.agentrt.push(
            measure
                .end(
                    &format!("S3 agentrt c={n}"),
                    n,
                    &rec.take(),
                    elapsed,
                    run.rss_startup_kb,
                )
                .await,
        );
    }
    run.server.terminate(Duration::from_secs(10)).await;

    // A new session for every turn, on a fresh server.
    let run = env.fresh_server("s3-new", connections_for(max_n)).await?;
    for &n in &plan.s3_levels {
        let rec = Arc::new(Recorder::default());
        let measure = Measure::begin(run.server.pid());
        let windows = (plan.s3_window, Duration::ZERO, grace);
        let tag = format!("s3n-{n}");
        let elapsed = new_session_loops(env, &run.clients, &tag, n, &rec, p, windows).await;
        out.new_session.push(
            measure
                .end(
                    &format!("S3 agentrt c={n}, new session per turn"),
                    n,
                    &rec.take(),
                    elapsed,
                    run.rss_startup_kb,
                )
                .await,
        );
    }
    run.server.terminate(Duration::from_secs(10)).await;

    // The minimal relay.
    let relay = env.fresh_relay(connections_for(max_n)).await?;
    for &n in &plan.s3_levels {
        let ids: Vec<String> = (0..n).map(|i| format!("s3-{n}-{i}")).collect();
        let rec = Arc::new(Recorder::default());
        let measure = Measure::begin(relay.server.pid());
        let windows = (plan.s3_window, Duration::ZERO, grace);
        let elapsed = agentrt_loops(env, &relay.clients, ids, &rec, p, windows).await;
        out.relay.push(
            measure
                .end(
                    &format!("S3 relay c={n}"),
                    n,
                    &rec.take(),
                    elapsed,
                    relay.rss_startup_kb,
                )
                .await,
        );
    }
    relay.server.terminate(Duration::from_secs(5)).await;

    let best = |v: &[Load]| v.iter().map(|l| l.tokens_per_s).fold(0.0, f64::max);
    out.tokens = plan.s3_tokens;
    out.max_tokens_per_s = best(&out.agentrt);
    out.direct_max_tokens_per_s = best(&out.direct);
    out.new_session_max_tokens_per_s = best(&out.new_session);
    out.relay_max_tokens_per_s = best(&out.relay);
    let vs = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    out.saturation_vs_relay = vs(out.max_tokens_per_s, out.relay_max_tokens_per_s);
    out.new_session_saturation_vs_relay =
        vs(out.new_session_max_tokens_per_s, out.relay_max_tokens_per_s);
    out.cpu_vs_relay = cpu_vs_relay(&out.agentrt, &out.relay);
    out.new_session_cpu_vs_relay = cpu_vs_relay(&out.new_session, &out.relay);
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    out.ratio_echo = div(out.max_tokens_per_s, echo_saturation);
    out.ratio_echo_unpaced = div(out.max_tokens_per_s, echo_unpaced);
    out.ratio_direct = div(out.max_tokens_per_s, out.direct_max_tokens_per_s);
    out.throughput_ratio = div(
        out.max_tokens_per_s,
        echo_saturation.min(out.direct_max_tokens_per_s),
    );
    Ok(out)
}

/// Server CPU per token of the best `agentrt` level (most tokens/s) ÷
/// the relay's at the same number of sessions (NaN without one).
fn cpu_vs_relay(agentrt: &[Load], relay: &[Load]) -> f64 {
    let best = agentrt
        .iter()
        .max_by(|a, b| a.tokens_per_s.total_cmp(&b.tokens_per_s));
    best.and_then(|a| {
        let r = relay.iter().find(|r| r.sessions == a.sessions)?;
        Some(VsRelay::of(a, r).cpu_per_token)
    })
    .unwrap_or(f64::NAN)
}

/// Like [`agentrt_loops`], but every turn runs in a session created for it
/// just before (`{tag}-{k}`); the CreateSession is part of the loop (and of
/// the throughput), not of the turn's latencies.
async fn new_session_loops(
    env: &Env,
    clients: &[Client],
    tag: &str,
    sessions: usize,
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
    let next = Arc::new(AtomicU64::new(0));
    let tag = Arc::new(tag.to_owned());
    crate::driver::run_loops(sessions, window, stagger, grace, move |i| {
        let (rec, fake, clients, next, tag) = (
            Arc::clone(&rec),
            Arc::clone(&fake),
            Arc::clone(&clients),
            Arc::clone(&next),
            Arc::clone(&tag),
        );
        async move {
            let c = &clients[i % clients.len()];
            let id = format!("{tag}-{}", next.fetch_add(1, Ordering::Relaxed));
            let obs = match create_session(c, &id).await {
                Ok(()) => agentrt_turn(c, &id, Some((&fake, p)), "", limit).await,
                Err(e) => TurnObs {
                    error: Some(e),
                    ..TurnObs::default()
                },
            };
            rec.add(obs);
        }
    })
    .await
}

/// S4: for each watcher count, one paced turn watched live by that many
/// Subscribe streams (attached with wait_for_turn before the turn starts).
pub(crate) async fn s4(env: &Env) -> Result<Vec<S4Level>, String> {
    let plan = &env.plan;
    let p = plan.s4;
    let max_w = plan.s4_watchers.iter().copied().max().unwrap_or(1);
    let run = env.fresh_server("s4", connections_for(max_w) + 1).await?;
    let mut out = Vec::new();
    for &w in &plan.s4_watchers {
        let session = format!("s4-{w}");
        create_session(&run.clients[0], &session).await?;
        let ticket = env.fake.ticket(p);
        let mut watchers = tokio::task::JoinSet::new();
        for i in 0..w {
            // Client 0 is the caller's; watchers use the others.
            let c = &run.clients[1 + i % (run.clients.len() - 1)];
            let stream = c
                .subscribe(&session, 0, true)
                .await
                .map_err(|e| format!("subscribe: {e}"))?;
            let limit = plan.turn_limit;
            watchers.spawn(watch_turn(stream, ticket.clone(), limit));
        }
        let measure = Measure::begin(run.server.pid());
        let start = Instant::now();
        let caller =
            agentrt_turn_with(&run.clients[0], &session, Some(ticket), "", plan.turn_limit).await;
        let rec = Recorder::default();
        let joined = tokio::time::timeout(plan.turn_limit, async {
            while let Some(obs) = watchers.join_next().await {
                if let Ok(obs) = obs {
                    rec.add(obs);
                }
            }
        })
        .await;
        if joined.is_err() {
            return Err(format!("S4: watchers of {w} did not finish"));
        }
        let elapsed = start.elapsed();
        let caller_rec = Recorder::default();
        caller_rec.add(caller);
        let caller_totals = caller_rec.take();
        let totals = rec.take();
        let mut watch = measure
            .end(
                &format!("S4 watchers w={w}"),
                w,
                &totals,
                elapsed,
                run.rss_startup_kb,
            )
            .await;
        let all_events = totals.events + caller_totals.events;
        if all_events > 0 {
            watch.cpu_us_per_event = watch.server_cpu_us as f64 / all_events as f64;
        }
        let streaming = elapsed.saturating_sub(p.ttft).as_secs_f64();
        let caller = Load {
            label: format!("S4 caller w={w}"),
            sessions: 1,
            ..Load::default()
        }
        .with_totals(&caller_totals, elapsed.as_secs_f64());
        out.push(S4Level {
            watchers: w,
            delivered_per_s: if streaming > 0.0 {
                totals.tokens as f64 / streaming
            } else {
                0.0
            },
            watch,
            caller,
        });
    }
    run.server.terminate(Duration::from_secs(10)).await;
    Ok(out)
}

/// The baselines section of the report.
pub(crate) fn markdown_baselines(b: &Baselines) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## Baselines\n");
    let rows: Vec<_> = [
        &b.echo_ttfe,
        &b.echo_saturation,
        &b.echo_unpaced,
        &b.relay_ttfe,
    ]
    .into_iter()
    .filter(|l| l.turns > 0)
    .map(load_row)
    .collect();
    out.push_str(&table(LOAD_HEAD, &rows));
    out
}

/// The S3 section of the report.
pub(crate) fn markdown_s3(s3: &S3) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## S3 saturation (unpaced)\n\nmax {} tokens/s end to end; direct from the fake {} /s; \
         ratio to paced echo (a) {:.2}, to unpaced echo {:.3}, to direct (b) {:.2}, \
         to min(a, b) {:.2}.\n",
        num(s3.max_tokens_per_s),
        num(s3.direct_max_tokens_per_s),
        s3.ratio_echo,
        s3.ratio_echo_unpaced,
        s3.ratio_direct,
        s3.throughput_ratio
    );
    let rows: Vec<_> = s3.agentrt.iter().chain(&s3.direct).map(load_row).collect();
    out.push_str(&table(LOAD_HEAD, &rows));
    out
}

/// The S4 section of the report.
pub(crate) fn markdown_s4(levels: &[S4Level]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n## S4 fan-out (one turn, N Subscribe watchers)\n");
    let rows: Vec<_> = levels
        .iter()
        .map(|l| {
            vec![
                l.watchers.to_string(),
                num(l.delivered_per_s),
                lat3(&l.watch.lag),
                lat3(&l.caller.lag),
                l.watch.gaps.to_string(),
                num(l.watch.cpu_us_per_event),
                fail_note(l.watch.failures + l.caller.failures),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "watchers",
            "tokens/s delivered to watchers",
            "watcher lag p50 / p99 / p99.9 ms",
            "caller lag ms",
            "gaps",
            "server CPU µs/event",
            "failures",
        ],
        &rows,
    ));
    out
}
