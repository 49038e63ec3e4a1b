//! Several replicas on one shared store (PostgreSQL): what the core does
//! differently when the store has [`Leases`](crate::store::Leases).
//!
//! It owns three background jobs, which exist only on a shared store:
//!
//! - the *renewer* extends the leases of this replica's live turns every
//!   third of the lease time, with one `renew_leases` call; a turn the store
//!   reports lost — and every live turn once no renewal has succeeded for a
//!   whole lease time (the database unreachable) — is ended at once
//!   ([`LiveTurn::lose_lease`]): it stores nothing more, since another
//!   replica may already have taken the session over;
//! - the *sweeper* interrupts turns whose owner let their lease expire (a
//!   dead replica), on every replica, every half lease time;
//! - the *pinger* (`store_health`, on every store) checks once a second
//!   that the store answers: while it does not, new Chats are refused at
//!   once (no pool wait) and readiness follows [`Runtime::store_health`].
//!
//! And the one question the calls ask: does another replica hold this
//! session's lease ([`Runtime::lease_elsewhere`])? On a store one process
//! owns (sled, memory) nothing here runs and that question costs nothing.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::jobs::{Job, every};
use super::slots::LiveTurn;
use super::{Inner, Runtime};
use crate::error::RuntimeError;
use crate::store::{Lease, LeaseKey};

/// The error a turn's callers get when its replica lost the session's lease.
pub(crate) const LEASE_LOST_MESSAGE: &str = "this replica lost the session's lease (the database \
     was unreachable or the lease expired); the turn was stopped and stores nothing more — retry \
     the turn";

impl Runtime {
    /// The session's lease when another replica holds it (its live turn
    /// runs there). `None` on a single-node store — without a store read —
    /// and when the lease is this replica's own leftover (no turn is live
    /// here: the caller then sees "nothing live").
    pub(crate) async fn lease_elsewhere(
        &self,
        session_id: &str,
    ) -> Result<Option<Lease>, RuntimeError> {
        let Some(leases) = self.inner.store.leases() else {
            return Ok(None);
        };
        let me = leases.replica_id();
        Ok(leases
            .lease(session_id)
            .await?
            .filter(|l| l.replica_id != me))
    }

    /// `Err(Elsewhere)` when another replica holds the session's lease: the
    /// call belongs to that replica (the adapter forwards it). What every
    /// call on a session with no live turn here asks.
    pub(crate) async fn not_elsewhere(&self, session_id: &str) -> Result<(), RuntimeError> {
        match self.lease_elsewhere(session_id).await? {
            Some(lease) => Err(RuntimeError::Elsewhere(lease)),
            None => Ok(()),
        }
    }

    /// This replica's id on a shared store, `None` on a single-node one.
    pub fn replica_id(&self) -> Option<&str> {
        self.inner.store.leases().map(|leases| leases.replica_id())
    }
}

/// Starts the pinger on every store, and the renewer and the sweeper (see
/// the module docs) when the store is shared. Jobs of the runtime's:
/// shutdown waits for them.
pub(crate) fn spawn_jobs(runtime: &Runtime) {
    let weak = Arc::downgrade(&runtime.inner);
    let lifecycle = &runtime.inner.lifecycle;
    every(
        runtime,
        super::store_health::PING_INTERVAL,
        super::store_health::Pinger(weak.clone()),
        lifecycle.background(),
    );
    if !runtime.inner.shared {
        return;
    }
    let ttl = runtime.inner.config.lease_ttl;
    // A draining replica's turns keep their leases until they end.
    every(
        runtime,
        ttl / 3,
        Renewer::new(ttl, weak.clone()),
        lifecycle.turns_over(),
    );
    every(runtime, ttl / 2, Sweeper(weak), lifecycle.background());
}

/// The renewer's state.
struct Renewer {
    ttl: Duration,
    inner: Weak<Inner>,
    /// When the last renewal that succeeded was sent: every lease this
    /// replica holds is good until at least this plus the lease time.
    renewed: Instant,
}

impl Renewer {
    fn new(ttl: Duration, inner: Weak<Inner>) -> Self {
        Self {
            ttl,
            inner,
            renewed: Instant::now(),
        }
    }
}

impl Job for Renewer {
    async fn tick(&mut self, period: Duration) -> bool {
        let Some(inner) = self.inner.upgrade() else {
            return false;
        };
        // Started only on a store with leases.
        let Some(leases) = inner.store.leases() else {
            return false;
        };
        let mut live = inner.slots.live_with_sessions();
        // A turn still being admitted has no committed lease to renew (a
        // renewal would report it lost); its admission commits one.
        live.retain(|(_, t)| t.is_leased());
        let sent = Instant::now();
        if live.is_empty() {
            self.renewed = sent;
            return true;
        }
        let keys: Vec<LeaseKey> = live
            .iter()
            .map(|(session_id, t)| LeaseKey {
                session_id: session_id.clone(),
                turn_id: t.turn_id.clone(),
            })
            .collect();
        match tokio::time::timeout(period, leases.renew_leases(&keys)).await {
            Ok(Ok(lost)) => {
                self.renewed = sent;
                for (session_id, turn) in live.iter().filter(|(_, t)| lost.contains(&t.turn_id)) {
                    tracing::warn!(
                        session_id = %session_id,
                        turn_id = %turn.turn_id,
                        "this replica lost the session's lease; stopping its turn"
                    );
                    turn.lose_lease();
                }
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, turns = keys.len(), "renewing the leases failed");
                self.give_up_stale(&live);
            }
            Err(_) => {
                tracing::warn!(turns = keys.len(), "renewing the leases timed out");
                self.give_up_stale(&live);
            }
        }
        true
    }
}

impl Renewer {
    /// Ends the live turns whose lease may have lapsed: no renewal has
    /// succeeded for a whole lease time, and they were admitted (taking
    /// their lease) longer ago than that.
    fn give_up_stale(&self, live: &[(String, Arc<LiveTurn>)]) {
        if self.renewed.elapsed() < self.ttl {
            return;
        }
        for (session_id, turn) in live {
            let admitted = turn.started_at.elapsed().unwrap_or_default();
            if admitted >= self.ttl && !turn.lease_lost() {
                tracing::warn!(
                    session_id = %session_id,
                    turn_id = %turn.turn_id,
                    "no lease renewal succeeded for a whole lease time; stopping the turn"
                );
                turn.lose_lease();
            }
        }
    }
}

/// The sweeper: interrupts the turns of replicas whose leases expired.
struct Sweeper(Weak<Inner>);

impl Job for Sweeper {
    async fn tick(&mut self, period: Duration) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        // Started only on a store with leases.
        let Some(leases) = inner.store.leases() else {
            return false;
        };
        match tokio::time::timeout(
            period.max(super::store_health::PING_TIMEOUT),
            leases.sweep_expired_leases(),
        )
        .await
        {
            Ok(Ok(swept)) => {
                for turn in &swept {
                    tracing::warn!(
                        session_id = %turn.session_id,
                        turn_id = %turn.turn_id,
                        "turn interrupted: its replica's lease expired"
                    );
                    crate::telemetry::metrics::turn_interrupted(
                        crate::telemetry::metrics::Interruption::LeaseExpired,
                    );
                }
            }
            Ok(Err(err)) => tracing::debug!(error = %err, "sweeping expired leases failed"),
            Err(_) => tracing::debug!("sweeping expired leases timed out"),
        }
        true
    }
}

#[cfg(test)]
mod tests;
