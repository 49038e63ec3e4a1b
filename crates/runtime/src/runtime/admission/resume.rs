//! Resuming a paused turn (`TurnStatus::Paused`: it waits for caller
//! results or approvals with no process running it) when one of its calls
//! is answered, on any replica: its session's slot (and on a shared store
//! its lease) taken again under the same turn id, its runner and tools
//! rebuilt from the record's pause, its context read from history, a wait
//! registered for every call it still waits for — before anyone can find
//! it — and the turn launched at its tool phase, watchable with Subscribe.
//! A pause past its bound resumes to time out at once.

use crate::runtime::agents::TurnAgent;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::sync::oneshot;

use super::{Runtime, abandon};
use crate::error::RuntimeError;
use crate::hub::TurnHub;
use crate::model::ToolSpec;
use crate::runtime::caller_tools::{Answer, PendingCall};
use crate::runtime::context::Context;
use crate::runtime::queued::chat_input;
use crate::runtime::runners::Runner;
use crate::runtime::slots::{Claim, LiveTurn};
use crate::runtime::turn::{Resume, Start, TurnHolds, TurnPlan};
use crate::runtime::{Inner, OnDisconnect};
use crate::runtime::{lock, spans};
use crate::store::StoreError;
use crate::types::{ContentBlock, Message, Pause, Session, TurnRecord, TurnStatus, Wait};

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
        let Some(record) = self.paused_record(session).await? else {
            return Ok(None);
        };
        if turn_id.is_some_and(|t| t != record.turn_id) || !record.waits_for(call_id) {
            return Ok(None);
        }
        self.resume(session, record).await.map(Some)
    }

    /// The session's paused turn, resumed here so it can be stopped,
    /// interrupted or steered like a live one; `None` when a turn is live
    /// here or none is paused.
    pub(crate) async fn wake_paused(
        &self,
        session: &Session,
    ) -> Result<Option<Arc<LiveTurn>>, RuntimeError> {
        if self.live_of(session).is_some() {
            return Ok(None);
        }
        // The caller's session may be older than a pause since.
        let Some(now) = self
            .inner
            .store
            .get_session(&session.id)
            .await?
            .filter(|s| s.incarnation == session.incarnation)
        else {
            return Ok(None);
        };
        let Some(record) = self.paused_record(&now).await? else {
            return Ok(None);
        };
        self.resume(&now, record).await.map(Some)
    }

    /// Ends the session's paused turn when its wait is over its bound (the
    /// deadline, `approval_timeout`): resumed, it times out at once; this
    /// waits (bounded) for its end. Nothing when no turn is paused.
    pub(crate) async fn expire_pause(&self, session: &Session) -> Result<(), RuntimeError> {
        let Some(record) = self.paused_record(session).await? else {
            return Ok(());
        };
        if record
            .pause
            .as_ref()
            .is_none_or(|p| p.until > SystemTime::now())
        {
            return Ok(());
        }
        let live = self.resume(session, record).await?;
        // Ended or not by then, the caller goes on as with any busy session.
        let _ =
            tokio::time::timeout(crate::runtime::control::STOP_WAIT, live.done.cancelled()).await;
        Ok(())
    }

    /// Ends the paused turns past their bound (at most `limit` looked at):
    /// each is resumed here and times out at once. Run by the inbox sweep,
    /// so a paused turn nobody touches still ends; one resumed or ended
    /// elsewhere meanwhile is left alone.
    pub(crate) async fn end_expired_pauses(&self, limit: usize) {
        let expired = match self
            .inner
            .store
            .expired_pauses(SystemTime::now(), limit)
            .await
        {
            Ok(expired) => expired,
            Err(err) => {
                tracing::debug!(error = %err, "listing the paused turns past their bound failed");
                return;
            }
        };
        for record in expired {
            let session = match self.inner.store.get_session(&record.session_id).await {
                Ok(Some(s)) if s.incarnation == record.incarnation => s,
                Ok(_) => continue,
                Err(err) => {
                    tracing::debug!(error = %err, "reading a paused turn's session failed");
                    continue;
                }
            };
            match self.resume(&session, record).await {
                Ok(live) => tracing::info!(session_id = %session.id, turn_id = %live.turn_id,
                    "a paused turn reached its bound: it times out"),
                Err(err) => tracing::debug!(error = %err, session_id = %session.id,
                    "a paused turn past its bound was not resumed here"),
            }
        }
    }

    /// The record of `session`'s paused turn, if its latest turn is paused
    /// (`session` as just read from the store: a turn resumed since is no
    /// longer paused in its record).
    pub(crate) async fn paused_record(
        &self,
        session: &Session,
    ) -> Result<Option<TurnRecord>, RuntimeError> {
        let Some(turn_id) = session.paused_turn() else {
            return Ok(None);
        };
        Ok(self
            .inner
            .store
            .get_turn(&session.id, turn_id)
            .await?
            .filter(|r| r.status == TurnStatus::Paused && r.pause.is_some()))
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
        let (runner, tools, agent) = self.resumed_runner(session, &record, &pause).await?;
        let live = Arc::new(LiveTurn::new(
            record.turn_id.clone(),
            session.incarnation.clone(),
            record.request_id.clone(),
            session.owner.clone(),
            TurnHub::new(self.inner.config.replay),
        ));
        // Every call the pause waits for gets its wait before the turn can
        // be found; those answered already are dropped once history is read.
        let waits: HashMap<_, _> = pause
            .calls
            .iter()
            .map(|c| {
                let rx = lock(&live.pending_tools).wait_for(PendingCall::from(c));
                (c.call_id.clone(), (c.wait, rx))
            })
            .collect();
        let slot = match self.inner.slots.claim_turn(session, &live, false) {
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
        let reopened = match self.reopen(session, &record.turn_id).await {
            Ok(reopened) => reopened,
            Err(e) => {
                abandon(&live, slot, None);
                return Err(e);
            }
        };
        let span = spans::invoke_agent(&reopened.session, &live.turn_id, &runner.key.model);
        let (plan, resume) =
            resumed_plan(&self.inner, reopened, pause, (runner, tools, agent), waits);
        // Calls answered before the pause was left: a second answer is
        // told so.
        let answered = plan.record.pause.iter().flat_map(|p| &p.calls);
        for call in answered.filter(|c| !resume.waits.contains_key(&c.call_id)) {
            lock(&live.pending_tools).answered_before(&call.call_id);
        }
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

    /// The runner of a paused turn's model, the tools its pause says were
    /// offered (as its session's agent allows them) and that agent.
    async fn resumed_runner(
        &self,
        session: &Session,
        record: &TurnRecord,
        pause: &Pause,
    ) -> Result<(Arc<Runner>, Vec<ToolSpec>, Option<TurnAgent>), RuntimeError> {
        let input = chat_input(session.id.clone(), pause.input.clone());
        let selection = (record.model.clone(), record.thinking, "model");
        // A restricted principal's turn stays capability-free when resumed:
        // no server tools, no built-ins.
        let restricted = pause.input.restricted;
        let (runner, mut tools) = self
            .runner_and_tools(
                session,
                selection,
                restricted,
                input.extra_tools,
                &input.excluded_tools,
            )
            .await?;
        let agent = self.turn_agent(session).await?;
        let profile = agent.as_ref().map(|a| &*a.agent);
        let excluded = &input.excluded_tools;
        self.restrict_tools(&mut tools, &runner, session, profile, excluded, restricted)?;
        Ok((runner, tools, agent))
    }

    /// The store's side of a resume, under the session's slot: the record
    /// running again (with the lease, on a shared store), then the session,
    /// its context and the turn's user message read. A failed read pauses
    /// the turn again: nothing ran.
    async fn reopen(&self, session: &Session, turn_id: &str) -> Result<Reopened, RuntimeError> {
        let store = &self.inner.store;
        let record = store
            .resume_turn(&session.id, &session.incarnation, turn_id)
            .await
            .map_err(|e| match e {
                StoreError::Busy(lease) => RuntimeError::Elsewhere(lease),
                StoreError::NotPaused { .. } => RuntimeError::FailedPrecondition(
                    "the turn is no longer paused: it resumed elsewhere, or ended",
                ),
                other => other.into(),
            })?;
        let read = async {
            let now = store
                .get_session(&session.id)
                .await?
                .ok_or(RuntimeError::SessionNotFound)?;
            let context = Context::load(store.as_ref(), &now).await?.into_messages();
            let user_message = user_message(store.as_ref(), &record, &context).await?;
            Ok::<_, RuntimeError>((now, context, user_message))
        };
        match read.await {
            Ok((session, context, user_message)) => Ok(Reopened {
                record,
                session,
                context,
                user_message,
            }),
            Err(e) => {
                let mut paused = record;
                paused.status = TurnStatus::Paused;
                if let Err(err) = store.finish_turn(paused).await {
                    tracing::error!(error = %err, "re-pausing a turn whose resume failed");
                }
                Err(e)
            }
        }
    }
}

/// A paused turn running again in the store, with what it resumes from.
struct Reopened {
    record: TurnRecord,
    session: Session,
    context: Vec<Message>,
    user_message: Message,
}

/// The plan of a resumed turn and where it resumes: the calls of its pause
/// still open (their `waits` kept), its options from the pause.
fn resumed_plan(
    inner: &Inner,
    reopened: Reopened,
    pause: Pause,
    (runner, tools, agent): (Arc<Runner>, Vec<ToolSpec>, Option<TurnAgent>),
    mut waits: HashMap<String, (Wait, oneshot::Receiver<Answer>)>,
) -> (TurnPlan, Resume) {
    let Reopened {
        record,
        session,
        context,
        user_message,
    } = reopened;
    let open = open_calls(&pause, &record.turn_id, &context);
    waits.retain(|id, _| open.iter().any(|c| &c.call_id == id));
    let system_prompt = pause
        .input
        .system_override
        .clone()
        .or_else(|| (!session.system_prompt.is_empty()).then(|| session.system_prompt.clone()))
        .or_else(|| agent.as_ref().and_then(|a| a.prompt.clone()));
    let agent_steps = agent.as_ref().and_then(|a| a.agent.spec.max_steps);
    let auto_title = agent
        .as_ref()
        .and_then(|a| a.agent.spec.auto_title)
        .unwrap_or(true);
    let resume = Resume {
        index: pause.step,
        open,
        waits,
        context,
        event_seq: pause.event_seq,
        until: instant(pause.until),
    };
    let plan = TurnPlan {
        runner,
        record,
        user_message,
        system_prompt,
        session,
        tools,
        max_steps: pause
            .input
            .max_steps
            .or(agent_steps)
            .unwrap_or(inner.config.max_steps),
        max_output_tokens: pause.input.max_output_tokens,
        started: Instant::now(),
        deadline: Some(instant(pause.deadline)),
        require_approval: pause.input.require_approval,
        // The day's budget was checked when the turn was admitted.
        daily: None,
        auto_title,
    };
    (plan, resume)
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
    store: &dyn crate::store::Store,
    record: &TurnRecord,
    context: &[Message],
) -> Result<Message, RuntimeError> {
    if let Some(m) = context.iter().find(|m| m.seq == record.user_message_seq) {
        return Ok(m.clone());
    }
    let after = record.user_message_seq.saturating_sub(1);
    store
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
