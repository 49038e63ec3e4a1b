//! Operator calls (admin principals only) and the idle-runner reaper.

use std::time::{Duration, Instant};

use super::Runtime;
use crate::error::RuntimeError;
use crate::limits::{MAX_ID_BYTES, check_short};
use crate::store::ListQuery;
use crate::types::{Principal, Spent};

/// Sessions read per page while summing a user's usage.
const USAGE_PAGE: usize = 500;

/// What one user's sessions spent, for `GetUserUsage`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserUsage {
    /// Sessions the user owns.
    pub sessions: u64,
    /// Their ended turns' usage and cost, summed.
    pub spent: Spent,
}

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

/// Admin principals only; a restricted principal never passes (the config
/// refuses `restricted` with `admin`, this holds whatever built it).
pub(super) fn require_admin(who: &Principal) -> Result<(), RuntimeError> {
    if who.admin && !who.restricted {
        Ok(())
    } else {
        Err(RuntimeError::PermissionDenied(
            "this call needs an admin principal",
        ))
    }
}

/// Closes runners idle past the timeout, every `reap_interval`, until the
/// runtime shuts down (or is dropped). A job of the runtime's: shutdown
/// waits for it to end.
pub(crate) fn spawn_reaper(runtime: &Runtime) {
    let weak = std::sync::Arc::downgrade(&runtime.inner);
    let stop = runtime.inner.lifecycle.background();
    let every = runtime.inner.config.reap_interval;
    runtime.inner.lifecycle.spawn_job(async move {
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
            // `reap_idle_runners` closed their session-scoped tools.
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
        let busy = self.inner.slots.busy_sessions();
        let reaped = self
            .inner
            .runners
            .reap(now, self.inner.config.runner_idle_timeout, &busy);
        self.close_orphaned_tools(&busy);
        reaped
    }

    /// Closes, in jobs of the runtime, the session-scoped tools (processes,
    /// workspaces) of sessions left with neither a cached runner nor a live
    /// turn (`busy`).
    pub(crate) fn close_orphaned_tools(&self, busy: &std::collections::HashSet<String>) {
        for tools in self.inner.runners.take_orphans(busy) {
            self.inner
                .lifecycle
                .spawn_job(async move { tools.close().await });
        }
    }

    /// Closes cached runners (all, or `user_id`'s). A live turn keeps its
    /// own selection; its session gets a new runner on its next turn.
    pub fn reset_runners(
        &self,
        who: &Principal,
        user_id: Option<&str>,
    ) -> Result<usize, RuntimeError> {
        require_admin(who)?;
        if let Some(user) = user_id {
            crate::limits::check_short("user_id", user, crate::limits::MAX_ID_BYTES)?;
        }
        let reset = self.inner.runners.reset(user_id);
        self.close_orphaned_tools(&self.inner.slots.busy_sessions());
        Ok(reset)
    }

    /// Marks every runner for rebuild before its next turn.
    pub fn invalidate_runners(&self, who: &Principal) -> Result<usize, RuntimeError> {
        self.reset_runners(who, None)
    }

    /// Stops admitting turns and waits, at most `timeout`, until none is
    /// live. Returns how many are still live.
    pub async fn drain(&self, who: &Principal, timeout: Duration) -> Result<usize, RuntimeError> {
        require_admin(who)?;
        self.stop_admitting();
        self.inner.lifecycle.wait_turns(timeout).await;
        Ok(self.live_turns())
    }

    /// Admits turns again after [`Runtime::drain`] (admin principals only);
    /// the draining flag, and so readiness, turns back. Returns whether it
    /// was draining. UNAVAILABLE once the shutdown began: that is never
    /// undone.
    pub fn undrain(&self, who: &Principal) -> Result<bool, RuntimeError> {
        require_admin(who)?;
        self.inner.lifecycle.resume_admitting()
    }

    /// What `user_id`'s sessions spent (admin principals only): their
    /// `spent` summed over every session the user owns, archived ones
    /// included, read page by page from the store.
    pub async fn user_usage(
        &self,
        who: &Principal,
        user_id: &str,
    ) -> Result<UserUsage, RuntimeError> {
        require_admin(who)?;
        if user_id.is_empty() {
            return Err(RuntimeError::invalid("user_id", "is empty; name the user"));
        }
        check_short("user_id", user_id, MAX_ID_BYTES)?;
        let mut usage = UserUsage::default();
        let mut after = None;
        loop {
            let query = ListQuery {
                include_archived: true,
                limit: USAGE_PAGE,
                after,
                ..ListQuery::default()
            };
            let page = self.inner.store.list_sessions(user_id, &query).await?;
            for session in &page.sessions {
                usage.sessions = usage.sessions.saturating_add(1);
                let spent = &session.spent;
                usage.spent = usage.spent.plus(&spent.usage, Some(spent.cost_nano_usd));
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(usage),
            }
        }
    }

    /// Runtime-wide numbers.
    pub async fn stats(&self, who: &Principal) -> Result<RuntimeStats, RuntimeError> {
        require_admin(who)?;
        let (live_turns, watching, waiting) = self.inner.slots.counts();
        Ok(RuntimeStats {
            live_turns,
            cached_runners: self.cached_runners(),
            watchers: watching + waiting,
            sessions_stored: self.inner.store.count_sessions().await?,
            uptime: self.uptime(),
            draining: self.is_closed(),
            default_model: self.inner.models.defaults().model,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;
    use futures::StreamExt as _;

    use super::*;
    use crate::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream, Models};
    use crate::runtime::{ChatInput, RuntimeConfig};
    use crate::store::MemoryStore;
    use crate::types::{ContentBlock, NewSession};

    /// Streams one delta, then never finishes.
    #[derive(Debug)]
    struct Stall;

    #[async_trait]
    impl ModelProvider for Stall {
        async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
            let first = futures::stream::iter([Ok(ModelEvent::TextDelta("x".into()))]);
            Ok(Box::pin(first.chain(futures::stream::pending())))
        }
    }

    async fn runtime() -> Runtime {
        let mut models = Models::with_builtin();
        models.insert("stall", Arc::new(Stall));
        Runtime::open(
            RuntimeConfig::default(),
            Arc::new(MemoryStore::new()),
            models,
        )
        .await
        .unwrap()
    }

    async fn session(rt: &Runtime, who: &Principal) -> String {
        rt.create_session(who, NewSession::default())
            .await
            .unwrap()
            .id
    }

    fn input(session_id: &str, model: &str) -> ChatInput {
        ChatInput {
            session_id: session_id.to_owned(),
            content: vec![ContentBlock::text("hi")],
            model: Some(model.to_owned()),
            ..ChatInput::default()
        }
    }

    #[tokio::test]
    async fn the_reaper_closes_idle_runners_but_never_a_busy_one() {
        let rt = runtime().await;
        let who = Principal::local();
        let idle = session(&rt, &who).await;
        let busy = session(&rt, &who).await;
        let done = rt.chat(&who, input(&idle, "builtin/echo")).await.unwrap();
        assert!(done.collect::<Vec<_>>().await.last().unwrap().is_final());
        let mut live = rt.chat(&who, input(&busy, "stall/x")).await.unwrap();
        // Wait until the stalled turn is streaming.
        while !matches!(
            live.next().await.unwrap().kind,
            crate::events::EventKind::Text(_)
        ) {}
        assert_eq!(rt.cached_runners(), 2);

        assert_eq!(
            rt.reap_idle_runners(Instant::now()),
            0,
            "nothing is idle yet"
        );
        let later = Instant::now() + Duration::from_secs(601);
        assert_eq!(rt.reap_idle_runners(later), 1);
        assert_eq!(rt.cached_runners(), 1, "the busy session keeps its runner");
        assert_eq!(rt.live_turns(), 1);
        assert!(rt.stop_session(&who, &busy).await.unwrap());
        assert_eq!(rt.reap_idle_runners(later), 1, "once idle it is reaped too");
    }

    #[tokio::test]
    async fn admin_calls_refuse_non_admins() {
        let rt = runtime().await;
        let user = Principal::new("u", false, crate::types::ActorKind::ApiKey);
        assert!(matches!(
            rt.reset_runners(&user, None),
            Err(RuntimeError::PermissionDenied(_))
        ));
        assert!(matches!(
            rt.stats(&user).await,
            Err(RuntimeError::PermissionDenied(_))
        ));
        assert!(matches!(
            rt.drain(&user, Duration::ZERO).await,
            Err(RuntimeError::PermissionDenied(_))
        ));
        assert!(matches!(
            rt.user_usage(&user, "u").await,
            Err(RuntimeError::PermissionDenied(_))
        ));
        assert!(!rt.is_closed());
        rt.stop_admitting();
        assert!(matches!(
            rt.undrain(&user),
            Err(RuntimeError::PermissionDenied(_))
        ));
        assert!(rt.is_closed());
    }

    #[tokio::test]
    async fn undrain_admits_turns_again_but_never_after_shutdown() {
        let rt = runtime().await;
        let who = Principal::local();
        let id = session(&rt, &who).await;
        let mut draining = rt.draining();
        assert!(!rt.undrain(&who).unwrap(), "it was not draining");
        assert_eq!(rt.drain(&who, Duration::ZERO).await.unwrap(), 0);
        assert!(*draining.borrow_and_update());
        assert!(matches!(
            rt.chat(&who, input(&id, "builtin/echo")).await,
            Err(RuntimeError::Unavailable(_))
        ));
        assert!(rt.undrain(&who).unwrap(), "it was draining");
        assert!(!*draining.borrow_and_update());
        assert!(!rt.is_closed());
        let done = rt.chat(&who, input(&id, "builtin/echo")).await.unwrap();
        assert!(done.collect::<Vec<_>>().await.last().unwrap().is_final());
        // A drain after the undrain still waits for turns admitted since.
        let live = rt.chat(&who, input(&id, "stall/x")).await.unwrap();
        assert_eq!(rt.drain(&who, Duration::from_millis(50)).await.unwrap(), 1);
        drop(live);
        rt.shutdown(Duration::ZERO, Duration::from_secs(5)).await;
        assert!(matches!(
            rt.undrain(&who),
            Err(RuntimeError::Unavailable(_))
        ));
        assert!(rt.is_closed());
    }
}
