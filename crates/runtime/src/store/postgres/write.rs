//! The steps every write is made of, inside one transaction: lock the
//! session row, check what the write may do (incarnation, lease), change the
//! record by the domain rules, write rows, commit.
//!
//! What must stay true: nothing is written unless the row is locked first
//! (appends to a session are serialised by that lock, which is what makes
//! seqs contiguous), and `Ok` is returned only after [`commit`].

use std::time::SystemTime;

use deadpool_postgres::Transaction;

use super::PostgresStore;
use super::codec::{self, Locked, SessionParams, locked_cols, update_session};
use super::error::pg_error;
use crate::store::{StoreError, record, seq_exhausted};
use crate::types::{Message, NewMessage, Session, TurnRecord, TurnStatus};

/// What a session write does to the lease columns.
#[derive(Debug, Clone, Copy)]
pub(super) enum LeaseWrite<'a> {
    /// Leaves them.
    Keep,
    /// Gives the lease to this replica's turn `0`, for the lease time.
    Take(&'a str),
    /// Clears them.
    Release,
}

/// The session row `id`, locked until the transaction ends, with its lease.
pub(super) async fn lock(tx: &Transaction<'_>, id: &str) -> Result<Option<Locked>, StoreError> {
    let sql = concat!(
        "SELECT ",
        locked_cols!(),
        " FROM sessions WHERE id = $1 FOR UPDATE"
    );
    codec::row(tx, sql, &[&id])
        .await?
        .map(|row| codec::locked(&row))
        .transpose()
}

/// [`lock`], for a write of incarnation `incarnation`: not found unless the
/// session exists as that one.
pub(super) async fn lock_as(
    tx: &Transaction<'_>,
    id: &str,
    incarnation: &str,
) -> Result<Locked, StoreError> {
    lock(tx, id)
        .await?
        .filter(|l| l.session.is_incarnation(incarnation))
        .ok_or(StoreError::SessionNotFound)
}

impl PostgresStore {
    /// Writes the changed columns of `session` and does `lease` to its
    /// lease.
    pub(super) async fn write_session(
        &self,
        tx: &Transaction<'_>,
        session: &Session,
        lease: LeaseWrite<'_>,
    ) -> Result<(), StoreError> {
        let params = SessionParams::new(session)?;
        let base = params.mutable();
        let changed = match lease {
            LeaseWrite::Keep => {
                let sql = concat!(update_session!(), " WHERE id = $1");
                codec::execute(tx, sql, &base).await?
            }
            LeaseWrite::Release => {
                let sql = concat!(
                    update_session!(),
                    ", lease_replica = NULL, lease_address = NULL, lease_turn = NULL, \
                     lease_expires = NULL WHERE id = $1"
                );
                codec::execute(tx, sql, &base).await?
            }
            LeaseWrite::Take(turn_id) => {
                let sql = concat!(
                    update_session!(),
                    ", lease_replica = $16, lease_address = $17, lease_turn = $18, \
                     lease_expires = clock_timestamp() + $19::bigint * interval '1 microsecond' \
                     WHERE id = $1"
                );
                let mut params = base.to_vec();
                params.extend_from_slice(&[
                    &self.replica_id,
                    &self.address,
                    &turn_id,
                    &self.lease_ttl_us,
                ]);
                codec::execute(tx, sql, &params).await?
            }
        };
        if changed != 1 {
            // The row is locked by this transaction: it cannot have gone.
            return Err(StoreError::Backend(format!(
                "updating session {} changed {changed} rows",
                session.id
            )));
        }
        Ok(())
    }

    /// Whether this replica holds the live lease of `turn_id` in `locked`.
    pub(super) fn holds(&self, locked: &Locked, turn_id: &str) -> bool {
        locked.lease.as_ref().is_some_and(|held| {
            held.live && held.lease.turn_id == turn_id && held.lease.replica_id == self.replica_id
        })
    }

    /// Refuses a write of a turn's message unless this replica holds the
    /// turn's live lease; a message of no recorded turn (a compaction
    /// outside turns, an import) is not a turn's write.
    pub(super) async fn check_message_lease(
        &self,
        tx: &Transaction<'_>,
        locked: &Locked,
        message: &NewMessage,
    ) -> Result<(), StoreError> {
        if self.holds(locked, &message.turn_id)
            || !turn_exists(tx, &locked.session.id, &message.turn_id).await?
        {
            return Ok(());
        }
        Err(StoreError::LeaseLost {
            turn_id: message.turn_id.clone(),
        })
    }
}

/// Whether session `session_id` has a record of turn `turn_id`.
pub(super) async fn turn_exists(
    tx: &Transaction<'_>,
    session_id: &str,
    turn_id: &str,
) -> Result<bool, StoreError> {
    let sql = "SELECT 1 FROM turns WHERE session_id = $1 AND turn_id = $2";
    Ok(codec::row(tx, sql, &[&session_id, &turn_id])
        .await?
        .is_some())
}

/// Appends `new` to the locked `session` by its rules and stores the row;
/// the caller writes the session.
pub(super) async fn append(
    tx: &Transaction<'_>,
    session: &mut Session,
    new: NewMessage,
    now: SystemTime,
) -> Result<Message, StoreError> {
    codec::check_text("a message's turn id", [new.turn_id.as_str()])?;
    let message = session.append(new, now).ok_or_else(seq_exhausted)?;
    let record = record::encode(&message)?;
    let seq = codec::big(message.seq)?;
    let sql = "INSERT INTO messages (session_id, seq, turn_id, record) VALUES ($1, $2, $3, $4)";
    codec::execute(
        tx,
        sql,
        &[&session.id, &seq, &message.body.turn_id, &record],
    )
    .await?;
    Ok(message)
}

/// Stores `turn`'s record: a new one (`begin`) or a replacement.
pub(super) async fn put_turn(
    tx: &Transaction<'_>,
    turn: &TurnRecord,
    begin: bool,
) -> Result<(), StoreError> {
    codec::check_text(
        "a turn's ids",
        [turn.turn_id.as_str()]
            .into_iter()
            .chain(turn.request_id.as_deref()),
    )?;
    let record = record::encode(turn)?;
    let status = codec::status(turn.status);
    let pause_until = match turn.paused_until() {
        Some(until) if turn.status == TurnStatus::Paused => Some(codec::nanos(until)?),
        Some(_) | None => None,
    };
    let sql = if begin {
        "INSERT INTO turns (session_id, turn_id, request_id, status, record, pause_until) \
         VALUES ($1, $2, $3, $4, $5, $6)"
    } else {
        "INSERT INTO turns (session_id, turn_id, request_id, status, record, pause_until) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (session_id, turn_id) DO UPDATE \
         SET request_id = EXCLUDED.request_id, status = EXCLUDED.status, \
         record = EXCLUDED.record, pause_until = EXCLUDED.pause_until"
    };
    codec::execute(
        tx,
        sql,
        &[
            &turn.session_id,
            &turn.turn_id,
            &turn.request_id,
            &status,
            &record,
            &pause_until,
        ],
    )
    .await
    .map(drop)
}

/// Commits: from here on the write is durable and may be acknowledged.
pub(super) async fn commit(tx: Transaction<'_>) -> Result<(), StoreError> {
    tx.commit().await.map_err(|e| pg_error("commit", &e))
}

/// Starts a transaction on `client`.
pub(super) async fn begin(
    client: &mut deadpool_postgres::Object,
) -> Result<Transaction<'_>, StoreError> {
    client
        .transaction()
        .await
        .map_err(|e| pg_error("begin", &e))
}
