//! The replicas of a shared store, as the runtime sees them: every replica
//! beats its heartbeat row once a [`HEARTBEAT`] and, in the same tick,
//! applies the cluster-wide default model when an operator changed it — so
//! a `SetDefaultModel` sent to any replica reaches every other within about
//! one heartbeat, and survives restarts (it is read before the first turn
//! is admitted). Operator calls that act cluster-wide reach the replicas
//! whose heartbeat is younger than [`LIVE_WITHIN`]
//! ([`Runtime::live_replicas`]).
//!
//! A watcher waiting for a session's next turn is told when another
//! replica admits it ([`NextTurns`]), so `Subscribe(wait_for_turn)` waits
//! cluster-wide.
//!
//! On a store one process owns, none of this runs: `SetDefaultModel`
//! changes this process's defaults, in memory, as before.

use std::sync::Weak;
use std::time::Duration;

use super::jobs::{Job, every};
use super::{Inner, Runtime};
use crate::error::RuntimeError;
use crate::store::{Cluster, Replica};
use crate::types::{Principal, ThinkingLevel};

/// How often a replica beats its heartbeat and reads the settings.
pub(crate) const HEARTBEAT: Duration = Duration::from_secs(1);
/// A replica whose last heartbeat is older than this is not live.
pub(crate) const LIVE_WITHIN: Duration = Duration::from_secs(5);
/// A replica silent this long has its row removed (by any replica).
pub(crate) const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The first heartbeat, at start: other replicas' operator calls reach
/// this one from now on.
pub(crate) async fn join(cluster: &dyn Cluster) {
    if let Err(err) = cluster.heartbeat(FORGET_AFTER).await {
        tracing::warn!(error = %err, "the replica's first heartbeat failed");
    }
}

/// Applies the stored cluster-wide default model, if newer than this
/// replica's.
pub(crate) async fn adopt_default(inner: &Inner, cluster: &dyn Cluster) {
    let stored = match cluster.default_model().await {
        Ok(Some(stored)) => stored,
        Ok(None) => return,
        Err(err) => {
            tracing::warn!(error = %err, "reading the cluster-wide default model failed");
            return;
        }
    };
    match inner.models.adopt(&stored) {
        Ok(Some(previous)) => tracing::info!(
            model = %stored.model,
            previous = %previous,
            version = stored.version,
            "the cluster-wide default model changed"
        ),
        Ok(None) => {}
        Err(err) => tracing::error!(
            model = %stored.model,
            error = %err,
            "the cluster-wide default model is not served by this replica's configuration; \
             keeping the previous default"
        ),
    }
}

/// The heartbeat job (see the module docs).
pub(crate) struct Heartbeat(Weak<Inner>);

impl Job for Heartbeat {
    async fn tick(&mut self, _period: Duration) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        let Some(cluster) = inner.store.cluster() else {
            return false;
        };
        if let Err(err) = cluster.heartbeat(FORGET_AFTER).await {
            tracing::warn!(error = %err, "the replica's heartbeat failed");
        }
        adopt_default(&inner, cluster).await;
        true
    }
}

/// How often the sessions watched for a next turn are looked up for a
/// turn admitted on another replica.
pub(crate) const NEXT_TURN_POLL: Duration = Duration::from_millis(100);

/// Watchers waiting for a session's next turn (`Subscribe` with
/// `wait_for_turn`) on a shared store: a turn admitted on another replica
/// takes the session's lease there, so the sessions waited on here are
/// looked up in one statement every [`NEXT_TURN_POLL`], and their waiters
/// told where the turn runs (the adapter follows it there). Nothing is
/// read while nobody waits.
pub(crate) struct NextTurns(Weak<Inner>);

impl Job for NextTurns {
    async fn tick(&mut self, _period: Duration) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        let Some(leases) = inner.store.leases() else {
            return false;
        };
        let waited = inner.slots.waited_sessions();
        if waited.is_empty() {
            return true;
        }
        let found = match leases.leases_of(&waited).await {
            Ok(found) => found,
            Err(err) => {
                tracing::debug!(error = %err, "looking up the watched sessions' leases failed");
                return true;
            }
        };
        for (session_id, lease) in found {
            if lease.replica_id != leases.replica_id() {
                inner
                    .slots
                    .end_waiters(&session_id, &super::slots::WaitEnded::Elsewhere(lease));
            }
        }
        true
    }
}

/// Starts the heartbeat and the next-turn watch on a shared store.
pub(crate) fn spawn_jobs(runtime: &Runtime) {
    let weak = std::sync::Arc::downgrade(&runtime.inner);
    if runtime.inner.store.leases().is_some() {
        every(
            runtime,
            NEXT_TURN_POLL,
            NextTurns(weak.clone()),
            runtime.inner.lifecycle.background(),
        );
    }
    if runtime.inner.store.cluster().is_some() {
        every(
            runtime,
            HEARTBEAT,
            Heartbeat(weak),
            runtime.inner.lifecycle.background(),
        );
    }
}

impl Runtime {
    /// The replicas whose heartbeat is recent (admins only); on a store
    /// one process owns, none.
    pub async fn live_replicas(&self, who: &Principal) -> Result<Vec<Replica>, RuntimeError> {
        super::admin::require_admin(who)?;
        match self.inner.store.cluster() {
            Some(cluster) => Ok(cluster.live_replicas(LIVE_WITHIN).await?),
            None => Ok(Vec::new()),
        }
    }

    /// Sets the default model and thinking level for turns admitted from
    /// now on — on a shared store for every replica (stored; each applies
    /// it within a heartbeat), otherwise for this process. Returns the
    /// previous default model.
    pub async fn set_default_model(
        &self,
        who: &Principal,
        model: &str,
        thinking: Option<ThinkingLevel>,
    ) -> Result<String, RuntimeError> {
        super::admin::require_admin(who)?;
        crate::limits::check_model_name("model", model)?;
        let Some(cluster) = self.inner.store.cluster() else {
            return self.inner.models.set_defaults(model, thinking, "model");
        };
        // Refused here, before any replica sees it, when this replica
        // cannot serve it.
        self.inner.models.resolve(model, "model")?;
        let previous = self.inner.models.defaults().model;
        let stored = cluster.set_default_model(model, thinking).await?;
        if let Err(err) = self.inner.models.adopt(&stored) {
            tracing::error!(error = %err, "applying the default model just stored failed");
        }
        Ok(previous)
    }

    /// Removes this replica's heartbeat row (it is stopping), so
    /// cluster-wide operator calls stop reaching it at once.
    pub(crate) async fn leave_cluster(&self) {
        if let Some(cluster) = self.inner.store.cluster()
            && let Err(err) = cluster.leave().await
        {
            tracing::warn!(error = %err, "removing the replica's heartbeat row failed");
        }
    }
}
