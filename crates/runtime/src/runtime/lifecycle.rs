//! The runtime's lifecycle: admitting, then draining (no new turns), then
//! shut down — and every task the runtime spawns, so that shutdown can wait
//! for all of them.
//!
//! Two trackers own the tasks. `turns` holds each turn's task and the
//! prestart task of its first model request; `Drain` and shutdown wait for
//! these. `jobs` holds the work that outlives the call or turn that started
//! it — title jobs, the idle-runner reaper and, on a shared store, the
//! lease renewer, the expired-lease sweeper and the store pinger
//! (`leases`); shutdown waits for them
//! after the turns (a turn starts its title job before it ends), within the
//! same bound, and cancels what is still running at the hard limit. So when
//! shutdown returns nothing the runtime spawned is still running, and every
//! span it opened is closed.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RuntimeError;

/// How long shutdown waits for cancelled jobs to end (they end at their
/// next poll).
const CANCELLED_JOBS_WAIT: Duration = Duration::from_secs(1);

/// The refusal of anything new once draining started.
const CLOSED: RuntimeError = RuntimeError::Unavailable("the server is draining or shutting down");

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Lifecycle {
    /// No new turns: draining or shutting down.
    closed: AtomicBool,
    /// Shutdown began: unlike an admin drain, it is never undone.
    shutting_down: AtomicBool,
    draining: watch::Sender<bool>,
    /// Stops the background loops (the reaper): at shutdown, or when the
    /// runtime is dropped.
    background: CancellationToken,
    /// Stops the loops live turns need while they run (lease renewal):
    /// once shutdown has seen the turns end (or gave up on them), or when
    /// the runtime is dropped.
    turns_over: CancellationToken,
    turns: TaskTracker,
    jobs: TaskTracker,
    /// Cancels the jobs still running at shutdown's hard limit.
    cancel_jobs: CancellationToken,
    started: Instant,
}

impl Lifecycle {
    pub(crate) fn new() -> Self {
        Self {
            closed: AtomicBool::new(false),
            shutting_down: AtomicBool::new(false),
            draining: watch::Sender::new(false),
            background: CancellationToken::new(),
            turns_over: CancellationToken::new(),
            turns: TaskTracker::new(),
            jobs: TaskTracker::new(),
            cancel_jobs: CancellationToken::new(),
            started: Instant::now(),
        }
    }

    /// Time since the runtime opened.
    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// True once draining or shutdown started.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// `Err` once draining or shutdown started.
    pub(crate) fn admitting(&self) -> Result<(), RuntimeError> {
        if self.is_closed() {
            return Err(CLOSED);
        }
        Ok(())
    }

    /// Refuses new turns from now on and reports the runtime as draining.
    pub(crate) fn stop_admitting(&self) {
        self.closed.store(true, Ordering::Release);
        self.draining.send_replace(true);
    }

    /// Refuses new turns for good: shutdown began, and no
    /// [`Lifecycle::resume_admitting`] undoes it.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        self.stop_admitting();
    }

    /// Admits turns again after an admin drain; `Ok(true)` when it was
    /// draining, `Ok(false)` when it was admitting already. Refused once
    /// shutdown began.
    pub(crate) fn resume_admitting(&self) -> Result<bool, RuntimeError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(RuntimeError::Unavailable("the server is shutting down"));
        }
        // The drain's wait closed the tracker; turns admitted from now on
        // are tracked for the next drain or the shutdown as before.
        self.turns.reopen();
        let was = self.closed.swap(false, Ordering::AcqRel);
        self.draining.send_replace(false);
        // A shutdown that began meanwhile wins: closed again.
        if self.shutting_down.load(Ordering::Acquire) {
            self.stop_admitting();
            return Err(RuntimeError::Unavailable("the server is shutting down"));
        }
        Ok(was)
    }

    /// Watches the draining flag.
    pub(crate) fn draining(&self) -> watch::Receiver<bool> {
        self.draining.subscribe()
    }

    /// Cancelled when the background loops must stop.
    pub(crate) fn background(&self) -> CancellationToken {
        self.background.clone()
    }

    /// Cancelled when no turn needs the loops that serve live turns any
    /// more (see [`Lifecycle::wind_down`]): later than [`Lifecycle::background`].
    pub(crate) fn turns_over(&self) -> CancellationToken {
        self.turns_over.clone()
    }

    /// Spawns a turn's task (or the prestart task of its first request).
    pub(crate) fn spawn_turn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.turns.spawn(task)
    }

    /// Spawns a job (see the module docs); it is cancelled if still
    /// running at shutdown's hard limit.
    pub(crate) fn spawn_job<F>(&self, job: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let cancel = self.cancel_jobs.clone();
        self.jobs.spawn(async move {
            tokio::select! {
                biased;
                () = cancel.cancelled() => tracing::debug!("a job was cancelled by shutdown"),
                () = job => {}
            }
        });
    }

    /// Waits, at most `timeout`, until no turn task is left. Further turns
    /// are still tracked.
    pub(crate) async fn wait_turns(&self, timeout: Duration) {
        self.turns.close();
        let _ = tokio::time::timeout(timeout, self.turns.wait()).await;
    }

    /// Shutdown's waiting: gives the turns `grace`, then calls
    /// `cancel_turns` and gives them `hard_limit` more; gives the jobs what
    /// is left of `grace + hard_limit` and cancels those still running then.
    /// Call [`Lifecycle::stop_admitting`] first.
    pub(crate) async fn wind_down(
        &self,
        grace: Duration,
        hard_limit: Duration,
        cancel_turns: impl FnOnce(),
    ) {
        let started = tokio::time::Instant::now();
        self.background.cancel();
        self.turns.close();
        self.jobs.close();
        if tokio::time::timeout(grace, self.turns.wait())
            .await
            .is_err()
        {
            cancel_turns();
            if tokio::time::timeout(hard_limit, self.turns.wait())
                .await
                .is_err()
            {
                tracing::error!("live turns did not end within the hard limit");
            }
        }
        // Every turn has ended (or is past saving): no job starts after this,
        // and no lease needs renewing.
        self.turns_over.cancel();
        let left = grace
            .saturating_add(hard_limit)
            .saturating_sub(started.elapsed());
        if tokio::time::timeout(left, self.jobs.wait()).await.is_err() {
            tracing::warn!("background jobs did not end within the hard limit; cancelling them");
            self.cancel_jobs.cancel();
            if tokio::time::timeout(CANCELLED_JOBS_WAIT, self.jobs.wait())
                .await
                .is_err()
            {
                tracing::error!("cancelled background jobs did not end");
            }
        }
    }
}

impl Drop for Lifecycle {
    fn drop(&mut self) {
        self.background.cancel();
        self.turns_over.cancel();
    }
}
