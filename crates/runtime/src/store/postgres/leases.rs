//! The lease upkeep of a shared database: reading a session's lease,
//! renewing this replica's, sweeping lapsed ones, start-up recovery.
//!
//! Sweeping is safe from every replica at once: candidates are read
//! without locks, then each session is interrupted in its own transaction
//! that locks the row with `SKIP LOCKED` and re-checks that the lease is
//! still lapsed — a session another sweeper (or an admission) is handling
//! is skipped, and a turn is interrupted exactly once.

use deadpool_postgres::Object;

use super::PostgresStore;
use super::codec::{self, locked_cols};
use super::write;
use crate::store::{Lease, LeaseCursor, LeaseKey, ListedLease, StoreError};
use crate::types::TurnRecord;

/// Most sessions one sweep handles (the next sweep takes the rest).
const SWEEP_BATCH: i64 = 64;

/// Running turns recovery reads per statement.
const RECOVER_BATCH: i64 = 256;

impl PostgresStore {
    pub(super) async fn live_lease(&self, session_id: &str) -> Result<Option<Lease>, StoreError> {
        let client = self.client().await?;
        let sql = "SELECT lease_replica, lease_address, lease_turn, lease_expires FROM sessions \
                   WHERE id = $1 AND lease_turn IS NOT NULL AND lease_expires > clock_timestamp()";
        codec::row(&client, sql, &[&session_id])
            .await?
            .map(|row| codec::lease(session_id, &row))
            .transpose()
    }

    pub(super) async fn live_leases(
        &self,
        session_ids: &[String],
    ) -> Result<Vec<(String, Lease)>, StoreError> {
        if session_ids.is_empty() {
            return Ok(Vec::new());
        }
        let client = self.client().await?;
        let sql = "SELECT id, lease_replica, lease_address, lease_turn, lease_expires \
                   FROM sessions WHERE id = ANY($1) AND lease_turn IS NOT NULL \
                   AND lease_expires > clock_timestamp()";
        let rows = codec::rows(&client, sql, &[&session_ids]).await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get("id").map_err(|e| StoreError::Corrupt {
                    key: "sessions/?".to_owned(),
                    reason: format!("column id: {e}"),
                })?;
                let lease = codec::lease(&id, row)?;
                Ok((id, lease))
            })
            .collect()
    }

    /// One statement: the leases after `after` in (replica, session)
    /// order, with their session's owner and their turn's record (for its
    /// start). The partial index of leased sessions bounds the scan to the
    /// sessions holding a lease.
    pub(super) async fn listed_leases(
        &self,
        after: Option<&LeaseCursor>,
        limit: usize,
    ) -> Result<Vec<ListedLease>, StoreError> {
        let client = self.client().await?;
        // Replica ids are never empty: ("", "") is before every lease.
        let (replica, session) =
            after.map_or(("", ""), |c| (c.replica_id.as_str(), c.session_id.as_str()));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let sql = "SELECT s.id, s.owner, s.lease_replica, s.lease_address, s.lease_turn, \
                   s.lease_expires, t.turn_id, t.record \
                   FROM sessions s LEFT JOIN turns t \
                   ON t.session_id = s.id AND t.turn_id = s.lease_turn \
                   WHERE s.lease_turn IS NOT NULL \
                   AND (s.lease_replica COLLATE \"C\", s.id) > ($1, $2) \
                   ORDER BY s.lease_replica COLLATE \"C\", s.id LIMIT $3";
        let rows = codec::rows(&client, sql, &[&replica, &session, &limit]).await?;
        rows.iter()
            .map(|row| {
                let corrupt = |e: tokio_postgres::Error| StoreError::Corrupt {
                    key: "sessions/?".to_owned(),
                    reason: e.to_string(),
                };
                let session_id: String = row.try_get("id").map_err(corrupt)?;
                let owner: String = row.try_get("owner").map_err(corrupt)?;
                let lease = codec::lease(&session_id, row)?;
                let record: Option<&[u8]> = row.try_get("record").map_err(corrupt)?;
                let turn_started_at = match record {
                    Some(_) => Some(codec::turn(&session_id, row)?.started_at),
                    None => None,
                };
                Ok(ListedLease {
                    session_id,
                    owner,
                    lease,
                    turn_started_at,
                })
            })
            .collect()
    }

    /// One statement: this replica's unexpired leases of `keys` are
    /// extended to the lease time from now; the turn ids not extended.
    pub(super) async fn renew(&self, keys: &[LeaseKey]) -> Result<Vec<String>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let sessions: Vec<&str> = keys.iter().map(|k| k.session_id.as_str()).collect();
        let turns: Vec<&str> = keys.iter().map(|k| k.turn_id.as_str()).collect();
        let client = self.client().await?;
        let sql = "UPDATE sessions s \
                   SET lease_expires = clock_timestamp() + $4::bigint * interval '1 microsecond' \
                   FROM unnest($1::text[], $2::text[]) AS k(session_id, turn_id) \
                   WHERE s.id = k.session_id AND s.lease_turn = k.turn_id \
                   AND s.lease_replica = $3 AND s.lease_expires > clock_timestamp() \
                   RETURNING s.lease_turn";
        let rows = codec::rows(
            &client,
            sql,
            &[&sessions, &turns, &self.replica_id, &self.lease_ttl_us],
        )
        .await?;
        let renewed = rows
            .iter()
            .map(|row| row.try_get::<_, String>(0))
            .collect::<Result<std::collections::HashSet<_>, _>>()
            .map_err(|e| StoreError::Backend(format!("reading renewed leases: {e}")))?;
        Ok(keys
            .iter()
            .filter(|k| !renewed.contains(&k.turn_id))
            .map(|k| k.turn_id.clone())
            .collect())
    }

    /// Interrupts the turns of up to [`SWEEP_BATCH`] lapsed leases, each in
    /// its own transaction.
    pub(super) async fn sweep(&self) -> Result<Vec<TurnRecord>, StoreError> {
        let mut client = self.client().await?;
        let sql = "SELECT id FROM sessions WHERE lease_turn IS NOT NULL \
                   AND lease_expires <= clock_timestamp() ORDER BY lease_expires LIMIT $1";
        let candidates = codec::rows(&client, sql, &[&SWEEP_BATCH]).await?;
        let mut changed = Vec::new();
        for row in candidates {
            let id: String = row
                .try_get(0)
                .map_err(|e| StoreError::Backend(format!("reading lapsed leases: {e}")))?;
            match self.sweep_one(&mut client, &id).await {
                Ok(turn) => changed.extend(turn),
                Err(e @ StoreError::Unavailable(_)) => return Err(e),
                // One bad session must not stop the sweep of the others.
                Err(e) => {
                    tracing::warn!(session_id = %id, error = %e, "cannot sweep a lapsed lease")
                }
            }
        }
        Ok(changed)
    }

    async fn sweep_one(
        &self,
        client: &mut Object,
        id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let tx = write::begin(client).await?;
        let sql = concat!(
            "SELECT ",
            locked_cols!(),
            " FROM sessions WHERE id = $1 AND lease_turn IS NOT NULL \
             AND lease_expires <= clock_timestamp() FOR UPDATE SKIP LOCKED"
        );
        let Some(row) = codec::row(&tx, sql, &[&id]).await? else {
            return Ok(None);
        };
        let locked = codec::locked(&row)?;
        let Some(turn_id) = locked.lease.as_ref().map(|h| h.lease.turn_id.clone()) else {
            return Ok(None);
        };
        let changed = self.interrupt_locked(&tx, locked, &turn_id).await?;
        write::commit(tx).await?;
        if let Some(turn) = &changed {
            tracing::warn!(session_id = %turn.session_id, turn_id = %turn.turn_id,
                "interrupted a turn whose lease lapsed");
        }
        Ok(changed)
    }

    /// Interrupts every running turn no live replica owns (see
    /// [`Store::recover_interrupted`](crate::store::Store::recover_interrupted)
    /// on [`PostgresStore`]).
    pub(super) async fn recover(&self) -> Result<Vec<TurnRecord>, StoreError> {
        let mut client = self.client().await?;
        let mut changed = Vec::new();
        let mut after = (String::new(), String::new());
        loop {
            let sql = "SELECT t.session_id, t.turn_id FROM turns t JOIN sessions s ON s.id = t.session_id \
                       WHERE t.status = 'running' AND (t.session_id, t.turn_id) > ($1, $2) \
                       AND (s.lease_turn IS DISTINCT FROM t.turn_id \
                            OR s.lease_expires <= clock_timestamp() OR s.lease_replica = $3) \
                       ORDER BY t.session_id, t.turn_id LIMIT $4";
            let rows = codec::rows(
                &client,
                sql,
                &[&after.0, &after.1, &self.replica_id, &RECOVER_BATCH],
            )
            .await?;
            let fetched = rows.len();
            for row in rows {
                let read = |i| {
                    row.try_get::<_, String>(i)
                        .map_err(|e| StoreError::Backend(format!("reading running turns: {e}")))
                };
                let key = (read(0)?, read(1)?);
                changed.extend(self.recover_one(&mut client, &key.0, &key.1).await?);
                after = key;
            }
            if fetched < RECOVER_BATCH as usize {
                return Ok(changed);
            }
        }
    }

    async fn recover_one(
        &self,
        client: &mut Object,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let tx = write::begin(client).await?;
        let Some(locked) = write::lock(&tx, session_id).await? else {
            return Ok(None);
        };
        // Re-checked under the lock: another replica may have taken the
        // lease for this very turn's session since the candidates were read.
        let owned_elsewhere = locked.lease.as_ref().is_some_and(|held| {
            held.lease.turn_id == turn_id && held.live && held.lease.replica_id != self.replica_id
        });
        if owned_elsewhere {
            return Ok(None);
        }
        let changed = self.interrupt_locked(&tx, locked, turn_id).await?;
        write::commit(tx).await?;
        Ok(changed)
    }
}
