//! Watching, stopping and inspecting a session's live turn.

use std::time::{Duration, SystemTime};

use super::slots::Next;
use super::{Cancelled, Runtime, TurnStream};
use crate::error::RuntimeError;
use crate::events::Phase;
use crate::types::{CancelReason, Principal};

/// How long StopSession waits for the turn to end.
pub(crate) const STOP_WAIT: Duration = Duration::from_secs(5);

/// A session's live-turn status.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionStatus {
    /// The live turn, if any: (turn id, phase, admission time).
    pub live: Option<(String, Phase, SystemTime)>,
    /// Watchers attached to the live turn.
    pub watchers: usize,
    /// The session's inbox: messages queued to run as later turns, oldest
    /// first.
    pub queued: Vec<crate::types::Queued>,
    /// Steering messages waiting for the live turn's next step boundary.
    pub steering: usize,
    /// Tool calls the live or paused turn waits for: caller-executed
    /// tools' results and approvals.
    pub pending_calls: Vec<PendingCall>,
    /// The paused turn (waiting for its pending calls with no process
    /// running it), when no turn is live.
    pub paused: Option<String>,
}

use super::caller_tools::PendingCall;

impl Runtime {
    /// Attaches read-only to the session's live turn from `after_seq`.
    /// `None` when nothing is live and `wait_for_turn` is false.
    pub async fn subscribe(
        &self,
        who: &Principal,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<Option<TurnStream>, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let key = session.id.clone();
        let session_id = key.as_str();
        if let Some(stream) = self.attach_if_live_from(&session, after_seq) {
            return Ok(Some(stream));
        }
        self.not_elsewhere(session_id).await?;
        // Nothing is live anywhere: a wait for the next turn waits for one
        // admitted here, or — on a shared store — until another replica
        // admits it (`cluster::NextTurns`; the stream then ends saying
        // where, see `TurnStream::moved_to`).
        if !wait_for_turn {
            return Ok(None);
        }
        self.inner.lifecycle.admitting()?;
        match self
            .inner
            .slots
            .wait_for_turn(&session, self.inner.config.max_waiters_per_session)?
        {
            Next::Live(turn) => Ok(Some(TurnStream::attached(
                session.id.clone(),
                &turn,
                after_seq,
            ))),
            Next::Waiting(rx) => Ok(Some(TurnStream::waiting(session.id, rx, after_seq))),
        }
    }

    fn attach_if_live_from(
        &self,
        session: &crate::types::Session,
        after_seq: u64,
    ) -> Option<TurnStream> {
        self.live_of(session)
            .map(|turn| TurnStream::attached(session.id.clone(), &turn, after_seq))
    }

    /// Cancels the live turn (reason STOPPED) and waits, at most 5 s, until
    /// it has ended. `false` when nothing was live.
    pub async fn stop_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<bool, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let key = session.id.clone();
        let session_id = key.as_str();
        // A paused turn is stopped like a live one: resumed here first.
        self.wake_paused(&session).await?;
        match self
            .cancel_live(&session, CancelReason::Stopped, STOP_WAIT)
            .await
        {
            Cancelled::NothingLive => self.not_elsewhere(session_id).await.map(|()| false),
            Cancelled::Ended => Ok(true),
            // `stopped` means stopped: the turn is told and will end, but
            // saying so now would be a lie.
            Cancelled::StillEnding => Err(RuntimeError::Unavailable(
                "the turn was told to stop but has not ended within 5 s; call StopSession again or check GetSessionStatus",
            )),
        }
    }

    /// The session's live-turn status.
    pub async fn session_status(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<SessionStatus, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let key = session.id.clone();
        let session_id = key.as_str();
        let mut status = match self.live_of(&session) {
            Some(turn) => SessionStatus {
                live: Some((turn.turn_id.clone(), turn.phase(), turn.started_at)),
                watchers: turn.hub.watcher_count(),
                queued: Vec::new(),
                steering: turn.steering(),
                pending_calls: super::lock(&turn.pending_tools).calls(),
                paused: None,
            },
            None => {
                self.not_elsewhere(session_id).await?;
                let paused = self.paused_record(&session).await?;
                SessionStatus {
                    live: None,
                    watchers: 0,
                    queued: Vec::new(),
                    steering: 0,
                    pending_calls: paused
                        .as_ref()
                        .and_then(|r| r.pause.as_ref())
                        .map(|p| p.calls.iter().map(PendingCall::from).collect())
                        .unwrap_or_default(),
                    paused: paused.map(|r| r.turn_id),
                }
            }
        };
        status.queued = self.inner.store.inbox().queued(session_id).await?;
        Ok(status)
    }

    /// Message `id` of one of `who`'s sessions while it waits in the
    /// session's inbox (`None` once it runs, ran, or was taken out).
    pub async fn queued_message(
        &self,
        who: &Principal,
        session_id: &str,
        id: &str,
    ) -> Result<Option<crate::types::Queued>, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let queued = self.inner.store.inbox().queued(&session.id).await?;
        Ok(queued.into_iter().find(|q| q.id == id).map(|mut q| {
            // As its client knows the session.
            q.session_id = super::keys::client_id(&q.session_id).to_owned();
            q
        }))
    }

    /// Takes message `id` out of the session's inbox before it runs (its
    /// Chat ends CANCELLED); whether it was still queued.
    pub async fn cancel_queued(
        &self,
        who: &Principal,
        session_id: &str,
        id: &str,
    ) -> Result<bool, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let taken = self
            .inner
            .store
            .inbox()
            .dequeue(&session.id, &session.incarnation, id, None)
            .await?;
        if taken {
            self.inner.slots.end_queued_waiter(
                &session.id,
                id,
                &super::slots::WaitEnded::NotRun(
                    crate::events::ErrorCode::Cancelled,
                    "the queued message was cancelled before it ran".to_owned(),
                ),
            );
        }
        Ok(taken)
    }

    /// Takes every queued message out of the session's inbox (none of
    /// them runs; their Chats end saying so); how many there were.
    pub async fn clear_inbox(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<u64, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let cleared = self.inner.store.inbox().clear(&session.id).await?;
        self.inner.slots.end_queued_waiters(
            &session.id,
            &super::slots::WaitEnded::NotRun(
                crate::events::ErrorCode::Cancelled,
                "the session's inbox was cleared (StopSession with clear_inbox) before this message ran"
                    .to_owned(),
            ),
        );
        Ok(cleared)
    }

    /// Evicts the session's cached runner; with `force` the live turn is
    /// stopped first. On a shared store, a session whose live turn runs on
    /// another replica is answered there ([`RuntimeError::Elsewhere`] after
    /// this replica's runner is evicted), as are `subscribe`,
    /// `stop_session` and `session_status`. A live turn keeps the
    /// selection it was admitted with.
    /// `true` when a runner was cached.
    pub async fn close_session(
        &self,
        who: &Principal,
        session_id: &str,
        force: bool,
    ) -> Result<bool, RuntimeError> {
        crate::limits::validate_session_id("session_id", session_id)?;
        let session = self.owned_session(who, session_id).await?;
        let key = session.id.clone();
        let session_id = key.as_str();
        if self.live_of(&session).is_none()
            && let Some(lease) = self.lease_elsewhere(session_id).await?
        {
            // This replica's runner goes now; the owner evicts its own
            // (and stops the turn with `force`) when the call reaches it.
            self.inner.runners.remove(session_id);
            self.close_orphaned_tools(&self.inner.slots.busy_sessions());
            return Err(RuntimeError::Elsewhere(lease));
        }
        if force {
            self.cancel_live(&session, CancelReason::Stopped, STOP_WAIT)
                .await;
        }
        let removed = self.inner.runners.remove(session_id);
        self.close_orphaned_tools(&self.inner.slots.busy_sessions());
        Ok(removed)
    }
}
