//! Throughput: the bare-echo baselines (TTFE floor, paced saturation,
//! unpaced), S3 saturation with unpaced fake streams, and S4 fan-out to
//! Subscribe watchers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::driver::{
    Recorder, agentrt_turn_with, connect_clients, connections_for, direct_stream, echo_call,
    run_loops, watch_turn,
};
use crate::fake::StreamParams;
use crate::proc_stats;
use crate::report::{Baselines, Load, S3, S4Level};
use crate::scenarios::{
    Env, Measure, agentrt_loops, bench_only, create_session, create_sessions, echo_load,
};
use crate::server::Child;

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
    Ok(Baselines {
        echo_ttfe,
        echo_saturation,
        echo_unpaced,
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
        let rec = Arc::new(Recorder::default());
        let bench0 = proc_stats::sample_self();
        let elapsed = {
            let (rec, fake, http, limit) = (
                Arc::clone(&rec),
                Arc::clone(&env.fake),
                env.http.clone(),
                plan.turn_limit,
            );
            run_loops(n, plan.s3_window, Duration::ZERO, grace, move |_| {
                let (rec, fake, http) = (Arc::clone(&rec), Arc::clone(&fake), http.clone());
                async move { rec.add(direct_stream(&http, &fake, p, limit).await) }
            })
            .await
        };
        out.direct.push(bench_only(
            &format!("S3 direct c={n}"),
            n,
            &rec.take(),
            elapsed,
            bench0,
        ));
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
    let best = |v: &[Load]| v.iter().map(|l| l.tokens_per_s).fold(0.0, f64::max);
    out.max_tokens_per_s = best(&out.agentrt);
    out.direct_max_tokens_per_s = best(&out.direct);
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
