//! Leases: how a store that several replicas share keeps one live turn
//! per session cluster-wide.
//!
//! A shared store (PostgreSQL) takes a session's lease in `begin_turn`,
//! refuses a second live turn cluster-wide with [`StoreError::Busy`],
//! refuses writes of a turn whose lease lapsed with
//! [`StoreError::LeaseLost`], releases the lease in `finish_turn`, and in
//! `recover_interrupted` interrupts only turns no live replica owns (an
//! expired lease, or one left under this replica's own id) — never another
//! live replica's. It hands out its [`Leases`] through
//! [`Store::leases`](super::Store::leases); a store one process owns
//! (sled, memory) has none, and the runtime then runs without the lease
//! machinery (`runtime/leases.rs`).

use std::time::SystemTime;

use async_trait::async_trait;

use super::StoreError;
use crate::types::TurnRecord;

/// A session's lease in a store shared by several replicas: which replica
/// runs the session's live turn, and until when it is trusted to.
///
/// Taken by [`Store::begin_turn`](super::Store::begin_turn) in the transaction that stores the user
/// message, renewed by its owner ([`Leases::renew_leases`]) while the turn
/// runs, released by [`Store::finish_turn`](super::Store::finish_turn). A lease past `expires_at`
/// belongs to a replica presumed dead: the next `begin_turn` or
/// [`Leases::sweep_expired_leases`] interrupts its turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The owner replica's id ([`Leases::replica_id`] of its store).
    pub replica_id: String,
    /// Where other replicas reach the owner's internal service.
    pub address: String,
    /// The live turn.
    pub turn_id: String,
    /// When the lease lapses unless renewed (the database's clock).
    pub expires_at: SystemTime,
}

/// A live turn whose lease its replica renews.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaseKey {
    /// The session.
    pub session_id: String,
    /// The turn holding the session's lease.
    pub turn_id: String,
}

/// A lease as an operator lists it (`RuntimeAdmin.ListReplicas`): the
/// lease, and whose session it is and when its turn began.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedLease {
    /// The session.
    pub session_id: String,
    /// The session's owner.
    pub owner: String,
    /// The lease itself.
    pub lease: Lease,
    /// When the turn holding the lease was admitted (its record's start);
    /// `None` if its record cannot be found.
    pub turn_started_at: Option<SystemTime>,
}

/// Where a listing of leases goes on: after this replica's lease of this
/// session (the order is by replica id, then session id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseCursor {
    /// The holder of the last lease listed.
    pub replica_id: String,
    /// Its session.
    pub session_id: String,
}

/// The lease capability of a shared store (see the module doc). Every
/// method is required: an engine that shares state across replicas cannot
/// leave one out and still compile.
#[async_trait]
pub trait Leases: Send + Sync + std::fmt::Debug {
    /// The id of the replica this store writes leases for.
    fn replica_id(&self) -> &str;

    /// The session's unexpired lease, if any (its live turn, on whichever
    /// replica).
    async fn lease(&self, session_id: &str) -> Result<Option<Lease>, StoreError>;

    /// The unexpired leases of those of `session_ids` that have one, with
    /// their session id (one statement, for the watchers waiting on these
    /// sessions' next turns).
    async fn leases_of(&self, session_ids: &[String]) -> Result<Vec<(String, Lease)>, StoreError>;

    /// Extends this replica's leases of `turns` by the store's lease time;
    /// returns the turn ids whose lease this replica no longer holds (those
    /// turns must stop and store nothing more).
    async fn renew_leases(&self, turns: &[LeaseKey]) -> Result<Vec<String>, StoreError>;

    /// Interrupts every turn whose lease expired: the record becomes
    /// `Interrupted`, its tool calls without a result get an error result
    /// (as start-up recovery does), the lease is released — one transaction
    /// per turn. Returns the turns it changed. Safe to call from every
    /// replica at once.
    async fn sweep_expired_leases(&self) -> Result<Vec<TurnRecord>, StoreError>;

    /// The leases in the store, every replica's — lapsed ones the sweepers
    /// have not released yet included — ordered by replica id, then
    /// session id (bytewise), starting after `after`, at most `limit`.
    async fn list_leases(
        &self,
        after: Option<&LeaseCursor>,
        limit: usize,
    ) -> Result<Vec<ListedLease>, StoreError>;
}
