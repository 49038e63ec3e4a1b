//! S2 bursts against the minimal relay: N Chats released at the same
//! instant, through agentrt and through the relay (baseline c), on the same
//! fake streams. Two kinds of agentrt sessions:
//!
//! - **new**: every Chat is the first turn of a session created just
//!   before the burst (CreateSession is not timed, the Chat is);
//! - **warm**: every Chat is the second turn of a session that was created
//!   and given one short turn before the burst.
//!
//! The relay has no sessions; it gets the same procedure (for warm, the
//! same short turns first, so both hold as many pooled upstream
//! connections). Each burst is a round: the Chats wait on a
//! [`tokio::sync::Barrier`] that opens once every one of them has its
//! connection and its request ready, so no sleep decides when they start.
//! The first round of each process is not measured (it opens the upstream
//! connections); the rounds after it are, each with new sessions, until
//! the level has about `burst_samples` Chats. No round starts while
//! agentrt still titles sessions after their first turns (a background
//! write a user's next turn would not meet): the bench waits until their
//! titles are set. Server CPU and RSS are taken
//! around each round only (not the session set-up between rounds): CPU
//! summed, RSS as the largest growth during one round over the RSS at its
//! start, divided by the Chats of the round.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde::Serialize;
use tokio::sync::Barrier;

use crate::driver::{Recorder, TurnObs, agentrt_turn, agentrt_turn_with};
use crate::fake::StreamParams;
use crate::latency::S2Level;
use crate::load::{LOAD_HEAD, Load, VsRelay, decomposition, fail_note, load_row, times};
use crate::markdown::{ms, num, table};
use crate::proc_stats::{self, RssSampler};
use crate::saturation::S3;
use crate::scenarios::{Env, Running, create_sessions};

/// Which sessions a burst's Chats run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Sessions {
    /// Each Chat is a new session's first turn.
    New,
    /// Each Chat is a later turn of a session with one turn behind it.
    Warm,
}

impl Sessions {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::New => "new",
            Self::Warm => "warm",
        }
    }
}

/// One burst level: agentrt beside the relay.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BurstLevel {
    /// Chats released at once.
    pub(crate) sessions: usize,
    pub(crate) kind: Sessions,
    /// Measured rounds (each of `sessions` Chats).
    pub(crate) rounds: usize,
    /// Client connections the Chats share (one per Chat up to 100).
    pub(crate) connections: usize,
    pub(crate) agentrt: Load,
    pub(crate) relay: Load,
    pub(crate) vs_relay: VsRelay,
}

/// Measured rounds at `n` Chats: about `samples` Chats in all, at least
/// one round, at most `max_rounds`.
pub(crate) fn rounds_for(n: usize, samples: usize, max_rounds: usize) -> usize {
    samples.div_ceil(n.max(1)).clamp(1, max_rounds.max(1))
}

/// Connections for a burst of `n` Chats: one each, at most 100.
pub(crate) fn burst_connections(n: usize) -> usize {
    n.clamp(1, 100)
}

/// The burst level of `n` Chats on `kind` sessions: a fresh relay, then a
/// fresh agentrt server, each through the same rounds.
pub(crate) async fn burst_level(env: &Env, n: usize, kind: Sessions) -> Result<BurstLevel, String> {
    let rounds = rounds_for(n, env.plan.burst_samples, env.plan.burst_max_rounds);
    let connections = burst_connections(n);
    let relay = env.fresh_relay(connections).await?;
    let label = format!("S2 burst relay c={n} ({})", kind.name());
    let relay_load = run_rounds(env, &relay, &label, n, kind, rounds, false).await;
    relay.server.terminate(Duration::from_secs(5)).await;
    let relay_load = relay_load?;

    let name = format!("burst-{}-{n}", kind.name());
    let run = env.fresh_server(&name, connections).await?;
    let label = format!("S2 burst agentrt c={n} ({} sessions)", kind.name());
    let agentrt = run_rounds(env, &run, &label, n, kind, rounds, true).await;
    run.server.terminate(Duration::from_secs(10)).await;
    let agentrt = agentrt?;
    Ok(BurstLevel {
        sessions: n,
        kind,
        rounds,
        connections,
        vs_relay: VsRelay::of(&agentrt, &relay_load),
        agentrt,
        relay: relay_load,
    })
}

/// What one process used over the measured rounds.
#[derive(Debug, Default)]
struct Usage {
    cpu_us: u64,
    bench_cpu_us: u64,
    elapsed: Duration,
    rss_peak_kb: u64,
    rss_growth_kb: u64,
    threads_peak: u64,
}

/// Round 0 (not measured) and `rounds` measured rounds of `n` Chats at
/// once against `run`; `sessions` says whether the server keeps sessions
/// (agentrt: created first; the relay takes any id).
async fn run_rounds(
    env: &Env,
    run: &Running,
    label: &str,
    n: usize,
    kind: Sessions,
    rounds: usize,
    sessions: bool,
) -> Result<Load, String> {
    let pid = run.server.pid();
    let p = env.plan.burst;
    let limit = env.plan.turn_limit;
    let rec = Recorder::default();
    let mut usage = Usage::default();
    for round in 0..=rounds {
        let ids: Vec<String> = (0..n)
            .map(|i| format!("b-{}-{n}-r{round}-{i}", kind.name()))
            .collect();
        if sessions {
            create_sessions(&run.clients, &ids).await?;
        }
        if kind == Sessions::Warm {
            warm_turns(env, &run.clients, &ids).await?;
            if sessions {
                settle_titles(&run.clients, &ids, limit).await?;
            }
        }
        let titles = if sessions && kind == Sessions::New {
            Some(ids.clone())
        } else {
            None
        };
        let barrier = Arc::new(Barrier::new(n + 1));
        let mut set = tokio::task::JoinSet::new();
        for (i, id) in ids.into_iter().enumerate() {
            let client = run.clients[i % run.clients.len()].clone();
            let ticket = env.fake.ticket(p);
            let barrier = Arc::clone(&barrier);
            set.spawn(async move {
                barrier.wait().await;
                agentrt_turn_with(&client, &id, Some(ticket), "", limit).await
            });
        }
        let before = proc_stats::sample(pid).unwrap_or_default();
        let bench_before = proc_stats::sample_self();
        let sampler = RssSampler::start(vec![pid], Duration::from_millis(20));
        barrier.wait().await;
        let start = Instant::now();
        let mut observed = Vec::with_capacity(n);
        while let Some(joined) = set.join_next().await {
            observed.push(joined.unwrap_or_else(|e| TurnObs {
                error: Some(format!("burst task: {e}")),
                ..TurnObs::default()
            }));
        }
        let elapsed = start.elapsed();
        let after = proc_stats::sample(pid).unwrap_or_default();
        let bench_after = proc_stats::sample_self();
        let (peak, threads) = sampler.stop().await;
        if let Some(ids) = titles {
            settle_titles(&run.clients, &ids, limit).await?;
        }
        if round == 0 {
            continue;
        }
        let peak = peak.max(after.rss_kb);
        usage.cpu_us += after.cpu_us.saturating_sub(before.cpu_us);
        usage.bench_cpu_us += bench_after.cpu_us.saturating_sub(bench_before.cpu_us);
        usage.elapsed += elapsed;
        usage.rss_peak_kb = usage.rss_peak_kb.max(peak);
        usage.rss_growth_kb = usage.rss_growth_kb.max(peak.saturating_sub(before.rss_kb));
        usage.threads_peak = usage.threads_peak.max(threads.max(after.threads));
        for obs in observed {
            rec.add(obs);
        }
    }
    let totals = rec.take();
    let per = |count: u64| {
        if count > 0 {
            usage.cpu_us as f64 / count as f64
        } else {
            0.0
        }
    };
    let wall_us = usage.elapsed.as_secs_f64() * 1e6;
    let cores = |us: u64| {
        if wall_us > 0.0 {
            us as f64 / wall_us
        } else {
            0.0
        }
    };
    Ok(Load {
        label: label.to_owned(),
        sessions: n,
        server_cpu_us: usage.cpu_us,
        cpu_us_per_event: per(totals.events),
        cpu_us_per_token: per(totals.tokens),
        server_cores: cores(usage.cpu_us),
        bench_cores: cores(usage.bench_cpu_us),
        rss_startup_kb: run.rss_startup_kb,
        rss_peak_kb: usage.rss_peak_kb,
        rss_hwm_kb: proc_stats::sample(pid).unwrap_or_default().hwm_kb,
        rss_per_session_kb: usage.rss_growth_kb as f64 / n.max(1) as f64,
        threads_peak: usage.threads_peak,
        ..Load::default()
    }
    .with_totals(&totals, usage.elapsed.as_secs_f64()))
}

/// One short turn in each of `ids` (32 at a time), before a warm burst.
async fn warm_turns(
    env: &Env,
    clients: &[agentrt_client::Client],
    ids: &[String],
) -> Result<(), String> {
    let warm = StreamParams {
        ttft: Duration::ZERO,
        tokens: 5,
        rate: 0.0,
    };
    let limit = env.plan.turn_limit;
    let errors: Vec<String> = futures::stream::iter(ids.iter().enumerate())
        .map(|(i, id)| {
            let c = &clients[i % clients.len()];
            async move { agentrt_turn(c, id, Some((&env.fake, warm)), "", limit).await }
        })
        .buffer_unordered(32)
        .filter_map(|obs| async move { obs.error })
        .collect()
        .await;
    match errors.first() {
        None => Ok(()),
        Some(e) => Err(format!("{} warm-up turns failed; first: {e}", errors.len())),
    }
}

/// Waits until every session of `ids` has its title: the background job
/// (a history read and a store write) agentrt starts after a session's
/// first successful turn. A user's next turn comes well after it, so no
/// burst is released while those jobs still run. Polls, bounded by `limit`.
async fn settle_titles(
    clients: &[agentrt_client::Client],
    ids: &[String],
    limit: Duration,
) -> Result<(), String> {
    let until = Instant::now() + limit;
    let mut pending: Vec<usize> = (0..ids.len()).collect();
    loop {
        let checked: Vec<(usize, Result<bool, String>)> =
            futures::stream::iter(std::mem::take(&mut pending))
                .map(|i| async move {
                    let c = &clients[i % clients.len()];
                    let titled = c
                        .get_session(&ids[i])
                        .await
                        .map(|s| !s.title.is_empty())
                        .map_err(|e| format!("get session {}: {e}", ids[i]));
                    (i, titled)
                })
                .buffer_unordered(32)
                .collect()
                .await;
        for (i, titled) in checked {
            if !titled? {
                pending.push(i);
            }
        }
        if pending.is_empty() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(format!(
                "{} sessions still had no title {limit:?} after their first turn",
                pending.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `agentrt / relay (ratio)` of two latencies in ms.
fn pair_ms(a: f64, r: f64, ratio: f64) -> String {
    format!("{} / {} ({})", ms(a), ms(r), times(ratio))
}

/// `agentrt / relay (ratio)` of two plain numbers.
fn pair(a: f64, r: f64, ratio: f64) -> String {
    format!("{} / {} ({})", num(a), num(r), times(ratio))
}

/// The columns shared by the burst and the steady tables.
fn vs_cells(a: &Load, r: &Load, v: &VsRelay) -> Vec<String> {
    vec![
        pair_ms(a.admission.p50_us, r.admission.p50_us, v.admission_p50),
        pair_ms(a.admission.p99_us, r.admission.p99_us, v.admission_p99),
        pair_ms(
            a.first_relay.p99_us,
            r.first_relay.p99_us,
            v.first_event_p99,
        ),
        pair_ms(a.ttfe.p99_us, r.ttfe.p99_us, v.ttfe_p99),
        pair(a.cpu_us_per_token, r.cpu_us_per_token, v.cpu_per_token),
        pair(a.rss_per_session_kb, r.rss_per_session_kb, v.rss_per_call),
    ]
}

const VS_HEAD: &[&str] = &[
    "Chat → upstream request p50 ms",
    "p99 ms",
    "first token → first event p99 ms",
    "TTFE p99 ms",
    "server CPU µs/token",
    "RSS growth KB/call",
];

/// The "Against the minimal relay" section: S2 bursts, S2 steady loops,
/// S3 saturation, each agentrt / relay (agentrt ÷ relay).
pub(crate) fn markdown(bursts: &[BurstLevel], s2: &[S2Level], s3: Option<&S3>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n## Against the minimal relay\n\n\
         Each cell: agentrt / minimal relay (agentrt ÷ relay). The relay is a tonic \
         Chat that sends one request to the same fake per Chat through one pooled \
         reqwest client and forwards each SSE delta as a text event (baseline c).\n"
    );
    if !bursts.is_empty() {
        let _ = writeln!(
            out,
            "### S2 bursts: N Chats released at once\n\n\
             new: each Chat is a new session's first turn; warm: each is the second turn \
             of a session given one turn before. Chats per level: sessions × rounds.\n"
        );
        let mut head = vec!["Chats at once", "sessions", "rounds"];
        head.extend_from_slice(VS_HEAD);
        head.push("failures");
        let rows: Vec<_> = bursts
            .iter()
            .map(|b| {
                let mut row = vec![
                    b.sessions.to_string(),
                    b.kind.name().to_owned(),
                    b.rounds.to_string(),
                ];
                row.extend(vs_cells(&b.agentrt, &b.relay, &b.vs_relay));
                row.push(fail_note(b.agentrt.failures + b.relay.failures));
                row
            })
            .collect();
        out.push_str(&table(&head, &rows));
    }
    let steady: Vec<&S2Level> = s2.iter().filter(|l| l.relay.turns > 0).collect();
    if !steady.is_empty() {
        let _ = writeln!(
            out,
            "\n### S2 steady load (each session's loop of turns, starts staggered)\n"
        );
        let mut head = vec!["sessions"];
        head.extend_from_slice(VS_HEAD);
        head.push("tokens/s");
        let rows: Vec<_> = steady
            .iter()
            .map(|l| {
                let mut row = vec![l.sessions.to_string()];
                row.extend(vs_cells(&l.agentrt, &l.relay, &l.vs_relay));
                row.push(pair(
                    l.agentrt.tokens_per_s,
                    l.relay.tokens_per_s,
                    l.vs_relay.tokens_per_s,
                ));
                row
            })
            .collect();
        out.push_str(&table(&head, &rows));
    }
    if let Some(s3) = s3.filter(|s| !s.relay.is_empty()) {
        let _ = writeln!(
            out,
            "\n### S3 saturation (unpaced streams of {} tokens)\n\n\
             Best tokens/s: agentrt {} (same session per loop) and {} (a new session per \
             turn), relay {}: {} and {}. Server CPU per token at agentrt's best level, \
             beside the relay at the same level: {} and {}.\n",
            s3.tokens,
            num(s3.max_tokens_per_s),
            num(s3.new_session_max_tokens_per_s),
            num(s3.relay_max_tokens_per_s),
            times(s3.saturation_vs_relay),
            times(s3.new_session_saturation_vs_relay),
            times(s3.cpu_vs_relay),
            times(s3.new_session_cpu_vs_relay),
        );
        let rows: Vec<_> = s3
            .agentrt
            .iter()
            .chain(&s3.new_session)
            .chain(&s3.relay)
            .map(|l| {
                vec![
                    l.label.clone(),
                    l.sessions.to_string(),
                    format!("{}{}", l.turns, fail_note(l.failures)),
                    num(l.tokens_per_s),
                    num(l.events_per_s),
                    num(l.cpu_us_per_token),
                    format!("{:.2}", l.server_cores),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "run",
                "sessions",
                "turns",
                "tokens/s",
                "events/s",
                "server CPU µs/token",
                "server cores",
            ],
            &rows,
        ));
    }
    if !bursts.is_empty() {
        let _ = writeln!(out, "\nEvery burst run:\n");
        let loads: Vec<&Load> = bursts.iter().flat_map(|b| [&b.agentrt, &b.relay]).collect();
        let rows: Vec<_> = loads.iter().map(|l| load_row(l)).collect();
        out.push_str(&table(LOAD_HEAD, &rows));
        out.push_str(&decomposition(&loads));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_give_about_the_samples_asked_for() {
        assert_eq!(rounds_for(1, 300, 20), 20);
        assert_eq!(rounds_for(10, 300, 20), 20);
        assert_eq!(rounds_for(100, 300, 20), 3);
        assert_eq!(rounds_for(1000, 300, 20), 1);
        assert_eq!(rounds_for(0, 300, 0), 1);
        assert_eq!(burst_connections(1), 1);
        assert_eq!(burst_connections(1000), 100);
    }
}
