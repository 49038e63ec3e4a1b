//! Operator calls (admin principals only) and the idle-runner reaper.

use std::time::{Duration, Instant};

use super::{Runtime, lock};
use crate::error::RuntimeError;
use crate::types::{Principal, ThinkingLevel};

/// Runtime-wide numbers for `GetRuntimeStats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Turns running now.
    pub live_turns: usize,
    /// Cached runners.
    pub cached_runners: usize,
    /// Watchers attached to live turns or waiting for one.
    pub watchers: usize,
    /// Sessions in the store (all users).
    pub sessions_stored: u64,
    /// Time since start.
    pub uptime: Duration,
    /// Whether new turns are refused.
    pub draining: bool,
    /// The current default `provider/model`.
    pub default_model: String,
}

fn require_admin(who: &Principal) -> Result<(), RuntimeError> {
    if who.admin {
        Ok(())
    } else {
        Err(RuntimeError::PermissionDenied(
            "this call needs an admin principal",
        ))
    }
}

/// Closes runners idle past the timeout, every `reap_interval`, until the
/// runtime shuts down.
pub(crate) fn spawn_reaper(runtime: &Runtime) {
    let weak = std::sync::Arc::downgrade(&runtime.inner);
    let stop = runtime.inner.background.clone();
    let every = runtime.inner.config.reap_interval;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let Some(inner) = weak.upgrade() else { return };
            let reaped = Runtime { inner }.reap_idle_runners(Instant::now());
            if reaped > 0 {
                tracing::debug!(reaped, "closed idle runners");
            }
        }
    });
}

impl Runtime {
    /// Closes runners unused for longer than the idle timeout at `now`,
    /// except those whose session has a live turn. Returns how many.
    pub fn reap_idle_runners(&self, now: Instant) -> usize {
        let idle_for = self.inner.config.runner_idle_timeout;
        let live = lock(&self.inner.live);
        let mut runners = lock(&self.inner.runners);
        let before = runners.len();
        runners.retain(|session_id, runner| {
            live.contains_key(session_id)
                || now.saturating_duration_since(*lock(&runner.last_used)) < idle_for
        });
        before - runners.len()
    }

    /// Closes cached runners (all, or `user_id`'s). A live turn keeps its
    /// own selection; its session gets a new runner on its next turn.
    pub fn reset_runners(
        &self,
        who: &Principal,
        user_id: Option<&str>,
    ) -> Result<usize, RuntimeError> {
        require_admin(who)?;
        let mut runners = lock(&self.inner.runners);
        let before = runners.len();
        runners.retain(|_, r| user_id.is_some_and(|u| r.owner != u));
        Ok(before - runners.len())
    }

    /// Marks every runner for rebuild before its next turn.
    pub fn invalidate_runners(&self, who: &Principal) -> Result<usize, RuntimeError> {
        self.reset_runners(who, None)
    }

    /// Sets the default model and thinking level for turns admitted from
    /// now on. Returns the previous model.
    pub fn set_default_model(
        &self,
        who: &Principal,
        model: &str,
        thinking: Option<ThinkingLevel>,
    ) -> Result<String, RuntimeError> {
        require_admin(who)?;
        self.inner
            .models
            .resolve(model)
            .map_err(|e| RuntimeError::unknown_model("model", &e))?;
        let mut defaults = lock(&self.inner.defaults);
        let previous = std::mem::replace(&mut defaults.model, model.to_owned());
        defaults.thinking = thinking;
        Ok(previous)
    }

    /// Stops admitting turns and waits, at most `timeout`, until none is
    /// live. Returns how many are still live.
    pub async fn drain(&self, who: &Principal, timeout: Duration) -> Result<usize, RuntimeError> {
        require_admin(who)?;
        self.stop_admitting();
        self.inner.tasks.close();
        let _ = tokio::time::timeout(timeout, self.inner.tasks.wait()).await;
        Ok(self.live_turns())
    }

    /// Runtime-wide numbers.
    pub async fn stats(&self, who: &Principal) -> Result<RuntimeStats, RuntimeError> {
        require_admin(who)?;
        let (live_turns, watching) = {
            let live = lock(&self.inner.live);
            (
                live.len(),
                live.values().map(|t| t.hub.watcher_count()).sum::<usize>(),
            )
        };
        let waiting: usize = lock(&self.inner.waiters).values().map(Vec::len).sum();
        Ok(RuntimeStats {
            live_turns,
            cached_runners: self.cached_runners(),
            watchers: watching + waiting,
            sessions_stored: self.inner.store.count_sessions().await?,
            uptime: self.uptime(),
            draining: self.is_closed(),
            default_model: lock(&self.inner.defaults).model.clone(),
        })
    }
}
