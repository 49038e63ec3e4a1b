//! Same-session admission races: each round, `N` connections send `Chat`
//! on the same idle session at the same instant (released together by a
//! barrier). Exactly one must be admitted, every other must be refused
//! `ABORTED` / `SESSION_BUSY` naming the admitted turn, and nothing but the
//! admitted turn's messages may be stored (checked per round through the
//! session's message count, and at the end through every history).
//!
//! The admitted turn calls a caller-executed tool and waits for its result,
//! which is sent only once every racer has its answer: the session stays
//! busy for the whole round, so a racer the scheduler happened to delay
//! cannot find it idle again (that would be a second, legitimate turn).
//!
//! Rounds rotate over a set of sessions (so no history grows into a
//! compaction) and run in a few lanes at once, each lane on its own
//! sessions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentrt_client::{ChatEvent, Client, Error, proto};
use futures::StreamExt as _;
use tokio::sync::Barrier;

use crate::fake::{Mode, directive};
use crate::server::{self, Server};

/// How many rounds and how wide.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) rounds: usize,
    /// Connections racing each round.
    pub(crate) racers: usize,
    /// Rounds run at once, each on its own sessions.
    pub(crate) lanes: usize,
    /// Sessions per lane (rounds rotate over them).
    pub(crate) sessions_per_lane: usize,
}

/// What the races measured.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub(crate) rounds: usize,
    pub(crate) racers: usize,
    pub(crate) admitted: u64,
    pub(crate) busy: u64,
    pub(crate) messages_checked: u64,
    pub(crate) wall: Duration,
    pub(crate) violations: Vec<String>,
}

enum Answer {
    Admitted(agentrt_client::EventStream),
    Busy(String),
    Other(String),
}

fn request(sid: &str, key: &str) -> proto::ChatRequest {
    proto::ChatRequest {
        session_id: sid.to_owned(),
        content: vec![proto::ContentBlock {
            block: Some(proto::content_block::Block::Text(proto::TextBlock {
                text: directive(Mode::CallerTool, 0, key),
            })),
        }],
        extra_tools: vec![proto::ToolDefinition {
            name: "lookup".into(),
            description: "Looks a key up (the caller runs it)".into(),
            parameters_json_schema: r#"{"type":"object"}"#.into(),
        }],
        ..Default::default()
    }
}

/// One round on `sid`; returns the messages the admitted turn stored.
async fn round(
    clients: &[Client],
    sid: &str,
    round: usize,
    fig: &mut Figures,
) -> Result<u64, String> {
    let barrier = Arc::new(Barrier::new(clients.len()));
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in clients.iter().enumerate() {
        let (c, barrier, req) = (
            c.clone(),
            Arc::clone(&barrier),
            request(sid, &format!("r{round}-c{i}")),
        );
        set.spawn(async move {
            barrier.wait().await;
            match c.chat_with(req).await {
                Ok(s) => Answer::Admitted(s),
                Err(Error::Busy { turn_id, .. }) => Answer::Busy(turn_id),
                Err(e) => Answer::Other(e.to_string()),
            }
        });
    }
    let mut admitted = Vec::new();
    let mut busy = Vec::new();
    let mut other = Vec::new();
    while let Some(joined) = set.join_next().await {
        match joined.map_err(|e| format!("racer task: {e}"))? {
            Answer::Admitted(s) => admitted.push(s),
            Answer::Busy(t) => busy.push(t),
            Answer::Other(e) => other.push(e),
        }
    }
    fig.admitted += admitted.len() as u64;
    fig.busy += busy.len() as u64;
    if admitted.len() != 1 || !other.is_empty() {
        return Err(format!(
            "{sid} round {round}: {} admitted, {} SESSION_BUSY, other answers {other:?} (want exactly 1 admitted of {})",
            admitted.len(),
            busy.len(),
            clients.len()
        ));
    }
    let mut stream = admitted.remove(0);
    let (mut turn_id, mut stored, mut outcome) = (String::new(), 0u64, None);
    while let Some(item) = stream.next().await {
        let event = item.map_err(|e| format!("{sid} round {round}: stream: {e}"))?;
        turn_id.clone_from(&event.turn_id);
        match event.kind {
            ChatEvent::MessageStored { .. } => stored += 1,
            ChatEvent::ToolCall { call_id, .. } => clients[0]
                .submit_tool_result(sid, &event.turn_id, &call_id, "found", false)
                .await
                .map_err(|e| format!("{sid} round {round}: SubmitToolResult: {e}"))?,
            ChatEvent::TurnFinished { outcome: o, .. } => outcome = Some(o),
            _ => {}
        }
    }
    if outcome != Some(proto::TurnOutcome::Success) {
        return Err(format!(
            "{sid} round {round}: the admitted turn ended {outcome:?}"
        ));
    }
    if let Some(t) = busy.iter().find(|t| !t.is_empty() && **t != turn_id) {
        return Err(format!(
            "{sid} round {round}: SESSION_BUSY named turn {t}, the admitted one is {turn_id}"
        ));
    }
    Ok(stored)
}

/// Runs the races against `server`.
pub(crate) async fn run(server: &Server, plan: &Plan, seed: u64) -> Result<Figures, String> {
    let start = Instant::now();
    let clients = server::clients(server.url(), plan.racers).await?;
    let admin = clients[0].clone();
    let lanes = plan.lanes.max(1);
    let mut sessions: Vec<Vec<String>> = Vec::new();
    for lane in 0..lanes {
        let mut ids = Vec::new();
        for k in 0..plan.sessions_per_lane.max(1) {
            let sid = format!("race-{seed}-{lane}-{k}");
            admin
                .create_session(proto::CreateSessionRequest {
                    session_id: sid.clone(),
                    ..Default::default()
                })
                .await
                .map_err(|e| format!("create {sid}: {e}"))?;
            ids.push(sid);
        }
        sessions.push(ids);
    }
    let per_lane = plan.rounds.div_ceil(lanes);
    let mut set = tokio::task::JoinSet::new();
    for (lane, ids) in sessions.iter().cloned().enumerate() {
        let clients = clients.clone();
        let total = plan.rounds;
        set.spawn(async move {
            let mut fig = Figures::default();
            let mut counts = vec![0u64; ids.len()];
            for k in 0..per_lane {
                let r = lane * per_lane + k;
                if r >= total {
                    break;
                }
                let slot = k % ids.len();
                let sid = &ids[slot];
                let stored = match round(&clients, sid, r, &mut fig).await {
                    Ok(n) => n,
                    Err(e) => {
                        fig.violations.push(e);
                        break;
                    }
                };
                counts[slot] += stored;
                let count = clients[0]
                    .get_session(sid)
                    .await
                    .map(|s| s.message_count)
                    .unwrap_or(u64::MAX);
                fig.messages_checked += stored;
                fig.rounds += 1;
                if count != counts[slot] {
                    fig.violations.push(format!(
                        "{sid} round {r}: {count} messages stored, {} expected (only the admitted turn's)",
                        counts[slot]
                    ));
                    break;
                }
            }
            (fig, ids, counts)
        });
    }
    let mut fig = Figures {
        racers: plan.racers,
        ..Figures::default()
    };
    while let Some(joined) = set.join_next().await {
        let (f, ids, counts) = joined.map_err(|e| format!("race lane: {e}"))?;
        fig.rounds += f.rounds;
        fig.admitted += f.admitted;
        fig.busy += f.busy;
        fig.messages_checked += f.messages_checked;
        fig.violations.extend(f.violations);
        for (sid, want) in ids.iter().zip(counts) {
            let history = admin
                .history(sid)
                .await
                .map_err(|e| format!("{sid}: GetHistory: {e}"))?;
            let users = history
                .iter()
                .filter(|m| m.role() == proto::Role::User)
                .count() as u64;
            // Each turn: user, assistant (tool call), tool result, answer.
            if history.len() as u64 != want || users * 4 != want {
                fig.violations.push(format!(
                    "{sid}: history has {} messages ({users} from users), {want} expected",
                    history.len()
                ));
            }
        }
    }
    fig.violations = fig
        .violations
        .into_iter()
        .map(|v| format!("[races seed {seed}] {v}"))
        .collect();
    fig.wall = start.elapsed();
    Ok(fig)
}
