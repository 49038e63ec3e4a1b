//! Running a session's inbox: each queued message (`OnBusy::Enqueue`)
//! becomes its own turn, oldest first, when nothing else runs in the
//! session.
//!
//! Who looks: a turn's end (`Inner::turn_ended`, after it freed the
//! session), an enqueue
//! that may have found the session just freed, and a sweep every
//! `RuntimeConfig::inbox_sweep` over every session with queued messages —
//! which is also what runs them after a restart, or after the replica
//! whose turn held the session died (a shared store).
//!
//! Exactly once: the queued message leaves the inbox in the store write
//! that begins its turn (`TurnRecord::from_inbox`), refused when another
//! replica or an earlier look took it. A message that can never be
//! admitted (the session archived, its budget spent, its request no longer
//! valid) is taken out with a notice in history saying so; one that cannot
//! be admitted *now* (a quota that refills, a drain, a busy model) stays
//! queued for a later look.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::jobs::{Job, every};
use super::queued::chat_input;
use super::slots::{Next, WaitEnded};
use super::stream::{Found, Pending};
use super::{Inner, Runtime, validate};
use crate::error::RuntimeError;
use crate::events::ErrorCode;
use crate::types::{ContentBlock, NewMessage, Principal, Queued, Role, Session, TurnStatus};
use tokio::sync::mpsc;

/// How often a queued Chat's stream looks in the store for its message's
/// turn: one another replica admitted (and may have finished before the
/// next-turn watch saw it), or a message taken out elsewhere.
const QUEUE_CHECK: Duration = Duration::from_secs(1);

/// Sessions looked at per sweep.
const SWEEP_BATCH: usize = 256;

/// Looks at session `session_id`'s inbox in a task of its own.
pub(crate) fn kick(inner: &Arc<Inner>, session_id: &str) {
    let runtime = Runtime {
        inner: Arc::clone(inner),
    };
    let session_id = session_id.to_owned();
    inner
        .lifecycle
        .spawn_job(async move { runtime.run_queued(&session_id).await });
}

/// Starts the inbox's jobs: a look at each session whose turn ended
/// (`ended`, fed by [`Inner::turn_ended`]), and the sweep (the first one at
/// once: messages queued before a restart run without waiting for a
/// period).
pub(crate) fn spawn_jobs(runtime: &Runtime, mut ended: mpsc::Receiver<String>) {
    let weak = Arc::downgrade(&runtime.inner);
    let looks = weak.clone();
    let stop = runtime.inner.lifecycle.background();
    runtime.inner.lifecycle.spawn_job(async move {
        loop {
            let session_id = tokio::select! {
                () = stop.cancelled() => return,
                next = ended.recv() => match next {
                    Some(session_id) => session_id,
                    None => return,
                },
            };
            let Some(inner) = looks.upgrade() else {
                return;
            };
            kick(&inner, &session_id);
        }
    });
    let first = runtime.clone();
    runtime
        .inner
        .lifecycle
        .spawn_job(async move { first.sweep().await });
    every(
        runtime,
        runtime.inner.config.inbox_sweep,
        Sweep(weak),
        runtime.inner.lifecycle.background(),
    );
}

/// The periodic sweep (see the module docs).
struct Sweep(Weak<Inner>);

impl Job for Sweep {
    async fn tick(&mut self, _period: Duration) -> bool {
        let Some(inner) = self.0.upgrade() else {
            return false;
        };
        Runtime { inner }.sweep().await;
        true
    }
}

/// What a queued message's turn could not be admitted for, when waiting
/// does not help: its code and what the notice says. `None`: it stays
/// queued for a later look.
fn not_runnable(err: &RuntimeError) -> Option<(ErrorCode, String)> {
    let code = match err {
        // Gone with its session, taken by another look, or not yet.
        RuntimeError::SessionNotFound
        | RuntimeError::SessionBusy { .. }
        | RuntimeError::SessionCompacting
        | RuntimeError::Unavailable(_)
        | RuntimeError::ResourceExhausted(_)
        | RuntimeError::Elsewhere(_)
        | RuntimeError::Store(_) => return None,
        RuntimeError::QuotaExceeded(q) if q.retry_after.is_some() => return None,
        RuntimeError::QuotaExceeded(_) => ErrorCode::ResourceExhausted,
        RuntimeError::SessionArchived
        | RuntimeError::FailedPrecondition(_)
        | RuntimeError::AgentPrompt(_)
        | RuntimeError::CompactionFailed(_) => ErrorCode::FailedPrecondition,
        RuntimeError::AgentNotFound => ErrorCode::FailedPrecondition,
        RuntimeError::InvalidArgument(_) => ErrorCode::InvalidArgument,
        RuntimeError::PermissionDenied(_) => ErrorCode::PermissionDenied,
        // An operator hook refused the message: it never runs. One that is
        // fail-closed and did not answer may answer at a later look.
        RuntimeError::Hook(crate::hooks::HookStop::Refused { .. }) => ErrorCode::PermissionDenied,
        RuntimeError::Hook(crate::hooks::HookStop::Failed { .. }) => return None,
        RuntimeError::SessionExists | RuntimeError::AlreadyExists(_) => ErrorCode::Internal,
    };
    Some((code, err.to_string()))
}

/// The wait of a queued Chat's stream for the turn of message `id`: woken
/// here when this replica admits it, told by the next-turn watch when
/// another does, and — for what neither sees (a turn another replica ran
/// to its end between two looks, a message taken out elsewhere) — the
/// store looked at every [`QUEUE_CHECK`].
pub(crate) fn wait_for_queued(inner: &Arc<Inner>, session: &Session, id: &str) -> Pending {
    let first = inner
        .slots
        .wait_for_queued(session, id, inner.config.max_waiters_per_session);
    let weak = Arc::downgrade(inner);
    let session = session.clone();
    let id = id.to_owned();
    Pending(Box::pin(async move {
        let mut rx = match first {
            Ok(Next::Live(live)) => return Found::Live(live, 0),
            Ok(Next::Waiting(rx)) => rx,
            Err(RuntimeError::SessionNotFound) => return Found::Ended(WaitEnded::SessionDeleted),
            // Too many waits already: this one ends, the message stays
            // queued (follow it with Subscribe).
            Err(err) => {
                return Found::Ended(WaitEnded::NotRun(
                    ErrorCode::ResourceExhausted,
                    format!("{err}; the message stays queued"),
                ));
            }
        };
        loop {
            tokio::select! {
                woken = &mut rx => return match woken {
                    Ok(Ok(live)) => Found::Live(live, 0),
                    Ok(Err(ended)) => Found::Ended(ended),
                    // The waiters were dropped: the runtime is shutting down.
                    Err(_) => Found::Ended(shutting_down()),
                },
                () = tokio::time::sleep(QUEUE_CHECK) => {
                    let Some(inner) = weak.upgrade() else {
                        return Found::Ended(shutting_down());
                    };
                    if let Some(found) = look_up(&inner, &session, &id).await {
                        return found;
                    }
                }
            }
        }
    }))
}

fn shutting_down() -> WaitEnded {
    WaitEnded::NotRun(
        ErrorCode::Unavailable,
        "the server is shutting down; the queued message stays queued — follow it with \
         Subscribe(wait_for_turn) or read the session's history"
            .to_owned(),
    )
}

/// Where the turn of queued message `id` is, from the store: `None` while
/// the message is still queued (or the store cannot say).
async fn look_up(inner: &Arc<Inner>, session: &Session, id: &str) -> Option<Found> {
    let store = inner.store.as_ref();
    let record = match store.get_turn(&session.id, id).await {
        Ok(Some(record)) => record,
        Ok(None) => {
            let queued = store.inbox().queued(&session.id).await.ok()?;
            if queued.iter().any(|q| q.id == id) {
                return None;
            }
            // Taken out meanwhile: as its turn, or not run.
            match store.get_turn(&session.id, id).await.ok()? {
                Some(record) => record,
                None => {
                    return Some(Found::Ended(WaitEnded::NotRun(
                        ErrorCode::FailedPrecondition,
                        "the queued message was taken out of the inbox without running (the \
                         session's history says why)"
                            .to_owned(),
                    )));
                }
            }
        }
        Err(_) => return None,
    };
    if record.status != TurnStatus::Running {
        return super::replay::replay_events(store, &record)
            .await
            .ok()
            .map(Found::Replay);
    }
    if let Some(live) = inner.slots.live_of(session).filter(|l| l.turn_id == id) {
        return Some(Found::Live(live, 0));
    }
    let leases = inner.store.leases()?;
    match leases.leases_of(std::slice::from_ref(&session.id)).await {
        Ok(found) => found
            .into_iter()
            .find(|(_, lease)| lease.turn_id == id)
            .map(|(_, lease)| Found::Ended(WaitEnded::Elsewhere(lease))),
        Err(_) => None,
    }
}

impl Runtime {
    /// Every session with queued messages gets a look, and paused turns
    /// past their bound end.
    async fn sweep(&self) {
        if self.inner.lifecycle.admitting().is_err() {
            return;
        }
        self.end_expired_pauses(SWEEP_BATCH).await;
        let sessions = match self
            .inner
            .store
            .inbox()
            .sessions_with_queued(SWEEP_BATCH)
            .await
        {
            Ok(sessions) => sessions,
            Err(err) => {
                tracing::debug!(error = %err, "listing the sessions with queued messages failed");
                return;
            }
        };
        if !sessions.is_empty() {
            self.inner.inbox_used.store(true, Ordering::Relaxed);
        }
        for session_id in sessions {
            self.run_queued(&session_id).await;
        }
    }

    /// Admits the oldest queued message of session `session_id` as a turn,
    /// when nothing runs in the session (see the module docs).
    pub(crate) async fn run_queued(&self, session_id: &str) {
        if self.inner.lifecycle.admitting().is_err() {
            return;
        }
        let store = self.inner.store.as_ref();
        let next = match store.inbox().queued(session_id).await {
            Ok(queued) => queued.into_iter().next(),
            Err(err) => {
                tracing::debug!(error = %err, "reading a session's inbox failed");
                return;
            }
        };
        let Some(next) = next else {
            return;
        };
        let session = match store.get_session(session_id).await {
            Ok(Some(session)) => session,
            Ok(None) | Err(_) => return,
        };
        if self.live_of(&session).is_some() {
            // Its end looks again.
            return;
        }
        if session.incarnation != next.incarnation {
            // Of a deleted session of this id (its delete purges the inbox;
            // nothing should be left).
            if let Err(err) = store
                .inbox()
                .dequeue(session_id, &next.incarnation, &next.id, None)
                .await
            {
                tracing::debug!(error = %err, "dropping a stale queued message failed");
            }
            return;
        }
        self.admit_queued(session, next).await;
    }

    /// Admits queued message `next` of `session`; one that can never run is
    /// taken out with a notice.
    async fn admit_queued(&self, session: Session, next: Queued) {
        let mut who = Principal {
            restricted: next.input.restricted,
            ..Principal::new(
                session.owner.clone(),
                next.admin,
                crate::types::ActorKind::System,
            )
        };
        // The turn runs for the owner; its user message keeps the sender's
        // provenance (a message queued before provenance existed is the
        // runtime's).
        if let Some(actor) = next.actor {
            who.actor = actor;
        }
        let id = next.id;
        let input = chat_input(session.id.clone(), next.input);
        let admitted = match validate::chat_input(&input, &self.inner.config) {
            Ok(checked) => {
                self.admit(&who, session.clone(), input, checked, Some(id.clone()))
                    .await
            }
            Err(err) => Err(err),
        };
        match admitted {
            // Nobody reads this stream: the turn runs on (its callers
            // follow it as watchers), its events kept in its hub.
            Ok(stream) => drop(stream),
            Err(err) => {
                if let Some((code, why)) = not_runnable(&err) {
                    self.not_run(&session, &id, code, why).await;
                }
            }
        }
    }

    /// Takes queued message `id` out of the inbox with a notice in history
    /// saying why it did not run, and ends its Chat's wait.
    async fn not_run(&self, session: &Session, id: &str, code: ErrorCode, why: String) {
        let text = format!("the queued message {id} was not run: {why}");
        let notice = NewMessage::new(id, Role::Notice, vec![ContentBlock::text(text.clone())]);
        match self
            .inner
            .store
            .inbox()
            .dequeue(&session.id, &session.incarnation, id, Some(notice))
            .await
        {
            Ok(true) => {
                tracing::info!(session_id = %session.id, queued_id = %id, reason = %why,
                    "a queued message could not be run");
                self.inner
                    .slots
                    .end_queued_waiter(&session.id, id, &WaitEnded::NotRun(code, text));
            }
            Ok(false) => {}
            Err(err) => tracing::warn!(error = %err, "reporting a queued message not run failed"),
        }
    }
}
