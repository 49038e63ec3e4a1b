//! Abusive clients next to well-behaved ones: callers that stop reading
//! their turn's stream (long answers pile up against HTTP/2 flow control),
//! callers that vanish mid-turn (their connection dropped after the first
//! events), and one connection opening many streams at once (turns left
//! waiting on a caller-executed tool that never answers). Meanwhile victim
//! sessions on their own connections run paced turns and measure relay lag
//! (the fake upstream's write of a token → the client's receipt of its
//! text event, one clock). Figures: the server's RSS before, at its peak
//! and after; lag p50/p99 without and with the abuse. Verdicts: every
//! victim turn succeeds, the peak RSS stays under the bound, and every
//! abusive session is idle again (not wedged) soon after its caller left.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use futures::StreamExt as _;
use hdrhistogram::Histogram;

use crate::fake::{Fake, Mode, directive, token_indices};
use crate::server::{self, Server};

/// Sizes of the abuse.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) victims: usize,
    pub(crate) stop_readers: usize,
    pub(crate) vanishers: usize,
    pub(crate) one_conn_streams: usize,
    /// Tokens of a victim turn (paced by the fake).
    pub(crate) victim_tokens: u32,
    /// Fat tokens of an abusive turn's answer.
    pub(crate) long_tokens: u32,
    /// How long victims are measured alone, then under the abuse.
    pub(crate) window: Duration,
    /// Verdict: the peak RSS must stay below this.
    pub(crate) rss_limit_mb: u64,
    /// Verdict (optional): victims' relay lag p99 under abuse.
    pub(crate) lag_p99_limit: Option<Duration>,
}

/// What the abuse measured.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) stop_readers: usize,
    pub(crate) vanishers: usize,
    pub(crate) one_conn_streams: usize,
    /// Streams of the one connection admitted (turn started) during the window.
    pub(crate) one_conn_admitted: u64,
    pub(crate) rss_before_kb: u64,
    pub(crate) rss_peak_kb: u64,
    pub(crate) rss_after_kb: u64,
    pub(crate) baseline_lag_us: (f64, f64, f64),
    pub(crate) abuse_lag_us: (f64, f64, f64),
    pub(crate) baseline_tokens: u64,
    pub(crate) abuse_tokens: u64,
    pub(crate) victim_turns: u64,
    pub(crate) idle_after_ms: f64,
    pub(crate) wall: Duration,
    pub(crate) violations: Vec<String>,
}

type Hist = Histogram<u64>;

fn new_hist() -> Hist {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("valid histogram bounds")
}

fn quantiles_us(h: &Hist) -> (f64, f64, f64) {
    let q = |p| h.value_at_quantile(p) as f64 / 1e3;
    (q(0.5), q(0.99), h.max() as f64 / 1e3)
}

fn chat(sid: &str, mode: Mode, tokens: u32, key: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: sid.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: directive(mode, tokens, key),
            })),
        }],
        extra_tools: if mode == Mode::CallerTool {
            vec![proto::ToolDefinition {
                name: "lookup".into(),
                description: "Looks a key up (the caller runs it)".into(),
                parameters_json_schema: r#"{"type":"object"}"#.into(),
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    }
}

/// Victim turns back to back until `stop`; lags go to `hist`.
async fn victim(
    c: Client,
    fake: Arc<Fake>,
    sid: String,
    tokens: u32,
    stop: Arc<AtomicBool>,
    hist: Arc<Mutex<Hist>>,
    turns: Arc<AtomicU64>,
) -> Result<(), String> {
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let key = format!("{sid}-{n}");
        n += 1;
        let mut stream = c
            .chat_with(chat(&sid, Mode::Lag, tokens, &key))
            .await
            .map_err(|e| format!("victim {sid}: Chat: {e}"))?;
        let mut got: Vec<(usize, Instant)> = Vec::new();
        let mut outcome = None;
        while let Some(item) = stream.next().await {
            let at = Instant::now();
            let event = item.map_err(|e| format!("victim {sid}: stream: {e}"))?;
            match event.kind {
                ChatEvent::Text(t) => got.extend(token_indices(&t).map(|i| (i, at))),
                ChatEvent::TurnFinished { outcome: o, .. } => outcome = Some(o),
                _ => {}
            }
        }
        if outcome != Some(proto::TurnOutcome::Success) {
            return Err(format!("victim {sid}: turn ended {outcome:?}"));
        }
        let emits = fake
            .take_emits(&key)
            .ok_or_else(|| format!("victim {sid}: the fake kept no emit times for {key}"))?;
        if got.len() != tokens as usize {
            return Err(format!(
                "victim {sid}: {} of {tokens} tokens received",
                got.len()
            ));
        }
        let mut h = hist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (i, at) in got {
            if let Some(e) = emits.get(i) {
                let lag = at.saturating_duration_since(*e);
                h.saturating_record(u64::try_from(lag.as_nanos()).unwrap_or(u64::MAX).max(1));
            }
        }
        turns.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

/// Victims for `window`; returns their lag histogram and turn count.
async fn measure_victims(
    clients: &[Client],
    fake: &Arc<Fake>,
    sids: &[String],
    tokens: u32,
    window: Duration,
    violations: &mut Vec<String>,
) -> (Hist, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let hist = Arc::new(Mutex::new(new_hist()));
    let turns = Arc::new(AtomicU64::new(0));
    let mut set = tokio::task::JoinSet::new();
    for (i, sid) in sids.iter().enumerate() {
        set.spawn(victim(
            clients[i % clients.len()].clone(),
            Arc::clone(fake),
            sid.clone(),
            tokens,
            Arc::clone(&stop),
            Arc::clone(&hist),
            Arc::clone(&turns),
        ));
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let join = async {
        let mut errors = Vec::new();
        while let Some(r) = set.join_next().await {
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("victim task: {e}")),
            }
        }
        errors
    };
    match tokio::time::timeout(Duration::from_secs(60), join).await {
        Ok(errors) => violations.extend(errors),
        Err(_) => violations.push("victim turns did not end within 60 s of the window".into()),
    }
    let h = std::mem::replace(
        &mut *hist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
        new_hist(),
    );
    (h, turns.load(Ordering::Relaxed))
}

async fn create(c: &Client, ids: &[String]) -> Result<(), String> {
    let results: Vec<Result<(), String>> = futures::stream::iter(ids.iter().cloned())
        .map(|sid| {
            let c = c.clone();
            async move {
                c.create_session(proto::CreateSessionRequest {
                    session_id: sid.clone(),
                    ..Default::default()
                })
                .await
                .map(drop)
                .map_err(|e| format!("create {sid}: {e}"))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Runs the abuse against `server` (its upstream is `fake`).
pub(crate) async fn run(
    server: &mut Server,
    fake: &Arc<Fake>,
    plan: &Plan,
    seed: u64,
) -> Result<Figures, String> {
    let start = Instant::now();
    let mut fig = Figures {
        stop_readers: plan.stop_readers,
        vanishers: plan.vanishers,
        one_conn_streams: plan.one_conn_streams,
        ..Figures::default()
    };
    let name = |kind: &str, n: usize| -> Vec<String> {
        (0..n).map(|i| format!("abuse-{seed}-{kind}-{i}")).collect()
    };
    let (victims, stoppers, vanishers, many) = (
        name("victim", plan.victims),
        name("stop", plan.stop_readers),
        name("vanish", plan.vanishers),
        name("many", plan.one_conn_streams),
    );
    let setup = server::clients(server.url(), 1).await?.remove(0);
    for ids in [&victims, &stoppers, &vanishers, &many] {
        create(&setup, ids).await?;
    }
    let victim_clients = server::clients(server.url(), 2).await?;
    let mut v = Vec::new();

    // Baseline: victims alone.
    fig.rss_before_kb = server.rss_kb();
    let (base, base_turns) = measure_victims(
        &victim_clients,
        fake,
        &victims,
        plan.victim_tokens,
        plan.window,
        &mut v,
    )
    .await;
    fig.baseline_lag_us = quantiles_us(&base);
    fig.baseline_tokens = base.len();

    // The abuse.
    let per_conn = 100;
    let stop_clients = server::clients(server.url(), plan.stop_readers.div_ceil(per_conn)).await?;
    let mut held = Vec::new();
    for (i, sid) in stoppers.iter().enumerate() {
        let c = &stop_clients[i / per_conn];
        match c
            .chat_with(chat(sid, Mode::Long, plan.long_tokens, sid))
            .await
        {
            // Kept, never read.
            Ok(s) => held.push(s),
            Err(e) => v.push(format!("stop-reader {sid}: Chat: {e}")),
        }
    }
    let vanish_clients = server::clients(server.url(), plan.vanishers.div_ceil(per_conn)).await?;
    let mut vanish_tasks = tokio::task::JoinSet::new();
    for (chunk, c) in vanishers.chunks(per_conn).zip(vanish_clients) {
        let (chunk, tokens) = (chunk.to_vec(), plan.long_tokens);
        vanish_tasks.spawn(async move {
            let mut streams = Vec::new();
            for sid in &chunk {
                if let Ok(mut s) = c.chat_with(chat(sid, Mode::Long, tokens, sid)).await {
                    // Read the first event or two, then vanish. Bounded: the
                    // earlier streams, held unread, may have used up the
                    // connection's flow-control window.
                    let first = async {
                        let _ = s.next().await;
                        let _ = s.next().await;
                    };
                    let _ = tokio::time::timeout(Duration::from_secs(2), first).await;
                    streams.push(s);
                }
            }
            // The connection goes with its last handle.
            drop(streams);
            drop(c);
        });
    }
    let many_client = server::clients(server.url(), 1).await?.remove(0);
    let admitted = Arc::new(AtomicU64::new(0));
    let mut many_tasks = tokio::task::JoinSet::new();
    for sid in &many {
        let (c, sid, admitted) = (many_client.clone(), sid.clone(), Arc::clone(&admitted));
        many_tasks.spawn(async move {
            if let Ok(mut s) = c.chat_with(chat(&sid, Mode::CallerTool, 0, &sid)).await {
                admitted.fetch_add(1, Ordering::Relaxed);
                // Read everything; the tool call is never answered.
                while let Some(Ok(_)) = s.next().await {}
            }
        });
    }
    drop(many_client);
    let sampling = Arc::new(AtomicBool::new(true));
    let peak = Arc::new(AtomicU64::new(server.rss_kb()));
    let pid_rss = {
        let (sampling, peak) = (Arc::clone(&sampling), Arc::clone(&peak));
        let pid = server.pid();
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(server::rss_kb(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let (under, abuse_turns) = measure_victims(
        &victim_clients,
        fake,
        &victims,
        plan.victim_tokens,
        plan.window,
        &mut v,
    )
    .await;
    fig.abuse_lag_us = quantiles_us(&under);
    fig.abuse_tokens = under.len();
    fig.victim_turns = base_turns + abuse_turns;
    fig.one_conn_admitted = admitted.load(Ordering::Relaxed);

    // The abusers leave; every session they held must become idle.
    drop(held);
    drop(stop_clients);
    many_tasks.abort_all();
    while many_tasks.join_next().await.is_some() {}
    while vanish_tasks.join_next().await.is_some() {}
    let left = Instant::now();
    let idle_by = left + Duration::from_secs(30);
    for sid in stoppers.iter().chain(&vanishers).chain(&many) {
        loop {
            match setup.session_status(sid).await {
                Ok(s) if !s.live => break,
                Ok(_) if Instant::now() < idle_by => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(s) => {
                    v.push(format!(
                        "{sid}: wedged: still live (turn {}) 30 s after its caller left",
                        s.turn_id
                    ));
                    break;
                }
                Err(e) => {
                    v.push(format!("{sid}: GetSessionStatus: {e}"));
                    break;
                }
            }
        }
    }
    fig.idle_after_ms = left.elapsed().as_secs_f64() * 1e3;
    sampling.store(false, Ordering::Relaxed);
    let _ = pid_rss.await;
    fig.rss_peak_kb = peak.load(Ordering::Relaxed);
    fig.rss_after_kb = server.rss_kb();
    if !server.alive() {
        v.push("the server died during the abuse".into());
    }
    if fig.rss_peak_kb > plan.rss_limit_mb * 1024 {
        v.push(format!(
            "peak RSS {} MB is above the bound of {} MB",
            fig.rss_peak_kb / 1024,
            plan.rss_limit_mb
        ));
    }
    if let Some(limit) = plan.lag_p99_limit
        && fig.abuse_lag_us.1 > limit.as_secs_f64() * 1e6
    {
        v.push(format!(
            "victims' relay lag p99 {:.0} µs under abuse is above {limit:?}",
            fig.abuse_lag_us.1
        ));
    }
    if fig.abuse_tokens == 0 {
        v.push("no victim token was measured under the abuse".into());
    }
    fig.violations = v
        .into_iter()
        .map(|e| format!("[abuse seed {seed}] {e}"))
        .collect();
    fig.wall = start.elapsed();
    Ok(fig)
}
