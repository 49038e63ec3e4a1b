//! The `detached_tasks` quota: A2A tasks still working after the call that
//! sent them ended (the caller dropped the stream, its deadline passed,
//! `return_immediately`, or the task waits for the caller's tool result).
//! A task keeps running without its caller (docs/a2a.md), so one user
//! could otherwise leave any number behind.
//!
//! The bound is enforced by refusing a *new* task while the user has
//! `detached_tasks` of them still working — `RESOURCE_EXHAUSTED` with a
//! `QuotaFailure` — rather than ending the oldest: a detached task may be
//! one its caller meant to collect later, and ending it would lose work
//! silently; a refusal is visible, and CancelTask (or the task ending)
//! makes room. Counted per replica: a task is counted where its call ran.
//! Resumed or re-subscribed tasks stay counted until they end.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use agentrt_runtime::quota::{Quota, QuotaExceeded};
use agentrt_runtime::types::{Principal, TurnStatus};
use agentrt_runtime::{Runtime, RuntimeError};

/// Most tasks remembered per user, whatever their state: a user who never
/// sends another task does not make the registry grow without bound (the
/// oldest entry, most likely ended, is forgotten first).
const MAX_REMEMBERED: usize = 256;

/// A detached task: (session id, turn id).
type Task = (String, String);

/// Each user's detached tasks, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Detached {
    users: Mutex<HashMap<String, VecDeque<Task>>>,
}

impl Detached {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Task>>> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn left(&self, user: &str, task: Task) {
        let mut users = self.lock();
        let tasks = users.entry(user.to_owned()).or_default();
        if !tasks.contains(&task) {
            tasks.push_back(task);
        }
        while tasks.len() > MAX_REMEMBERED {
            tasks.pop_front();
        }
    }

    /// Refuses a new task of `who` while `limit` of theirs are detached and
    /// still working; forgets those that ended.
    pub(crate) async fn admit(
        &self,
        runtime: &Runtime,
        who: &Principal,
        limit: Option<u64>,
    ) -> Result<(), RuntimeError> {
        let Some(limit) = limit else {
            return Ok(());
        };
        let known: Vec<Task> = self
            .lock()
            .get(&who.user_id)
            .map(|tasks| tasks.iter().cloned().collect())
            .unwrap_or_default();
        let mut ended = Vec::new();
        let mut working = 0u64;
        for (session, turn) in known {
            match runtime.turn(who, &session, &turn).await {
                Ok(Some(detail)) if detail.record.status == TurnStatus::Running => working += 1,
                // Ended, deleted, or unreadable now: not counted.
                Ok(_) | Err(_) => ended.push((session, turn)),
            }
        }
        {
            let mut users = self.lock();
            if let Some(tasks) = users.get_mut(&who.user_id) {
                tasks.retain(|task| !ended.contains(task));
                if tasks.is_empty() {
                    users.remove(&who.user_id);
                }
            }
        }
        if working >= limit {
            return Err(RuntimeError::QuotaExceeded(QuotaExceeded {
                quota: Quota::DetachedTasks,
                limit,
                retry_after: None,
            }));
        }
        Ok(())
    }

    /// Watches the call that sent task `turn` of `session`: unless
    /// [`CallerGuard::ended`] says the task ended first, the task counts
    /// as detached once the guard drops.
    pub(crate) fn guard(
        self: &Arc<Self>,
        who: &Principal,
        session: &str,
        turn: &str,
    ) -> CallerGuard {
        CallerGuard {
            registry: Arc::clone(self),
            user: who.user_id.clone(),
            task: Some((session.to_owned(), turn.to_owned())),
        }
    }

    /// How many tasks of `user` are remembered (tests).
    #[cfg(test)]
    pub(crate) fn remembered(&self, user: &str) -> usize {
        self.lock().get(user).map_or(0, VecDeque::len)
    }
}

/// A call attached to its task; see [`Detached::guard`].
#[derive(Debug)]
pub(crate) struct CallerGuard {
    registry: Arc<Detached>,
    user: String,
    task: Option<Task>,
}

impl CallerGuard {
    /// The task ended while its caller was still there: it never counts.
    pub(crate) fn ended(&mut self) {
        self.task = None;
    }
}

impl Drop for CallerGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.registry.left(&self.user, task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tasks_left_working_are_remembered() {
        let registry = Arc::new(Detached::default());
        let who = Principal::new("u", false, agentrt_runtime::types::ActorKind::A2a);
        let mut finished = registry.guard(&who, "s", "t1");
        finished.ended();
        drop(finished);
        assert_eq!(registry.remembered("u"), 0);
        drop(registry.guard(&who, "s", "t2"));
        drop(registry.guard(&who, "s", "t2"));
        assert_eq!(registry.remembered("u"), 1);
        for i in 0..MAX_REMEMBERED + 10 {
            drop(registry.guard(&who, "s", &format!("x{i}")));
        }
        assert_eq!(registry.remembered("u"), MAX_REMEMBERED);
    }
}
