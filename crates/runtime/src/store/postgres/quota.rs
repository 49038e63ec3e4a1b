//! Quotas on PostgreSQL ([`crate::quota`]): every replica counts from the
//! database, in the transaction of the write it admits, under a per-owner
//! advisory lock, so replicas together never pass an owner's limit.
//!
//! - `sessions`: the owner's rows of `sessions`;
//! - `stored_bytes`: the sum of their `user_bytes` (each begin adds its
//!   user message's);
//! - `live_turns`: the owner's sessions holding an unexpired lease;
//! - `turns_per_minute`: the owner's row of `turn_minutes` for the
//!   database clock's current minute.
//!
//! The owner lock is taken only when one of these limits applies, and
//! always after the session row's lock (a begin) or with no other lock held
//! (a create), so two writes cannot wait on each other in a cycle.

use std::time::Duration;

use deadpool_postgres::Transaction;

use super::codec;
use crate::quota::{Quota, QuotaExceeded, QuotaLimits, WriteQuota};
use crate::store::StoreError;

/// Takes `owner`'s quota lock until the transaction ends.
pub(super) async fn lock_owner(tx: &Transaction<'_>, owner: &str) -> Result<(), StoreError> {
    let sql = "SELECT pg_advisory_xact_lock(hashtextextended('agentrt quota ' || $1, 0))";
    codec::row(tx, sql, &[&owner]).await.map(drop)
}

fn count(row: Option<tokio_postgres::Row>, what: &str) -> Result<u64, StoreError> {
    let value: i64 = row
        .map(|r| r.try_get(0))
        .transpose()
        .map_err(|e| StoreError::Backend(format!("counting {what}: {e}")))?
        .unwrap_or(0);
    Ok(u64::try_from(value).unwrap_or(0))
}

fn refused(e: QuotaExceeded) -> StoreError {
    StoreError::QuotaExceeded(e)
}

/// Refuses one more session of `owner` past `limit` (the caller holds the
/// owner lock).
pub(super) async fn check_sessions(
    tx: &Transaction<'_>,
    owner: &str,
    limit: u64,
) -> Result<(), StoreError> {
    // Counting stops one past the limit: the cost stays bounded by it.
    let cap = codec::big(limit.saturating_add(1))?;
    let sql = "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE owner = $1 LIMIT $2) held";
    let held = count(codec::row(tx, sql, &[&owner, &cap]).await?, "sessions")?;
    QuotaLimits::check(Quota::Sessions, Some(limit), held, 1).map_err(refused)
}

/// Whether `quota` asks [`check_turn`] to count anything.
pub(super) fn limits_turn(quota: &WriteQuota) -> bool {
    let l = &quota.limits;
    l.stored_bytes.is_some()
        || (quota.count_turns && (l.live_turns.is_some() || l.turns_per_minute.is_some()))
}

/// Refuses a turn of `owner` in session `session_id` adding `bytes` that
/// would pass a limit of `quota`; takes the owner lock first. Counts the
/// turn in its minute (undone with the transaction when it is refused
/// later).
pub(super) async fn check_turn(
    tx: &Transaction<'_>,
    owner: &str,
    session_id: &str,
    bytes: u64,
    quota: &WriteQuota,
) -> Result<(), StoreError> {
    if !limits_turn(quota) {
        return Ok(());
    }
    lock_owner(tx, owner).await?;
    let limits = &quota.limits;
    if let Some(limit) = limits.stored_bytes {
        let sql = "SELECT coalesce(sum(user_bytes), 0)::bigint FROM sessions WHERE owner = $1";
        let used = count(codec::row(tx, sql, &[&owner]).await?, "stored bytes")?;
        QuotaLimits::check(Quota::StoredBytes, Some(limit), used, bytes).map_err(refused)?;
    }
    if !quota.count_turns {
        return Ok(());
    }
    if let Some(limit) = limits.live_turns {
        let cap = codec::big(limit.saturating_add(1))?;
        let sql = "SELECT count(*) FROM (SELECT 1 FROM sessions WHERE owner = $1 AND id <> $2 \
                   AND lease_turn IS NOT NULL AND lease_expires > clock_timestamp() LIMIT $3) live";
        let live = count(
            codec::row(tx, sql, &[&owner, &session_id, &cap]).await?,
            "live turns",
        )?;
        QuotaLimits::check(Quota::LiveTurns, Some(limit), live, 1).map_err(refused)?;
    }
    if let Some(limit) = limits.turns_per_minute {
        per_minute(tx, owner, limit).await?;
    }
    Ok(())
}

/// Counts one more turn of `owner` in the database clock's current minute,
/// refusing past `limit` with the time until the next minute.
async fn per_minute(tx: &Transaction<'_>, owner: &str, limit: u64) -> Result<(), StoreError> {
    let sql = "DELETE FROM turn_minutes WHERE owner = $1 AND minute < date_trunc('minute', now())";
    codec::execute(tx, sql, &[&owner]).await?;
    let sql = "INSERT INTO turn_minutes AS m (owner, minute, turns) \
               VALUES ($1, date_trunc('minute', now()), 1) \
               ON CONFLICT (owner, minute) DO UPDATE SET turns = m.turns + 1 \
               RETURNING m.turns, \
               (extract(epoch FROM date_trunc('minute', now()) + interval '1 minute' - now()) \
               * 1000)::bigint";
    let row = codec::row(tx, sql, &[&owner])
        .await?
        .ok_or_else(|| StoreError::Backend("counting turns: no row".to_owned()))?;
    let parse = |e: tokio_postgres::Error| StoreError::Backend(format!("counting turns: {e}"));
    let turns: i64 = row.try_get(0).map_err(parse)?;
    let wait_ms: i64 = row.try_get(1).map_err(parse)?;
    let turns = u64::try_from(turns).unwrap_or(0);
    // `turns` already counts this one.
    QuotaLimits::check(
        Quota::TurnsPerMinute,
        Some(limit),
        turns.saturating_sub(1),
        1,
    )
    .map_err(|e| {
        refused(QuotaExceeded {
            retry_after: Some(Duration::from_millis(
                u64::try_from(wait_ms).unwrap_or(0).max(1),
            )),
            ..e
        })
    })
}

/// Counts `bytes` more user message bytes in session `session_id`.
pub(super) async fn add_bytes(
    tx: &Transaction<'_>,
    session_id: &str,
    bytes: u64,
) -> Result<(), StoreError> {
    let bytes = codec::big(bytes)?;
    let sql = "UPDATE sessions SET user_bytes = user_bytes + $2 WHERE id = $1";
    codec::execute(tx, sql, &[&session_id, &bytes])
        .await
        .map(drop)
}
