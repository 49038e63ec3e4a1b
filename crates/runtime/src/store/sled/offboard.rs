//! Offboarding (`DeleteSessions`): an agent's sessions across owners, page
//! by page, and what the store keeps of an owner beyond their sessions —
//! the daily spending keys (`daily.rs`; an owner's `usage` count goes
//! when their last session does).

use std::ops::Bound;

use sled::Batch;

use super::{SESSIONS, SledStore, backend, blocking, daily, decode};
use crate::store::{AgentSessions, StoreError};
use crate::types::Session;

/// Records one page of [`SledStore::of_agent`] reads at most, per session
/// it may return: an agent with few sessions among many costs bounded
/// pages, never one scan of everything.
const SCAN_PER_SESSION: usize = 16;

/// Daily keys removed per batch while forgetting an owner.
const FORGET_BATCH: usize = 1024;

impl SledStore {
    /// Up to `limit` sessions of `agent_id` in id order after `after`,
    /// reading at most `limit * 16` records (see [`AgentSessions::next`]).
    pub(super) async fn of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AgentSessions, StoreError> {
        let sessions = self.sessions.clone();
        let (agent_id, after) = (agent_id.to_owned(), after.map(str::to_owned));
        blocking(move || {
            let mut page = AgentSessions::default();
            if limit == 0 {
                return Ok(page);
            }
            let start = after.map_or(Bound::Unbounded, |a| Bound::Excluded(a.into_bytes()));
            let budget = limit.saturating_mul(SCAN_PER_SESSION);
            let mut last_read = None;
            for (read, item) in sessions.range((start, Bound::Unbounded)).enumerate() {
                if read == budget || page.sessions.len() == limit {
                    // More may follow: the next page starts after the last
                    // record this one read.
                    page.next = last_read;
                    return Ok(page);
                }
                let (key, raw) = item.map_err(|e| backend("scan", e))?;
                // A corrupt record is skipped here; deleting by id still
                // removes it.
                match decode::<Session>(SESSIONS, &key, &raw) {
                    Ok(session) if session.agent_id == agent_id => page.sessions.push(session),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "skipping a corrupt session record"),
                }
                last_read = Some(String::from_utf8_lossy(&key).into_owned());
            }
            Ok(page)
        })
        .await
    }

    /// Removes `owner`'s daily spending keys (every day's) and their total
    /// of the current day in memory.
    pub(super) async fn forget(&self, owner: &str) -> Result<(), StoreError> {
        let usage = self.usage.clone();
        let owner_bytes = owner.as_bytes().to_vec();
        blocking(move || {
            let mut batch = Batch::default();
            let mut held = 0;
            for item in usage.scan_prefix(daily::PREFIX) {
                let (key, raw) = item.map_err(|e| backend("scan", e))?;
                if daily::owner_of(&raw) == owner_bytes.as_slice() {
                    batch.remove(key);
                    held += 1;
                }
                if held == FORGET_BATCH {
                    usage
                        .apply_batch(std::mem::take(&mut batch))
                        .map_err(|e| backend("write", e))?;
                    held = 0;
                }
            }
            usage.apply_batch(batch).map_err(|e| backend("write", e))
        })
        .await?;
        self.daily.forget(owner);
        self.flush_db().await
    }
}
