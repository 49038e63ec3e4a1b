//! Turns on PostgreSQL: admission with the session's lease, the final
//! record that releases it, reads of turn records, and the interruption of
//! a turn whose owner is gone.

use std::time::SystemTime;

use deadpool_postgres::Transaction;

use super::codec::{self, Locked};
use super::write::{self, LeaseWrite};
use super::{PostgresStore, quota};
use crate::quota::WriteQuota;
use crate::store::stored_bytes;
use crate::store::{INTERRUPTED_TOOL, StoreError, settle_open_calls};
use crate::types::{Message, NewMessage, Session, TurnRecord, TurnStatus};

/// Most messages of one turn read to find its open tool calls (as the
/// runtime's start-up recovery reads).
const TURN_READ_LIMIT: i64 = 10_000;

impl PostgresStore {
    /// One transaction: lock the session, refuse while another replica's
    /// lease is live ([`StoreError::Busy`]), interrupt the turn of a lapsed
    /// lease (or of one this replica left behind), store the turn record and
    /// the user message, take the lease.
    pub(super) async fn begin(
        &self,
        turn: TurnRecord,
        user: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        let bytes = stored_bytes(&user);
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, &turn.session_id, &turn.incarnation).await?;
        let now = SystemTime::now();
        if let Some(held) = &locked.lease
            && held.live
            && held.lease.replica_id != self.replica_id
        {
            return Err(StoreError::Busy(held.lease.clone()));
        }
        // Before any write: a refusal leaves the transaction empty.
        let owner = locked.session.owner.clone();
        quota::check_turn(&tx, &owner, &turn.session_id, bytes, quota).await?;
        if let Some(held) = &locked.lease {
            // A lapsed lease's owner is presumed dead. This replica's own
            // lease outlived its turn here: the runtime admits one turn per
            // session per process, so that turn's final write failed (or a
            // previous process under this id died).
            let left = held.lease.turn_id.clone();
            if let Some(old) = interrupt(&tx, &mut locked.session, &left, now).await? {
                tracing::warn!(session_id = %old.session_id, turn_id = %old.turn_id,
                    replica_id = %held.lease.replica_id, lapsed = !held.live,
                    "interrupted the turn that held the session's lease");
            }
        }
        // A paused turn (one just found so, above, included) keeps the
        // session busy.
        crate::store::not_paused(&locked.session)?;
        if let Some(request_id) = &turn.request_id
            && let Some(earlier) = by_request(&tx, &turn.session_id, request_id).await?
        {
            // Admission looks the request id up first; this is the race
            // with another replica admitting the same request meanwhile.
            return Err(StoreError::Backend(format!(
                "request id already started turn {} of this session",
                earlier.turn_id
            )));
        }
        if let Some(id) = &turn.from_inbox {
            super::inbox::take(&tx, &turn.session_id, id).await?;
        }
        let message = write::append(&tx, &mut locked.session, user, now).await?;
        quota::add_bytes(&tx, &turn.session_id, bytes).await?;
        let record = TurnRecord {
            user_message_seq: message.seq,
            ..turn
        };
        write::put_turn(&tx, &record, true).await?;
        locked.session.begin_turn(&record);
        self.write_session(&tx, &locked.session, LeaseWrite::Take(&record.turn_id))
            .await?;
        write::commit(tx).await?;
        Ok(message)
    }

    /// The final record (with the last message, when given) while this
    /// replica holds the turn's live lease; releases the lease. Repeating a
    /// plain finish that is already stored is accepted and writes nothing.
    pub(super) async fn finish(
        &self,
        turn: TurnRecord,
        last: Option<NewMessage>,
    ) -> Result<Option<Message>, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, &turn.session_id, &turn.incarnation).await?;
        if !self.holds(&locked, &turn.turn_id) {
            let stored = get_turn(&tx, &turn.session_id, &turn.turn_id).await?;
            if last.is_none() && stored.as_ref() == Some(&turn) {
                return Ok(None);
            }
            return Err(StoreError::LeaseLost {
                turn_id: turn.turn_id,
            });
        }
        let stored = match last {
            Some(message) => {
                Some(write::append(&tx, &mut locked.session, message, SystemTime::now()).await?)
            }
            None => None,
        };
        write::put_turn(&tx, &turn, false).await?;
        // Under its own lease the stored record is still running: this is
        // the turn's one end, so what it spent counts now.
        if locked.session.spend(None, &turn) {
            add_daily(&tx, &locked.session.owner, &turn).await?;
        }
        locked.session.finish_turn(&turn);
        self.write_session(&tx, &locked.session, LeaseWrite::Release)
            .await?;
        write::commit(tx).await?;
        Ok(stored)
    }

    /// A running turn's record (its pause), while this replica holds the
    /// turn's live lease.
    pub(super) async fn put_running(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let locked = write::lock_as(&tx, &turn.session_id, &turn.incarnation).await?;
        if !self.holds(&locked, &turn.turn_id) {
            return Err(StoreError::LeaseLost {
                turn_id: turn.turn_id,
            });
        }
        write::put_turn(&tx, &turn, false).await?;
        write::commit(tx).await
    }

    /// A paused turn runs again on this replica: the record `Running`, the
    /// session's lease taken — refused while another replica's lease is
    /// live; a lapsed lease's turn is settled first (it may be this very
    /// turn, paused by a replica that died).
    pub(super) async fn resume(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        let mut client = self.client().await?;
        let tx = write::begin(&mut client).await?;
        let mut locked = write::lock_as(&tx, session_id, incarnation).await?;
        let now = SystemTime::now();
        if let Some(held) = &locked.lease {
            if held.live && held.lease.replica_id != self.replica_id {
                return Err(StoreError::Busy(held.lease.clone()));
            }
            if held.live && held.lease.turn_id == turn_id {
                // Running here already.
                return Err(StoreError::NotPaused {
                    turn_id: turn_id.to_owned(),
                });
            }
            let left = held.lease.turn_id.clone();
            interrupt(&tx, &mut locked.session, &left, now).await?;
        }
        let mut turn = get_turn(&tx, session_id, turn_id)
            .await?
            .filter(|t| t.status == TurnStatus::Paused)
            .ok_or_else(|| StoreError::NotPaused {
                turn_id: turn_id.to_owned(),
            })?;
        turn.status = TurnStatus::Running;
        write::put_turn(&tx, &turn, false).await?;
        locked.session.begin_turn(&turn);
        self.write_session(&tx, &locked.session, LeaseWrite::Take(turn_id))
            .await?;
        write::commit(tx).await?;
        Ok(turn)
    }

    pub(super) async fn turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        get_turn(&self.client().await?, session_id, turn_id).await
    }

    pub(super) async fn turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        by_request(&self.client().await?, session_id, request_id).await
    }

    pub(super) async fn turns_before(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let limit = codec::big(u64::try_from(limit).unwrap_or(u64::MAX))?;
        let client = self.client().await?;
        let rows = match before {
            Some(before) => {
                let sql = "SELECT turn_id, record FROM turns WHERE session_id = $1 \
                           AND turn_id COLLATE \"C\" < $2 \
                           ORDER BY turn_id COLLATE \"C\" DESC LIMIT $3";
                codec::rows(&client, sql, &[&session_id, &before, &limit]).await?
            }
            None => {
                let sql = "SELECT turn_id, record FROM turns WHERE session_id = $1 \
                           ORDER BY turn_id COLLATE \"C\" DESC LIMIT $2";
                codec::rows(&client, sql, &[&session_id, &limit]).await?
            }
        };
        rows.iter()
            .map(|row| codec::turn(session_id, row))
            .collect()
    }

    /// At most `limit` paused turns past their bound at `now`, the longest
    /// expired first (the partial index `turns_paused`).
    pub(super) async fn expired(
        &self,
        now: SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let limit = codec::big(u64::try_from(limit).unwrap_or(u64::MAX))?;
        let now = codec::nanos(now)?;
        let client = self.client().await?;
        let sql = "SELECT session_id, turn_id, record FROM turns \
                   WHERE status = 'paused' AND pause_until <= $1 ORDER BY pause_until LIMIT $2";
        let rows = codec::rows(&client, sql, &[&now, &limit]).await?;
        rows.iter()
            .map(|row| {
                let session_id: String = row
                    .try_get(0)
                    .map_err(|e| StoreError::Backend(format!("reading paused turns: {e}")))?;
                codec::turn(&session_id, row)
            })
            .collect()
    }

    pub(super) async fn turn_count(&self, session_id: &str) -> Result<u64, StoreError> {
        let sql = "SELECT count(*) FROM turns WHERE session_id = $1";
        let row = codec::row(&self.client().await?, sql, &[&session_id]).await?;
        let count: i64 = row.map_or(0, |row| row.get(0));
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Interrupts `turn_id` of the `locked` session inside `tx` and writes
    /// the session, releasing the lease when that turn held it; the caller
    /// commits.
    pub(super) async fn interrupt_locked(
        &self,
        tx: &Transaction<'_>,
        mut locked: Locked,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let now = SystemTime::now();
        let changed = interrupt(tx, &mut locked.session, turn_id, now).await?;
        let releases = locked
            .lease
            .as_ref()
            .is_some_and(|held| held.lease.turn_id == turn_id);
        let lease = if releases {
            LeaseWrite::Release
        } else {
            LeaseWrite::Keep
        };
        if changed.is_some() || releases {
            self.write_session(tx, &locked.session, lease).await?;
        }
        Ok(changed)
    }
}

/// Marks `turn_id` of the locked `session` interrupted — or paused, when
/// it waited for caller results or approvals — (when it is still running)
/// and answers its tool calls left without a result (but those a paused
/// turn waits for), as start-up recovery does; the caller writes the session. The changed record.
pub(super) async fn interrupt(
    tx: &Transaction<'_>,
    session: &mut Session,
    turn_id: &str,
    now: SystemTime,
) -> Result<Option<TurnRecord>, StoreError> {
    let Some(mut turn) = get_turn(tx, &session.id, turn_id).await? else {
        return Ok(None);
    };
    if !turn.interrupt(now) {
        return Ok(None);
    }
    let from = codec::big(turn.user_message_seq)?;
    let sql = "SELECT seq, record FROM messages WHERE session_id = $1 AND seq >= $2 \
               AND turn_id = $3 ORDER BY seq LIMIT $4";
    let rows = codec::rows(tx, sql, &[&session.id, &from, &turn_id, &TURN_READ_LIMIT]).await?;
    let messages = rows
        .iter()
        .map(|row| codec::message(&session.id, row))
        .collect::<Result<Vec<_>, _>>()?;
    for result in settle_open_calls(&mut turn, &messages, INTERRUPTED_TOOL, now) {
        write::append(tx, session, result, now).await?;
    }
    write::put_turn(tx, &turn, false).await?;
    session.recover_turn(&turn);
    Ok(Some(turn))
}

/// Adds what `turn` spent to its owner's row of the day it ended.
async fn add_daily(tx: &Transaction<'_>, owner: &str, turn: &TurnRecord) -> Result<(), StoreError> {
    let spent = crate::quota::DailySpent::of(turn);
    let day = crate::quota::day_window(turn.finished_at.unwrap_or_else(SystemTime::now)).0;
    let (day, tokens, cost) = (
        codec::big(day)?,
        codec::big(spent.tokens)?,
        codec::big(spent.cost_nano_usd)?,
    );
    let sql = "INSERT INTO daily_spent (owner, day, tokens, cost) VALUES ($1, $2, $3, $4) \
               ON CONFLICT (owner, day) DO UPDATE SET \
               tokens = daily_spent.tokens + EXCLUDED.tokens, cost = daily_spent.cost + EXCLUDED.cost";
    codec::execute(tx, sql, &[&owner, &day, &tokens, &cost]).await?;
    Ok(())
}

/// What `owner`'s turns spent on `day`.
pub(super) async fn daily_spent<C: deadpool_postgres::GenericClient>(
    client: &C,
    owner: &str,
    day: u64,
) -> Result<crate::quota::DailySpent, StoreError> {
    let day = codec::big(day)?;
    let sql = "SELECT tokens, cost FROM daily_spent WHERE owner = $1 AND day = $2";
    let Some(row) = codec::row(client, sql, &[&owner, &day]).await? else {
        return Ok(crate::quota::DailySpent::default());
    };
    let word = |i: usize| -> u64 { u64::try_from(row.get::<_, i64>(i)).unwrap_or(0) };
    Ok(crate::quota::DailySpent {
        tokens: word(0),
        cost_nano_usd: word(1),
    })
}

async fn get_turn<C: deadpool_postgres::GenericClient>(
    client: &C,
    session_id: &str,
    turn_id: &str,
) -> Result<Option<TurnRecord>, StoreError> {
    let sql = "SELECT turn_id, record FROM turns WHERE session_id = $1 AND turn_id = $2";
    codec::row(client, sql, &[&session_id, &turn_id])
        .await?
        .map(|row| codec::turn(session_id, &row))
        .transpose()
}

async fn by_request<C: deadpool_postgres::GenericClient>(
    client: &C,
    session_id: &str,
    request_id: &str,
) -> Result<Option<TurnRecord>, StoreError> {
    let sql = "SELECT turn_id, record FROM turns WHERE session_id = $1 AND request_id = $2";
    codec::row(client, sql, &[&session_id, &request_id])
        .await?
        .map(|row| codec::turn(session_id, &row))
        .transpose()
}
