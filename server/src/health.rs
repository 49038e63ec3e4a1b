//! The standard health service (`grpc.health.v1.Health`) and the one place
//! that sets what it reports: every readiness and liveness transition of
//! the server's life goes through [`Health::set`], so what a probe sees in
//! each [`Phase`] is written down once.
//!
//! Three names are served: [`READINESS`] and the overall `""` follow the
//! phase (SERVING only while calls are admitted); [`LIVENESS`] is SERVING
//! for as long as the process serves at all — a drain must not look like a
//! dead process to a liveness probe, or the orchestrator would restart the
//! pod mid-drain (docs/contract.md §7).

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_util::task::AbortOnDropHandle;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health as HealthService, HealthServer};
use tonic_health::server::HealthReporter;

/// The health service name that turns SERVING once the store is open and
/// NOT_SERVING when draining.
pub const READINESS: &str = "readiness";

/// The health service name that is SERVING while the process serves at
/// all, including during a drain (docs/contract.md §7): the one for liveness probes.
pub const LIVENESS: &str = "liveness";

/// Where the server is in its life, as the health service reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// The services are built but the listener is not served yet:
    /// readiness NOT_SERVING, liveness SERVING.
    Starting,
    /// Calls are admitted: readiness SERVING.
    Serving,
    /// The shared store (PostgreSQL) cannot be reached: readiness
    /// NOT_SERVING (new Chats are refused), liveness SERVING; back to
    /// [`Phase::Serving`] when it answers again.
    StoreDown,
    /// An admin `Drain` or the shutdown began: readiness NOT_SERVING, so
    /// the orchestrator stops routing here; liveness stays SERVING. Final:
    /// no later phase is reported.
    Draining,
}

/// The reporter behind the health service.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    reporter: HealthReporter,
    /// The phase reported last; `Draining` is never left.
    phase: Arc<Mutex<Phase>>,
}

impl Health {
    /// The health service to mount, and its reporter, already in
    /// [`Phase::Starting`].
    pub(crate) async fn start() -> (Self, HealthServer<impl HealthService>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        let health = Self {
            reporter,
            phase: Arc::new(Mutex::new(Phase::Starting)),
        };
        health.set(Phase::Starting).await;
        (health, service)
    }

    /// Reports `phase` — unless the server is already draining, which it
    /// never stops doing.
    pub(crate) async fn set(&self, phase: Phase) {
        {
            let mut now = self.phase.lock().unwrap_or_else(|p| p.into_inner());
            if *now == Phase::Draining && phase != Phase::Draining {
                return;
            }
            *now = phase;
        }
        let ready = match phase {
            Phase::Serving => ServingStatus::Serving,
            Phase::Starting | Phase::StoreDown | Phase::Draining => ServingStatus::NotServing,
        };
        self.reporter.set_service_status("", ready).await;
        self.reporter.set_service_status(READINESS, ready).await;
        if phase == Phase::Starting {
            // Set once: it never changes while the process serves.
            self.reporter
                .set_service_status(LIVENESS, ServingStatus::Serving)
                .await;
        }
    }

    /// Follows whether the store answers ([`Phase::StoreDown`] while it
    /// does not; [`Phase::Serving`] again when it does), until the returned
    /// handle is dropped. Call it once serving.
    pub(crate) fn follow_store(
        &self,
        mut reachable: watch::Receiver<bool>,
    ) -> AbortOnDropHandle<()> {
        let health = self.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let up = *reachable.borrow_and_update();
                health
                    .set(if up { Phase::Serving } else { Phase::StoreDown })
                    .await;
                if reachable.changed().await.is_err() {
                    return;
                }
            }
        }))
    }

    /// Turns [`Phase::Draining`] when the runtime starts draining (an admin
    /// `Drain` flips readiness before the process is told to stop). The
    /// watcher stops when the returned handle is dropped.
    pub(crate) fn drain_on(&self, mut draining: watch::Receiver<bool>) -> AbortOnDropHandle<()> {
        let health = self.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            if draining.wait_for(|d| *d).await.is_ok() {
                health.set(Phase::Draining).await;
            }
        }))
    }
}
