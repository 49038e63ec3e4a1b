//! Resuming a paused turn (`TurnStatus::Paused`: it waits for caller
//! results or approvals with no process running it) when one of its calls
//! is answered, on any replica: its session's slot (and on a shared store
//! its lease) taken again under the same turn id, its runner and tools
//! rebuilt from the record's pause, its context read from history, a wait
//! registered for every call it still waits for — before anyone can find
//! it — and the turn launched at its tool phase, watchable with Subscribe.
//! A pause past its bound resumes to time out at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use super::offer::offered;
use super::{Runtime, abandon};
use crate::error::RuntimeError;
use crate::hub::TurnHub;
use crate::runtime::OnDisconnect;
use crate::runtime::caller_tools::PendingCall;
use crate::runtime::context::Context;
use crate::runtime::runners::RunnerKey;
use crate::runtime::slots::{Claim, LiveTurn};
use crate::runtime::turn::{Resume, Start, TurnHolds, TurnPlan};
use crate::runtime::{lock, spans};
use crate::store::StoreError;
use crate::types::{ContentBlock, Message, Pause, Session, TurnRecord, TurnStatus};

impl Runtime {
    /// The paused turn of `session` (the one named `turn_id`, when given)
    /// that waits for `call_id`, resumed here: its live turn, ready for the
    /// answer. `None` when the session has no such paused turn.
    pub(crate) async fn resume_paused(
        &self,
        session: &Session,
        turn_id: Option<&str>,
        call_id: &str,
    ) -> Result<Option<Arc<LiveTurn>>, RuntimeError> {
        let Some((session, record)) = self.paused_record(session).await? else {
            return Ok(None);
        };
        if turn_id.is_some_and(|t| t != record.turn_id) || !record.waits_for(call_id) {
            return Ok(None);
        }
        self.resume(&session, record).await.map(Some)
    }

    /// The session's paused turn, resumed here so it can be stopped,
    /// interrupted or steered like a live one; `None` when a turn is live
    /// here or none is paused.
    pub(crate) async fn wake_paused(
        &self,
        session: &Session,
    ) -> Result<Option<Arc<LiveTurn>>, RuntimeError> {
        if session.paused_turn().is_none() || self.live_of(session).is_some() {
            return Ok(None);
        }
        let Some((now, record)) = self.paused_record(session).await? else {
            return Ok(None);
        };
        self.resume(&now, record).await.map(Some)
    }

    /// Ends the session's paused turn when its wait is over its bound (the
    /// deadline, `approval_timeout`): resumed, it times out at once; this
    /// waits (bounded) for its end. Nothing when no turn is paused.
    pub(crate) async fn expire_pause(&self, session: &Session) -> Result<(), RuntimeError> {
        if session.paused_turn().is_none() {
            return Ok(());
        }
        let Some((now, record)) = self.paused_record(session).await? else {
            return Ok(());
        };
        if record
            .pause
            .as_ref()
            .is_none_or(|p| p.until > SystemTime::now())
        {
            return Ok(());
        }
        let live = self.resume(&now, record).await?;
        // Ended or not by then, the caller goes on as with any busy session.
        let _ =
            tokio::time::timeout(crate::runtime::control::STOP_WAIT, live.done.cancelled()).await;
        Ok(())
    }

    /// The session as stored now and its paused turn's record, if its
    /// latest turn is paused.
    pub(crate) async fn paused_record(
        &self,
        session: &Session,
    ) -> Result<Option<(Session, TurnRecord)>, RuntimeError> {
        let store = &self.inner.store;
        let Some(now) = store
            .get_session(&session.id)
            .await?
            .filter(|s| s.incarnation == session.incarnation)
        else {
            return Ok(None);
        };
        let Some(turn_id) = now.paused_turn() else {
            return Ok(None);
        };
        let record = store
            .get_turn(&now.id, turn_id)
            .await?
            .filter(|r| r.status == TurnStatus::Paused && r.pause.is_some());
        Ok(record.map(|r| (now, r)))
    }

    /// Resumes the paused turn `record` of `session` here (see the module
    /// docs); its live turn.
    pub(crate) async fn resume(
        &self,
        session: &Session,
        record: TurnRecord,
    ) -> Result<Arc<LiveTurn>, RuntimeError> {
        self.inner.lifecycle.admitting()?;
        let Some(pause) = record.pause.clone() else {
            return Err(RuntimeError::FailedPrecondition("the turn is not paused"));
        };
        let inner = &self.inner;
        let key = RunnerKey {
            model: record.model.clone(),
            thinking: record.thinking,
            incarnation: session.incarnation.clone(),
        };
        let runner = inner
            .runners
            .runner_for(
                &inner.models,
                &inner.toolbox,
                (&session.id, &session.owner),
                key,
                "model",
            )
            .await?;
        let extra = pause
            .input
            .extra_tools
            .iter()
            .map(|t| crate::model::ToolSpec {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            })
            .collect();
        let tools = offered(&runner, extra, &pause.input.excluded_tools)?;
        let live = Arc::new(LiveTurn::new(
            record.turn_id.clone(),
            session.incarnation.clone(),
            record.request_id.clone(),
            TurnHub::new(inner.config.replay),
        ));
        // Every call the pause waits for gets its wait before the turn can
        // be found; those answered already are dropped below.
        let mut waits: HashMap<_, _> = pause
            .calls
            .iter()
            .map(|c| {
                let rx = lock(&live.pending_tools).wait_for(PendingCall::from(c));
                (c.call_id.clone(), (c.wait, rx))
            })
            .collect();
        let slot = match inner.slots.claim_turn(session, &live, false) {
            Ok(Claim::Claimed(slot)) => slot,
            Ok(Claim::Joined(busy)) => return Ok(busy),
            // Resumed here a moment ago by another answer.
            Err(RuntimeError::SessionBusy { turn_id }) if turn_id == record.turn_id => {
                return self
                    .live_of(session)
                    .ok_or(RuntimeError::SessionBusy { turn_id });
            }
            Err(e) => return Err(e),
        };
        let resumed = inner
            .store
            .resume_turn(&session.id, &session.incarnation, &record.turn_id)
            .await;
        let record = match resumed {
            Ok(record) => record,
            Err(e) => {
                abandon(&live, slot, None);
                return Err(match e {
                    StoreError::Busy(lease) => RuntimeError::Elsewhere(lease),
                    StoreError::NotPaused { .. } => RuntimeError::FailedPrecondition(
                        "the turn is no longer paused: it resumed elsewhere, or ended",
                    ),
                    other => other.into(),
                });
            }
        };
        let loaded = async {
            let now = inner
                .store
                .get_session(&session.id)
                .await?
                .ok_or(RuntimeError::SessionNotFound)?;
            let context = Context::load(inner.store.as_ref(), &now).await?;
            Ok::<_, RuntimeError>((now, context.into_messages()))
        }
        .await;
        let (now, context) = match loaded {
            Ok(loaded) => loaded,
            Err(e) => {
                // Paused again for a later answer: nothing ran.
                let mut paused = record;
                paused.status = TurnStatus::Paused;
                if let Err(err) = inner.store.finish_turn(paused).await {
                    tracing::error!(error = %err, "re-pausing a turn whose resume failed");
                }
                abandon(&live, slot, None);
                return Err(e);
            }
        };
        let open = open_calls(&pause, &record.turn_id, &context);
        waits.retain(|id, _| open.iter().any(|c| &c.call_id == id));
        for call in &pause.calls {
            if !waits.contains_key(&call.call_id) {
                lock(&live.pending_tools).answered_before(&call.call_id);
            }
        }
        let user_message = user_message(inner, &record, &context).await?;
        let span = spans::invoke_agent(&now, &record.turn_id, &runner.key.model);
        let resume = Resume {
            index: pause.step,
            open,
            waits,
            context,
            event_seq: pause.event_seq,
            until: instant(pause.until),
        };
        let system_prompt = pause
            .input
            .system_override
            .clone()
            .or_else(|| (!now.system_prompt.is_empty()).then(|| now.system_prompt.clone()));
        let plan = TurnPlan {
            runner,
            record,
            user_message,
            system_prompt,
            session: now,
            tools,
            max_steps: pause.input.max_steps.unwrap_or(inner.config.max_steps),
            max_output_tokens: pause.input.max_output_tokens,
            started: Instant::now(),
            deadline: Some(instant(pause.deadline)),
            require_approval: pause.input.require_approval,
        };
        let holds = TurnHolds {
            slot,
            start: Start::Resumed(resume),
            quota: None,
        };
        tracing::info!(session_id = %session.id, turn_id = %live.turn_id, "resuming a paused turn");
        // Nobody reads its own stream: it runs on, watched with Subscribe.
        drop(self.launch(Arc::clone(&live), plan, holds, OnDisconnect::Continue, span));
        Ok(live)
    }
}

/// The calls of `pause` still without a result in `context`, in call
/// order.
fn open_calls(pause: &Pause, turn_id: &str, context: &[Message]) -> Vec<crate::types::PausedCall> {
    let answered: Vec<&str> = context
        .iter()
        .filter(|m| m.body.turn_id == turn_id)
        .flat_map(|m| &m.body.content)
        .filter_map(|b| match b {
            ContentBlock::ToolResult { call_id, .. } => Some(call_id.as_str()),
            _ => None,
        })
        .collect();
    pause
        .calls
        .iter()
        .filter(|c| !answered.contains(&c.call_id.as_str()))
        .cloned()
        .collect()
}

/// The turn's stored user message: in its context, or read.
async fn user_message(
    inner: &crate::runtime::Inner,
    record: &TurnRecord,
    context: &[Message],
) -> Result<Message, RuntimeError> {
    if let Some(m) = context.iter().find(|m| m.seq == record.user_message_seq) {
        return Ok(m.clone());
    }
    let after = record.user_message_seq.saturating_sub(1);
    inner
        .store
        .history(&record.session_id, after, 1, true)
        .await?
        .into_iter()
        .next()
        .ok_or(RuntimeError::FailedPrecondition(
            "the paused turn's user message is gone",
        ))
}

/// The monotonic instant of wall time `at` (now, when it passed).
fn instant(at: SystemTime) -> tokio::time::Instant {
    let left = at.duration_since(SystemTime::now()).unwrap_or_default();
    tokio::time::Instant::now() + left
}
