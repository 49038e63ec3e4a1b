//! What the replicas of a shared store know of each other besides leases:
//! which replicas are alive (a heartbeat row each), and the operator
//! settings every replica applies (the default model).
//!
//! A shared store hands its [`Cluster`] out through
//! [`Store::cluster`](super::Store::cluster); a store one process owns
//! (sled, memory) has none, and the runtime keeps those settings in
//! memory, for itself.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::StoreError;
use crate::types::ThinkingLevel;

/// A replica as its heartbeat row says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    /// Its id ([`Leases::replica_id`](super::Leases::replica_id) of its store).
    pub id: String,
    /// Where other replicas reach its internal listener.
    pub address: String,
    /// When it started (the database's clock).
    pub started_at: SystemTime,
    /// Its last heartbeat (the database's clock).
    pub heartbeat_at: SystemTime,
}

/// The default model and thinking level every replica applies, with the
/// version of the setting (it grows with every change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefaultModel {
    /// The model name (`provider/model`).
    pub model: String,
    /// The thinking level, if set.
    pub thinking: Option<ThinkingLevel>,
    /// The setting's version (0 before the first change).
    pub version: i64,
}

/// See the module docs. Every method is required.
#[async_trait]
pub trait Cluster: Send + Sync + std::fmt::Debug {
    /// Records this replica alive now (inserting its row on the first
    /// call), and removes the rows of replicas silent for longer than
    /// `forget_after`.
    async fn heartbeat(&self, forget_after: Duration) -> Result<(), StoreError>;

    /// The replicas whose heartbeat is younger than `within`, this one
    /// included once it has beaten; ordered by id.
    async fn live_replicas(&self, within: Duration) -> Result<Vec<Replica>, StoreError>;

    /// Removes this replica's row (it is stopping).
    async fn leave(&self) -> Result<(), StoreError>;

    /// The cluster-wide default model, if an operator set one.
    async fn default_model(&self) -> Result<Option<DefaultModel>, StoreError>;

    /// Stores `model` and `thinking` as the cluster-wide default; returns
    /// the setting with its new version.
    async fn set_default_model(
        &self,
        model: &str,
        thinking: Option<ThinkingLevel>,
    ) -> Result<DefaultModel, StoreError>;
}
