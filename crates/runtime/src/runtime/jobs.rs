//! The runtime's background jobs: a step run every period until the
//! runtime stops or is dropped (the pinger, `store_health.rs`; the renewer
//! and the sweeper, `leases.rs`, which starts them all).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::Runtime;

/// One of the jobs: a step run every period.
pub(crate) trait Job: Send + 'static {
    /// One step; `false` once the runtime is gone.
    fn tick(&mut self, period: Duration) -> impl std::future::Future<Output = bool> + Send;
}

/// Runs `job` every `period` (the first step after one period) until
/// `stop` is cancelled or the runtime is dropped.
pub(crate) fn every(
    runtime: &Runtime,
    period: Duration,
    mut job: impl Job,
    stop: CancellationToken,
) {
    let period = period.max(Duration::from_millis(10));
    runtime.inner.lifecycle.spawn_job(async move {
        let mut timer = tokio::time::interval(period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = timer.tick() => {}
            }
            let keep_going = tokio::select! {
                () = stop.cancelled() => return,
                go = job.tick(period) => go,
            };
            if !keep_going {
                return;
            }
        }
    });
}
