//! The `inbox` table (migration 6; see `store/inbox.rs`). An enqueue locks
//! the session row, so the count it checks against the bound is the count
//! it writes to, across replicas.

use std::time::SystemTime;

use async_trait::async_trait;
use deadpool_postgres::Transaction;

use super::PostgresStore;
use super::codec;
use super::write::{self, LeaseWrite};
use crate::quota::{Quota, QuotaLimits};
use crate::store::record::{decode, encode};
use crate::store::{Inbox, StoreError};
use crate::types::{NewMessage, Queued};

/// Takes queued message `id` of the session out of the inbox inside `tx`
/// (the write that begins its turn); `NotQueued` when it is gone.
pub(super) async fn take(
    tx: &Transaction<'_>,
    session_id: &str,
    id: &str,
) -> Result<(), StoreError> {
    let sql = "DELETE FROM inbox WHERE session_id = $1 AND id = $2";
    match codec::execute(tx, sql, &[&session_id, &id]).await? {
        0 => Err(StoreError::NotQueued { id: id.to_owned() }),
        _ => Ok(()),
    }
}

fn queued(session_id: &str, raw: &[u8]) -> Result<Queued, StoreError> {
    decode(raw).map_err(|reason| StoreError::Corrupt {
        key: format!("inbox/{}", session_id.escape_debug()),
        reason,
    })
}

#[async_trait]
impl Inbox for PostgresStore {
    async fn enqueue(&self, message: Queued, max: u64) -> Result<u64, StoreError> {
        codec::check_text("a queued message's id", [message.id.as_str()])?;
        let record = encode(&message)?;
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        write::lock_as(&tx, &message.session_id, &message.incarnation).await?;
        let sql = "SELECT count(*) FROM inbox WHERE session_id = $1";
        let row = codec::row(&tx, sql, &[&message.session_id]).await?;
        let held: i64 = row.map_or(0, |row| row.get(0));
        let held = u64::try_from(held).unwrap_or(0);
        QuotaLimits::check(Quota::Inbox, Some(max), held, 1).map_err(StoreError::QuotaExceeded)?;
        let sql = "INSERT INTO inbox (session_id, id, record) VALUES ($1, $2, $3)";
        codec::execute(&tx, sql, &[&message.session_id, &message.id, &record]).await?;
        write::commit(tx).await?;
        Ok(held + 1)
    }

    async fn queued(&self, session_id: &str) -> Result<Vec<Queued>, StoreError> {
        let sql = "SELECT record FROM inbox WHERE session_id = $1 ORDER BY id";
        let rows = codec::rows(&self.client().await?, sql, &[&session_id]).await?;
        rows.iter()
            .map(|row| queued(session_id, row.get::<_, &[u8]>(0)))
            .collect()
    }

    async fn dequeue(
        &self,
        session_id: &str,
        incarnation: &str,
        id: &str,
        notice: Option<NewMessage>,
    ) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, session_id, incarnation).await?;
        match take(&tx, session_id, id).await {
            Ok(()) => {}
            Err(StoreError::NotQueued { .. }) => return Ok(false),
            Err(other) => return Err(other),
        }
        if let Some(notice) = notice {
            write::append(&tx, &mut locked.session, notice, SystemTime::now()).await?;
            self.write_session(&tx, &locked.session, LeaseWrite::Keep)
                .await?;
        }
        write::commit(tx).await?;
        Ok(true)
    }

    async fn clear(&self, session_id: &str) -> Result<u64, StoreError> {
        let sql = "DELETE FROM inbox WHERE session_id = $1";
        codec::execute(&self.client().await?, sql, &[&session_id]).await
    }

    async fn sessions_with_queued(&self, limit: usize) -> Result<Vec<String>, StoreError> {
        let limit = codec::big(u64::try_from(limit).unwrap_or(u64::MAX))?;
        let sql = "SELECT DISTINCT session_id FROM inbox ORDER BY session_id LIMIT $1";
        let rows = codec::rows(&self.client().await?, sql, &[&limit]).await?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }
}
