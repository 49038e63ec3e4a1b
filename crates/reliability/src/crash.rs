//! The crash battery: `kill -9` of the server at seeded points of progress
//! while 16 sessions stream turns with tools, then a restart on the same
//! data (sled directory or PostgreSQL database) and the checks:
//!
//! - every acknowledged message (a `message_stored` event a client
//!   received) is in `GetHistory` at its seq with its id, exactly once;
//! - each session's seqs are contiguous from 1, ids unique, every user
//!   message stored once, every tool call answered exactly once (recovery
//!   answers the calls a crash left open);
//! - no session is wedged: its last turn is no longer running once the
//!   store has recovered it (sled: at start-up; PostgreSQL: when the dead
//!   replica's lease expires), and a new turn is admitted on every session.
//!
//! Kill points are counted in events received by the clients (after `N`
//! events, `N` drawn from the cycle's seeded generator), never in time, so
//! a failing cycle replays from the seed printed with the violation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, proto};
use futures::StreamExt as _;
use tokio::sync::watch;

use crate::fake::{Mode, directive};
use crate::mirror::Mirror;
use crate::rng::Rng;
use crate::server::{self, Server, Spec};

/// How many cycles and how hard.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) cycles: usize,
    pub(crate) sessions: usize,
    /// Connections the sessions share.
    pub(crate) connections: usize,
    /// The kill comes after 1..=this many events.
    pub(crate) max_kill_events: u64,
    /// Re-read every session's whole history every this many cycles (and
    /// after the last).
    pub(crate) full_check_every: usize,
    /// Longest a session may stay busy after a restart (the PostgreSQL
    /// lease of the dead process must expire first).
    pub(crate) settle: Duration,
    /// Turns may call the MCP test server's `test__slow`.
    pub(crate) server_tools: bool,
    /// A fresh turn ending other than SUCCESS before the kill is a
    /// violation (sled). With PostgreSQL it is counted only: a replica
    /// whose lease renewals stall for the whole (1 s) TTL on a loaded
    /// machine fences itself and ends its turns ERROR, as designed.
    pub(crate) strict_outcomes: bool,
}

/// What a crash run measured.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) store: String,
    pub(crate) cycles: usize,
    pub(crate) kill_events: Vec<u64>,
    pub(crate) turns_started: u64,
    pub(crate) turns_finished: u64,
    pub(crate) caller_tool_results: u64,
    pub(crate) retried: u64,
    pub(crate) failed_turns: u64,
    pub(crate) acks_checked: u64,
    pub(crate) interrupted: u64,
    pub(crate) messages: u64,
    pub(crate) restart_ms: Vec<f64>,
    pub(crate) settle_ms: Vec<f64>,
    pub(crate) wall: Duration,
    pub(crate) violations: Vec<String>,
}

/// What one session's loop saw during a cycle.
#[derive(Debug, Default)]
struct Log {
    acks: Vec<(u64, String)>,
    /// Started (turn_started seen), not finished.
    open_turn: Option<String>,
    /// The request of the turn in flight (sent, not finished): the next
    /// cycle sends it again, with the same `request_id`.
    pending: Option<proto::ChatRequest>,
    /// Requests sent again after a restart (idempotent retries).
    retried: u64,
    /// Fresh turns that ended other than SUCCESS before the kill.
    failed_turns: u64,
    started: u64,
    finished: u64,
    tool_results: u64,
    /// A failure seen before the kill.
    failure: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Every page of a session's history after `after_seq`.
async fn history_after(
    c: &Client,
    sid: &str,
    after_seq: u64,
) -> Result<Vec<proto::Message>, String> {
    let mut out = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = c
            .history_page(proto::GetHistoryRequest {
                session_id: sid.to_owned(),
                after_seq: if page_token.is_empty() { after_seq } else { 0 },
                page_size: 1_000,
                include_compacted: true,
                page_token: std::mem::take(&mut page_token),
            })
            .await
            .map_err(|e| format!("{sid}: GetHistory: {e}"))?;
        out.extend(page.messages);
        if page.next_page_token.is_empty() {
            return Ok(out);
        }
        page_token = page.next_page_token;
    }
}

/// Shared by one cycle's session loops.
struct Cycle {
    progress: watch::Sender<u64>,
    killing: AtomicBool,
    settle: Duration,
    server_tools: bool,
    strict_outcomes: bool,
    cycle: usize,
}

fn lookup_tool() -> proto::ToolDefinition {
    proto::ToolDefinition {
        name: "lookup".into(),
        description: "Looks a key up (the caller runs it)".into(),
        parameters_json_schema:
            r#"{"type":"object","properties":{"key":{"type":"string"}},"required":["key"]}"#.into(),
    }
}

/// Runs turns back to back on one session until the server dies. The
/// first is `retry` when the previous cycle left a request unfinished: the
/// same request with the same `request_id`, which must not run a second
/// time (the mirror's checks find a second user message).
async fn session_loop(
    cy: Arc<Cycle>,
    client: Client,
    sid: String,
    mut rng: Rng,
    log: Arc<Mutex<Log>>,
    mut retry: Option<proto::ChatRequest>,
) {
    let mut first = true;
    for n in 0.. {
        let retrying = retry.is_some();
        let pick = rng.range(0, 9);
        let (mode, tokens) = match pick {
            0..=4 => (Mode::Text, rng.range(3, 30)),
            5..=7 => (Mode::CallerTool, 0),
            _ if cy.server_tools => (Mode::ServerTool, rng.range(1, 30)),
            _ => (Mode::Text, rng.range(3, 30)),
        };
        let key = format!("c{}-{sid}-n{n}", cy.cycle);
        let req = retry.take().unwrap_or_else(|| proto::ChatRequest {
            session_id: sid.clone(),
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: directive(mode, tokens as u32, &key),
                })),
            }],
            extra_tools: if mode == Mode::CallerTool {
                vec![lookup_tool()]
            } else {
                Vec::new()
            },
            request_id: key.clone(),
            ..Default::default()
        });
        {
            let mut l = lock(&log);
            l.pending = Some(req.clone());
            l.retried += u64::from(retrying);
        }
        let admitted_by = Instant::now() + if first { cy.settle } else { Duration::ZERO };
        let stream = loop {
            match client.chat_with(req.clone()).await {
                Ok(s) => break Ok(s),
                // PostgreSQL: the dead replica's lease holds the session
                // until it expires.
                Err(e) if e.is_busy() && Instant::now() < admitted_by => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => break Err(e),
            }
        };
        first = false;
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                if !cy.killing.load(Ordering::SeqCst) {
                    let why = if e.is_busy() {
                        format!(
                            "{sid}: wedged: a new turn still refused after {:?}: {e}",
                            cy.settle
                        )
                    } else {
                        format!("{sid}: Chat refused before the kill: {e}")
                    };
                    lock(&log).failure.get_or_insert(why);
                }
                return;
            }
        };
        let mut finished = false;
        while let Some(item) = stream.next().await {
            let Ok(event) = item else { break };
            cy.progress.send_modify(|n| *n += 1);
            match event.kind {
                ChatEvent::TurnStarted(_) => {
                    let mut l = lock(&log);
                    l.open_turn = Some(event.turn_id.clone());
                    l.started += 1;
                }
                ChatEvent::MessageStored { seq, id, .. } => lock(&log).acks.push((seq, id)),
                ChatEvent::ToolCall { call_id, .. } if !retrying => {
                    match client
                        .submit_tool_result(&sid, &event.turn_id, &call_id, "found it", false)
                        .await
                    {
                        Ok(()) => lock(&log).tool_results += 1,
                        Err(e) => {
                            if !cy.killing.load(Ordering::SeqCst) {
                                lock(&log)
                                    .failure
                                    .get_or_insert(format!("{sid}: SubmitToolResult: {e}"));
                            }
                            return;
                        }
                    }
                }
                ChatEvent::TurnFinished { outcome, .. } => {
                    finished = true;
                    let mut l = lock(&log);
                    l.finished += 1;
                    if l.open_turn.as_deref() == Some(event.turn_id.as_str()) {
                        l.open_turn = None;
                    }
                    l.pending = None;
                    // A retry replays the first attempt's outcome (an
                    // interrupted turn ends ERROR); a fresh turn succeeds.
                    if outcome != proto::TurnOutcome::Success
                        && !retrying
                        && !cy.killing.load(Ordering::SeqCst)
                    {
                        l.failed_turns += 1;
                    }
                    if outcome != proto::TurnOutcome::Success
                        && !retrying
                        && cy.strict_outcomes
                        && !cy.killing.load(Ordering::SeqCst)
                    {
                        l.failure.get_or_insert(format!(
                            "{sid}: turn {} ended {outcome:?} before the kill",
                            event.turn_id
                        ));
                    }
                }
                _ => {}
            }
        }
        if !finished {
            if !cy.killing.load(Ordering::SeqCst) {
                lock(&log).failure.get_or_insert(format!(
                    "{sid}: stream ended without turn_finished before the kill"
                ));
            }
            return;
        }
    }
}

/// Waits until the session's last turn is no longer running — a paused
/// one is resumed by answering its calls — and returns its outcome.
pub(crate) async fn settled(
    c: &Client,
    sid: &str,
    limit: Duration,
) -> Result<proto::TurnOutcome, String> {
    let until = Instant::now() + limit;
    let mut answered = false;
    loop {
        let s = c
            .get_session(sid)
            .await
            .map_err(|e| format!("{sid}: GetSession after restart: {e}"))?;
        let outcome = s
            .last_turn
            .as_ref()
            .map_or(proto::TurnOutcome::Success, |t| t.outcome());
        if outcome == proto::TurnOutcome::Paused && !answered {
            // The turn waited for the caller when the server died: it is
            // paused, not lost; answering its calls resumes it.
            answer_pending(c, sid).await?;
            answered = true;
        } else if outcome != proto::TurnOutcome::Running
            && outcome != proto::TurnOutcome::Paused
            && outcome != proto::TurnOutcome::Unspecified
        {
            return Ok(outcome);
        }
        if Instant::now() >= until {
            return Err(format!(
                "{sid}: wedged: its last turn is still {outcome:?} {limit:?} after the restart (not recovered)"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Answers the calls a paused turn of `sid` waits for, as its caller
/// would: "found it" for a caller tool, an approval for a server tool.
async fn answer_pending(c: &Client, sid: &str) -> Result<(), String> {
    let status = c
        .session_status(sid)
        .await
        .map_err(|e| format!("{sid}: GetSessionStatus of a paused turn: {e}"))?;
    for call in &status.pending_calls {
        let answered = match call.wait() {
            proto::PendingCallWait::Approval => {
                c.submit_tool_approval(sid, &call.call_id, true, "").await
            }
            proto::PendingCallWait::Result | proto::PendingCallWait::Unspecified => {
                c.submit_tool_result(
                    sid,
                    &status.paused_turn_id,
                    &call.call_id,
                    "found it",
                    false,
                )
                .await
            }
        };
        answered
            .map_err(|e| format!("{sid}: resuming paused turn {}: {e}", status.paused_turn_id))?;
    }
    Ok(())
}

/// Runs the crash cycles against a server started from `spec`.
pub(crate) async fn run(
    spec: &Spec,
    plan: &Plan,
    seed: u64,
    store: &str,
) -> Result<Figures, String> {
    let start = Instant::now();
    let root = Rng::new(seed);
    let mut fig = Figures {
        store: store.to_owned(),
        ..Figures::default()
    };
    let sids: Vec<String> = (0..plan.sessions).map(|i| format!("crash-{i}")).collect();
    let mut mirrors: Vec<Mirror> = (0..plan.sessions).map(|_| Mirror::default()).collect();
    let mut pending: Vec<Option<proto::ChatRequest>> = Vec::new();
    let mut server = Server::start(spec).await?;
    fig.restart_ms.push(server.ready_after.as_secs_f64() * 1e3);
    {
        let c = server::clients(server.url(), 1).await?.remove(0);
        for sid in &sids {
            c.create_session(proto::CreateSessionRequest {
                session_id: sid.clone(),
                ..Default::default()
            })
            .await
            .map_err(|e| format!("create {sid}: {e}"))?;
        }
    }
    for cycle in 0..plan.cycles {
        let mut rng = root.fork(cycle as u64);
        let target = rng.range(1, plan.max_kill_events);
        fig.kill_events.push(target);
        let cy = Arc::new(Cycle {
            progress: watch::Sender::new(0),
            killing: AtomicBool::new(false),
            settle: plan.settle,
            server_tools: plan.server_tools,
            strict_outcomes: plan.strict_outcomes,
            cycle,
        });
        let clients = server::clients(server.url(), plan.connections).await?;
        let logs: Vec<Arc<Mutex<Log>>> = (0..plan.sessions).map(|_| Arc::default()).collect();
        let retries = std::mem::take(&mut pending);
        let mut loops = tokio::task::JoinSet::new();
        for (i, sid) in sids.iter().enumerate() {
            loops.spawn(session_loop(
                Arc::clone(&cy),
                clients[i % clients.len()].clone(),
                sid.clone(),
                rng.fork(i as u64),
                Arc::clone(&logs[i]),
                retries.get(i).cloned().flatten(),
            ));
        }
        let mut progress = cy.progress.subscribe();
        // (The watch's borrow is dropped at once: the loops keep writing.)
        let reached = tokio::time::timeout(
            plan.settle + Duration::from_secs(30),
            progress.wait_for(|n| *n >= target),
        )
        .await
        .map(|r| r.is_ok());
        let stalled = reached != Ok(true);
        let seen = *cy.progress.borrow();
        cy.killing.store(true, Ordering::SeqCst);
        server.kill9().await?;
        let drain = async { while loops.join_next().await.is_some() {} };
        if tokio::time::timeout(Duration::from_secs(10), drain)
            .await
            .is_err()
        {
            loops.abort_all();
        }
        drop(clients);
        let mut v = Vec::new();
        if stalled {
            v.push(format!(
                "no progress: {seen} of {target} events before the time limit"
            ));
        }
        pending = logs.iter().map(|l| lock(l).pending.clone()).collect();
        for l in &logs {
            let l = lock(l);
            fig.turns_started += l.started;
            fig.turns_finished += l.finished;
            fig.caller_tool_results += l.tool_results;
            fig.retried += l.retried;
            fig.failed_turns += l.failed_turns;
            if let Some(f) = &l.failure {
                v.push(f.clone());
            }
        }

        server = match Server::start(spec).await {
            Ok(s) => s,
            Err(e) => {
                // A server that cannot start on the data a crash left is
                // the worst finding of all: a violation, with its log.
                v.push(format!(
                    "restart after the kill failed: {e}; log: {}",
                    server::log_tail(spec, 6)
                ));
                fig.cycles = cycle + 1;
                fig.violations.extend(v.into_iter().map(|e| {
                    format!("[{store} seed {seed} cycle {cycle} kill after {target} events] {e}")
                }));
                fig.wall = start.elapsed();
                return Ok(fig);
            }
        };
        fig.restart_ms.push(server.ready_after.as_secs_f64() * 1e3);
        let c = server::clients(server.url(), 1).await?.remove(0);
        let full = (cycle + 1) % plan.full_check_every.max(1) == 0 || cycle + 1 == plan.cycles;
        let settle_start = Instant::now();
        for (i, sid) in sids.iter().enumerate() {
            let outcome = match settled(&c, sid, plan.settle).await {
                Ok(o) => o,
                Err(e) => {
                    v.push(e);
                    continue;
                }
            };
            let (was_open, acks) = {
                let mut log = lock(&logs[i]);
                (log.open_turn.is_some(), std::mem::take(&mut log.acks))
            };
            if was_open && outcome == proto::TurnOutcome::Interrupted {
                fig.interrupted += 1;
            }
            let mirror = &mut mirrors[i];
            let after = mirror.ids.len() as u64;
            let msgs = history_after(&c, sid, after).await?;
            mirror.extend(sid, msgs, &mut v);
            if !mirror.open_calls.is_empty() {
                v.push(format!(
                    "{sid}: tool calls without a result after recovery: {:?}",
                    mirror.open_calls
                ));
            }
            for (seq, id) in &acks {
                fig.acks_checked += 1;
                let at = usize::try_from(*seq).ok().and_then(|s| s.checked_sub(1));
                match at.and_then(|a| mirror.ids.get(a)) {
                    Some(stored) if stored == id => {}
                    Some(stored) => v.push(format!(
                        "{sid}: acknowledged message seq {seq} id {id} is {stored} in GetHistory"
                    )),
                    None => v.push(format!(
                        "{sid}: acknowledged message seq {seq} id {id} is missing from GetHistory"
                    )),
                }
            }
            if full {
                let all = history_after(&c, sid, 0).await?;
                let ids: Vec<&str> = all.iter().map(|m| m.id.as_str()).collect();
                let want: Vec<&str> = mirror.ids.iter().map(String::as_str).collect();
                if ids != want {
                    v.push(format!(
                        "{sid}: the full history ({} messages) differs from what was read before ({})",
                        ids.len(),
                        want.len()
                    ));
                }
            }
        }
        fig.settle_ms
            .push(settle_start.elapsed().as_secs_f64() * 1e3);
        fig.cycles = cycle + 1;
        if !v.is_empty() {
            fig.violations.extend(v.into_iter().map(|e| {
                format!("[{store} seed {seed} cycle {cycle} kill after {target} events] {e}")
            }));
            break;
        }
    }
    fig.messages = mirrors.iter().map(|m| m.ids.len() as u64).sum();
    // The last restart must take turns too: one short turn per session.
    if fig.violations.is_empty() {
        let c = server::clients(server.url(), 1).await?.remove(0);
        for sid in &sids {
            let req = proto::ChatRequest {
                session_id: sid.clone(),
                content: vec![proto::ContentBlock {
                    block: Some(proto::content_block::Block::Text(proto::TextBlock {
                        text: directive(Mode::Text, 2, &format!("final-{sid}")),
                    })),
                }],
                ..Default::default()
            };
            let until = Instant::now() + plan.settle;
            let outcome = loop {
                match c.chat_with(req.clone()).await {
                    Ok(s) => {
                        break s
                            .finish()
                            .await
                            .map(|t| t.outcome)
                            .map_err(|e| e.to_string());
                    }
                    Err(e) if e.is_busy() && Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => break Err(e.to_string()),
                }
            };
            if !matches!(outcome, Ok(Some(proto::TurnOutcome::Success))) {
                fig.violations.push(format!(
                    "[{store} seed {seed} after the last restart] {sid}: wedged: {outcome:?}"
                ));
            }
        }
    }
    server.kill9().await?;
    fig.wall = start.elapsed();
    Ok(fig)
}
