//! Turns: the turn record with its user message, the messages a turn
//! appends, its final record (with its last message), the turn lookups,
//! and start-up recovery of turns a crash left running.

use std::time::SystemTime;

use sled::Tree;
use sled::transaction::{
    ConflictableTransactionError as TxError, Transactional, TransactionalTree,
};

use super::keys::{child, child_end, inbox_key, turn_key};
use super::tx::{append_tx, session_as_tx, session_tx, write_session_tx};
use super::{SledStore, TURNS, backend, blocking, decode, keep_body, tx_err, usage};
use crate::quota::{DailySpent, WriteQuota};
use crate::store::StoreError;
use crate::store::record::encode;
use crate::store::stored_bytes;
use crate::types::{Message, NewMessage, TurnRecord, TurnStatus};

impl SledStore {
    pub(super) async fn begin(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        self.disk.admit()?;
        let bytes = stored_bytes(&user_message);
        let write_started = std::time::Instant::now();
        // The model request waits for this write (docs/contract.md §3.3), so the
        // transaction runs right here and the flush on the flusher.
        let now = SystemTime::now();
        let user_message = self.outgoing(&turn.session_id, &user_message).await?;
        // Reserved on the first run of the transaction's closure (sled may
        // run it again after a conflict; the owner is the same).
        let reserved = std::cell::RefCell::new(None);
        let queued = turn
            .from_inbox
            .as_deref()
            .map(|id| inbox_key(&turn.session_id, id));
        let message = {
            let body = |s: &TransactionalTree,
                        a: &TransactionalTree,
                        m: &TransactionalTree,
                        t: &TransactionalTree,
                        u: &TransactionalTree,
                        inbox: Option<&TransactionalTree>| {
                let (mut session, message) = append_tx(
                    s,
                    a,
                    m,
                    &turn.session_id,
                    Some(&turn.incarnation),
                    &user_message,
                    now,
                )?;
                crate::store::not_paused(&session).map_err(TxError::Abort)?;
                // A queued message leaves the inbox in the write that begins its
                // turn, or the turn does not begin.
                if let (Some(i), Some(key)) = (inbox, &queued)
                    && i.remove(key.as_slice())?.is_none()
                {
                    let id = turn.from_inbox.clone().unwrap_or_default();
                    return Err(TxError::Abort(StoreError::NotQueued { id }));
                }
                if reserved.borrow().is_none() {
                    let held = self.owners.reserve(&session.owner, bytes, &quota.limits)?;
                    *reserved.borrow_mut() = Some(held);
                }
                usage::add_bytes_tx(u, &session.owner, &session.id, bytes)?;
                let record = TurnRecord {
                    user_message_seq: message.seq,
                    ..turn.clone()
                };
                let key = turn_key(&record.session_id, &record.turn_id);
                t.insert(key, encode(&record).map_err(TxError::Abort)?)?;
                session.begin_turn(&record);
                write_session_tx(s, &session)?;
                Ok(message)
            };
            let (s, a, m, t, u) = (
                &self.sessions,
                &self.activity,
                &self.messages,
                &self.turns,
                &self.usage,
            );
            match &queued {
                None => (s, a, m, t, u).transaction(|(s, a, m, t, u)| body(s, a, m, t, u, None)),
                Some(_) => (s, a, m, t, u, &self.inbox)
                    .transaction(|(s, a, m, t, u, i)| body(s, a, m, t, u, Some(i))),
            }
            .map_err(|e| self.tx_failed(e))?
        };
        if let Some(held) = reserved.into_inner() {
            held.commit();
        }
        keep_body(user_message);
        self.durable_write(write_started).await?;
        Ok(message)
    }

    pub(super) async fn append(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.disk.running()?;
        let write_started = std::time::Instant::now();
        let now = SystemTime::now();
        let outgoing = self.outgoing(session_id, &message).await?;
        let message = (&self.sessions, &self.activity, &self.messages)
            .transaction(|(s, a, m)| {
                let (session, message) =
                    append_tx(s, a, m, session_id, Some(incarnation), &outgoing, now)?;
                write_session_tx(s, &session)?;
                Ok(message)
            })
            .map_err(|e| self.tx_failed(e))?;
        keep_body(outgoing);
        self.durable_write(write_started).await?;
        Ok(message)
    }

    pub(super) async fn finish(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let write_started = std::time::Instant::now();
        let record = encode(&turn)?;
        let day = day_of(&turn);
        let counted = (&self.sessions, &self.turns, &self.usage)
            .transaction(|(s, t, u)| {
                let mut session = session_as_tx(s, &turn.session_id, &turn.incarnation)?;
                let before = put_turn_tx(t, &turn, &record)?;
                let spent = session.spend(before.as_ref(), &turn);
                if session.finish_turn(&turn) || spent {
                    write_session_tx(s, &session)?;
                }
                count_day(u, spent, day, &session, &turn)
            })
            .map_err(|e| self.tx_failed(e))?;
        self.finished(day, counted, &turn);
        self.durable_write(write_started).await
    }

    /// After a turn's final (or paused) record is committed: its spending,
    /// counted for `owner`, added to the day's totals in memory, and the
    /// paused turns' index told its state.
    fn finished(&self, day: u64, owner: Option<String>, turn: &TurnRecord) {
        if let Some(owner) = owner {
            self.daily.add(day, &owner, DailySpent::of(turn));
        }
        self.paused.note(turn);
    }

    pub(super) async fn finish_with(
        &self,
        turn: TurnRecord,
        last: Option<NewMessage>,
    ) -> Result<Option<Message>, StoreError> {
        let write_started = std::time::Instant::now();
        let record = encode(&turn)?;
        let now = SystemTime::now();
        let last = match &last {
            Some(message) => {
                self.disk.running()?;
                Some(self.outgoing(&turn.session_id, message).await?)
            }
            None => None,
        };
        let day = day_of(&turn);
        let written = (
            &self.sessions,
            &self.activity,
            &self.messages,
            &self.turns,
            &self.usage,
        )
            .transaction(|(s, a, m, t, u)| {
                let (mut session, stored) = match &last {
                    Some(message) => {
                        let (session, stored) = append_tx(
                            s,
                            a,
                            m,
                            &turn.session_id,
                            Some(&turn.incarnation),
                            message,
                            now,
                        )?;
                        (session, Some(stored))
                    }
                    None => (session_as_tx(s, &turn.session_id, &turn.incarnation)?, None),
                };
                let before = put_turn_tx(t, &turn, &record)?;
                let spent = session.spend(before.as_ref(), &turn);
                session.finish_turn(&turn);
                write_session_tx(s, &session)?;
                Ok((stored, count_day(u, spent, day, &session, &turn)?))
            })
            .map_err(|e| self.tx_failed(e))?;
        let (written, counted) = written;
        self.finished(day, counted, &turn);
        last.into_iter().for_each(keep_body);
        self.durable_write(write_started).await?;
        Ok(written)
    }

    pub(super) async fn put_running(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let write_started = std::time::Instant::now();
        let record = encode(&turn)?;
        (&self.sessions, &self.turns)
            .transaction(|(s, t)| {
                session_as_tx(s, &turn.session_id, &turn.incarnation)?;
                put_turn_tx(t, &turn, &record)?;
                Ok(())
            })
            .map_err(|e| self.tx_failed(e))?;
        self.durable_write(write_started).await
    }

    pub(super) async fn resume(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        let write_started = std::time::Instant::now();
        let key = turn_key(session_id, turn_id);
        let resumed = (&self.sessions, &self.turns)
            .transaction(|(s, t)| {
                let mut session = session_as_tx(s, session_id, incarnation)?;
                let not_paused = || {
                    TxError::Abort(StoreError::NotPaused {
                        turn_id: turn_id.to_owned(),
                    })
                };
                let raw = t.get(&key)?.ok_or_else(not_paused)?;
                let mut turn: TurnRecord = decode(TURNS, &key, &raw).map_err(TxError::Abort)?;
                if turn.status != TurnStatus::Paused {
                    return Err(not_paused());
                }
                turn.status = TurnStatus::Running;
                t.insert(key.as_slice(), encode(&turn).map_err(TxError::Abort)?)?;
                session.begin_turn(&turn);
                write_session_tx(s, &session)?;
                Ok(turn)
            })
            .map_err(|e| self.tx_failed(e))?;
        self.paused.note(&resumed);
        self.durable_write(write_started).await?;
        Ok(resumed)
    }

    pub(super) fn turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if !self.session_exists(session_id)? {
            return Ok(None);
        }
        let key = turn_key(session_id, turn_id);
        match self.turns.get(&key).map_err(|e| backend("read", e))? {
            None => Ok(None),
            Some(raw) => decode(TURNS, &key, &raw).map(Some),
        }
    }

    pub(super) async fn turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        if !self.session_exists(session_id)? {
            return Ok(None);
        }
        let (turns, prefix, request_id) =
            (self.turns.clone(), child(session_id), request_id.to_owned());
        blocking(move || {
            for entry in turns.scan_prefix(&prefix) {
                let (key, raw) = entry.map_err(|e| backend("scan", e))?;
                let turn: TurnRecord = decode(TURNS, &key, &raw)?;
                if turn.started_by(&request_id) {
                    return Ok(Some(turn));
                }
            }
            Ok(None)
        })
        .await
    }

    /// The session's turn records newest first (a reverse scan of its key
    /// range, which ends before `before`'s key).
    pub(super) async fn turns_before(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        if limit == 0 || !self.session_exists(session_id)? {
            return Ok(Vec::new());
        }
        let start = child(session_id);
        let end = match before {
            Some(turn_id) => turn_key(session_id, turn_id),
            None => child_end(session_id),
        };
        let turns = self.turns.clone();
        blocking(move || {
            let mut page = Vec::new();
            for entry in turns.range(start..end).rev().take(limit) {
                let (key, raw) = entry.map_err(|e| backend("scan", e))?;
                page.push(decode(TURNS, &key, &raw)?);
            }
            Ok(page)
        })
        .await
    }

    pub(super) async fn turn_count(&self, session_id: &str) -> Result<u64, StoreError> {
        if !self.session_exists(session_id)? {
            return Ok(0);
        }
        let (turns, prefix) = (self.turns.clone(), child(session_id));
        blocking(move || {
            let mut count = 0u64;
            for entry in turns.scan_prefix(&prefix).keys() {
                entry.map_err(|e| backend("scan", e))?;
                count = count.saturating_add(1);
            }
            Ok(count)
        })
        .await
    }

    pub(super) async fn recover(&self) -> Result<Vec<TurnRecord>, StoreError> {
        let (sessions, turns) = (self.sessions.clone(), self.turns.clone());
        let (changed, paused) = blocking(move || recover_blocking(&sessions, &turns)).await?;
        for turn in changed.iter().chain(&paused) {
            self.paused.note(turn);
        }
        self.flush_db().await?;
        Ok(changed)
    }
}

/// The UTC day a turn's end counts on.
fn day_of(turn: &TurnRecord) -> u64 {
    crate::quota::day_window(turn.finished_at.unwrap_or_else(SystemTime::now)).0
}

/// When the turn's end `spent` (counted now) something, adds it to the
/// session's key of `day`; the owner it counted for.
fn count_day(
    u: &TransactionalTree,
    spent: bool,
    day: u64,
    session: &crate::types::Session,
    turn: &TurnRecord,
) -> Result<Option<String>, TxError<StoreError>> {
    let adds = DailySpent::of(turn);
    if !spent || adds == DailySpent::default() {
        return Ok(None);
    }
    super::daily::add_tx(u, day, &session.id, &session.owner, adds)?;
    Ok(Some(session.owner.clone()))
}

/// Writes `turn`'s `record` in the transaction; the record it replaced.
fn put_turn_tx(
    t: &sled::transaction::TransactionalTree,
    turn: &TurnRecord,
    record: &[u8],
) -> Result<Option<TurnRecord>, TxError<StoreError>> {
    let key = turn_key(&turn.session_id, &turn.turn_id);
    let before = t.insert(key.as_slice(), record)?;
    before
        .map(|raw| decode(TURNS, &key, &raw))
        .transpose()
        .map_err(TxError::Abort)
}

/// Interrupts (or pauses) the turns left running; the changed records,
/// and those a previous process left paused.
fn recover_blocking(
    sessions: &Tree,
    turns: &Tree,
) -> Result<(Vec<TurnRecord>, Vec<TurnRecord>), StoreError> {
    let now = SystemTime::now();
    let mut running = Vec::new();
    let mut paused = Vec::new();
    for entry in turns.iter() {
        let (key, raw) = entry.map_err(|e| backend("scan", e))?;
        let turn = decode::<TurnRecord>(TURNS, &key, &raw)?;
        match turn.status {
            TurnStatus::Running => running.push(key),
            TurnStatus::Paused => paused.push(turn),
            TurnStatus::Success
            | TurnStatus::Error
            | TurnStatus::Canceled
            | TurnStatus::TimedOut
            | TurnStatus::Interrupted
            | TurnStatus::BudgetExceeded => {}
        }
    }
    let mut changed = Vec::new();
    for key in running {
        // Re-read in the transaction: the turn may have finished since.
        let outcome = (sessions, turns).transaction(|(s, t)| {
            let Some(raw) = t.get(&key)? else {
                return Ok(None);
            };
            let mut turn: TurnRecord = decode(TURNS, &key, &raw).map_err(TxError::Abort)?;
            if !turn.interrupt(now) {
                return Ok(None);
            }
            let Some(mut session) = session_tx(s, &turn.session_id)? else {
                tracing::warn!(turn_id = %turn.turn_id, "dropping a turn of a deleted session");
                t.remove(&key)?;
                return Ok(None);
            };
            t.insert(&key, encode(&turn).map_err(TxError::Abort)?)?;
            if session.recover_turn(&turn) {
                write_session_tx(s, &session)?;
            }
            Ok(Some(turn))
        });
        changed.extend(outcome.map_err(tx_err)?);
    }
    Ok((changed, paused))
}
