//! Phase 3: the disk full to its last page under running turns, with no
//! reserve (`--store-min-free-mb 0`): sled fails a write, and the server
//! must say so through liveness.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use agentrt_client::Client;

use super::turn::{Turn, request};
use super::{Ctx, mib, ms};
use crate::fake::{Mode, directive};
use crate::rng::Rng;
use crate::server::{self, Health, Server, Serving};
use crate::tmpfs::Filler;

/// Counts of phase 3's turn loops.
#[derive(Debug, Default)]
struct Hard {
    filled: AtomicBool,
    stop: AtomicBool,
    ok_before: AtomicU64,
    ok_after: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
    /// What refusals and failed turns said (each text once).
    refusals: Mutex<BTreeSet<String>>,
    failures: Mutex<BTreeSet<String>>,
}

/// Keeps a few distinct texts.
fn note(texts: &Mutex<BTreeSet<String>>, text: String) {
    let mut texts = texts.lock().unwrap_or_else(PoisonError::into_inner);
    if texts.len() < 4 {
        texts.insert(text);
    }
}

fn take(texts: &Mutex<BTreeSet<String>>) -> Vec<String> {
    let texts = std::mem::take(&mut *texts.lock().unwrap_or_else(PoisonError::into_inner));
    texts.into_iter().collect()
}

/// What one session's loop saw.
struct Seen {
    acks: Vec<(u64, String)>,
    /// Every turn admitted: id, and what went wrong.
    turns: Vec<(String, Option<String>)>,
    /// What went wrong that should not have.
    problems: Vec<String>,
}

/// Small turns back to back on one session until `stop`.
async fn hard_loop(c: Client, sid: String, mut rng: Rng, hard: Arc<Hard>, limit: Duration) -> Seen {
    let (mut acks, mut turns, mut problems) = (Vec::new(), Vec::new(), Vec::new());
    for n in 0.. {
        if hard.stop.load(Ordering::SeqCst) {
            break;
        }
        let text = directive(
            Mode::Text,
            rng.range(2, 12) as u32,
            &format!("hard-{sid}-{n}"),
        );
        // A turn is judged by whether the disk was full when it ended.
        match c.chat_with(request(&sid, text)).await {
            Err(e) => {
                if hard.filled.load(Ordering::SeqCst) {
                    hard.refused.fetch_add(1, Ordering::SeqCst);
                    note(&hard.refusals, e.to_string());
                } else {
                    problems.push(format!("{sid}: refused before the fill: {e}"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(mut stream) => {
                let mut t = Turn::default();
                t.finish(&mut stream, limit).await;
                acks.extend(t.acks.iter().map(|(s, id, _)| (*s, id.clone())));
                turns.push((t.turn_id.clone(), t.told()));
                let filled = hard.filled.load(Ordering::SeqCst);
                let counter = match (t.succeeded(), filled) {
                    (true, false) => &hard.ok_before,
                    (true, true) => &hard.ok_after,
                    (false, true) => &hard.failed,
                    (false, false) => {
                        problems.push(format!("{sid}: a turn before the fill ended {t:?}"));
                        break;
                    }
                };
                counter.fetch_add(1, Ordering::SeqCst);
                if let (true, Some(told)) = (filled, t.told()) {
                    note(&hard.failures, told);
                }
                if t.broken.as_deref().is_some_and(|b| b.starts_with("no end")) {
                    problems.push(format!("{sid}: turn {} hung: {t:?}", t.turn_id));
                    break;
                }
            }
        }
    }
    Seen {
        acks,
        turns,
        problems,
    }
}

/// Phase 3: the disk full to the last page under running turns; returns
/// the filler (removed only once the server is dead).
pub(super) async fn hard_full(ctx: &mut Ctx<'_>, server: &Server) -> Result<Filler, String> {
    const PHASE: &str = "hard full";
    let health = Health::connect(server.url()).await?;
    let clients = server::clients(server.url(), ctx.sids.len()).await?;
    let hard = Arc::new(Hard::default());
    let mut loops = tokio::task::JoinSet::new();
    for (i, c) in clients.into_iter().enumerate() {
        let rng = ctx.rng.fork(i as u64);
        let (sid, hard, limit) = (ctx.sids[i].clone(), Arc::clone(&hard), ctx.plan.turn_limit);
        loops.spawn(async move { (i, hard_loop(c, sid, rng, hard, limit).await) });
    }
    // Turns are flowing before the disk fills.
    let want = ctx.sids.len() as u64;
    let flowing = Instant::now() + ctx.plan.turn_limit;
    while hard.ok_before.load(Ordering::SeqCst) < want && Instant::now() < flowing {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut filler = ctx.filler()?;
    hard.filled.store(true, Ordering::SeqCst);
    filler.fill_completely();
    let filled = Instant::now();
    let keeper = filler.keep_full()?;
    let free = ctx.free()?;
    ctx.fig.hard_free = free;
    let why = format!(
        "the disk full ({} free) under turns, --store-min-free-mb 0",
        mib(free)
    );
    let down = ctx
        .wait_health(&health, PHASE, "liveness", Serving::NotServing, &why)
        .await;
    ctx.fig.liveness_down_ms = down.and(ms(filled.elapsed()));
    if down.is_some() {
        ctx.expect_health(&health, PHASE, "readiness", Serving::NotServing)
            .await;
    }
    hard.stop.store(true, Ordering::SeqCst);
    while let Some(joined) = loops.join_next().await {
        let (i, seen) = joined.map_err(|e| format!("hard-full loop: {e}"))?;
        ctx.fig.acked += seen.acks.len() as u64;
        ctx.acks[i].extend(seen.acks);
        ctx.turns.extend(seen.turns);
        for p in seen.problems {
            ctx.violate(PHASE, p);
        }
    }
    keeper.stop().await?;
    let f = &mut ctx.fig;
    f.hard_ok_before = hard.ok_before.load(Ordering::SeqCst);
    f.hard_ok_after = hard.ok_after.load(Ordering::SeqCst);
    f.hard_refused = hard.refused.load(Ordering::SeqCst);
    f.hard_failed = hard.failed.load(Ordering::SeqCst);
    f.hard_refusals = take(&hard.refusals);
    f.hard_failures = take(&hard.failures);
    f.turns_ok += f.hard_ok_before + f.hard_ok_after;
    if f.hard_refused + f.hard_failed == 0 {
        let ok = f.hard_ok_after;
        ctx.violate(
            PHASE,
            format!("no turn failed with {why}: {ok} succeeded after the fill"),
        );
    }
    Ok(filler)
}
