//! Whether the store can take writes, as readiness and admission see it:
//! the store is pinged once a second ([`crate::store::Store::ping`]) and
//! [`Runtime::store_health`] follows the answer.
//!
//! - A shared store (PostgreSQL) that does not answer is
//!   [`StoreHealth::Unreachable`]: new Chats are refused at once (no pool
//!   wait) until it answers again.
//! - A store whose disk is under its reserve is [`StoreHealth::DiskFull`]
//!   until space returns. Admission does not consult this state — the store
//!   checks its disk on every write, which is both fresher and exact — but
//!   readiness does, so traffic goes elsewhere meanwhile.
//! - A store in this process (sled) that failed a write and takes none
//!   until the process restarts is [`StoreHealth::Failed`], for good: new
//!   Chats are refused, and the server reports that it needs a restart.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::jobs::Job;
use super::{Inner, Runtime};
use crate::error::RuntimeError;
use crate::store::StoreError;

/// How often the store is pinged.
pub(crate) const PING_INTERVAL: Duration = Duration::from_secs(1);
/// How long a ping may take before a shared store counts as unreachable.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// What a Chat is told while the store cannot be reached.
pub(crate) const STORE_DOWN: RuntimeError = RuntimeError::Unavailable(
    "the database cannot be reached; this replica refuses new turns until it is back (retry, or \
     send the call to another replica)",
);

/// What a Chat is told once the store failed for good.
const STORE_FAILED: RuntimeError = RuntimeError::Unavailable(
    "the store failed a write and takes none until the server restarts; this replica refuses new \
     turns (send the call to another replica)",
);

/// Whether the store can take writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHealth {
    /// It answers and has room.
    Writable,
    /// A shared store that does not answer (or not in time).
    Unreachable,
    /// Its disk is under the reserve: new work is refused until space
    /// returns.
    DiskFull,
    /// A store in this process failed a write and takes none until the
    /// process restarts. Final.
    Failed,
}

/// The runtime's view of its store's health.
#[derive(Debug)]
pub(crate) struct HealthWatch {
    state: watch::Sender<StoreHealth>,
    /// Whether the store is shared by several replicas.
    shared: bool,
}

impl HealthWatch {
    /// Writable until a ping says otherwise (the store was just opened).
    pub(crate) fn new(shared: bool) -> Self {
        Self {
            state: watch::Sender::new(StoreHealth::Writable),
            shared,
        }
    }

    /// The state now.
    pub(crate) fn now(&self) -> StoreHealth {
        *self.state.borrow()
    }

    /// `Err` while new turns must be refused without trying the store.
    pub(crate) fn admitting(&self) -> Result<(), RuntimeError> {
        match *self.state.borrow() {
            StoreHealth::Writable | StoreHealth::DiskFull => Ok(()),
            StoreHealth::Unreachable => Err(STORE_DOWN),
            StoreHealth::Failed => Err(STORE_FAILED),
        }
    }

    /// What one ping's answer means.
    fn classify(&self, answer: Option<Result<(), StoreError>>) -> Option<StoreHealth> {
        match answer {
            Some(Ok(())) => Some(StoreHealth::Writable),
            Some(Err(StoreError::DiskFull(_))) => Some(StoreHealth::DiskFull),
            Some(Err(StoreError::Failed(_))) => Some(StoreHealth::Failed),
            Some(Err(err)) if self.shared => {
                tracing::debug!(error = %err, "store ping failed");
                Some(StoreHealth::Unreachable)
            }
            Some(Err(err)) => {
                tracing::debug!(error = %err, "store ping failed");
                Some(StoreHealth::Failed)
            }
            None if self.shared => Some(StoreHealth::Unreachable),
            // A store in this process that is slow to say how much room it
            // has: no news.
            None => None,
        }
    }

    /// Records `now`; `Failed` is never left.
    fn record(&self, now: StoreHealth) {
        let mut was = StoreHealth::Writable;
        let changed = self.state.send_if_modified(|state| {
            was = *state;
            if *state == now || *state == StoreHealth::Failed {
                return false;
            }
            *state = now;
            true
        });
        if !changed {
            return;
        }
        match now {
            StoreHealth::Writable if was == StoreHealth::DiskFull => {
                tracing::info!("the store's disk has room again; admitting turns");
            }
            StoreHealth::Writable => {
                tracing::info!("the database is reachable again; admitting turns");
            }
            StoreHealth::Unreachable => {
                tracing::error!(
                    "the database cannot be reached; refusing new turns until it is back"
                );
            }
            StoreHealth::DiskFull => tracing::error!(
                "the store's disk is full (under store_min_free_mb free); refusing new sessions and \
                 turns until space is freed"
            ),
            StoreHealth::Failed => tracing::error!(
                "the store failed a write and takes none until the server restarts; readiness and \
                 liveness now say so"
            ),
        }
    }
}

impl Runtime {
    /// Follows whether the store can take writes (see the module docs).
    /// Readiness follows it; [`StoreHealth::Failed`] also ends liveness.
    pub fn store_health(&self) -> watch::Receiver<StoreHealth> {
        self.inner.health.state.subscribe()
    }
}

/// The pinger: records the store's health every [`PING_INTERVAL`].
pub(crate) struct Pinger(pub(crate) Weak<Inner>);

impl Job for Pinger {
    async fn tick(&mut self, _period: Duration) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        let answer = tokio::time::timeout(PING_TIMEOUT, inner.store.ping())
            .await
            .ok();
        if let Some(now) = inner.health.classify(answer) {
            inner.health.record(now);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_answer_means_one_state_and_failed_is_final() {
        let single = HealthWatch::new(false);
        let shared = HealthWatch::new(true);
        let full = || Some(Err(StoreError::DiskFull("x".into())));
        let broken = || Some(Err(StoreError::Backend("x".into())));
        let failed = || Some(Err(StoreError::Failed("x".into())));
        assert_eq!(shared.classify(failed()), Some(StoreHealth::Failed));
        assert_eq!(single.classify(Some(Ok(()))), Some(StoreHealth::Writable));
        assert_eq!(single.classify(full()), Some(StoreHealth::DiskFull));
        assert_eq!(shared.classify(full()), Some(StoreHealth::DiskFull));
        assert_eq!(single.classify(broken()), Some(StoreHealth::Failed));
        assert_eq!(shared.classify(broken()), Some(StoreHealth::Unreachable));
        assert_eq!(shared.classify(None), Some(StoreHealth::Unreachable));
        assert_eq!(single.classify(None), None);

        let mut seen = single.state.subscribe();
        single.record(StoreHealth::DiskFull);
        assert_eq!(*seen.borrow_and_update(), StoreHealth::DiskFull);
        single.admitting().unwrap();
        single.record(StoreHealth::Writable);
        assert_eq!(*seen.borrow_and_update(), StoreHealth::Writable);
        single.record(StoreHealth::Failed);
        assert!(single.admitting().is_err());
        single.record(StoreHealth::Writable);
        assert_eq!(*seen.borrow_and_update(), StoreHealth::Failed);
        shared.record(StoreHealth::Unreachable);
        assert!(matches!(
            shared.admitting(),
            Err(RuntimeError::Unavailable(_))
        ));
    }
}
