//! The on-disk [`Store`], on sled 0.34.
//!
//! # Layout
//!
//! Four trees. Values are records: one version byte ([`RECORD_VERSION`] = 1)
//! then serde_json; another version byte, or a record that does not decode,
//! is [`StoreError::Corrupt`].
//!
//! | tree               | key                                                | value          |
//! |--------------------|----------------------------------------------------|----------------|
//! | `sessions`         | id                                                 | [`Session`]    |
//! | `session_activity` | owner `\0` last_active_at (u64 BE ns since epoch) id | empty        |
//! | `messages`         | session id `\0` seq (u64 BE)                       | [`Message`]    |
//! | `messages`         | session id `\0` `u64::MAX` (BE) body file name     | seq (u64 BE)   |
//! | `turns`            | session id `\0` turn id                            | [`TurnRecord`] |
//!
//! A message record above 4 KiB keeps its body in a file of its own and
//! only a reference (version byte 2) in the tree, and the file's name under
//! the session's prefix, after every seq: see [`bodies`] for why (sled's
//! page cache does not count large values) and how that stays durable.
//!
//! NUL separates key parts, so ids and owners must not contain it (validated
//! upstream; `create_session` refuses them too, or a prefix scan of one
//! session could reach another's keys).
//!
//! `session_activity` is the listing index: walked backwards, an owner's
//! prefix is newest activity first with ties by id descending — exactly the
//! [`Store::list_sessions`] order, so a [`ListCursor`] is an exclusive upper
//! bound. Nanoseconds (not coarser) keep the index order equal to the order
//! of the stored `SystemTime`s. The index key moves in the same transaction
//! as every change of `last_active_at`; a reader outside transactions may
//! still glimpse half a commit, so listing skips entries that disagree with
//! their session record.
//!
//! # Consistency
//!
//! Multi-key writes are single multi-tree transactions (a message with its
//! seq, counters and index key; a turn's user message with the turn record
//! and `last_turn`). Deletion removes the session record and index key in one
//! transaction — from then on the session is gone for readers and writers —
//! and then its messages and turns in batches. A crash in between leaves
//! orphans: reads go through the session record so they stay invisible,
//! `create_session` purges them before reusing the id, and
//! `recover_interrupted` drops orphan turns. Creation and deletion share a
//! lock so a purge never meets the new session of a reused id.

use std::ops::Bound;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sled::transaction::{
    ConflictableTransactionError as TxError, TransactionError, Transactional, TransactionalTree,
};
use sled::{Batch, IVec, Tree};

mod bodies;
mod disk;

use self::bodies::{Bodies, Outgoing};
use self::disk::Disk;
use super::flusher::Flusher;
use super::size::{Budget, message_wire_bytes, session_wire_bytes};
use super::{
    CreateOutcome, HistoryQuery, ListCursor, ListQuery, MessagePage, SessionPage, Store,
    StoreError, seq_exhausted,
};
use crate::quota::{WriteQuota, stored_bytes};
use crate::types::{
    Message, NewMessage, NewSession, Session, SessionUpdate, TurnRecord, TurnStatus, new_id,
};

/// The version byte in front of every record.
pub(crate) const RECORD_VERSION: u8 = 1;

const SESSIONS: &str = "sessions";
const ACTIVITY: &str = "session_activity";
const MESSAGES: &str = "messages";
const TURNS: &str = "turns";
const USAGE: &str = "usage";

/// The page cache of [`SledStore::open`]: 16 MiB.
pub(crate) const DEFAULT_CACHE_BYTES: u64 = 16 << 20;

/// Messages per transaction of [`SledStore::import_messages`].
pub(crate) const IMPORT_BATCH: usize = 1_000;

/// Bounds the in-memory batch when purging a long history.
const PURGE_BATCH: usize = 1024;

mod usage;

type TxResult<T> = Result<T, TxError<StoreError>>;

/// The sled-backed [`Store`]. Cloning is cheap and shares the database.
#[derive(Clone)]
pub struct SledStore {
    path: PathBuf,
    sessions: Tree,
    activity: Tree,
    messages: Tree,
    turns: Tree,
    /// Quota counts (`usage`).
    usage: Tree,
    /// Held by deletions and by the insert path of creations.
    lifecycle: Arc<tokio::sync::Mutex<()>>,
    /// Flushes for every writer at once (group commit).
    flusher: Flusher,
    /// Message bodies above [`bodies::INLINE_MAX`], outside the trees.
    bodies: Bodies,
    /// The free-space reserve, and whether sled failed a write.
    disk: Arc<Disk>,
    /// Every owner's stored bytes (`usage.rs`).
    owners: Arc<usage::Owners>,
}

// sled's own Debug dumps every tree's contents.
impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SledStore {
    /// Opens (or creates) the database at `path` with a 16 MiB page cache.
    /// A locked or unreadable database is an error.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// [`SledStore::open`] with sled's page cache bounded to `cache_bytes`
    /// (sled's own default is 1 GiB, which lets freshly written data stay
    /// resident).
    pub fn open_with_cache(path: impl AsRef<Path>, cache_bytes: u64) -> Result<Self, StoreError> {
        let path = path.as_ref().to_owned();
        let fail = |e: String| StoreError::Backend(format!("opening {}: {e}", path.display()));
        // sled 0.34 panics on some damaged files instead of returning an
        // error; a bad data directory must not take the process down.
        let opened = std::panic::catch_unwind(AssertUnwindSafe(|| {
            let db = sled::Config::new()
                .path(&path)
                .cache_capacity(cache_bytes)
                .open()?;
            let [s, a, m, t] = [SESSIONS, ACTIVITY, MESSAGES, TURNS].map(|n| db.open_tree(n));
            let u = db.open_tree(USAGE)?;
            Ok::<_, sled::Error>((db, s?, a?, m?, t?, u))
        }));
        let (db, sessions, activity, messages, turns, usage) = opened
            .map_err(|_| fail("sled panicked (damaged database?)".to_owned()))?
            .map_err(|e| fail(e.to_string()))?;
        usage::init(&sessions, &usage)?;
        let owners = Arc::new(usage::Owners::load(&sessions, &usage)?);
        let bodies = Bodies::open(&path, |key| {
            messages.contains_key(key).map_err(|e| backend("read", e))
        })?;
        let lifecycle = Arc::default();
        // The flusher keeps the database open (the trees share it too).
        let flusher = Flusher::start(db)?;
        let disk = Arc::new(Disk::new(path.clone(), disk::DEFAULT_MIN_FREE_BYTES));
        Ok(Self {
            path,
            sessions,
            activity,
            messages,
            turns,
            usage,
            lifecycle,
            flusher,
            bodies,
            disk,
            owners,
        })
    }

    /// Keeps `bytes` free on the data directory's filesystem instead of
    /// the default 128 MiB: under it new sessions and turns are refused,
    /// under a quarter of it running turns' writes too, each with
    /// [`StoreError::DiskFull`] and nothing written (see `disk.rs` for why
    /// sled must never meet a full disk). 0 turns the reserve off.
    #[must_use]
    pub fn with_min_free(mut self, bytes: u64) -> Self {
        self.disk = Arc::new(Disk::new(self.path.clone(), bytes));
        self
    }

    /// A transaction's error; a storage failure (sled's log write) marks
    /// the store failed.
    fn tx_failed(&self, e: TransactionError<StoreError>) -> StoreError {
        match e {
            TransactionError::Abort(e) => e,
            TransactionError::Storage(e @ sled::Error::Io(_)) => {
                self.disk.fail(backend("transaction", e))
            }
            TransactionError::Storage(e) => backend("transaction", e),
        }
    }

    fn load_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        load_session(&self.sessions, id)
    }

    /// Appends `messages` to a session in transactions of up to
    /// `IMPORT_BATCH` (1,000) messages and one flush at the end: a bulk import
    /// (migrations, benchmarks). Returns the last stored seq. Not for
    /// turns: nothing is acknowledged per message.
    pub async fn import_messages(
        &self,
        session_id: &str,
        messages: Vec<NewMessage>,
    ) -> Result<u64, StoreError> {
        self.disk.admit()?;
        let now = SystemTime::now();
        let mut last = 0;
        for chunk in messages.chunks(IMPORT_BATCH) {
            let mut outgoing = Vec::with_capacity(chunk.len());
            for message in chunk {
                outgoing.push(self.outgoing(session_id, message).await?);
            }
            last = (&self.sessions, &self.activity, &self.messages)
                .transaction(|(s, a, m)| {
                    let mut seq = 0;
                    for message in &outgoing {
                        let (session, stored) = append_tx(s, a, m, session_id, None, message, now)?;
                        write_session_tx(s, &session)?;
                        seq = stored.seq;
                    }
                    Ok(seq)
                })
                .map_err(|e| self.tx_failed(e))?;
            outgoing.into_iter().for_each(keep_body);
        }
        self.flush_db().await?;
        Ok(last)
    }

    /// `new` ready for [`append_tx`]: a body above [`bodies::INLINE_MAX`]
    /// is written to its file (and synced) first.
    async fn outgoing<'a>(
        &self,
        session_id: &str,
        new: &'a NewMessage,
    ) -> Result<Outgoing<'a>, StoreError> {
        let Some(body) = bodies::external_body(new)? else {
            return Ok((new, None));
        };
        let (files, prefix) = (self.bodies.clone(), body_key_prefix(session_id));
        let pending = blocking(move || files.write(&prefix, &body)).await?;
        Ok((new, Some(pending)))
    }

    fn session_exists(&self, id: &str) -> Result<bool, StoreError> {
        let found = self
            .sessions
            .contains_key(id)
            .map_err(|e| backend("read", e))?;
        Ok(found && !id.contains('\0'))
    }

    /// Not `flush_async`: it waits on sled's small internal threadpool for a
    /// log write queued on that same pool, so a few concurrent flushes
    /// deadlock it (sled 0.34.7). A blocking flush on the store's flusher
    /// thread instead, shared by every writer waiting at the time.
    async fn flush_db(&self) -> Result<(), StoreError> {
        // sled keeps the first failed log write as an error for every
        // later call: the store has failed (disk.rs).
        self.flusher.flush().await.map_err(|e| self.disk.fail(e))
    }

    /// Ends a turn's write that began at `started`: records its duration
    /// (the transaction, not the flush), then makes it durable.
    async fn durable_write(&self, started: std::time::Instant) -> Result<(), StoreError> {
        crate::telemetry::metrics::timed(
            &crate::telemetry::metrics::get().store_write,
            started.elapsed(),
        );
        self.flush_db().await
    }

    /// Removes messages and turns stored under `id` (see the module doc).
    async fn purge_children(&self, id: &str) -> Result<(), StoreError> {
        let (messages, turns, prefix) = (self.messages.clone(), self.turns.clone(), child(id));
        let files = self.bodies.clone();
        blocking(move || {
            purge_prefix(&messages, &prefix, |keys| files.forget(&prefix, keys))?;
            purge_prefix(&turns, &prefix, |_| {})
        })
        .await
    }

    /// The scan behind [`Store::history`], or `None` when it finds nothing.
    fn history_scan(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<Option<HistoryScan>, StoreError> {
        let Some(first) = query.after_seq.checked_add(1) else {
            return Ok(None);
        };
        if query.limit == 0 || session_id.contains('\0') {
            return Ok(None);
        }
        let Some(session) = self.load_session(session_id)? else {
            return Ok(None);
        };
        Ok(Some(HistoryScan {
            messages: self.messages.clone(),
            bodies: self.bodies.clone(),
            body_keys: body_key_prefix(session_id),
            range: message_key(session_id, first)..=message_key(session_id, u64::MAX),
            session,
            query: *query,
        }))
    }

    fn has_children(&self, id: &str) -> Result<bool, StoreError> {
        for tree in [&self.messages, &self.turns] {
            let first = tree.scan_prefix(child(id)).next().transpose();
            if first.map_err(|e| backend("scan", e))?.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[async_trait]
impl Store for SledStore {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.create_session_within(new, &WriteQuota::default())
            .await
    }

    async fn create_session_within(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        let id = new.id.clone().unwrap_or_else(new_id);
        if let Some(existing) = self.load_session(&id)? {
            return Ok(CreateOutcome::Existing(existing));
        }
        if id.contains('\0') || new.owner.contains('\0') {
            let reason = "session id and owner must not contain NUL";
            return Err(StoreError::Backend(reason.to_owned()));
        }
        self.disk.admit()?;
        let guard = self.lifecycle.lock().await;
        // Again under the lock: a concurrent create may have won, and its
        // messages must not be purged as leftovers.
        if let Some(existing) = self.load_session(&id)? {
            return Ok(CreateOutcome::Existing(existing));
        }
        if self.has_children(&id)? {
            tracing::warn!(session_id = %id, "purging leftovers of an interrupted delete");
            self.purge_children(&id).await?;
        }
        let session = new.into_session(id, SystemTime::now());
        let outcome = (&self.sessions, &self.activity, &self.usage)
            .transaction(|(s, a, u)| {
                if let Some(existing) = session_tx(s, &session.id)? {
                    return Ok(CreateOutcome::Existing(existing));
                }
                usage::add_session_tx(u, &session.owner, &quota.limits)?;
                write_session_tx(s, &session)?;
                a.insert(activity_key(&session), IVec::default())?;
                Ok(CreateOutcome::Created(session.clone()))
            })
            .map_err(|e| self.tx_failed(e))?;
        drop(guard);
        if matches!(outcome, CreateOutcome::Created(_)) {
            self.flush_db().await?;
        }
        Ok(outcome)
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.load_session(id)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        let (sessions, activity) = (self.sessions.clone(), self.activity.clone());
        let (owner, query) = (owner.to_owned(), query.clone());
        blocking(move || list_blocking(&sessions, &activity, &owner, &query)).await
    }

    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError> {
        self.disk.admit()?;
        let now = SystemTime::now();
        let session = (&self.sessions, &self.activity)
            .transaction(|(s, a)| {
                let mut session = session_tx(s, id)?.ok_or_else(not_found)?;
                let old_index = activity_key(&session);
                session.apply(update.clone());
                session.touch(now);
                reindex_tx(a, &session, old_index)?;
                write_session_tx(s, &session)?;
                Ok(session)
            })
            .map_err(|e| self.tx_failed(e))?;
        self.flush_db().await?;
        Ok(session)
    }

    async fn delete_session(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        let guard = self.lifecycle.lock().await;
        let removed = (&self.sessions, &self.activity, &self.usage)
            .transaction(|(s, a, u)| {
                let Some(raw) = s.get(id.as_bytes())? else {
                    return Ok(None);
                };
                // A corrupt record must stay deletable; its index entry then
                // dangles, and listing skips it.
                match decode::<Session>(SESSIONS, id.as_bytes(), &raw) {
                    Ok(session) if incarnation.is_some_and(|i| !session.is_incarnation(i)) => {
                        Ok(None)
                    }
                    Ok(session) => {
                        s.remove(id.as_bytes())?;
                        drop(a.remove(activity_key(&session))?);
                        let bytes = usage::remove_session_tx(u, &session.owner, id)?;
                        Ok(Some(Some((session.owner, bytes))))
                    }
                    Err(e) => {
                        tracing::warn!(session_id = %id, error = %e, "deleting a corrupt session record");
                        s.remove(id.as_bytes())?;
                        Ok(Some(None))
                    }
                }
            })
            .map_err(|e| self.tx_failed(e))?;
        if let Some(Some((owner, bytes))) = &removed {
            self.owners.forget(owner, *bytes);
        }
        let removed = removed.is_some();
        if removed {
            self.purge_children(id).await?;
            drop(guard);
            self.flush_db().await?;
        }
        Ok(removed)
    }

    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.begin_turn_within(turn, user_message, &WriteQuota::default())
            .await
    }

    async fn begin_turn_within(
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
        let trees = (
            &self.sessions,
            &self.activity,
            &self.messages,
            &self.turns,
            &self.usage,
        );
        // Reserved on the first run of the transaction's closure (sled may
        // run it again after a conflict; the owner is the same).
        let reserved = std::cell::RefCell::new(None);
        let message = trees
            .transaction(|(s, a, m, t, u)| {
                let (mut session, message) = append_tx(
                    s,
                    a,
                    m,
                    &turn.session_id,
                    Some(&turn.incarnation),
                    &user_message,
                    now,
                )?;
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
            })
            .map_err(|e| self.tx_failed(e))?;
        if let Some(held) = reserved.into_inner() {
            held.commit();
        }
        keep_body(user_message);
        self.durable_write(write_started).await?;
        Ok(message)
    }

    async fn append_message(
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

    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        let write_started = std::time::Instant::now();
        let record = encode(&turn)?;
        (&self.sessions, &self.turns)
            .transaction(|(s, t)| {
                let mut session = session_as_tx(s, &turn.session_id, &turn.incarnation)?;
                t.insert(turn_key(&turn.session_id, &turn.turn_id), record.clone())?;
                if session.finish_turn(&turn) {
                    write_session_tx(s, &session)?;
                }
                Ok(())
            })
            .map_err(|e| self.tx_failed(e))?;
        self.durable_write(write_started).await
    }

    async fn finish_turn_with(
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
        let written = (&self.sessions, &self.activity, &self.messages, &self.turns)
            .transaction(|(s, a, m, t)| {
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
                t.insert(turn_key(&turn.session_id, &turn.turn_id), record.clone())?;
                session.finish_turn(&turn);
                write_session_tx(s, &session)?;
                Ok(stored)
            })
            .map_err(|e| self.tx_failed(e))?;
        last.into_iter().for_each(keep_body);
        self.durable_write(write_started).await?;
        Ok(written)
    }

    async fn get_turn(
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

    async fn find_turn_by_request(
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

    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        let Some(scan) = self.history_scan(session_id, query)? else {
            return Ok(MessagePage::default());
        };
        blocking(move || scan.run()).await
    }

    async fn history_inline(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Message>, StoreError> {
        let query = HistoryQuery::unbounded(after_seq, limit, false);
        match self.history_scan(session_id, &query)? {
            Some(scan) => Ok(scan.run()?.messages),
            None => Ok(Vec::new()),
        }
    }

    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        let now = SystemTime::now();
        let summary = self.outgoing(session_id, &summary).await?;
        let written = (&self.sessions, &self.activity, &self.messages)
            .transaction(|(s, a, m)| {
                let session = session_as_tx(s, session_id, incarnation)?;
                super::check_compaction(&session, summary.0, through_seq)
                    .map_err(TxError::Abort)?;
                let (mut session, stored) =
                    append_tx(s, a, m, session_id, Some(incarnation), &summary, now)?;
                session.compacted(through_seq, stored.seq);
                write_session_tx(s, &session)?;
                Ok(stored)
            })
            .map_err(|e| self.tx_failed(e))?;
        keep_body(summary);
        self.flush_db().await?;
        Ok(written)
    }

    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        let set = self
            .sessions
            .transaction(|s| {
                let mut session = session_as_tx(s, session_id, incarnation)?;
                if !session.set_title_if_empty(title) {
                    return Ok(false);
                }
                write_session_tx(s, &session)?;
                Ok(true)
            })
            .map_err(|e| self.tx_failed(e))?;
        if set {
            self.flush_db().await?;
        }
        Ok(set)
    }

    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        let (sessions, turns) = (self.sessions.clone(), self.turns.clone());
        let changed = blocking(move || recover_blocking(&sessions, &turns)).await?;
        self.flush_db().await?;
        Ok(changed)
    }

    async fn count_sessions(&self) -> Result<u64, StoreError> {
        let sessions = self.sessions.clone();
        let len = blocking(move || Ok(sessions.len())).await?;
        Ok(u64::try_from(len).unwrap_or(u64::MAX))
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.flush_db().await
    }

    /// The reserve and the failed state (`disk.rs`): a statvfs, no write.
    async fn ping(&self) -> Result<(), StoreError> {
        self.disk.admit()
    }
}

/// One page of a session's messages, read by [`HistoryScan::run`].
struct HistoryScan {
    messages: Tree,
    bodies: Bodies,
    /// Where the reference keys of the session's body files begin.
    body_keys: Vec<u8>,
    range: std::ops::RangeInclusive<Vec<u8>>,
    session: Session,
    query: HistoryQuery,
}

impl HistoryScan {
    /// Reads up to the page's bounds and no further.
    fn run(self) -> Result<MessagePage, StoreError> {
        let mut page = MessagePage::default();
        let mut budget = Budget::new(self.query.max_bytes);
        for entry in self.messages.range(self.range) {
            let (key, raw) = entry.map_err(|e| backend("scan", e))?;
            let mut message = self.bodies.load(&key, &raw, |name| {
                [self.body_keys.as_slice(), name.as_bytes()].concat()
            })?;
            message.compacted = self.session.covers(&message);
            if !self.query.include_compacted && message.compacted {
                continue;
            }
            if !budget.admit(message_wire_bytes(&message)) {
                page.more = true;
                break;
            }
            page.messages.push(message);
            if page.messages.len() == self.query.limit {
                break;
            }
        }
        Ok(page)
    }
}

fn list_blocking(
    sessions: &Tree,
    activity: &Tree,
    owner: &str,
    query: &ListQuery,
) -> Result<SessionPage, StoreError> {
    let mut page = SessionPage::default();
    let mut budget = Budget::new(query.max_bytes);
    if query.limit == 0 || owner.contains('\0') {
        return Ok(page);
    }
    let prefix = child(owner);
    let mut owner_end = owner.as_bytes().to_vec();
    owner_end.push(1);
    let upper = match &query.after {
        None => owner_end,
        Some(cursor) => match cursor.last_active_at.duration_since(UNIX_EPOCH) {
            // Nothing stored is older than the epoch.
            Err(_) => return Ok(page),
            Ok(since) => match u64::try_from(since.as_nanos()) {
                Ok(nanos) => index_key(owner, nanos, &cursor.id),
                Err(_) => owner_end,
            },
        },
    };
    for entry in activity
        .range((Bound::Included(prefix.clone()), Bound::Excluded(upper)))
        .rev()
    {
        let (key, _) = entry.map_err(|e| backend("scan", e))?;
        let corrupt = |reason: &str| StoreError::Corrupt {
            key: printable(ACTIVITY, &key),
            reason: reason.to_owned(),
        };
        let rest = key
            .get(prefix.len()..)
            .ok_or_else(|| corrupt("key outside its prefix"))?;
        let (stamp, id) = rest
            .split_at_checked(8)
            .ok_or_else(|| corrupt("key too short"))?;
        let id = std::str::from_utf8(id).map_err(|_| corrupt("session id is not UTF-8"))?;
        let Some(session) = load_session(sessions, id)? else {
            continue;
        };
        if session.owner != owner || index_nanos(session.last_active_at).to_be_bytes() != stamp {
            tracing::debug!(session_id = %id, "skipping a stale activity index entry");
            continue;
        }
        if !query.admits(&session) {
            continue;
        }
        if page.sessions.len() == query.limit || !budget.admit(session_wire_bytes(&session)) {
            // One more match exists, so the next page is not empty.
            page.next = page.sessions.last().map(|last| ListCursor {
                last_active_at: last.last_active_at,
                id: last.id.clone(),
            });
            break;
        }
        page.sessions.push(session);
    }
    Ok(page)
}

fn recover_blocking(sessions: &Tree, turns: &Tree) -> Result<Vec<TurnRecord>, StoreError> {
    let now = SystemTime::now();
    let mut running = Vec::new();
    for entry in turns.iter() {
        let (key, raw) = entry.map_err(|e| backend("scan", e))?;
        if decode::<TurnRecord>(TURNS, &key, &raw)?.status == TurnStatus::Running {
            running.push(key);
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
    Ok(changed)
}

/// Stores `new` under the next seq; the caller writes the returned session
/// (possibly changed further) in the same transaction. With `incarnation`
/// the session must be that incarnation (every write but a bulk import).
fn append_tx(
    s: &TransactionalTree,
    a: &TransactionalTree,
    m: &TransactionalTree,
    session_id: &str,
    incarnation: Option<&str>,
    (new, body): &Outgoing<'_>,
    now: SystemTime,
) -> TxResult<(Session, Message)> {
    let mut session = match incarnation {
        Some(incarnation) => session_as_tx(s, session_id, incarnation)?,
        None => session_tx(s, session_id)?.ok_or_else(not_found)?,
    };
    let old_index = activity_key(&session);
    let message = session
        .append((*new).clone(), now)
        .ok_or_else(|| TxError::Abort(seq_exhausted()))?;
    let key = message_key(session_id, message.seq);
    match body {
        None => m.insert(key, encode(&message).map_err(TxError::Abort)?)?,
        Some(file) => {
            // The file's reference key, in the same transaction.
            let reference = [body_key_prefix(session_id).as_slice(), file.name()].concat();
            m.insert(reference, &message.seq.to_be_bytes()[..])?;
            m.insert(key, file.record(message.seq).map_err(TxError::Abort)?)?
        }
    };
    reindex_tx(a, &session, old_index)?;
    Ok((session, message))
}

/// Moves the session's listing index entry from `old_index` to where its
/// (touched) `last_active_at` puts it.
fn reindex_tx(a: &TransactionalTree, session: &Session, old_index: Vec<u8>) -> TxResult<()> {
    a.remove(old_index)?;
    a.insert(activity_key(session), IVec::default())?;
    Ok(())
}

fn session_tx(s: &TransactionalTree, id: &str) -> TxResult<Option<Session>> {
    match s.get(id.as_bytes())? {
        None => Ok(None),
        Some(raw) => decode(SESSIONS, id.as_bytes(), &raw)
            .map(Some)
            .map_err(TxError::Abort),
    }
}

/// The session `id` if it exists as `incarnation`; not found otherwise.
fn session_as_tx(s: &TransactionalTree, id: &str, incarnation: &str) -> TxResult<Session> {
    session_tx(s, id)?
        .filter(|session| session.is_incarnation(incarnation))
        .ok_or_else(not_found)
}

fn write_session_tx(s: &TransactionalTree, session: &Session) -> TxResult<()> {
    s.insert(
        session.id.as_bytes(),
        encode(session).map_err(TxError::Abort)?,
    )?;
    Ok(())
}

fn load_session(sessions: &Tree, id: &str) -> Result<Option<Session>, StoreError> {
    match sessions
        .get(id.as_bytes())
        .map_err(|e| backend("read", e))?
    {
        None => Ok(None),
        Some(raw) => decode(SESSIONS, id.as_bytes(), &raw).map(Some),
    }
}

/// The outgoing message's body file (if any) is referenced now.
fn keep_body((_, body): Outgoing<'_>) {
    if let Some(file) = body {
        file.keep();
    }
}

/// Removes every key under `prefix`, in batches; `removed` sees each
/// batch once it is gone.
fn purge_prefix(tree: &Tree, prefix: &[u8], removed: impl Fn(&[IVec])) -> Result<(), StoreError> {
    loop {
        let keys = tree.scan_prefix(prefix).keys().take(PURGE_BATCH);
        let keys = keys
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| backend("scan", e))?;
        if keys.is_empty() {
            return Ok(());
        }
        let mut batch = Batch::default();
        keys.iter().for_each(|key| batch.remove(key));
        tree.apply_batch(batch).map_err(|e| backend("delete", e))?;
        removed(&keys);
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let joined = tokio::task::spawn_blocking(work).await;
    joined.map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
}

pub(crate) fn encode<T: Serialize>(record: &T) -> Result<Vec<u8>, StoreError> {
    let mut out = vec![RECORD_VERSION];
    serde_json::to_writer(&mut out, record)
        .map_err(|e| StoreError::Backend(format!("encoding a record: {e}")))?;
    Ok(out)
}

pub(crate) fn decode<T: DeserializeOwned>(
    tree: &str,
    key: &[u8],
    value: &[u8],
) -> Result<T, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: printable(tree, key),
        reason,
    };
    match value.split_first() {
        None => Err(corrupt("empty value".to_owned())),
        Some((&RECORD_VERSION, json)) => serde_json::from_slice(json)
            .map_err(|e| corrupt(format!("undecodable version {RECORD_VERSION} record: {e}"))),
        Some((version, _)) => Err(corrupt(format!("unknown record version {version}"))),
    }
}

fn printable(tree: &str, key: &[u8]) -> String {
    format!("{tree}/{}", key.escape_ascii())
}

fn backend(what: &str, e: sled::Error) -> StoreError {
    match &e {
        sled::Error::Io(io) if disk::is_full(io) => {
            StoreError::DiskFull(format!("sled {what}: {e}"))
        }
        _ => StoreError::Backend(format!("sled {what}: {e}")),
    }
}

fn not_found() -> TxError<StoreError> {
    TxError::Abort(StoreError::SessionNotFound)
}

fn tx_err(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => backend("transaction", e),
    }
}

/// `parent \0`: the prefix of every key below `parent`.
fn child(parent: &str) -> Vec<u8> {
    [parent.as_bytes(), b"\0"].concat()
}

fn message_key(session_id: &str, seq: u64) -> Vec<u8> {
    [child(session_id).as_slice(), &seq.to_be_bytes()].concat()
}

/// What the reference keys of a session's body files begin with: after
/// every message key of the session (`u64::MAX` is the largest seq, and a
/// reference key is longer), so history scans never reach them, and under
/// its prefix, so purging the session removes them.
fn body_key_prefix(session_id: &str) -> Vec<u8> {
    message_key(session_id, u64::MAX)
}

fn turn_key(session_id: &str, turn_id: &str) -> Vec<u8> {
    [child(session_id).as_slice(), turn_id.as_bytes()].concat()
}

fn activity_key(session: &Session) -> Vec<u8> {
    index_key(
        &session.owner,
        index_nanos(session.last_active_at),
        &session.id,
    )
}

fn index_key(owner: &str, nanos: u64, id: &str) -> Vec<u8> {
    [child(owner).as_slice(), &nanos.to_be_bytes(), id.as_bytes()].concat()
}

/// Saturating: stored times come from the local clock, which only leaves
/// u64 nanoseconds in the year 2554.
fn index_nanos(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH);
    since.map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{self, running_turn, text_message};
    use crate::types::Role;

    fn open_temp() -> (SledStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        (SledStore::open(dir.path().join("db")).expect("open"), dir)
    }

    fn user(turn_id: &str) -> NewMessage {
        text_message(turn_id, Role::User, "q")
    }

    fn assert_corrupt<T: std::fmt::Debug>(result: Result<T, StoreError>, reason: &str) {
        match result {
            Err(StoreError::Corrupt { reason: got, .. }) => assert!(got.contains(reason), "{got}"),
            other => panic!("expected Corrupt ({reason}), got {other:?}"),
        }
    }

    #[tokio::test]
    async fn reopen_keeps_sessions_and_messages() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SledStore::open(dir.path().join("db")).expect("open");
        let id = testing::seed_history(&store, 3).await;
        store
            .begin_turn(
                running_turn(&id, &testing::incarnation(&store, &id).await, "t1"),
                user("t1"),
            )
            .await
            .expect("begin");
        let before = store.get_session(&id).await.expect("get");
        drop(store);
        let store = SledStore::open(dir.path().join("db")).expect("reopen");
        assert_eq!(store.get_session(&id).await.expect("get"), before);
        let history = store.history(&id, 0, 100, true).await.expect("history");
        assert!(history.iter().map(|m| m.seq).eq(1..=4));
        let query = ListQuery {
            limit: 5,
            ..ListQuery::default()
        };
        assert_eq!(
            store
                .list_sessions("seed", &query)
                .await
                .expect("list")
                .sessions
                .len(),
            1
        );
        assert_eq!(store.recover_interrupted().await.expect("recover").len(), 1);
        assert_eq!(
            store
                .append_message(&id, &testing::incarnation(&store, &id).await, user("t2"))
                .await
                .expect("append")
                .seq,
            5
        );
    }

    #[tokio::test]
    async fn garbage_values_are_corrupt() {
        let (store, _dir) = open_temp();
        let broken = testing::seed_history(&store, 3).await;
        let intact = testing::seed_history(&store, 3).await;
        store
            .begin_turn(
                running_turn(&intact, &testing::incarnation(&store, &intact).await, "t1"),
                user("t1"),
            )
            .await
            .expect("begin");
        store
            .sessions
            .insert(broken.as_bytes(), &b"\x01{not json"[..])
            .expect("raw write");
        assert_corrupt(store.get_session(&broken).await, "undecodable version 1");
        let query = ListQuery {
            limit: 10,
            ..ListQuery::default()
        };
        assert_corrupt(store.list_sessions("seed", &query).await, "undecodable");
        assert_corrupt(
            store.append_message(&broken, "", user("t")).await,
            "undecodable",
        );
        store
            .messages
            .insert(message_key(&intact, 2), &b"\xff\xfe"[..])
            .expect("raw write");
        assert_corrupt(
            store.history(&intact, 0, 10, true).await,
            "unknown record version 255",
        );
        assert_eq!(
            store
                .history(&intact, 2, 10, true)
                .await
                .expect("after it")
                .len(),
            2
        );
        store
            .turns
            .insert(turn_key(&intact, "t1"), IVec::default())
            .expect("raw write");
        assert_corrupt(store.get_turn(&intact, "t1").await, "empty value");
        assert_corrupt(store.recover_interrupted().await, "empty value");
        assert!(
            store
                .delete_session(&broken, None)
                .await
                .expect("a corrupt session is deletable")
        );
        assert_eq!(
            store
                .list_sessions("seed", &query)
                .await
                .expect("list")
                .sessions
                .len(),
            1
        );
    }

    #[tokio::test]
    async fn unknown_version_is_corrupt() {
        let (store, _dir) = open_temp();
        let id = testing::seed_history(&store, 1).await;
        let session = store.get_session(&id).await.expect("get").expect("exists");
        let mut value = encode(&session).expect("encode");
        value[0] = RECORD_VERSION + 1;
        store
            .sessions
            .insert(id.as_bytes(), value)
            .expect("raw write");
        assert_corrupt(store.get_session(&id).await, "unknown record version 2");
        let update = store.update_session(&id, SessionUpdate::default()).await;
        assert_corrupt(update, "unknown record version 2");
    }

    #[tokio::test]
    async fn compacted_messages_hidden_unless_asked() {
        let (store, _dir) = open_temp();
        let id = testing::seed_history(&store, 5).await;
        for seq in [1, 3] {
            let mut message = store.history(&id, seq - 1, 1, true).await.expect("history");
            message[0].compacted = true;
            let value = encode(&message[0]).expect("encode");
            store
                .messages
                .insert(message_key(&id, seq), value)
                .expect("raw write");
        }
        testing::check_compacted_filter(&store, &id, &[1, 3]).await;
    }

    #[tokio::test]
    async fn locked_or_unusable_path_is_an_error() {
        let (_store, dir) = open_temp();
        let second = SledStore::open(dir.path().join("db"));
        assert!(matches!(second, Err(StoreError::Backend(_))), "{second:?}");
        std::fs::write(dir.path().join("file"), b"not a directory").expect("write");
        let opened = SledStore::open(dir.path().join("file"));
        assert!(matches!(opened, Err(StoreError::Backend(_))), "{opened:?}");
    }

    /// A crash between the two steps of a delete leaves orphans behind.
    #[tokio::test]
    async fn orphans_of_an_interrupted_delete_stay_invisible() {
        let (store, _dir) = open_temp();
        let id = testing::seed_history(&store, 2).await;
        store
            .begin_turn(
                running_turn(&id, &testing::incarnation(&store, &id).await, "t1"),
                user("t1"),
            )
            .await
            .expect("begin");
        let session = store.get_session(&id).await.expect("get").expect("exists");
        store.sessions.remove(id.as_bytes()).expect("raw remove");
        store
            .activity
            .remove(activity_key(&session))
            .expect("raw remove");
        assert!(
            store
                .history(&id, 0, 10, true)
                .await
                .expect("history")
                .is_empty()
        );
        assert_eq!(store.get_turn(&id, "t1").await.expect("get_turn"), None);
        assert!(
            store
                .recover_interrupted()
                .await
                .expect("recover")
                .is_empty()
        );
        assert_eq!(store.turns.len(), 0, "recovery drops orphan turns");
        let new = NewSession {
            id: Some(id.clone()),
            ..NewSession::default()
        };
        assert!(matches!(
            store.create_session(new).await,
            Ok(CreateOutcome::Created(_))
        ));
        assert_eq!(
            store.messages.len(),
            0,
            "re-creating the id purges its leftovers"
        );
        assert_eq!(
            store
                .append_message(&id, &testing::incarnation(&store, &id).await, user("t2"))
                .await
                .expect("append")
                .seq,
            1
        );
    }

    #[tokio::test]
    async fn activity_index_has_one_current_entry_per_session() {
        let (store, _dir) = open_temp();
        let a = testing::seed_history(&store, 3).await;
        let b = testing::seed_history(&store, 1).await;
        let update = SessionUpdate {
            title: Some("t".to_owned()),
            ..SessionUpdate::default()
        };
        store.update_session(&a, update).await.expect("update");
        store
            .begin_turn(
                running_turn(&b, &testing::incarnation(&store, &b).await, "t1"),
                user("t1"),
            )
            .await
            .expect("begin");
        let doomed = testing::seed_history(&store, 1).await;
        assert!(store.delete_session(&doomed, None).await.expect("delete"));
        let mut expected = Vec::new();
        for id in [&a, &b] {
            let session = store.get_session(id).await.expect("get").expect("exists");
            expected.push(activity_key(&session));
        }
        expected.sort();
        let keys = store
            .activity
            .iter()
            .keys()
            .map(|k| k.expect("key").to_vec());
        assert_eq!(keys.collect::<Vec<_>>(), expected);
    }

    #[tokio::test]
    async fn nul_in_ids_is_refused() {
        let (store, _dir) = open_temp();
        let bad_id = NewSession {
            id: Some("a\0b".to_owned()),
            ..NewSession::default()
        };
        let bad_owner = NewSession {
            owner: "o\0".to_owned(),
            ..NewSession::default()
        };
        for new in [bad_id, bad_owner] {
            assert!(matches!(
                store.create_session(new).await,
                Err(StoreError::Backend(_))
            ));
        }
        assert_eq!(store.count_sessions().await.expect("count"), 0);
        assert_eq!(store.get_turn("a\0b", "t").await.expect("get_turn"), None);
    }
}
