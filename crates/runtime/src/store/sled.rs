//! The on-disk [`Store`], on sled 0.34.
//!
//! # Layout
//!
//! Five trees (and `usage`, see `usage.rs`). Values are records
//! (`store/record.rs`: one version byte, then serde_json); another version
//! byte, or a record that does not decode, is [`StoreError::Corrupt`].
//!
//! | tree               | key                                                | value          |
//! |--------------------|----------------------------------------------------|----------------|
//! | `sessions`         | id                                                 | [`Session`]    |
//! | `session_activity` | owner `\0` last_active_at (u64 BE ns since epoch) id | empty        |
//! | `messages`         | session id `\0` seq (u64 BE)                       | [`Message`]    |
//! | `messages`         | session id `\0` `u64::MAX` (BE) body file name     | seq (u64 BE)   |
//! | `turns`            | session id `\0` turn id                            | [`TurnRecord`] |
//! | `inbox`            | session id `\0` queued id                          | [`Queued`]     |
//!
//! A message record above 4 KiB keeps its body in a file of its own and
//! only a reference (version byte 2) in the tree, and the file's name under
//! the session's prefix, after every seq: see `bodies.rs` for why (sled's
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
//!
//! # Files
//!
//! This file opens the database and maps the [`Store`] calls; by topic:
//! `sessions.rs`, `turns.rs`, `history.rs`, `inbox.rs`; the keys in `keys.rs`, the
//! pieces of every transaction in `tx.rs`; large bodies in `bodies.rs`,
//! the free-space reserve in `disk.rs`, quota counts in `usage.rs`.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use sled::Tree;
use sled::transaction::{TransactionError, Transactional};

mod agents;
mod bodies;
mod daily;
mod disk;
mod history;
mod inbox;
mod keys;
mod offboard;
mod paused;
mod sessions;
#[cfg(test)]
mod tests;
mod turns;
mod tx;
mod usage;

use self::bodies::{Bodies, Outgoing};
use self::disk::Disk;
use self::keys::body_key_prefix;
use self::tx::{append_tx, load_session, write_session_tx};
use super::flusher::Flusher;
use super::{
    CreateOutcome, HistoryQuery, Leases, ListQuery, MessagePage, SessionPage, Store, StoreError,
    record,
};
use crate::quota::{DailySpent, WriteQuota};
#[cfg(doc)]
use crate::types::Queued;
use crate::types::{Message, NewMessage, NewSession, Session, SessionUpdate, TurnRecord};

const SESSIONS: &str = "sessions";
const ACTIVITY: &str = "session_activity";
const MESSAGES: &str = "messages";
const TURNS: &str = "turns";
const USAGE: &str = "usage";
const INBOX: &str = "inbox";
const AGENTS: &str = "agents";

/// The page cache of [`SledStore::open`]: 16 MiB.
pub(crate) const DEFAULT_CACHE_BYTES: u64 = 16 << 20;

/// Messages per transaction of [`SledStore::import_messages`].
pub(crate) const IMPORT_BATCH: usize = 1_000;

/// Bounds the in-memory batch when purging a long history.
const PURGE_BATCH: usize = 1024;

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
    /// Queued messages (`inbox.rs`).
    inbox: Tree,
    /// Agent versions and memory blocks (`agents.rs`).
    agents: Tree,
    /// Serialises enqueues (each checks the inbox's bound).
    enqueues: Arc<tokio::sync::Mutex<()>>,
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
    /// Every owner's spending of the current day (`daily.rs`).
    daily: Arc<daily::Daily>,
    /// The paused turns (`paused.rs`).
    paused: Arc<paused::Paused>,
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
            let i = db.open_tree(INBOX)?;
            let g = db.open_tree(AGENTS)?;
            Ok::<_, sled::Error>((db, s?, a?, m?, t?, u, i, g))
        }));
        let (db, sessions, activity, messages, turns, usage, inbox, agents) = opened
            .map_err(|_| fail("sled panicked (damaged database?)".to_owned()))?
            .map_err(|e| fail(e.to_string()))?;
        usage::init(&sessions, &usage)?;
        let owners = Arc::new(usage::Owners::load(&sessions, &usage)?);
        let today = crate::quota::day_window(std::time::SystemTime::now()).0;
        let daily = Arc::new(daily::Daily::load(&usage, today)?);
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
            inbox,
            agents,
            enqueues: Arc::default(),
            lifecycle,
            flusher,
            bodies,
            disk,
            owners,
            daily,
            paused: Arc::default(),
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
}

#[async_trait]
impl Store for SledStore {
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError> {
        self.create(new, &WriteQuota::default()).await
    }

    async fn create_session_within(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        self.create(new, quota).await
    }

    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError> {
        self.load_session(id)
    }

    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError> {
        self.list(owner, query).await
    }

    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError> {
        self.update(id, update).await
    }

    async fn delete_session(
        &self,
        id: &str,
        incarnation: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.delete(id, incarnation).await
    }

    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.begin(turn, user_message, &WriteQuota::default()).await
    }

    async fn begin_turn_within(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        self.begin(turn, user_message, quota).await
    }

    async fn append_message(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError> {
        self.append(session_id, incarnation, message).await
    }

    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        self.finish(turn).await
    }

    async fn finish_turn_with(
        &self,
        turn: TurnRecord,
        last: Option<NewMessage>,
    ) -> Result<Option<Message>, StoreError> {
        self.finish_with(turn, last).await
    }

    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.turn(session_id, turn_id)
    }

    async fn list_turns(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        self.turns_before(session_id, before, limit).await
    }

    async fn count_turns(&self, session_id: &str) -> Result<u64, StoreError> {
        self.turn_count(session_id).await
    }

    async fn find_turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError> {
        self.turn_by_request(session_id, request_id).await
    }

    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError> {
        self.page(session_id, query).await
    }

    async fn history_inline(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Message>, StoreError> {
        self.inline(session_id, after_seq, limit)
    }

    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError> {
        self.compaction(session_id, incarnation, summary, through_seq)
            .await
    }

    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError> {
        self.title_if_empty(session_id, incarnation, title).await
    }

    async fn update_turn(&self, turn: TurnRecord) -> Result<(), StoreError> {
        self.put_running(turn).await
    }

    async fn resume_turn(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError> {
        self.resume(session_id, incarnation, turn_id).await
    }

    async fn expired_pauses(
        &self,
        now: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError> {
        let mut expired = Vec::new();
        for (session_id, turn_id) in self.paused.expired(now, limit) {
            match self.turn(&session_id, &turn_id)? {
                Some(turn) if turn.status == crate::types::TurnStatus::Paused => expired.push(turn),
                Some(_) | None => self.paused.forget(&session_id, &turn_id),
            }
        }
        Ok(expired)
    }

    async fn daily_spent(&self, owner: &str, day: u64) -> Result<DailySpent, StoreError> {
        self.daily.spent(&self.usage, owner, day)
    }

    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError> {
        self.recover().await
    }

    async fn count_sessions(&self) -> Result<u64, StoreError> {
        self.count().await
    }

    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<super::AgentSessions, StoreError> {
        self.of_agent(agent_id, after, limit).await
    }

    async fn forget_owner(&self, owner: &str) -> Result<(), StoreError> {
        self.forget(owner).await
    }

    async fn flush(&self) -> Result<(), StoreError> {
        self.flush_db().await
    }

    fn leases(&self) -> Option<&dyn Leases> {
        None
    }

    fn inbox(&self) -> &dyn crate::store::Inbox {
        self
    }

    fn agents(&self) -> &dyn crate::store::AgentStore {
        self
    }

    fn cluster(&self) -> Option<&dyn super::cluster::Cluster> {
        None
    }

    /// The reserve and the failed state (`disk.rs`): a statvfs, no write.
    async fn ping(&self) -> Result<(), StoreError> {
        self.disk.admit()
    }
}

/// The outgoing message's body file (if any) is referenced now.
fn keep_body((_, body): Outgoing<'_>) {
    if let Some(file) = body {
        file.keep();
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    let joined = tokio::task::spawn_blocking(work).await;
    joined.map_err(|e| StoreError::Backend(format!("store task failed: {e}")))?
}

/// The record under `key` of `tree`, or [`StoreError::Corrupt`] naming
/// them.
pub(crate) fn decode<T: DeserializeOwned>(
    tree: &str,
    key: &[u8],
    value: &[u8],
) -> Result<T, StoreError> {
    record::decode(value).map_err(|reason| StoreError::Corrupt {
        key: printable(tree, key),
        reason,
    })
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

fn tx_err(e: TransactionError<StoreError>) -> StoreError {
    match e {
        TransactionError::Abort(e) => e,
        TransactionError::Storage(e) => backend("transaction", e),
    }
}
