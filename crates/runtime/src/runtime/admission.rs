//! Admission of a turn: [`Runtime::chat`] as a short sequence — validate,
//! resolve the session once, plan, begin — after which the turn runs in its
//! own task (`turn`) and admission has nothing more to do with it.
//!
//! - *validate*: the request alone (`validate`), no side effect.
//! - *resolve*: the session record, read once; a retried request id
//!   attaches to its turn or replays it instead.
//! - *plan*: every decision that needs no slot — the model and its runner,
//!   the tools offered, the provider's capacity, the system prompt — into
//!   a [`Plan`].
//! - *begin*: take the session's slot, store the turn's record and user
//!   message durably (the one re-read of the session record, under the
//!   slot) while the first model request is pre-started, then spawn the
//!   turn. A rejection at any point stores nothing and frees the slot.
//!
//! Admission must not return before the user message is durable, and the
//! model must not be called before then either (docs/contract.md §3.3): a sled
//! transaction plus a device flush, together ~0.1–0.6 ms here. Admission
//! yields to the prestart task once (so it loads the context and builds the
//! request meanwhile), then writes: the store's transaction, then its flush
//! on the store's flusher, shared with other writers. Nothing is
//! acknowledged before the flush: the turn emits `turn_started` and the
//! user message's `message_stored` only after admission returned.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use tokio::sync::{mpsc, oneshot};
use tracing::Instrument as _;

use self::offer::{admit_model, offered};
use super::queued::Busy;
use super::runners::{Runner, RunnerKey};
use super::slots::{Claim, LiveTurn, TurnSlot};
use super::turn::prestart::{self, FirstRequest, Prestart};
use super::turn::{DailyBudget, Emitter, Start, Turn, TurnHolds, TurnPlan};
use super::validate::{self, Checked};
use super::{ChatInput, Inner, OnBusy, OnDisconnect, Runtime, TurnStream, replay, spans};
use crate::error::RuntimeError;
use crate::hub::TurnHub;
use crate::model::{Reservation, ToolSpec};
use crate::quota::{LiveTurnGuard, QuotaExceeded, WriteQuota};
use crate::store::StoreError;
use crate::types::{
    InputActor, Message, NewMessage, Principal, Session, ThinkingLevel, TurnRecord, TurnStatus,
    Usage,
};

/// An agent's step and time limits for a call that sets none.
fn apply_agent_limits(
    checked: &mut Checked,
    spec: &crate::agents::AgentSpec,
    input: &ChatInput,
    config: &crate::runtime::RuntimeConfig,
) {
    if input.max_steps.is_none()
        && let Some(steps) = spec.max_steps
    {
        checked.max_steps = steps.min(config.max_steps.max(1) * 8);
    }
    if input.timeout.is_none()
        && let Some(timeout) = spec.turn_timeout
    {
        let mut timeout = timeout.min(config.max_turn_timeout);
        if let Some(d) = input.transport_deadline {
            timeout = timeout.min(d.saturating_sub(validate::transport_margin(d)));
        }
        checked.timeout = timeout;
    }
}

/// What admission decided about a turn before taking its session's slot.
struct Plan {
    /// The request's checked limits.
    checked: Checked,
    /// The session's runner for the turn's model selection.
    runner: Arc<Runner>,
    /// Tools offered to the model: the runner's server tools and the
    /// caller's, minus the excluded ones.
    tools: Vec<ToolSpec>,
    /// The capacity the provider set aside for the first step.
    reservation: Option<Reservation>,
    /// The call's system prompt, else the session's.
    system_prompt: Option<String>,
    /// The call replaced the session's system prompt.
    system_overridden: bool,
    /// The caller's quota, for the write that begins the turn.
    quota: WriteQuota,
    /// The owner's budget for the day, when one is set.
    daily: Option<DailyBudget>,
    /// The caller's provenance, stored on the user message.
    actor: InputActor,
    /// Whether the turn may title its session (its agent's `auto_title`).
    auto_title: bool,
}

impl Runtime {
    /// Admits and starts a turn. On `Ok` the user message is durable and the
    /// stream's first event is `TurnStarted`; on `Err` nothing was stored.
    ///
    /// With a `request_id` this session already admitted, nothing runs: the
    /// stream attaches to that turn while it is live, or replays its stored
    /// outcome.
    pub async fn chat(
        &self,
        who: &Principal,
        mut input: ChatInput,
    ) -> Result<TurnStream, RuntimeError> {
        self.inner.lifecycle.admitting()?;
        self.inner.health.admitting()?;
        let checked = validate::chat_input(&input, &self.inner.config)?;
        // Before anything routes the message (a queue, a live turn).
        super::restricted::check_chat(who, &input, &self.inner.config)?;
        // The session record's one read before the slot; `store_user`
        // re-reads it under the slot.
        let session = self.owned_session(who, &input.session_id).await?;
        // From here on the session's stored key (see `keys`).
        input.session_id.clone_from(&session.id);
        if let Some(rid) = &input.request_id
            && let Some(existing) = self.existing_turn(&session, rid).await?
        {
            return Ok(existing);
        }
        // Media become blobs of the session before anything routes the
        // message (a queue, a live turn): those carry references only. A
        // refused admission may leave them stored — content-addressed, so a
        // retry adds nothing, and deleted with the session.
        input.content = super::media::store_user_media(
            &self.inner,
            &session.owner,
            &session.id,
            std::mem::take(&mut input.content),
        )
        .await?;
        // A paused turn past its bound ends first (it times out).
        self.expire_pause(&session).await?;
        let on_busy = input.on_busy;
        if on_busy == OnBusy::Reject {
            return self.admit(who, session, input, checked, None).await;
        }
        // What a busy session does with the message (module `busy`).
        let busy = Busy::of(who, &input);
        if on_busy == OnBusy::Enqueue
            && let Some(queued) = self.behind_inbox(&session, &busy).await?
        {
            return Ok(queued);
        }
        match self.admit(who, session.clone(), input, checked, None).await {
            Err(err @ (RuntimeError::SessionBusy { .. } | RuntimeError::SessionCompacting)) => {
                self.when_busy(who, session, on_busy, busy, err).await
            }
            admitted => admitted,
        }
    }

    /// Plans and begins a turn of `session` for `input`; `from_inbox`
    /// names the queued message it runs.
    pub(super) async fn admit(
        &self,
        who: &Principal,
        session: Session,
        mut input: ChatInput,
        checked: Checked,
        from_inbox: Option<String>,
    ) -> Result<TurnStream, RuntimeError> {
        let checked = Checked {
            restricted: super::restricted::admit(who, &input, &self.inner.config)?,
            ..checked
        };
        let mut plan = self.plan(&session, &mut input, checked).await?;
        plan.quota = self.write_quota(who);
        plan.actor = who.input_actor();
        plan.daily = self.spent_today(&session.owner, plan.quota.limits).await?;
        self.begin(session, input, plan, from_inbox).await
    }

    /// The owner's budget for today with what it spent, when `limits` set
    /// one; refused ([`QuotaExceeded`], retry at midnight UTC) once spent.
    async fn spent_today(
        &self,
        owner: &str,
        limits: crate::quota::QuotaLimits,
    ) -> Result<Option<DailyBudget>, RuntimeError> {
        if !limits.limits_days() {
            return Ok(None);
        }
        let now = SystemTime::now();
        let day = crate::quota::day_window(now).0;
        let spent = self.inner.store.daily_spent(owner, day).await?;
        if let Some(refused) = limits.daily_reached(spent, now) {
            return Err(RuntimeError::QuotaExceeded(refused));
        }
        Ok(Some(DailyBudget { limits, spent }))
    }

    /// The turn's decisions (see [`Plan`]); takes the call's extra tools
    /// and system prompt out of `input`.
    async fn plan(
        &self,
        session: &Session,
        input: &mut ChatInput,
        checked: Checked,
    ) -> Result<Plan, RuntimeError> {
        if session.archived {
            return Err(RuntimeError::SessionArchived);
        }
        if let Some((limit, value)) = session.budget.reached(&session.spent) {
            return Err(RuntimeError::QuotaExceeded(QuotaExceeded::budget(
                limit, value,
            )));
        }
        // The session's agent, resolved once: a turn keeps this version and
        // prompt whatever changes while it runs.
        let agent = self.turn_agent(session).await?;
        let profile = agent.as_ref().map(|a| &a.agent.spec);
        let mut checked = checked;
        if let Some(spec) = profile {
            apply_agent_limits(&mut checked, spec, input, &self.inner.config);
            input
                .require_approval
                .extend(spec.require_approval.iter().cloned());
        }
        let (model, thinking, model_field) =
            self.inner
                .models
                .for_turn(input.model.as_deref(), input.thinking, session, profile);
        let extra = std::mem::take(&mut input.extra_tools);
        let (runner, mut tools) = self
            .runner_and_tools(
                session,
                (model, thinking, model_field),
                checked.restricted,
                extra,
                &input.excluded_tools,
            )
            .await?;
        // A restricted principal's turn gets no built-in tools either.
        let profile = agent.as_ref().map(|a| &*a.agent);
        let excluded = &input.excluded_tools;
        self.restrict_tools(
            &mut tools,
            &runner,
            session,
            profile,
            excluded,
            checked.restricted,
        )?;
        let reservation = admit_model(&runner, &tools, input.max_output_tokens)?;
        let system_overridden = input.system_override.is_some();
        let system_prompt = input
            .system_override
            .take()
            .or_else(|| (!session.system_prompt.is_empty()).then(|| session.system_prompt.clone()))
            .or_else(|| agent.as_ref().and_then(|a| a.prompt.clone()));
        let auto_title = agent
            .as_ref()
            .and_then(|a| a.agent.spec.auto_title)
            .unwrap_or(true);
        Ok(Plan {
            checked,
            runner,
            tools,
            reservation,
            system_prompt,
            system_overridden,
            quota: WriteQuota::default(),
            daily: None,
            actor: InputActor::new(crate::types::ActorKind::System, &session.owner),
            auto_title,
        })
    }

    /// The session's runner for `model` and `thinking` (`model_field`
    /// names the request field they came from, for errors), and the tools
    /// offered with it: the runner's server tools and the caller's
    /// `extra`, minus `excluded`. A `restricted` principal's runner has no
    /// server tools.
    async fn runner_and_tools(
        &self,
        session: &Session,
        (model, thinking, model_field): (String, Option<ThinkingLevel>, &str),
        restricted: bool,
        extra: Vec<ToolSpec>,
        excluded: &[String],
    ) -> Result<(Arc<Runner>, Vec<ToolSpec>), RuntimeError> {
        let inner = &self.inner;
        let key = RunnerKey {
            model,
            thinking,
            incarnation: session.incarnation.clone(),
            restricted,
        };
        let runner = inner
            .runners
            .runner_for(
                &inner.models,
                &inner.toolbox,
                (&session.id, &session.owner),
                key,
                model_field,
            )
            .await?;
        let tools = offered(&runner, extra, excluded)?;
        Ok((runner, tools))
    }

    /// Takes the session's slot, stores the turn's start durably and spawns
    /// the turn.
    /// A queued message's turn (`from_inbox`) takes the message's id.
    async fn begin(
        &self,
        session: Session,
        input: ChatInput,
        mut plan: Plan,
        from_inbox: Option<String>,
    ) -> Result<TurnStream, RuntimeError> {
        let admitted_at = Instant::now();
        let live = Arc::new(LiveTurn::new(
            from_inbox.clone().unwrap_or_else(crate::types::new_id),
            session.incarnation.clone(),
            input.request_id.clone(),
            session.owner.clone(),
            TurnHub::new(self.inner.config.replay),
        ));
        let claimed = self
            .inner
            .slots
            .claim_turn(&session, &live, from_inbox.is_some())?;
        let slot = match claimed {
            Claim::Claimed(slot) => slot,
            // A concurrent retry of the same request joins the turn.
            Claim::Joined(busy) => return Ok(TurnStream::attached(session.id.clone(), &busy, 0)),
        };
        let counted = match self.meter(&session.owner, &plan.quota) {
            Ok(counted) => counted,
            Err(refused) => {
                abandon(&live, slot, None);
                return Err(refused);
            }
        };
        // The operator's BeforeTurn hooks: before anything is stored or
        // the first model request is built (they may replace its system
        // prompt); the slot is held meanwhile.
        let turn = super::hooks::context(&session, &live.turn_id, &plan.runner.key.model);
        if let Err(refused) =
            super::hooks::before_turn(&self.inner, turn, &input.content, &mut plan.system_prompt)
                .await
        {
            abandon(&live, slot, counted);
            return Err(refused);
        }
        let held = Held {
            live,
            slot,
            counted,
            admitted_at,
            from_inbox,
        };
        self.start(session, input, plan, held).await
    }

    /// Stores the user message with the turn's record (the durable start;
    /// the first model request is already on its way) and launches the
    /// turn; a refused write leaves no trace.
    async fn start(
        &self,
        session: Session,
        input: ChatInput,
        plan: Plan,
        held: Held,
    ) -> Result<TurnStream, RuntimeError> {
        let Held {
            live,
            slot,
            counted,
            admitted_at,
            from_inbox,
        } = held;
        let turn_id = live.turn_id.clone();
        let runner = plan.runner;
        let record = TurnRecord {
            from_inbox,
            ..running_record(&session, &live, &runner, plan.system_overridden)
        };
        // The turn's span, a child of the caller's (the RPC span), carried
        // explicitly into the spawned turn; its first model step's span is
        // made here because that request starts during admission.
        let span = spans::invoke_agent(&session, &turn_id, &runner.key.model);
        let first_chat = spans::chat(&span, &runner.key.model);
        let first = FirstRequest {
            tools: plan.tools.clone(),
            max_output_tokens: input.max_output_tokens,
            reservation: plan.reservation,
            span: first_chat.clone(),
            turn: super::hooks::context(&session, &turn_id, &runner.key.model),
        };
        let write = TurnWrite {
            record: record.clone(),
            user_message: NewMessage::from_user(&turn_id, input.content, input.speaker, plan.actor),
            quota: plan.quota,
        };
        let system_prompt = plan.system_prompt;
        let begun = store_user(
            &self.inner,
            &runner,
            &session,
            write,
            system_prompt.clone(),
            first,
        )
        .instrument(span.clone())
        .await;
        let Begun {
            session,
            user,
            prestart,
        } = match begun {
            Ok(begun) => begun,
            Err(e) => {
                abandon(&live, slot, counted);
                return self.rejected(&session, &record, e).await;
            }
        };
        let plan = TurnPlan {
            runner,
            record: TurnRecord {
                user_message_seq: user.seq,
                ..record
            },
            user_message: user,
            system_prompt,
            session,
            tools: plan.tools,
            max_steps: plan.checked.max_steps,
            max_output_tokens: input.max_output_tokens,
            started: admitted_at,
            deadline: plan.checked.deadline_from(admitted_at),
            require_approval: input.require_approval,
            daily: plan.daily,
            auto_title: plan.auto_title,
        };
        let holds = TurnHolds {
            slot,
            start: Start::Admitted(prestart, first_chat),
            quota: counted,
        };
        Ok(self.launch(live, plan, holds, input.on_disconnect, span))
    }

    /// Spawns the turn admission stored and planned (its user message is
    /// durable, its lease committed) and hands the caller its stream.
    fn launch(
        &self,
        live: Arc<LiveTurn>,
        plan: TurnPlan,
        holds: TurnHolds,
        on_disconnect: OnDisconnect,
        span: tracing::Span,
    ) -> TurnStream {
        let inner = &self.inner;
        if inner.shared {
            // The lease is committed: the renewer may renew it from now on.
            live.mark_leased();
        }
        let (tx, rx) = mpsc::channel(inner.config.event_buffer.max(1));
        let session = plan.session.clone();
        let turn_id = plan.record.turn_id.clone();
        let emitter = Emitter::new(
            Arc::clone(&live),
            tx,
            &inner.config,
            on_disconnect,
            plan.started,
        );
        let turn = Turn::new(Arc::clone(inner), Arc::clone(&live), plan, holds);
        inner
            .lifecycle
            .spawn_turn(turn.run(emitter).instrument(span));
        inner.slots.wake_waiters(&session, &live);
        TurnStream::own(session.id, turn_id, rx, live, on_disconnect)
    }

    /// On a store only this process writes, counts the turn against its
    /// owner's live-turn and per-minute quotas here (a shared store counts
    /// them in `begin_turn`'s transaction): the guard keeps it counted while
    /// the turn lives.
    fn meter(
        &self,
        owner: &str,
        quota: &WriteQuota,
    ) -> Result<Option<LiveTurnGuard>, RuntimeError> {
        if quota.count_turns {
            return Ok(None);
        }
        self.inner
            .turn_meter
            .admit(owner, &quota.limits, SystemTime::now())
            .map_err(RuntimeError::QuotaExceeded)
    }

    /// The turn a request id already started in this session, as a stream:
    /// attached while live, replayed from the store once finished.
    async fn existing_turn(
        &self,
        session: &Session,
        request_id: &str,
    ) -> Result<Option<TurnStream>, RuntimeError> {
        if let Some(stream) = self.attach_if_live(session, request_id) {
            return Ok(Some(stream));
        }
        let Some(record) = self
            .inner
            .store
            .find_turn_by_request(&session.id, request_id)
            .await?
        else {
            return Ok(None);
        };
        if record.status == TurnStatus::Running {
            if let Some(stream) = self.attach_if_live(session, request_id) {
                return Ok(Some(stream));
            }
            // Live on another replica: the adapter forwards the join there.
            if let Some(lease) = self.lease_elsewhere(&session.id).await?
                && lease.turn_id == record.turn_id
            {
                return Err(RuntimeError::Elsewhere(lease));
            }
        }
        Ok(Some(
            replay::replay_turn(self.inner.store.as_ref(), record).await?,
        ))
    }

    /// What a failed `begin_turn` means for the caller (the slot is freed
    /// already). On a shared store another replica may have admitted the
    /// same request id between this admission's look-up and its write, and
    /// even finished it: the store then refuses the duplicate, and the
    /// caller gets that turn — joined or replayed — as a retry would.
    /// Otherwise see [`Runtime::busy_elsewhere`].
    async fn rejected(
        &self,
        session: &Session,
        record: &TurnRecord,
        err: RuntimeError,
    ) -> Result<TurnStream, RuntimeError> {
        if self.inner.shared
            && let RuntimeError::Store(StoreError::Backend(_)) = &err
            && let Some(rid) = &record.request_id
        {
            match self.existing_turn(session, rid).await {
                Ok(Some(existing)) => return Ok(existing),
                Err(moved @ RuntimeError::Elsewhere(_)) => return Err(moved),
                // Not that race: the store's own error stands.
                Ok(None) | Err(_) => {}
            }
        }
        Err(self.busy_elsewhere(session, record, err).await)
    }

    /// What a failed `begin_turn` means for the caller. On a shared store
    /// the session may be busy on another replica (`StoreError::Busy`):
    /// SESSION_BUSY with that turn's id — unless the caller retries the
    /// request that turn was started with, which then joins it there
    /// ([`RuntimeError::Elsewhere`]). Nothing was stored either way.
    async fn busy_elsewhere(
        &self,
        session: &Session,
        record: &TurnRecord,
        err: RuntimeError,
    ) -> RuntimeError {
        let RuntimeError::Store(StoreError::Busy(lease)) = err else {
            return err;
        };
        let mine = self.replica_id() == Some(lease.replica_id.as_str());
        if let Some(rid) = &record.request_id
            && !mine
        {
            match self
                .inner
                .store
                .find_turn_by_request(&session.id, rid)
                .await
            {
                Ok(Some(started)) if started.turn_id == lease.turn_id => {
                    return RuntimeError::Elsewhere(lease);
                }
                Ok(_) => {}
                Err(e) => return e.into(),
            }
        }
        RuntimeError::SessionBusy {
            turn_id: lease.turn_id,
        }
    }

    /// A watcher stream on the session's live turn, when it is the one
    /// started with `request_id`.
    fn attach_if_live(&self, session: &Session, request_id: &str) -> Option<TurnStream> {
        let turn = self.live_of(session)?;
        if turn.request_id.as_deref() != Some(request_id) {
            return None;
        }
        Some(TurnStream::attached(session.id.clone(), &turn, 0))
    }
}

/// An admitted turn's durable start.
struct Begun {
    /// The session as it was when the user message was stored (re-read
    /// under the slot).
    session: Session,
    /// The stored, durable user message.
    user: Message,
    /// The context load and first model request, under way.
    prestart: Prestart,
}

/// What begins a turn in the store: its record, its user message, and the
/// caller's quota the write is checked against.
struct TurnWrite {
    record: TurnRecord,
    user_message: NewMessage,
    quota: WriteQuota,
}

/// Stores the turn's record and user message durably (`record`'s
/// `user_message_seq` is overwritten), with the context load and first
/// model request started alongside. The caller holds the session's slot.
async fn store_user(
    inner: &Arc<Inner>,
    runner: &Arc<Runner>,
    admitted: &Session,
    write: TurnWrite,
    system_prompt: Option<String>,
    first: FirstRequest,
) -> Result<Begun, RuntimeError> {
    let TurnWrite {
        record,
        user_message,
        quota,
    } = write;
    // The one re-read of the session record that correctness needs: a turn
    // may have ended (storing its answer, or compacting) between the
    // admission's first read and taking the slot, so the first read's
    // `next_seq` and compaction state may be stale. Under the slot nothing
    // else writes to the session, so this read stays exact.
    let session = inner
        .store
        .get_session(&admitted.id)
        .await?
        .filter(|s| s.owner == admitted.owner)
        .ok_or(RuntimeError::SessionNotFound)?;
    let provisional = Message {
        seq: session.next_seq,
        body: user_message.clone(),
        compacted: false,
    };
    let (go, durable) = oneshot::channel();
    let prestart = prestart::spawn(
        inner,
        runner,
        &session,
        provisional,
        system_prompt.clone(),
        first.clone(),
        durable,
    );
    // Let the task load the context and build the request while this one
    // hands the write to a blocking thread and the flusher.
    tokio::task::yield_now().await;
    let user = inner
        .store
        .begin_turn_within(record, user_message, &quota)
        .await?;
    if user.seq == session.next_seq {
        // Durable: the model may be called now (docs/contract.md §3.3).
        let _ = go.send(());
        return Ok(Begun {
            session,
            user,
            prestart,
        });
    }
    drop(prestart);
    reload(inner, runner, session, user, system_prompt, first).await
}

/// Something else wrote to the session although this turn holds its slot
/// (a store anomaly, never seen in the normal course): the context is
/// loaded again from the store as it is now — the only third read — after
/// the user message `user` stored.
async fn reload(
    inner: &Arc<Inner>,
    runner: &Arc<Runner>,
    session: Session,
    user: Message,
    system_prompt: Option<String>,
    first: FirstRequest,
) -> Result<Begun, RuntimeError> {
    tracing::warn!(
        session_id = %session.id,
        expected = session.next_seq,
        stored = user.seq,
        "the session changed while its turn was being admitted; reloading its context"
    );
    let mut session = inner
        .store
        .get_session(&session.id)
        .await?
        .ok_or(RuntimeError::SessionNotFound)?;
    session.next_seq = user.seq;
    let (go, durable) = oneshot::channel();
    let prestart = prestart::spawn(
        inner,
        runner,
        &session,
        user.clone(),
        system_prompt,
        first,
        durable,
    );
    let _ = go.send(());
    Ok(Begun {
        session,
        user,
        prestart,
    })
}

/// What a turn being admitted holds before its durable start.
struct Held {
    live: Arc<LiveTurn>,
    slot: TurnSlot,
    /// Its count against the owner's quotas (a store only this process
    /// writes).
    counted: Option<LiveTurnGuard>,
    admitted_at: Instant,
    /// The queued message the turn runs.
    from_inbox: Option<String>,
}

/// A rejected admission leaves no trace: the slot freed, the hub closed
/// for any retry that already joined, the quota count given back.
pub(super) fn abandon(live: &LiveTurn, slot: TurnSlot, counted: Option<LiveTurnGuard>) {
    live.hub.abort();
    drop(slot);
    if let Some(counted) = counted {
        counted.refund();
    }
}

/// The record of a turn about to begin (`Running`; its user message's seq
/// is set by the store).
fn running_record(
    session: &Session,
    live: &LiveTurn,
    runner: &Runner,
    system_overridden: bool,
) -> TurnRecord {
    TurnRecord {
        turn_id: live.turn_id.clone(),
        session_id: session.id.clone(),
        status: TurnStatus::Running,
        started_at: live.started_at,
        finished_at: None,
        model: runner.key.model.clone(),
        thinking: runner.key.thinking,
        system_overridden,
        usage: Usage::default(),
        user_message_seq: 0,
        error: None,
        cancel_reason: None,
        request_id: live.request_id.clone(),
        incarnation: session.incarnation.clone(),
        steps: 0,
        cost_nano_usd: None,
        from_inbox: None,
        pause: None,
        delegated: crate::types::Spent::default(),
    }
}

mod offer;
mod resume;
#[cfg(test)]
mod tests;
