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
//! counts; the verdicts wait on the health service (bounded, as the server
//! polls its store once a second), never on a fixed time: the store checks
//! the free space on every write, so a refusal needs no wait at all.
//!
//! Modules: `turn` (what a client saw of one turn, the requests), `phases`
//! (1 and 2), `hard` (3); the tmpfs and the filler are [`crate::tmpfs`].

mod hard;
mod phases;
mod turn;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentrt_client::Client;

use self::turn::{Turn, request};
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
    /// What phase 3's refusals and failed turns said (a few, each once).
    pub(crate) hard_refusals: Vec<String>,
    pub(crate) hard_failures: Vec<String>,
    /// Bytes free once phase 3 filled the disk.
    pub(crate) hard_free: u64,
    pub(crate) liveness_down_ms: Option<f64>,
    pub(crate) restart_ms: Option<f64>,
    /// Acknowledgements from before the last restart, each looked for in
    /// history after it.
    pub(crate) acks_checked: u64,
    pub(crate) messages: u64,
    /// Messages in history after the restart that no client saw
    /// acknowledged: a figure, not a verdict (phases 1 and 2 check that
    /// refused work stores nothing; under phase 3's failed sled write the
    /// outcome of that write is not known to the server either).
    pub(crate) unacked: Vec<String>,
    pub(crate) wall: Duration,
    pub(crate) violations: Vec<String>,
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
    /// Every turn a client saw admitted, and what went wrong.
    turns: HashMap<String, Option<String>>,
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
        self.turns.insert(turn.turn_id.clone(), turn.told());
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

    /// The end of a phase: no session busy; the filler removed, readiness
    /// SERVING again (the time it took, `None` past the bound); then a
    /// turn on every session.
    async fn space_returns(
        &mut self,
        c: &Client,
        health: &Health,
        phase: &str,
        filler: Filler,
    ) -> Option<f64> {
        self.none_busy(c, phase).await;
        drop(filler);
        let freed = Instant::now();
        let up = self
            .wait_health(
                health,
                phase,
                "readiness",
                Serving::Serving,
                "filler removed",
            )
            .await;
        let up = up.and(ms(freed.elapsed()));
        self.every_session_turns(c, phase).await;
        up
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
        let acked: HashSet<&str> = ctx.acks[i].iter().map(|(_, id)| id.as_str()).collect();
        for m in history.iter().filter(|m| !acked.contains(m.id.as_str())) {
            let whose = match ctx.turns.get(&m.turn_id) {
                None => "a Chat refused at admission".to_owned(),
                Some(Some(told)) => format!("a turn told {told:?}"),
                Some(None) => "a turn that succeeded".to_owned(),
            };
            ctx.fig.unacked.push(format!(
                "{sid} seq {}: the {:?} message of {whose}",
                m.seq,
                m.role()
            ));
        }
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
        turns: HashMap::new(),
        fig: Figures::default(),
    };
    let server = Server::start(&spec(plan.min_free_mb)).await?;
    {
        let c = server::clients(server.url(), 1).await?.remove(0);
        let health = Health::connect(server.url()).await?;
        phases::watermark(&mut ctx, &c, &health).await?;
        if !ctx.failed() {
            phases::mid_turn(&mut ctx, &c, &health, fake).await?;
        }
    }
    server.kill9().await?;
    let mut filler = None;
    if !ctx.failed() {
        let server = Server::start(&spec(0)).await?;
        filler = Some(hard::hard_full(&mut ctx, &server).await?);
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
