//! Phases 1 and 2: the disk under the reserve refuses new work at
//! admission (readiness NOT_SERVING) and comes back without a restart;
//! under a quarter of it, the writes of running turns are refused too.

use std::time::Instant;

use agentrt_client::{Client, proto};

use super::turn::{Turn, big_text, disk_full, request};
use super::{Ctx, mib, ms};
use crate::fake::{Fake, Mode, directive};
use crate::server::{Health, Serving};
use crate::tmpfs::MIB;

/// Phase 1: refused at admission below the reserve, back without a restart.
pub(super) async fn watermark(
    ctx: &mut Ctx<'_>,
    c: &Client,
    health: &Health,
) -> Result<(), String> {
    const PHASE: &str = "watermark";
    for sid in &ctx.sids {
        c.create_session(proto::CreateSessionRequest {
            session_id: sid.clone(),
            ..Default::default()
        })
        .await
        .map_err(|e| format!("create {sid}: {e}"))?;
    }
    for _ in 0..ctx.plan.turns_before {
        for i in 0..ctx.sids.len() {
            let key = ctx.key(i, PHASE);
            let (lo, hi) = ctx.plan.big_bytes;
            let text = big_text(&key, ctx.rng.range(lo, hi));
            let sid = ctx.sids[i].clone();
            match ctx.turn(c, i, text).await {
                Ok(t) if t.succeeded() => {}
                Ok(t) => ctx.violate(PHASE, format!("{sid}: a turn before the fill ended {t:?}")),
                Err(e) => ctx.violate(PHASE, format!("{sid}: refused before the fill: {e}")),
            }
        }
    }
    if ctx.failed() {
        return Ok(());
    }
    let before = ctx.histories(c).await?;
    let mut filler = ctx.filler()?;
    filler.fill_leaving(ctx.plan.min_free_mb * MIB / 2)?;
    let filled = Instant::now();
    let free = ctx.free()?;
    ctx.fig.watermark_free = free;
    let why = format!(
        "{} free with a {} MiB reserve",
        mib(free),
        ctx.plan.min_free_mb
    );
    let down = ctx
        .wait_health(health, PHASE, "readiness", Serving::NotServing, &why)
        .await;
    ctx.fig.watermark_down_ms = down.and(ms(filled.elapsed()));
    ctx.expect_health(health, PHASE, "", Serving::NotServing)
        .await;
    ctx.expect_health(health, PHASE, "liveness", Serving::Serving)
        .await;
    for i in 0..ctx.sids.len() {
        let key = ctx.key(i, PHASE);
        let text = if i % 2 == 0 {
            big_text(&key, ctx.plan.big_bytes.0)
        } else {
            directive(Mode::Text, 3, &key)
        };
        let sid = ctx.sids[i].clone();
        match c.chat_with(request(&sid, text)).await {
            Err(e) if disk_full(&e) => ctx.fig.refused_chat += 1,
            Err(e) => ctx.violate(
                PHASE,
                format!("{sid}: Chat at {why}: refused with {e}, not UNAVAILABLE \"disk is full\""),
            ),
            Ok(mut s) => {
                let mut t = Turn::default();
                t.finish(&mut s, ctx.plan.turn_limit).await;
                ctx.record(i, &t);
                ctx.violate(PHASE, format!("{sid}: Chat admitted at {why}: {t:?}"));
            }
        }
    }
    let fresh = format!("disk-new-{}", ctx.seed);
    let created = c
        .create_session(proto::CreateSessionRequest {
            session_id: fresh.clone(),
            ..Default::default()
        })
        .await;
    match created {
        Err(e) if disk_full(&e) => {
            ctx.fig.refused_create += 1;
            match c.get_session(&fresh).await {
                Err(agentrt_client::Error::NotFound { .. }) => {}
                Ok(_) => ctx.violate(PHASE, format!("the refused CreateSession stored {fresh}")),
                Err(e) => return Err(format!("GetSession {fresh}: {e}")),
            }
        }
        Err(e) => ctx.violate(
            PHASE,
            format!("CreateSession at {why}: refused with {e}, not UNAVAILABLE \"disk is full\""),
        ),
        Ok(_) => ctx.violate(PHASE, format!("CreateSession {fresh} admitted at {why}")),
    }
    let after = ctx.histories(c).await?;
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if b != a {
            let sid = ctx.sids[i].clone();
            ctx.violate(
                PHASE,
                format!(
                    "{sid}: the refused calls changed its history: {} messages before, {} after",
                    b.len(),
                    a.len()
                ),
            );
        }
    }
    ctx.fig.watermark_up_ms = ctx.space_returns(c, health, PHASE, filler).await;
    Ok(())
}

/// Phase 2: answers that arrive once the disk is below a quarter of the
/// reserve end the turn ERROR, with nothing half-stored.
pub(super) async fn mid_turn(
    ctx: &mut Ctx<'_>,
    c: &Client,
    health: &Health,
    fake: &Fake,
) -> Result<(), String> {
    const PHASE: &str = "mid-turn";
    fake.set_gate(false);
    let mut open = Vec::new();
    for i in 0..ctx.sids.len() {
        let key = ctx.key(i, PHASE);
        let text = directive(Mode::Gated, ctx.plan.answer_tokens, &key);
        let sid = ctx.sids[i].clone();
        let mut stream = match c.chat_with(request(&sid, text)).await {
            Ok(s) => s,
            Err(e) => {
                ctx.violate(PHASE, format!("{sid}: refused before the fill: {e}"));
                continue;
            }
        };
        let mut t = Turn::default();
        let _ = tokio::time::timeout(ctx.plan.turn_limit, t.until_text(&mut stream)).await;
        if !t.text {
            ctx.record(i, &t);
            ctx.violate(PHASE, format!("{sid}: the answer did not start: {t:?}"));
            continue;
        }
        open.push((i, stream, t));
    }
    ctx.fig.mid_turns = open.len() as u64;
    let mut filler = ctx.filler()?;
    filler.fill_leaving(ctx.plan.min_free_mb * MIB / 8)?;
    let filled = Instant::now();
    let down = ctx
        .wait_health(health, PHASE, "readiness", Serving::NotServing, "filled")
        .await;
    ctx.fig.mid_down_ms = down.and(ms(filled.elapsed()));
    let free = ctx.free()?;
    ctx.fig.mid_free = free;
    fake.set_gate(true);
    let limit = ctx.plan.turn_limit;
    let mut set = tokio::task::JoinSet::new();
    for (i, mut stream, mut t) in open {
        set.spawn(async move {
            t.finish(&mut stream, limit).await;
            (i, t)
        });
    }
    let mut done = Vec::new();
    while let Some(joined) = set.join_next().await {
        done.push(joined.map_err(|e| format!("mid-turn reader: {e}"))?);
    }
    done.sort_by_key(|(i, _)| *i);
    for (i, t) in &done {
        let sid = ctx.sids[*i].clone();
        ctx.record(*i, t);
        let at = format!("answer at {} free", mib(free));
        if t.outcome != Some(proto::TurnOutcome::Error) || !t.ended_disk_full() {
            ctx.violate(
                PHASE,
                format!(
                    "{sid}: turn {} ({at}) ended {:?} with errors {:?} (want ERROR and an UNAVAILABLE \"disk is full\" error event)",
                    t.turn_id, t.outcome, t.errors
                ),
            );
        } else {
            ctx.fig.mid_disk_full += 1;
        }
        if !t.acks.iter().any(|(_, _, r)| *r == proto::Role::User) {
            ctx.violate(
                PHASE,
                format!("{sid}: turn {}: no user message acknowledged", t.turn_id),
            );
        }
        let history = c
            .history(&sid)
            .await
            .map_err(|e| format!("{sid}: GetHistory: {e}"))?;
        let mut stored: Vec<&str> = history
            .iter()
            .filter(|m| m.turn_id == t.turn_id)
            .map(|m| m.id.as_str())
            .collect();
        let mut acked: Vec<&str> = t.acks.iter().map(|(_, id, _)| id.as_str()).collect();
        stored.sort_unstable();
        acked.sort_unstable();
        if stored != acked {
            ctx.violate(
                PHASE,
                format!(
                    "{sid}: turn {} ({at}) stored {stored:?} but acknowledged {acked:?}",
                    t.turn_id
                ),
            );
        }
    }
    ctx.fig.mid_up_ms = ctx.space_returns(c, health, PHASE, filler).await;
    Ok(())
}
