//! Durable state behind the [`Store`] trait: sessions, messages, turn records.
//!
//! Three implementations: [`SledStore`] (the default, on disk, one
//! process), [`PostgresStore`] (shared by several replicas, with session
//! leases; `docs/postgres.md`) and [`MemoryStore`] (tests). All pass the
//! same contract suite (the `agentrt-testkit` crate's `contract`, run by
//! `crates/runtime/tests/store_contract.rs`), and all apply the session
//! rules of the domain types (`types/session.rs`). Every write that returns
//! `Ok` is durable by the time it returns (sled: flushed; PostgreSQL:
//! committed), so the runtime may acknowledge it (`message_stored`).
//!
//! A store several replicas share also has [`Leases`] (one live turn per
//! session cluster-wide), reached through [`Store::leases`]; both engines
//! write the record encoding of `record.rs`. The sled engine is laid out by
//! topic under `sled/`, as the PostgreSQL one is under `postgres/`.

use std::time::SystemTime;

use async_trait::async_trait;

use crate::quota::WriteQuota;
use crate::types::{Message, NewMessage, NewSession, Session, SessionUpdate, TurnRecord};

pub(crate) mod agents;
pub(crate) mod cluster;
mod flusher;
pub(crate) mod inbox;
pub(crate) mod leases;
mod memory;
pub(crate) mod postgres;
#[cfg(test)]
mod quota_tests;
pub(crate) mod record;
pub(crate) mod size;
pub(crate) mod sled;
#[cfg(test)]
pub(crate) mod testing;

pub use self::sled::SledStore;
pub use agents::AgentStore;
pub use cluster::{Cluster, DefaultModel, Replica};
pub use inbox::Inbox;
pub use leases::{Lease, LeaseCursor, LeaseKey, Leases, ListedLease};
pub use memory::MemoryStore;
pub use postgres::{PgConfig, PgSslMode, PgTls, PostgresStore};
pub use size::{message_wire_bytes, session_wire_bytes, stored_bytes};

/// Errors of a store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The session does not exist.
    #[error("session not found")]
    SessionNotFound,
    /// A stored value could not be decoded (corrupted or of an unknown
    /// version). Never a panic.
    #[error("corrupt record at {key}: {reason}")]
    Corrupt {
        /// Where (tree and key, printable).
        key: String,
        /// What was wrong.
        reason: String,
    },
    /// The storage engine failed (I/O, lock, ...).
    #[error("storage failure: {0}")]
    Backend(String),
    /// The store cannot be reached now (a shared store's database is down
    /// or its connection pool timed out). Nothing was written; the call may
    /// be retried.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The filesystem (or the database server's disk) has no room for the
    /// write: free space is below the store's reserve, or a write failed
    /// with "no space left". Nothing was written; retrying once space is
    /// freed succeeds.
    #[error("the disk is full: {0}")]
    DiskFull(String),
    /// A store in this process failed a write (sled: its log write met a
    /// full or failing disk). Whether that write reached the disk is
    /// unknown — it may be there after a restart — and the store takes no
    /// write until the process restarts.
    #[error("the store failed a write and takes none until restarted: {0}")]
    Failed(String),
    /// [`Store::begin_turn`] on a shared store: another turn holds the
    /// session's unexpired lease (cluster-wide busy). Nothing was written.
    #[error("the session's lease is held by turn {} on replica {}", .0.turn_id, .0.replica_id)]
    Busy(Lease),
    /// A write that would take the owner past a quota
    /// ([`crate::quota`]). Nothing was written.
    #[error("{0}")]
    QuotaExceeded(crate::quota::QuotaExceeded),
    /// A turn meant to run queued message `id` found it gone from the
    /// inbox (it ran already, was reported failed, or was cleared).
    #[error("queued message {id} is no longer in the inbox")]
    NotQueued {
        /// The queued message.
        id: String,
    },
    /// [`Store::begin_turn`] while the session's latest turn is paused
    /// (waiting for caller results or approvals): the session is busy.
    /// Nothing was written.
    #[error("the session's turn {turn_id} is paused")]
    Paused {
        /// The paused turn.
        turn_id: String,
    },
    /// [`Store::resume_turn`] of a turn that is not paused (it resumed
    /// elsewhere, or ended). Nothing was written.
    #[error("turn {turn_id} is not paused")]
    NotPaused {
        /// The turn.
        turn_id: String,
    },
    /// A write for a turn whose lease this replica no longer holds (it
    /// expired and may have been taken over). Nothing was written; the turn
    /// must stop and store nothing more.
    #[error("this replica no longer holds the lease of turn {turn_id}")]
    LeaseLost {
        /// The turn whose write was refused.
        turn_id: String,
    },
}

/// The result stored for a tool call whose turn ended without it: every
/// tool call in history has exactly one result. Pure, so a store can use it
/// inside its own transaction: for `turn`'s messages (any order, other
/// turns' messages ignored), one `Tool` message per call without a result,
/// saying `why`.
pub fn open_call_results(turn_id: &str, messages: &[Message], why: &str) -> Vec<NewMessage> {
    results_for(turn_id, open_calls(turn_id, messages), why)
}

/// [`open_call_results`] for a turn whose process is gone, already marked
/// interrupted — or paused, when it waited for caller results or
/// approvals: a paused turn keeps the calls it waits for open (answered
/// when it resumes) — unless none of them is open any more, and then it is
/// interrupted like any other.
pub fn settle_open_calls(
    turn: &mut TurnRecord,
    messages: &[Message],
    why: &str,
    now: std::time::SystemTime,
) -> Vec<NewMessage> {
    let open = open_calls(&turn.turn_id, messages);
    let ids: Vec<String> = open.iter().map(|(id, _)| id.clone()).collect();
    turn.settle_pause(&ids, now);
    let open = if turn.status == crate::types::TurnStatus::Paused {
        open.into_iter()
            .filter(|(id, _)| !turn.waits_for(id))
            .collect()
    } else {
        open
    };
    results_for(&turn.turn_id, open, why)
}

/// The tool calls of `turn_id` in `messages` without a result: (id, name).
fn open_calls(turn_id: &str, messages: &[Message]) -> Vec<(String, String)> {
    use crate::types::ContentBlock;
    let mut calls = Vec::new();
    let mut answered = std::collections::HashSet::new();
    for m in messages.iter().filter(|m| m.body.turn_id == turn_id) {
        for block in &m.body.content {
            match block {
                ContentBlock::ToolCall { id, name, .. } => calls.push((id.clone(), name.clone())),
                ContentBlock::ToolResult { call_id, .. } => {
                    answered.insert(call_id.clone());
                }
                _ => {}
            }
        }
    }
    calls.retain(|(id, _)| !answered.contains(id));
    calls
}

/// One interrupted result saying `why` per call.
fn results_for(turn_id: &str, calls: Vec<(String, String)>, why: &str) -> Vec<NewMessage> {
    use crate::types::{ContentBlock, Role};
    calls
        .into_iter()
        .map(|(call_id, name)| {
            NewMessage::new(
                turn_id,
                Role::Tool,
                // Whether it ran, nobody here can tell.
                vec![ContentBlock::ToolResult {
                    call_id,
                    name,
                    content: why.to_owned(),
                    is_error: true,
                    interrupted: Some(crate::types::Interrupted::OutcomeUnknown),
                    media: Vec::new(),
                }],
            )
        })
        .collect()
}

/// The tool result [`Store::recover_interrupted`] and
/// [`Leases::sweep_expired_leases`] store for a call a dead process never
/// finished.
pub const INTERRUPTED_TOOL: &str = "the server stopped before this tool call finished";

/// Result of [`Store::create_session`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    /// A new session was stored.
    Created(Session),
    /// A session with that id already existed; it is returned unchanged
    /// (the caller decides whether the owner matches).
    Existing(Session),
}

/// A page of [`Store::sessions_of_agent`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentSessions {
    /// In id order.
    pub sessions: Vec<Session>,
    /// Where the next page starts (exclusive); `None` at the end.
    pub next: Option<String>,
}

/// A page request for [`Store::list_sessions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// Only this agent's sessions when set.
    pub agent_id: Option<String>,
    /// Only the delegate sessions of this parent (its stored key) when set.
    pub parent_session_id: Option<String>,
    /// Include archived sessions.
    pub include_archived: bool,
    /// Maximum sessions returned (the caller bounds it).
    pub limit: usize,
    /// Continue after this cursor (from a previous [`SessionPage`]).
    pub after: Option<ListCursor>,
    /// The page ends before a session that would take the sum of
    /// [`session_wire_bytes`] past this; the first session is returned
    /// whatever its size. Default: no bound.
    pub max_bytes: usize,
}

impl Default for ListQuery {
    fn default() -> Self {
        Self {
            agent_id: None,
            parent_session_id: None,
            include_archived: false,
            limit: 0,
            after: None,
            max_bytes: usize::MAX,
        }
    }
}

/// A page request for [`Store::history_page`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Only messages with `seq > after_seq`.
    pub after_seq: u64,
    /// Maximum messages returned.
    pub limit: usize,
    /// The page ends before a message that would take the sum of
    /// [`message_wire_bytes`] past this; the first message is returned
    /// whatever its size, so a page always makes progress.
    pub max_bytes: usize,
    /// Include messages a summary covers.
    pub include_compacted: bool,
}

impl HistoryQuery {
    /// At most `limit` messages after `after_seq`, with no byte budget.
    pub fn unbounded(after_seq: u64, limit: usize, include_compacted: bool) -> Self {
        Self {
            after_seq,
            limit,
            max_bytes: usize::MAX,
            include_compacted,
        }
    }
}

/// One page of [`Store::history_page`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessagePage {
    /// In seq order.
    pub messages: Vec<Message>,
    /// True when the page ended at the byte budget with a matching message
    /// left over. A page that ends at its `limit` does not look further
    /// (ask for one more to learn whether another follows).
    pub more: bool,
}

/// Position in the newest-activity-first order: sessions strictly after
/// `(last_active_at, id)` in that order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    /// `last_active_at` of the last session of the previous page.
    pub last_active_at: SystemTime,
    /// Its id (ties on time are broken by id, descending).
    pub id: String,
}

/// One page of sessions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionPage {
    /// Newest activity first.
    pub sessions: Vec<Session>,
    /// Set when more sessions may follow.
    pub next: Option<ListCursor>,
}

impl ListQuery {
    /// Whether `session` (one of the owner's, inside the cursor) belongs in
    /// the listing: of the asked agent, and not archived unless asked.
    pub(crate) fn admits(&self, session: &Session) -> bool {
        self.agent_id
            .as_ref()
            .is_none_or(|agent| *agent == session.agent_id)
            && self
                .parent_session_id
                .as_ref()
                .is_none_or(|parent| *parent == session.agent.parent_session_id)
            && (self.include_archived || !session.archived)
    }
}

/// Checks the arguments of [`Store::store_compaction`] against the session.
pub(crate) fn check_compaction(
    session: &Session,
    summary: &NewMessage,
    through_seq: u64,
) -> Result<(), StoreError> {
    session
        .check_compaction(summary, through_seq)
        .map_err(|why| StoreError::Backend(format!("invalid compaction: {why}")))
}

/// [`StoreError::Paused`] when the session's latest turn is paused: no
/// other turn begins then.
pub(crate) fn not_paused(session: &crate::types::Session) -> Result<(), StoreError> {
    match session.paused_turn() {
        Some(turn_id) => Err(StoreError::Paused {
            turn_id: turn_id.to_owned(),
        }),
        None => Ok(()),
    }
}

/// The error of an append past the last seq.
pub(crate) fn seq_exhausted() -> StoreError {
    StoreError::Backend("seq space exhausted".to_owned())
}

/// Durable storage of sessions, history and turn records.
///
/// Implementations must be safe to call concurrently. Appends to one session
/// are serialised by the store (seq assignment is atomic). Every mutating
/// method is durable when it returns `Ok`.
#[async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Stores a new session, or returns the existing one with the same id.
    async fn create_session(&self, new: NewSession) -> Result<CreateOutcome, StoreError>;

    /// [`Store::create_session`] within the owner's quota: refuses with
    /// [`StoreError::QuotaExceeded`] (`sessions`) when the owner already
    /// has `quota.limits.sessions` sessions, counted in the same
    /// transaction as the write (a shared store under a per-owner lock, so
    /// replicas together stay within it). A session that already exists
    /// is returned whatever the quota. The default ignores the quota (a
    /// test double's); every store of this crate overrides it.
    async fn create_session_within(
        &self,
        new: NewSession,
        quota: &WriteQuota,
    ) -> Result<CreateOutcome, StoreError> {
        let _ = quota;
        self.create_session(new).await
    }

    /// One session, or `None`.
    async fn get_session(&self, id: &str) -> Result<Option<Session>, StoreError>;

    /// A page of `owner`'s sessions, newest `last_active_at` first (ties by
    /// id descending), at most `query.limit` and — after the first — at
    /// most `query.max_bytes` of [`session_wire_bytes`]. `next` is set when
    /// the page ended at either bound with a matching session left over.
    async fn list_sessions(
        &self,
        owner: &str,
        query: &ListQuery,
    ) -> Result<SessionPage, StoreError>;

    /// Applies `update` (touching `last_active_at`) and returns the result.
    async fn update_session(&self, id: &str, update: SessionUpdate) -> Result<Session, StoreError>;

    /// Deletes a session with its whole history and turn records. `false`
    /// when it did not exist — or, with `incarnation`, when it exists as
    /// another incarnation, which is left untouched.
    async fn delete_session(&self, id: &str, incarnation: Option<&str>)
    -> Result<bool, StoreError>;

    /// Atomically stores a new turn record (status `Running`) and the turn's
    /// user message, sets the session's `last_turn`, and returns the stored
    /// message. `turn.user_message_seq` is overwritten with the assigned seq.
    /// [`StoreError::SessionNotFound`] unless the session exists as
    /// `turn.incarnation`.
    async fn begin_turn(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
    ) -> Result<Message, StoreError>;

    /// [`Store::begin_turn`] within the session owner's quota, checked in
    /// the same transaction: `stored_bytes` (the user messages' bytes the
    /// owner has stored, plus this one, as [`message_wire_bytes`] counts
    /// them) and, with `quota.count_turns` (a shared store), `live_turns`
    /// (the owner's sessions with a live lease, plus this one) and
    /// `turns_per_minute` (turns begun in the database clock's current
    /// minute). A refusal is [`StoreError::QuotaExceeded`] with nothing
    /// written. The default ignores the quota (a test double's).
    async fn begin_turn_within(
        &self,
        turn: TurnRecord,
        user_message: NewMessage,
        quota: &WriteQuota,
    ) -> Result<Message, StoreError> {
        let _ = quota;
        self.begin_turn(turn, user_message).await
    }

    /// Appends a message to a session's history, assigning the next seq.
    /// [`StoreError::SessionNotFound`] unless the session exists as
    /// `incarnation` ([`Session::incarnation`](crate::types::Session::incarnation)):
    /// a write meant for a deleted session never lands in a new one with
    /// the same id.
    async fn append_message(
        &self,
        session_id: &str,
        incarnation: &str,
        message: NewMessage,
    ) -> Result<Message, StoreError>;

    /// Stores the final state of a turn record and the session's `last_turn`.
    /// [`StoreError::SessionNotFound`] unless the session exists as
    /// `turn.incarnation`.
    async fn finish_turn(&self, turn: TurnRecord) -> Result<(), StoreError>;

    /// Appends the turn's last message (when given) and stores the turn's
    /// final record, durable together. Stores that can do both in one write
    /// (sled: one transaction, one flush) should override this; the default
    /// does two.
    async fn finish_turn_with(
        &self,
        turn: TurnRecord,
        last: Option<NewMessage>,
    ) -> Result<Option<Message>, StoreError> {
        let stored = match last {
            Some(message) => Some(
                self.append_message(&turn.session_id, &turn.incarnation, message)
                    .await?,
            ),
            None => None,
        };
        self.finish_turn(turn).await?;
        Ok(stored)
    }

    /// Stores the record of a turn still running (its [`TurnRecord::pause`]
    /// when it starts waiting for caller results or approvals) — on a
    /// shared store only while this replica holds the turn's lease
    /// ([`StoreError::LeaseLost`] otherwise). [`StoreError::SessionNotFound`]
    /// unless the session exists as `turn.incarnation`.
    async fn update_turn(&self, turn: TurnRecord) -> Result<(), StoreError>;

    /// A paused turn runs again: its record becomes `Running` (the
    /// session's latest turn, busy), and on a shared store this replica
    /// takes the session's lease. Returns the record. [`StoreError::NotPaused`]
    /// when the turn is not paused (resumed elsewhere, or ended);
    /// [`StoreError::SessionNotFound`] unless the session exists as
    /// `incarnation`.
    async fn resume_turn(
        &self,
        session_id: &str,
        incarnation: &str,
        turn_id: &str,
    ) -> Result<TurnRecord, StoreError>;

    /// One turn record.
    async fn get_turn(
        &self,
        session_id: &str,
        turn_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError>;

    /// A session's turns, newest first: at most `limit` records whose turn
    /// id sorts before `before` (from the newest when `None`). Turn ids are
    /// UUIDv7, so id order is admission order. Empty for a session that
    /// does not exist.
    async fn list_turns(
        &self,
        session_id: &str,
        before: Option<&str>,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError>;

    /// How many turn records a session has (0 for one that does not exist).
    async fn count_turns(&self, session_id: &str) -> Result<u64, StoreError>;

    /// The turn a Chat with this idempotency key started in this session.
    async fn find_turn_by_request(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<Option<TurnRecord>, StoreError>;

    /// Messages with `seq > query.after_seq`, in seq order, at most
    /// `query.limit` and — after the first — at most `query.max_bytes` of
    /// [`message_wire_bytes`]; compacted ones only when
    /// `query.include_compacted`. Each message's `compacted` flag is as
    /// [`Session::covers`](crate::types::Session::covers) says. The read
    /// stops at the first message that does not fit: nothing past the page
    /// is loaded.
    async fn history_page(
        &self,
        session_id: &str,
        query: &HistoryQuery,
    ) -> Result<MessagePage, StoreError>;

    /// [`Store::history_page`] without a byte budget: messages with
    /// `seq > after_seq`, in seq order, at most `limit`.
    async fn history(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
        include_compacted: bool,
    ) -> Result<Vec<Message>, StoreError> {
        let query = HistoryQuery::unbounded(after_seq, limit, include_compacted);
        Ok(self.history_page(session_id, &query).await?.messages)
    }

    /// [`Store::history`] without compacted messages, for a read the caller
    /// knows is short (a few dozen messages): done on the calling thread
    /// where that is cheaper than handing it to a blocking thread. The
    /// default is [`Store::history`].
    async fn history_inline(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<Message>, StoreError> {
        self.history(session_id, after_seq, limit, false).await
    }

    /// Records a compaction, durable as one write: appends `summary` (role
    /// [`Role::Summary`](crate::types::Role::Summary)) and moves the
    /// session's `compacted_through` to `through_seq` and `summary_seq` to
    /// the summary's seq, so every message up to `through_seq` and every
    /// earlier summary count as compacted. Originals are never rewritten
    /// or deleted. `through_seq` must not be below the current
    /// `compacted_through` nor reach the summary's own seq; the session must
    /// exist as `incarnation`.
    async fn store_compaction(
        &self,
        session_id: &str,
        incarnation: &str,
        summary: NewMessage,
        through_seq: u64,
    ) -> Result<Message, StoreError>;

    /// Sets the session's title when it has none (empty); `false` when a
    /// title was already set, which is then left as it is. Does not count as
    /// activity. [`StoreError::SessionNotFound`] unless the session exists
    /// as `incarnation`.
    async fn set_title_if_empty(
        &self,
        session_id: &str,
        incarnation: &str,
        title: &str,
    ) -> Result<bool, StoreError>;

    /// Marks every turn record still `Running` as `Interrupted` (with
    /// `finished_at` = now) and updates their sessions' `last_turn`.
    /// Called once at start-up; returns the records it changed.
    async fn recover_interrupted(&self) -> Result<Vec<TurnRecord>, StoreError>;

    /// Turns left paused (`TurnStatus::Paused`, no process running them)
    /// whose pause's bound ([`crate::types::Pause::until`]) is at or
    /// before `now`, at most `limit`, the longest expired first: the
    /// runtime ends them. A store in this process knows its paused turns
    /// from [`Store::recover_interrupted`] on and from every write since.
    async fn expired_pauses(
        &self,
        now: std::time::SystemTime,
        limit: usize,
    ) -> Result<Vec<TurnRecord>, StoreError>;

    /// What `owner`'s ended turns used (input plus output tokens) and
    /// cost on UTC day `day` (days since the epoch), summed by the store
    /// in the write that ends each turn, whatever became of its session
    /// since (the `daily_*` quotas).
    async fn daily_spent(
        &self,
        owner: &str,
        day: u64,
    ) -> Result<crate::quota::DailySpent, StoreError>;

    /// Number of stored sessions (all owners).
    async fn count_sessions(&self) -> Result<u64, StoreError>;

    /// A page of the sessions of agent `agent_id`, every owner's, archived
    /// ones included, in id order after `after`: at most `limit` of them.
    /// `next` (continue after it) is set while more may follow — the page
    /// may then be shorter than `limit`, even empty: an engine that scans
    /// bounds the records it reads per page. For `DeleteSessions` by agent.
    async fn sessions_of_agent(
        &self,
        agent_id: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<AgentSessions, StoreError>;

    /// Removes what the store keeps of `owner` beyond their sessions: the
    /// quota counts and the daily spending of their turns. Called by
    /// `DeleteSessions` once every session of the owner is deleted; a
    /// session stored since counts from zero.
    async fn forget_owner(&self, owner: &str) -> Result<(), StoreError>;

    /// Flushes everything to durable storage.
    async fn flush(&self) -> Result<(), StoreError>;

    /// The lease capability of a store several replicas share
    /// ([`Leases`]); `None` for a store one process owns (sled, memory),
    /// which then never refuses a turn as busy elsewhere. Required, so a
    /// new engine states which it is.
    fn leases(&self) -> Option<&dyn Leases>;

    /// What the replicas of a shared store know of each other
    /// ([`Cluster`]: heartbeats, the cluster-wide default model); `None`
    /// for a store one process owns. Required, as [`Store::leases`].
    fn cluster(&self) -> Option<&dyn Cluster>;

    /// The sessions' inboxes ([`Inbox`]): every engine has one.
    fn inbox(&self) -> &dyn Inbox;

    /// Agent versions and memory blocks ([`AgentStore`]): every engine
    /// keeps them.
    fn agents(&self) -> &dyn AgentStore;

    /// Whether the store can take writes now (readiness, polled once a
    /// second). `Err(DiskFull)` while its disk is below the reserve (it
    /// passes when space returns); on a shared store any other error means
    /// "unreachable", on a store in this process "failed until restart".
    /// A store in memory always can.
    async fn ping(&self) -> Result<(), StoreError> {
        Ok(())
    }
}
