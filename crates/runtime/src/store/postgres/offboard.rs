//! Offboarding (`DeleteSessions`): an agent's sessions across owners, page
//! by page, and what the store keeps of an owner beyond their sessions.

use super::PostgresStore;
use super::codec::{self, session_cols};
use crate::store::{AgentSessions, StoreError};

impl PostgresStore {
    /// Up to `limit` sessions of `agent_id`, in id order after `after`
    /// (the primary key's order: no index on `agent_id` is needed for an
    /// operator's call).
    pub(super) async fn of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AgentSessions, StoreError> {
        let mut page = AgentSessions::default();
        if limit == 0 {
            return Ok(page);
        }
        let client = self.client().await?;
        // One more than the page holds, to learn whether another follows.
        let want = codec::big(limit as u64 + 1)?;
        let sql = concat!(
            "SELECT ",
            session_cols!(),
            " FROM sessions WHERE agent_id = $1 AND ($2::text IS NULL OR id > $2) \
             ORDER BY id LIMIT $3"
        );
        let rows = codec::rows(&client, sql, &[&agent_id, &after, &want]).await?;
        for row in rows {
            if page.sessions.len() == limit {
                page.next = page.sessions.last().map(|s| s.id.clone());
                break;
            }
            page.sessions.push(codec::session(&row)?);
        }
        Ok(page)
    }

    /// The owner's rows of the quota tables: the minutes' turn counts and
    /// the daily spending (their sessions, with their stored bytes, are
    /// deleted already).
    pub(super) async fn forget(&self, owner: &str) -> Result<(), StoreError> {
        let client = self.client().await?;
        codec::execute(
            &client,
            "DELETE FROM turn_minutes WHERE owner = $1",
            &[&owner],
        )
        .await?;
        codec::execute(
            &client,
            "DELETE FROM daily_spent WHERE owner = $1",
            &[&owner],
        )
        .await?;
        Ok(())
    }
}
