//! S9 context load: how long a turn's context takes to read from sled for a
//! short session and for a long one, before and after compaction. The turn
//! reads the latest summary plus the uncompacted tail
//! (`agentrt_runtime::runtime::load_context`), so a compacted 50,000-message
//! session should cost about what a 50-message one does.
//!
//! Runs in process on the real `SledStore` (no server): sessions are filled
//! with `SledStore::import_messages` (one flush) so a 50,000-message history
//! takes seconds, not a flushed write per message.

use std::time::Instant;

use agentrt_runtime::runtime::load_context;
use agentrt_runtime::store::{CreateOutcome, SledStore, Store};
use agentrt_runtime::types::{ContentBlock, NewMessage, NewSession, Role};
use serde::Serialize;

use crate::markdown::{num, table};

/// Messages kept after the summary in the compacted case.
const TAIL: u64 = 50;

/// One session size.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ContextLoad {
    pub(crate) messages: u64,
    /// Messages the context holds (uncompacted: all of them).
    pub(crate) uncompacted_context: usize,
    pub(crate) uncompacted_p50_ms: f64,
    /// After a compaction keeping the last 50: summary + 50.
    pub(crate) compacted_context: usize,
    pub(crate) compacted_p50_ms: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn time_load(store: &SledStore, id: &str, runs: usize) -> Result<(usize, f64), String> {
    let session = store
        .get_session(id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("session vanished")?;
    let mut times = Vec::with_capacity(runs);
    let mut len = 0;
    for _ in 0..runs {
        let start = Instant::now();
        let context = load_context(store, &session)
            .await
            .map_err(|e| e.to_string())?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
        len = context.len();
    }
    Ok((len, median(times)))
}

/// Measures each size in `sizes` (messages, alternating user/assistant
/// turns of ~200 bytes each).
pub(crate) async fn s9(dir: &std::path::Path, sizes: &[u64]) -> Result<Vec<ContextLoad>, String> {
    let store = SledStore::open(dir.join("s9-db")).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for &n in sizes {
        let created = store
            .create_session(NewSession {
                owner: "bench".into(),
                ..NewSession::default()
            })
            .await
            .map_err(|e| e.to_string())?;
        let CreateOutcome::Created(session) = created else {
            return Err("session id collision".into());
        };
        let messages = (0..n)
            .map(|i| {
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                let text = format!("message {i}: {}", "lorem ipsum ".repeat(16));
                NewMessage::new("bench", role, vec![ContentBlock::text(text)])
            })
            .collect();
        store
            .import_messages(&session.id, messages)
            .await
            .map_err(|e| e.to_string())?;
        let runs = if n > 10_000 { 5 } else { 50 };
        let (uncompacted_context, uncompacted_p50_ms) =
            time_load(&store, &session.id, runs).await?;
        let through = n.saturating_sub(TAIL);
        let (compacted_context, compacted_p50_ms) = if through > 0 {
            let summary = NewMessage::new(
                "bench",
                Role::Summary,
                vec![ContentBlock::text("a summary of the conversation so far")],
            );
            store
                .store_compaction(&session.id, &session.incarnation, summary, through)
                .await
                .map_err(|e| e.to_string())?;
            time_load(&store, &session.id, 50).await?
        } else {
            (uncompacted_context, uncompacted_p50_ms)
        };
        out.push(ContextLoad {
            messages: n,
            uncompacted_context,
            uncompacted_p50_ms,
            compacted_context,
            compacted_p50_ms,
        });
    }
    Ok(out)
}

/// The S9 section of the report.
pub(crate) fn markdown(rows: &[ContextLoad]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.messages.to_string(),
                format!(
                    "{} ms ({} messages)",
                    num(r.uncompacted_p50_ms),
                    r.uncompacted_context
                ),
                format!(
                    "{} ms ({} messages)",
                    num(r.compacted_p50_ms),
                    r.compacted_context
                ),
            ]
        })
        .collect();
    let body = table(
        &[
            "messages stored",
            "context load p50, uncompacted",
            "context load p50, compacted (summary + 50)",
        ],
        &rows,
    );
    format!("\n## S9 context load (sled, in process)\n\n{body}")
}
