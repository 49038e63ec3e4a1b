//! The disk-full battery: the sled store on a small tmpfs (64 MiB), the
//! server started with `--store-min-free-mb 16`, and the disk filled under
//! it by a filler file beside the data dir, in three phases:
//!
//! 1. **watermark**: sessions take turns with 150–250 KB user messages
//!    (bodies in files); the disk is filled to leave half the reserve.
//!    Readiness (and `""`) must turn NOT_SERVING within the bound while
//!    liveness stays SERVING; a `Chat` on every session and a
//!    `CreateSession` must be refused `UNAVAILABLE` "disk is full" and store
//!    nothing; once the filler is gone readiness must be SERVING again and a
//!    turn on every session succeed, without a restart.
//! 2. **mid-turn**: a turn per session is admitted and its answer (~100 KB)
//!    held at the fake's gate; the disk is filled to leave an eighth of the
//!    reserve (below the quarter under which running turns' writes are
//!    refused) and the gate opened. Each turn must end ERROR with an
//!    `error` event UNAVAILABLE "disk is full", its user message stored, no
//!    message stored that was not acknowledged, the session not busy.
//! 3. **hard full**: restarted with `--store-min-free-mb 0`, small turns run
//!    on every session while the disk is filled to the last page and kept
//!    full: turns must fail and liveness turn NOT_SERVING within the bound.
//!    Then `kill -9`, the filler removed, a restart on the same data.
//!
//! After that restart every message acknowledged by `message_stored` in
//! any phase must be in history at its seq exactly once, seqs contiguous
//! (the crash battery's [`Mirror`] checks), no session busy, and a new turn
//! on every session must succeed. The seed chooses message sizes and token
//! counts; the verdicts wait on the health service (bounded), never on a
//! fixed time, except one poll period and a half in phase 2 so the server
//! has measured the disk as filled, not half-way.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, Event, EventStream, proto};
use futures::StreamExt as _;

use crate::crash::settled;
use crate::fake::{Fake, Mode, directive};
use crate::mirror::Mirror;
use crate::rng::Rng;
use crate::server::{self, Health, Server, Serving, Spec};
use crate::tmpfs::{self, Filler, MIB, Tmpfs};

/// Sizes and bounds.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The tmpfs under the data dir, MiB.
    pub(crate) size_mb: u64,
    /// The server's `--store-min-free-mb`.
    pub(crate) min_free_mb: u64,
    pub(crate) sessions: usize,
    /// Turns per session before the first fill.
    pub(crate) turns_before: usize,
    /// Bytes of those turns' user messages, drawn in this range.
    pub(crate) big_bytes: (u64, u64),
    /// Fat tokens (251 bytes each) of a mid-turn answer.
    pub(crate) answer_tokens: u32,
    /// Longest wait for the health service to change.
    pub(crate) health_limit: Duration,
    /// Longest a turn may run.
    pub(crate) turn_limit: Duration,
}

/// What the battery measured.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) turns_ok: u64,
    pub(crate) acked: u64,
    pub(crate) refused_chat: u64,
    pub(crate) refused_create: u64,
    /// Bytes free when phase 1 checked admission.
    pub(crate) watermark_free: u64,
    pub(crate) watermark_down_ms: Option<f64>,
    pub(crate) watermark_up_ms: Option<f64>,
    pub(crate) mid_turns: u64,
    pub(crate) mid_disk_full: u64,
    /// Bytes free when phase 2 opened the gate.
    pub(crate) mid_free: u64,
    pub(crate) mid_down_ms: Option<f64>,
    pub(crate) mid_up_ms: Option<f64>,
    pub(crate) hard_ok_before: u64,
    pub(crate) hard_ok_after: u64,
    pub(crate) hard_refused: u64,
    pub(crate) hard_failed: u64,
    pub(crate) liveness_down_ms: Option<f64>,
    pub(crate) restart_ms: Option<f64>,
    /// Acknowledgements from before the last restart, each looked for in
    /// history after it.
    pub(crate) acks_checked: u64,
    pub(crate) messages: u64,
    pub(crate) wall: Duration,
    pub(crate) violations: Vec<String>,
}

/// What a client saw of one turn.
#[derive(Debug, Default)]
struct Turn {
    turn_id: String,
    acks: Vec<(u64, String, proto::Role)>,
    outcome: Option<proto::TurnOutcome>,
    errors: Vec<(proto::ErrorCode, String)>,
    /// The stream failed or did not end in time.
    broken: Option<String>,
    /// A text delta arrived (the answer started).
    text: bool,
}

impl Turn {
    fn absorb(&mut self, event: Event) {
        if self.turn_id.is_empty() {
            self.turn_id.clone_from(&event.turn_id);
        }
        match event.kind {
            ChatEvent::Text(_) => self.text = true,
            ChatEvent::MessageStored { seq, id, role } => self.acks.push((seq, id, role)),
            ChatEvent::Error { code, message } => self.errors.push((code, message)),
            ChatEvent::TurnFinished { outcome, .. } => self.outcome = Some(outcome),
            _ => {}
        }
    }

    /// Reads until the first text delta, or the end.
    async fn until_text(&mut self, stream: &mut EventStream) {
        while !self.text {
            match stream.next().await {
                Some(Ok(e)) => self.absorb(e),
                Some(Err(e)) => {
                    self.broken = Some(e.to_string());
                    return;
                }
                None => return,
            }
        }
    }

    /// Reads to the end, for at most `limit`.
    async fn finish(&mut self, stream: &mut EventStream, limit: Duration) {
        let drain = async {
            while let Some(item) = stream.next().await {
                match item {
                    Ok(e) => self.absorb(e),
                    Err(e) => {
                        self.broken = Some(e.to_string());
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(limit, drain).await.is_err() {
            self.broken = Some(format!("no end within {limit:?}"));
        }
    }

    fn succeeded(&self) -> bool {
        self.outcome == Some(proto::TurnOutcome::Success) && self.broken.is_none()
    }

    fn ended_disk_full(&self) -> bool {
        self.errors
            .iter()
            .any(|(c, m)| *c == proto::ErrorCode::Unavailable && m.contains("disk is full"))
    }
}

/// A refusal at admission for the full disk.
fn disk_full(e: &agentrt_client::Error) -> bool {
    e.code() == Some(tonic::Code::Unavailable)
        && e.status()
            .is_some_and(|s| s.message().contains("disk is full"))
}

fn request(sid: &str, text: String) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: sid.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock { text })),
        }],
        ..Default::default()
    }
}

/// A `bytes`-long user message asking the fake for a short answer.
fn big_text(key: &str, bytes: u64) -> String {
    let mut s = directive(Mode::Text, 3, key);
    while (s.len() as u64) < bytes {
        s.push_str(" padding");
    }
    s
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

fn ms(d: Duration) -> Option<f64> {
    Some(d.as_secs_f64() * 1e3)
}

/// The state the phases share.
struct Ctx<'a> {
    plan: &'a Plan,
    seed: u64,
    rng: Rng,
    /// The tmpfs root: `data/` (the server's) and `filler` beside it.
    mnt: PathBuf,
    sids: Vec<String>,
    /// Per session: every `message_stored` (seq, id) a client received.
    acks: Vec<Vec<(u64, String)>>,
    keys: u64,
    fig: Figures,
}

impl Ctx<'_> {
    fn violate(&mut self, phase: &str, what: impl Into<String>) {
        let what = what.into();
        self.fig
            .violations
            .push(format!("[disk seed {} {phase}] {what}", self.seed));
    }

    fn failed(&self) -> bool {
        !self.fig.violations.is_empty()
    }

    /// A key no other user message has (the mirror checks each is stored
    /// once).
    fn key(&mut self, i: usize, phase: &str) -> String {
        self.keys += 1;
        format!("{phase}-{}-{}", self.sids[i], self.keys)
    }

    fn filler(&self) -> Result<Filler, String> {
        Filler::create(&self.mnt.join("filler"))
    }

    fn free(&self) -> Result<u64, String> {
        tmpfs::avail(&self.mnt)
    }

    fn record(&mut self, i: usize, turn: &Turn) {
        self.acks[i].extend(turn.acks.iter().map(|(s, id, _)| (*s, id.clone())));
        self.fig.acked += turn.acks.len() as u64;
        self.fig.turns_ok += u64::from(turn.succeeded());
    }

    /// One turn on session `i`: the admission error, or what the stream
    /// showed (its acknowledgements recorded).
    async fn turn(&mut self, c: &Client, i: usize, text: String) -> Result<Turn, String> {
        let mut stream = c
            .chat_with(request(&self.sids[i], text))
            .await
            .map_err(|e| e.to_string())?;
        let mut turn = Turn::default();
        turn.finish(&mut stream, self.plan.turn_limit).await;
        self.record(i, &turn);
        Ok(turn)
    }

    /// A short turn on every session must succeed.
    async fn every_session_turns(&mut self, c: &Client, phase: &str) {
        for i in 0..self.sids.len() {
            let key = self.key(i, phase);
            let text = directive(Mode::Text, self.rng.range(2, 20) as u32, &key);
            let sid = self.sids[i].clone();
            match self.turn(c, i, text).await {
                Ok(t) if t.succeeded() => {}
                Ok(t) => self.violate(
                    phase,
                    format!("{sid}: a turn after the space returned ended {t:?}"),
                ),
                Err(e) => self.violate(
                    phase,
                    format!("{sid}: a turn after the space returned was refused: {e}"),
                ),
            }
        }
    }

    /// Every session's message ids.
    async fn histories(&self, c: &Client) -> Result<Vec<Vec<String>>, String> {
        let mut out = Vec::new();
        for sid in &self.sids {
            let h = c
                .history(sid)
                .await
                .map_err(|e| format!("{sid}: GetHistory: {e}"))?;
            out.push(h.into_iter().map(|m| m.id).collect());
        }
        Ok(out)
    }

    /// No session's last turn is still running.
    async fn none_busy(&mut self, c: &Client, phase: &str) {
        for i in 0..self.sids.len() {
            let sid = self.sids[i].clone();
            if let Err(e) = settled(c, &sid, Duration::from_secs(2)).await {
                self.violate(phase, e);
            }
        }
    }

    /// Waits for `service` to report `want`; `None` (and a violation) when
    /// it did not within the bound.
    async fn wait_health(
        &mut self,
        health: &Health,
        phase: &str,
        service: &str,
        want: Serving,
        why: &str,
    ) -> Option<Duration> {
        match health.wait(service, want, self.plan.health_limit).await {
            Ok(d) => Some(d),
            Err(e) => {
                self.violate(phase, format!("{why}: {e}"));
                None
            }
        }
    }

    /// `service` reports `want` now.
    async fn expect_health(&mut self, health: &Health, phase: &str, service: &str, want: Serving) {
        match health.check(service).await {
            Ok(s) if s == want => {}
            Ok(s) => self.violate(phase, format!("health {service:?} is {s:?}, want {want:?}")),
            Err(e) => self.violate(phase, e),
        }
    }
}

/// Phase 1: refused at admission below the reserve, back without a restart.
async fn watermark(ctx: &mut Ctx<'_>, c: &Client, health: &Health) -> Result<(), String> {
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
        "{} free, under the {} MiB reserve",
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
        Err(e) if disk_full(&e) => ctx.fig.refused_create += 1,
        Err(e) => ctx.violate(
            PHASE,
            format!("CreateSession at {why}: refused with {e}, not UNAVAILABLE \"disk is full\""),
        ),
        Ok(_) => ctx.violate(PHASE, format!("CreateSession {fresh} admitted at {why}")),
    }
    match c.get_session(&fresh).await {
        Err(agentrt_client::Error::NotFound { .. }) => {}
        Ok(_) => ctx.violate(PHASE, format!("the refused CreateSession stored {fresh}")),
        Err(e) => return Err(format!("GetSession {fresh}: {e}")),
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
    ctx.none_busy(c, PHASE).await;
    drop(filler);
    let freed = Instant::now();
    let up = ctx
        .wait_health(
            health,
            PHASE,
            "readiness",
            Serving::Serving,
            "filler removed",
        )
        .await;
    ctx.fig.watermark_up_ms = up.and(ms(freed.elapsed()));
    ctx.every_session_turns(c, PHASE).await;
    Ok(())
}

/// Phase 2: answers that arrive once the disk is below a quarter of the
/// reserve end the turn ERROR, with nothing half-stored.
async fn mid_turn(
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
    // The server polls the disk once a second: one period and a half more
    // and it has measured the disk as filled, not half-way there.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
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
    ctx.none_busy(c, PHASE).await;
    drop(filler);
    let freed = Instant::now();
    let up = ctx
        .wait_health(
            health,
            PHASE,
            "readiness",
            Serving::Serving,
            "filler removed",
        )
        .await;
    ctx.fig.mid_up_ms = up.and(ms(freed.elapsed()));
    ctx.every_session_turns(c, PHASE).await;
    Ok(())
}

/// Counts of phase 3's turn loops.
#[derive(Debug, Default)]
struct Hard {
    filled: AtomicBool,
    stop: AtomicBool,
    ok_before: AtomicU64,
    ok_after: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

/// Small turns back to back on one session until `stop`; what was
/// acknowledged, and what went wrong that should not have.
async fn hard_loop(
    c: Client,
    sid: String,
    mut rng: Rng,
    hard: Arc<Hard>,
    limit: Duration,
) -> (Vec<(u64, String)>, Vec<String>) {
    let (mut acks, mut problems) = (Vec::new(), Vec::new());
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
                if t.broken.as_deref().is_some_and(|b| b.starts_with("no end")) {
                    problems.push(format!("{sid}: turn {} hung: {t:?}", t.turn_id));
                    break;
                }
            }
        }
    }
    (acks, problems)
}

/// Phase 3: the disk full to the last page under running turns; returns
/// the filler (removed only once the server is dead).
async fn hard_full(ctx: &mut Ctx<'_>, server: &Server) -> Result<Filler, String> {
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
    let keep = Arc::new(AtomicBool::new(false));
    let keeper = filler.keep_full(Arc::clone(&keep))?;
    let why = format!(
        "the disk full ({} free) under turns, --store-min-free-mb 0",
        mib(ctx.free()?)
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
        let (i, (acks, problems)) = joined.map_err(|e| format!("hard-full loop: {e}"))?;
        ctx.fig.acked += acks.len() as u64;
        ctx.acks[i].extend(acks);
        for p in problems {
            ctx.violate(PHASE, p);
        }
    }
    keep.store(true, Ordering::SeqCst);
    keeper
        .await
        .map_err(|e| format!("the filler's keeper: {e}"))?;
    let f = &mut ctx.fig;
    f.hard_ok_before = hard.ok_before.load(Ordering::SeqCst);
    f.hard_ok_after = hard.ok_after.load(Ordering::SeqCst);
    f.hard_refused = hard.refused.load(Ordering::SeqCst);
    f.hard_failed = hard.failed.load(Ordering::SeqCst);
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

/// After the last restart: every acknowledged message in history exactly
/// once at its seq, seqs contiguous, no session busy, every session takes
/// a turn.
async fn final_check(ctx: &mut Ctx<'_>, c: &Client) -> Result<(), String> {
    const PHASE: &str = "after the restart";
    ctx.none_busy(c, PHASE).await;
    for i in 0..ctx.sids.len() {
        let sid = ctx.sids[i].clone();
        let history = c
            .history(&sid)
            .await
            .map_err(|e| format!("{sid}: GetHistory: {e}"))?;
        let (mut mirror, mut v) = (Mirror::default(), Vec::new());
        mirror.extend(&sid, history, &mut v);
        for (seq, id) in &ctx.acks[i] {
            let found = usize::try_from(*seq)
                .ok()
                .and_then(|s| mirror.ids.get(s.wrapping_sub(1)));
            if found != Some(id) {
                v.push(format!(
                    "{sid}: acknowledged message {id} at seq {seq}: history has {found:?} there"
                ));
            }
        }
        ctx.fig.acks_checked += ctx.acks[i].len() as u64;
        ctx.fig.messages += mirror.ids.len() as u64;
        for e in v {
            ctx.violate(PHASE, e);
        }
    }
    ctx.every_session_turns(c, PHASE).await;
    Ok(())
}

/// Runs the battery in `dir` (config, log; the tmpfs is mounted on
/// `dir/mnt`).
pub(crate) async fn run(
    binary: &Path,
    fake: &Fake,
    dir: &Path,
    plan: &Plan,
    seed: u64,
) -> Result<Figures, String> {
    let start = Instant::now();
    let mnt = Tmpfs::mount(&dir.join("mnt"), plan.size_mb)?;
    let spec = |min_free: u64| Spec {
        binary: binary.to_owned(),
        dir: dir.to_owned(),
        // No compaction: a summary would be one more write under a full
        // disk, beside the ones each phase is about.
        config: server::config(
            &fake.base_url(),
            None,
            "\n[compaction]\nmax_tokens = 1000000000\n",
        ),
        env: Vec::new(),
        data_dir: Some(mnt.path().join("data")),
        args: vec!["--store-min-free-mb".into(), min_free.to_string()],
    };
    let mut ctx = Ctx {
        plan,
        seed,
        rng: Rng::new(seed).fork(0xd15c),
        mnt: mnt.path().to_owned(),
        sids: (0..plan.sessions).map(|i| format!("disk-{i}")).collect(),
        acks: vec![Vec::new(); plan.sessions],
        keys: 0,
        fig: Figures::default(),
    };
    let server = Server::start(&spec(plan.min_free_mb)).await?;
    {
        let c = server::clients(server.url(), 1).await?.remove(0);
        let health = Health::connect(server.url()).await?;
        watermark(&mut ctx, &c, &health).await?;
        if !ctx.failed() {
            mid_turn(&mut ctx, &c, &health, fake).await?;
        }
    }
    server.kill9().await?;
    let mut filler = None;
    if !ctx.failed() {
        let server = Server::start(&spec(0)).await?;
        filler = Some(hard_full(&mut ctx, &server).await?);
        server.kill9().await?;
    }
    drop(filler);
    // Whatever failed before, what was acknowledged must have survived.
    let server = Server::start(&spec(plan.min_free_mb)).await?;
    ctx.fig.restart_ms = ms(server.ready_after);
    let c = server::clients(server.url(), 1).await?.remove(0);
    final_check(&mut ctx, &c).await?;
    server.kill9().await?;
    drop(mnt);
    ctx.fig.wall = start.elapsed();
    Ok(ctx.fig)
}
