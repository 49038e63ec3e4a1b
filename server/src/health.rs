//! The standard health service (`grpc.health.v1.Health`) and the one place
//! that sets what it reports: every readiness and liveness transition of
//! the server's life goes through [`Health::set`], so what a probe sees in
//! each [`Phase`] is written down once.
//!
//! Three names are served: [`READINESS`] and the overall `""` follow the
//! phase (SERVING only while calls are admitted); [`LIVENESS`] is SERVING
//! for as long as the process serves at all — a drain must not look like a
//! dead process to a liveness probe, or the orchestrator would restart the
//! pod mid-drain (docs/contract.md §7) — except once the store failed for
//! good ([`Phase::StoreFailed`]): then a restart is what it needs.

use std::sync::Arc;

use agentrt_runtime::StoreHealth;
use tokio::sync::{Mutex, watch};
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
    /// Calls are admitted: readiness SERVING (NOT_SERVING while an admin
    /// `Drain` holds, see [`Health::drain_on`]).
    Serving,
    /// The shared store (PostgreSQL) cannot be reached, or the store's
    /// disk is under its reserve: readiness NOT_SERVING (new Chats are
    /// refused), liveness SERVING; back to [`Phase::Serving`] when it
    /// answers again or space returns.
    StoreDown,
    /// The store (sled) failed a write and takes none until the process
    /// restarts: readiness and liveness NOT_SERVING, so the orchestrator
    /// restarts it. Final, like [`Phase::Draining`], and it overrides a
    /// drain.
    StoreFailed,
    /// The shutdown began: readiness NOT_SERVING, so the orchestrator
    /// stops routing here; liveness stays SERVING. Final: no later phase
    /// is reported. (An admin `Drain`, which `Undrain` can undo, is not a
    /// phase: see [`Health::drain_on`].)
    Draining,
}

/// What the reporter reported last.
#[derive(Debug, Clone, Copy)]
struct State {
    phase: Phase,
    /// An admin `Drain` holds (until `Undrain`).
    drained: bool,
}

impl State {
    const STARTING: Self = Self {
        phase: Phase::Starting,
        drained: false,
    };

    /// Whether [`READINESS`] is SERVING: in [`Phase::Serving`] with no
    /// admin drain holding.
    fn ready(self) -> bool {
        match self.phase {
            Phase::Serving => !self.drained,
            Phase::Starting | Phase::StoreDown | Phase::StoreFailed | Phase::Draining => false,
        }
    }
}

/// A read-only view of what the health service reports, for the HTTP
/// routes `/readyz` and `/livez` on the metrics listener (docs/contract.md
/// §8): kubelet's gRPC probes cannot speak TLS, HTTP probes on the
/// plaintext metrics port can. The reporter updates it with every report,
/// so the two views never disagree.
#[derive(Debug, Clone)]
pub struct HealthProbe {
    reported: Arc<std::sync::Mutex<State>>,
}

impl HealthProbe {
    /// A view in [`Phase::Starting`]: not ready, live.
    pub(crate) fn starting() -> Self {
        Self {
            reported: Arc::new(std::sync::Mutex::new(State::STARTING)),
        }
    }

    fn state(&self) -> State {
        *self.reported.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, state: State) {
        *self.reported.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// Whether [`READINESS`] is SERVING.
    pub fn ready(&self) -> bool {
        self.state().ready()
    }

    /// Whether [`LIVENESS`] is SERVING.
    pub fn live(&self) -> bool {
        match self.state().phase {
            Phase::StoreFailed => false,
            Phase::Starting | Phase::Serving | Phase::StoreDown | Phase::Draining => true,
        }
    }
}

/// The reporter behind the health service.
#[derive(Debug, Clone)]
pub(crate) struct Health {
    reporter: HealthReporter,
    /// `Draining` and `StoreFailed` are never left. Held while reporting
    /// (an async lock), so that two changes at once cannot report in the
    /// opposite order of their state changes.
    state: Arc<Mutex<State>>,
    /// The HTTP routes' view of what is reported.
    probe: HealthProbe,
}

impl Health {
    /// The health service to mount, and its reporter, already in
    /// [`Phase::Starting`]; `probe` sees every phase it reports.
    pub(crate) async fn start(probe: &HealthProbe) -> (Self, HealthServer<impl HealthService>) {
        let (reporter, service) = tonic_health::server::health_reporter();
        probe.record(State::STARTING);
        let health = Self {
            reporter,
            state: Arc::new(Mutex::new(State::STARTING)),
            probe: probe.clone(),
        };
        health.set(Phase::Starting).await;
        (health, service)
    }

    /// Reports `phase` — unless the server is already draining, which it
    /// never stops doing.
    pub(crate) async fn set(&self, phase: Phase) {
        let mut now = self.state.lock().await;
        let stays = match now.phase {
            Phase::StoreFailed => true,
            Phase::Draining => phase != Phase::StoreFailed,
            Phase::Starting | Phase::Serving | Phase::StoreDown => false,
        };
        if stays && now.phase != phase {
            return;
        }
        now.phase = phase;
        self.report_ready(*now).await;
        match phase {
            // Set at the start; it changes only when the store failed.
            Phase::Starting => {
                self.reporter
                    .set_service_status(LIVENESS, ServingStatus::Serving)
                    .await;
            }
            Phase::StoreFailed => {
                self.reporter
                    .set_service_status(LIVENESS, ServingStatus::NotServing)
                    .await;
            }
            Phase::Serving | Phase::StoreDown | Phase::Draining => {}
        }
    }

    /// Records whether an admin `Drain` holds and reports readiness anew.
    async fn set_drained(&self, drained: bool) {
        let mut now = self.state.lock().await;
        now.drained = drained;
        self.report_ready(*now).await;
    }

    /// Readiness and the overall `""` as `state` says (see
    /// [`State::ready`]), for the gRPC service and the HTTP routes alike.
    async fn report_ready(&self, state: State) {
        self.probe.record(state);
        let ready = if state.ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        self.reporter.set_service_status("", ready).await;
        self.reporter.set_service_status(READINESS, ready).await;
    }

    /// Follows whether the store can take writes ([`Phase::StoreDown`]
    /// while it cannot reach it or its disk is full, [`Phase::Serving`]
    /// again when it can, [`Phase::StoreFailed`] for good), until the
    /// returned handle is dropped. Call it once serving.
    pub(crate) fn follow_store(
        &self,
        mut store: watch::Receiver<StoreHealth>,
    ) -> AbortOnDropHandle<()> {
        let health = self.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let phase = match *store.borrow_and_update() {
                    StoreHealth::Writable => Phase::Serving,
                    StoreHealth::Unreachable | StoreHealth::DiskFull => Phase::StoreDown,
                    StoreHealth::Failed => Phase::StoreFailed,
                };
                health.set(phase).await;
                if store.changed().await.is_err() {
                    return;
                }
            }
        }))
    }

    /// Follows the runtime's draining flag: an admin `Drain` flips
    /// readiness to NOT_SERVING before the process is told to stop, and an
    /// `Undrain` flips it back. The watcher stops when the returned handle
    /// is dropped.
    pub(crate) fn drain_on(&self, mut draining: watch::Receiver<bool>) -> AbortOnDropHandle<()> {
        let health = self.clone();
        AbortOnDropHandle::new(tokio::spawn(async move {
            loop {
                let drained = *draining.borrow_and_update();
                health.set_drained(drained).await;
                if draining.changed().await.is_err() {
                    return;
                }
            }
        }))
    }
}
