//! `lf.a2a.v1.A2AService`: the A2A protocol's gRPC binding, served on the
//! public port beside agentrt.v1, behind the same authenticator, limits
//! and layers. An A2A context is an agentrt session and a task is one of
//! its turns; every call goes through the runtime core, exactly as the
//! agentrt.v1 handlers do (admission, busy sessions, the turn time limit,
//! durability; a caller's deadline ends its call, not the task), so nothing
//! is stored on the side.
//!
//! - [`tasks`]: task ids, a turn's events as A2A stream responses, a stored
//!   turn as a `Task`.
//! - [`errors`]: the A2A errors (status code + `google.rpc.ErrorInfo`) and
//!   the exhaustive mapping from core errors.
//! - [`ids`]: the caller's ids checked for size and charset before use.
//! - [`budget`]: the byte budget of the texts a task repeats.
//! - [`card`]: the agent card.
//! - `list`: `ListTasks`, a context's turn records as tasks.
//!
//! What is not supported, and what it answers instead, is in docs/a2a.md.

pub mod budget;
pub mod caller_tools;
pub mod card;
mod detached;
pub mod errors;
pub mod ids;
mod list;
pub mod tasks;

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;

use agentrt_proto::a2a::v1 as a2a;
use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::a2a::v1::a2a_service_server::A2aService;
use agentrt_runtime::runtime::TurnDetail;
use agentrt_runtime::runtime::{ChatInput, OnBusy, OnDisconnect, TurnStream};
use agentrt_runtime::types::{ContentBlock, NewSession, TurnStatus};
use agentrt_runtime::{Runtime, RuntimeError};
use futures::{Stream, StreamExt as _};
use tonic::metadata::MetadataMap;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::call::Call;
use crate::clip::quoted;
use crate::cluster::Forwarder;
use errors::{A2aError, from_runtime, from_runtime_for_task, task_not_found};
use ids::{context_id_ok, parse_task_id};
use tasks::{Translator, task_id, task_of};

/// The metadata header naming the A2A protocol version a caller speaks.
pub const VERSION_HEADER: &str = "a2a-version";
/// The `agent_id` of the sessions created for A2A contexts.
pub const A2A_AGENT_ID: &str = "a2a";

/// A stream of A2A responses.
pub type A2aStream = Pin<Box<dyn Stream<Item = Result<a2a::StreamResponse, Status>> + Send>>;

/// The owner's client, the one forwarded calls of this service go through.
type Owner = A2aServiceClient<Channel>;

/// Why a SendMessage did not start or continue a task here.
enum Refused {
    /// Refused, with this status.
    Status(Status),
    /// The context's live turn runs on another replica (the core's
    /// `Elsewhere`): the message goes there.
    Elsewhere(RuntimeError),
}

impl From<Status> for Refused {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

/// A core error met while starting a task: a turn on another replica is
/// forwarded, any other error is `map`ped.
fn refused(err: RuntimeError, map: impl FnOnce(RuntimeError) -> Status) -> Refused {
    match err {
        elsewhere @ RuntimeError::Elsewhere(_) => Refused::Elsewhere(elsewhere),
        other => Refused::Status(map(other)),
    }
}

/// What a SendMessage started or continued.
enum Sent {
    /// A new task: its turn, and the caller's message (the task's first
    /// history entry).
    New(TurnStream, a2a::Message),
    /// A working task the caller sent the result of tool call `call_id`:
    /// its live turn (`None` once it has ended).
    Resumed {
        task_id: String,
        session: String,
        call_id: String,
        turn: Option<TurnStream>,
    },
}

impl Sent {
    /// The task's id, its turn (if still live) and the translator of its
    /// events; `pending` gets what goes first on its stream.
    fn into_parts(
        self,
        pending: &mut VecDeque<a2a::StreamResponse>,
    ) -> (String, Option<(TurnStream, Translator)>) {
        match self {
            Self::New(turn, user) => {
                let id = user.task_id.clone();
                let translator =
                    Translator::for_send(id.clone(), turn.session_id().to_owned(), user);
                (id, Some((turn, translator)))
            }
            Self::Resumed {
                task_id,
                session,
                call_id,
                turn,
            } => {
                let live = turn.map(|turn| {
                    let translator =
                        Translator::for_resume(task_id.clone(), session, call_id, pending);
                    (turn, translator)
                });
                (task_id, live)
            }
        }
    }
}

/// The `A2AService` implementation.
#[derive(Debug, Clone)]
pub struct A2aHandler {
    runtime: Runtime,
    /// Sends calls for turns of other replicas to their owner (`[cluster]`).
    forward: Option<Arc<Forwarder>>,
    card: Arc<a2a::AgentCard>,
    /// Tasks left working by their callers (the `detached_tasks` quota).
    detached: Arc<detached::Detached>,
}

impl A2aHandler {
    /// Serves tasks of `runtime`, describing itself with `card`.
    pub fn new(runtime: Runtime, card: a2a::AgentCard) -> Self {
        Self::with_forwarder(runtime, card, None)
    }

    /// Serves tasks of `runtime`, forwarding calls for tasks live on other
    /// replicas with `forward`.
    pub(crate) fn with_forwarder(
        runtime: Runtime,
        card: a2a::AgentCard,
        forward: Option<Arc<Forwarder>>,
    ) -> Self {
        Self {
            runtime,
            forward,
            card: Arc::new(card),
            detached: Arc::default(),
        }
    }

    fn forwarder(&self) -> Option<&Forwarder> {
        self.forward.as_deref()
    }

    /// A copy of `request` where it may have to be forwarded: a message to
    /// an existing context (its task may be live on another replica).
    fn forwardable(&self, request: &a2a::SendMessageRequest) -> Option<a2a::SendMessageRequest> {
        let existing = request
            .message
            .as_ref()
            .is_some_and(|m| !m.context_id.is_empty() || !m.task_id.is_empty());
        (self.forward.is_some() && existing).then(|| request.clone())
    }

    /// Admits the message's turn — in a new context (session) when it
    /// names none — or, for a message to a task, delivers the tool result
    /// it carries.
    async fn start(&self, call: &Call, request: a2a::SendMessageRequest) -> Result<Sent, Refused> {
        let who = &call.who;
        if request
            .configuration
            .as_ref()
            .is_some_and(|c| c.task_push_notification_config.is_some())
        {
            return Err(push_not_supported().into());
        }
        let Some(mut message) = request.message else {
            return Err(A2aError::InvalidParams.status("message is required").into());
        };
        ids::check_message(&message)?;
        if message.role == a2a::Role::Agent as i32 {
            return Err(A2aError::InvalidParams
                .status("message.role is ROLE_AGENT; a caller's message has ROLE_USER")
                .into());
        }
        if !message.task_id.is_empty() {
            return self.answer_tool_call(call, &message).await;
        }
        let content = user_content(&message)?;
        let extra_tools =
            caller_tools::extra_tools(request.metadata.as_ref()).map_err(from_runtime)?;
        let require_approval =
            caller_tools::require_approval(request.metadata.as_ref()).map_err(from_runtime)?;
        let limit = self.runtime.quota_limits(who).detached_tasks;
        self.detached
            .admit(&self.runtime, who, limit)
            .await
            .map_err(from_runtime)?;
        let input = ChatInput {
            session_id: message.context_id.clone(),
            content,
            // A task outlives the call that sent it: a caller that drops
            // the stream comes back with SubscribeToTask or GetTask.
            on_disconnect: OnDisconnect::Continue,
            // A retried message (same id) joins its task instead of
            // starting another.
            request_id: (!message.message_id.is_empty()).then(|| message.message_id.clone()),
            extra_tools,
            require_approval,
            // A2A has no busy error: a message to a context whose task is
            // still working waits in its inbox (the task SUBMITTED).
            on_busy: OnBusy::Enqueue,
            ..ChatInput::default()
        };
        let admitted = if message.context_id.is_empty() {
            let new = NewSession {
                agent_id: A2A_AGENT_ID.to_owned(),
                ..NewSession::default()
            };
            self.runtime.chat_in_new_session(who, new, input).await
        } else {
            call.session(&message.context_id);
            self.runtime.chat(who, input).await
        };
        let turn = admitted.map_err(|err| refused(err, from_runtime))?;
        call.session(turn.session_id());
        message.context_id = turn.session_id().to_owned();
        message.task_id = task_id(turn.session_id(), turn.turn_id());
        message.role = a2a::Role::User as i32;
        Ok(Sent::New(turn, message))
    }

    /// A message to an existing task: the result of the tool call it waits
    /// for (a data part, see [`caller_tools::tool_result`]), delivered through
    /// SubmitToolResult's core path. A task is one exchange otherwise, so
    /// any other message to a task is refused.
    async fn answer_tool_call(&self, call: &Call, message: &a2a::Message) -> Result<Sent, Refused> {
        let who = &call.who;
        let id = &message.task_id;
        let detail = self.lookup(call, id).await?;
        let session = detail.record.session_id.clone();
        if !message.context_id.is_empty() && message.context_id != session {
            return Err(A2aError::InvalidParams
                .status(format!(
                    "message.task_id {} belongs to context {}, not to message.context_id {}",
                    quoted(id),
                    quoted(&session),
                    quoted(&message.context_id)
                ))
                .into());
        }
        let state = match detail.record.status {
            TurnStatus::Running => "is still working",
            TurnStatus::Paused => "waits for its pending calls",
            TurnStatus::Success
            | TurnStatus::Error
            | TurnStatus::Canceled
            | TurnStatus::TimedOut
            | TurnStatus::Interrupted
            | TurnStatus::BudgetExceeded => "has ended",
        };
        let answer = caller_tools::answer(message).map_err(from_runtime)?;
        let (Some(answer), TurnStatus::Running | TurnStatus::Paused) =
            (answer, detail.record.status)
        else {
            return Err(A2aError::UnsupportedOperation
                .status(format!(
                    "task {} {state}, and a task here is one exchange (a message to a task \
                     only answers its pending tool call): send the message with context_id \
                     {} and no task_id to start the next task in that context",
                    quoted(id),
                    quoted(&session)
                ))
                .into());
        };
        let turn_id = detail.record.turn_id.clone();
        let call_id = answer.call_id().to_owned();
        let answered = match answer {
            caller_tools::Answer::Result(result) => {
                self.runtime
                    .submit_tool_result(
                        who,
                        &session,
                        &turn_id,
                        &result.call_id,
                        result.content,
                        result.is_error,
                        Vec::new(),
                    )
                    .await
            }
            caller_tools::Answer::Decision {
                call_id,
                approved,
                reason,
            } => {
                self.runtime
                    .submit_tool_approval(who, &session, &call_id, approved, reason)
                    .await
            }
        };
        answered.map_err(|err| refused(err, from_runtime))?;
        let turn = self
            .runtime
            .subscribe(who, &session, 0, false)
            .await
            .map_err(|err| refused(err, |err| from_runtime_for_task(id, err)))?
            .filter(|turn| turn.turn_id() == turn_id);
        Ok(Sent::Resumed {
            task_id: id.clone(),
            session,
            call_id,
            turn,
        })
    }

    /// Stops the task's turn if it is the session's live one here; whether
    /// it was. `Err` is the core's (a turn on another replica included).
    async fn stop_live(&self, call: &Call, detail: &TurnDetail) -> Result<bool, RuntimeError> {
        let session = &detail.record.session_id;
        let status = self.runtime.session_status(&call.who, session).await?;
        let live = status
            .live
            .as_ref()
            .is_some_and(|(turn, _, _)| *turn == detail.record.turn_id);
        if live {
            self.runtime.stop_session(&call.who, session).await?;
        }
        Ok(live)
    }

    /// The turn a task id names, for the caller.
    /// The task `id` as GetTask shows it: its turn's, or — while its
    /// message waits in the context's inbox — SUBMITTED.
    async fn task(
        &self,
        call: &Call,
        id: &str,
        history_length: Option<i32>,
    ) -> Result<(a2a::Task, Option<TurnStatus>), Status> {
        match self.lookup(call, id).await {
            Ok(detail) => Ok((task_of(&detail, history_length), Some(detail.record.status))),
            Err(not_found) => match self.queued(call, id).await? {
                Some(q) => Ok((tasks::queued_task(&q, false), None)),
                None => Err(not_found),
            },
        }
    }

    /// Task `id`'s message while it waits in its context's inbox.
    async fn queued(
        &self,
        call: &Call,
        id: &str,
    ) -> Result<Option<agentrt_runtime::types::Queued>, Status> {
        let Some((session, turn)) = parse_task_id(id) else {
            return Ok(None);
        };
        self.runtime
            .queued_message(&call.who, session, turn)
            .await
            .map_err(|err| from_runtime_for_task(id, err))
    }

    /// CancelTask of a task whose message waits in its context's inbox:
    /// the message is taken out (it never runs) and the task is CANCELED;
    /// `not_found` when it is not queued either.
    async fn cancel_queued(
        &self,
        call: &Call,
        id: &str,
        not_found: Status,
    ) -> Result<Response<a2a::Task>, Status> {
        let Some(q) = self.queued(call, id).await? else {
            return Err(not_found);
        };
        let taken = self
            .runtime
            .cancel_queued(&call.who, &q.session_id, &q.id)
            .await
            .map_err(|err| from_runtime_for_task(id, err))?;
        if !taken {
            // It started meanwhile: cancel it as a working task.
            return Err(A2aError::TaskNotCancelable.status(format!(
                "task {} started while it was being cancelled; cancel it again",
                quoted(id)
            )));
        }
        Ok(Response::new(tasks::queued_task(&q, true)))
    }

    async fn lookup(&self, call: &Call, id: &str) -> Result<TurnDetail, Status> {
        let (session, turn) = parse_task_id(id).ok_or_else(|| task_not_found(id))?;
        call.session(session);
        self.runtime
            .turn(&call.who, session, turn)
            .await
            .map_err(|err| from_runtime_for_task(id, err))?
            .ok_or_else(|| task_not_found(id))
    }
}

/// The user text of a message: its text parts, in order. Other parts are
/// refused (agentrt's A2A binding takes text only).
pub(crate) fn user_content(message: &a2a::Message) -> Result<Vec<ContentBlock>, Status> {
    if message.parts.is_empty() {
        return Err(A2aError::InvalidParams.status("message.parts is empty; send a text part"));
    }
    message
        .parts
        .iter()
        .enumerate()
        .map(|(i, part)| match &part.content {
            Some(a2a::part::Content::Text(text)) => Ok(ContentBlock::text(text.clone())),
            Some(a2a::part::Content::Raw(_)) => Err(unsupported_part(i, "raw")),
            Some(a2a::part::Content::Url(_)) => Err(unsupported_part(i, "url")),
            Some(a2a::part::Content::Data(_)) => Err(unsupported_part(i, "data")),
            None => Err(A2aError::InvalidParams.status(format!(
                "message.parts[{i}] has no content; send a text part"
            ))),
        })
        .collect()
}

fn unsupported_part(index: usize, kind: &str) -> Status {
    A2aError::ContentTypeNotSupported.status(format!(
        "message.parts[{index}] is a {kind} part; this agent takes text parts only"
    ))
}

/// Refuses a call whose `a2a-version` names a major version other than 1.
/// A call without the header is taken as 1.0: the `lf.a2a.v1` service is
/// the 1.x protocol (0.3 callers use another package).
fn check_version(metadata: &MetadataMap) -> Result<(), Status> {
    let Some(value) = metadata.get(VERSION_HEADER) else {
        return Ok(());
    };
    let version = value.to_str().unwrap_or("").trim();
    if version.is_empty() {
        return Ok(());
    }
    let major = version.split('.').next().unwrap_or("");
    if major == "1" {
        return Ok(());
    }
    Err(A2aError::VersionNotSupported.status(format!(
        "A2A version {} is not supported here; this server speaks A2A {} over gRPC \
         (lf.a2a.v1)",
        quoted(version),
        card::PROTOCOL_VERSION
    )))
}

/// The call and the request, once the version is accepted.
fn accept<T>(req: Request<T>) -> Result<(Call, T), Status> {
    check_version(req.metadata())?;
    let (mut call, message) = Call::open(req)?;
    // Provenance: what this caller sends arrived through A2A; the actor's
    // id stays the identity its credentials were mapped by.
    call.who.actor.kind = agentrt_runtime::types::ActorKind::A2a;
    Ok((call, message))
}

/// A turn's events as A2A responses, until the terminal status.
/// With `caller`, the stream is the call that sent the task: dropped
/// before the task ended, the task counts as detached.
fn events(
    turn: TurnStream,
    translator: Translator,
    pending: VecDeque<a2a::StreamResponse>,
    caller: Option<detached::CallerGuard>,
) -> A2aStream {
    let state = (turn, translator, pending, caller);
    futures::stream::unfold(Some(state), |state| async move {
        let (mut turn, mut translator, mut pending, mut caller) = state?;
        loop {
            if translator.finished()
                && let Some(caller) = &mut caller
            {
                caller.ended();
            }
            if let Some(item) = pending.pop_front() {
                return Some((Ok(item), Some((turn, translator, pending, caller))));
            }
            if translator.finished() {
                return None;
            }
            match turn.next().await {
                Some(event) => translator.on_event(&event, &mut pending),
                None => {
                    let status = if turn.session_deleted() {
                        A2aError::TaskNotFound
                            .status("the task's context was deleted while it was working")
                    } else {
                        Status::unavailable(
                            "the task's stream ended without an outcome; read it with GetTask",
                        )
                    };
                    return Some((Err(status), None));
                }
            }
        }
    })
    .boxed()
}

#[tonic::async_trait]
impl A2aService for A2aHandler {
    type SendStreamingMessageStream = A2aStream;
    type SubscribeToTaskStream = A2aStream;

    async fn send_message(
        &self,
        req: Request<a2a::SendMessageRequest>,
    ) -> Result<Response<a2a::SendMessageResponse>, Status> {
        let (call, r) = accept(req)?;
        let (history_length, immediately) = r
            .configuration
            .as_ref()
            .map_or((None, false), |c| (c.history_length, c.return_immediately));
        let kept = self.forwardable(&r);
        let sent = match (self.start(&call, r).await, kept) {
            (Ok(sent), _) => sent,
            (Err(Refused::Elsewhere(err)), Some(r)) => {
                return call
                    .forward_or(
                        self.forwarder(),
                        err,
                        from_runtime,
                        r,
                        |mut c: Owner, r| async move { c.send_message(r).await },
                    )
                    .await;
            }
            (Err(Refused::Elsewhere(err)), None) => return Err(from_runtime(err)),
            (Err(Refused::Status(status)), _) => return Err(status),
        };
        let who = &call.who;
        let mut discard = VecDeque::new();
        let (id, live) = sent.into_parts(&mut discard);
        // Dropped with the call (its deadline, a disconnect) or at its end
        // while the task still works: the task counts as detached.
        let mut caller = live
            .as_ref()
            .map(|(turn, _)| self.detached.guard(who, turn.session_id(), turn.turn_id()));
        let mut input_required = None;
        if let (Some((mut turn, mut translator)), false) = (live, immediately) {
            // Until the task ends or waits for the caller's tool result.
            while !translator.finished() {
                let Some(event) = turn.next().await else {
                    if turn.session_deleted() {
                        return Err(A2aError::TaskNotFound
                            .status("the task's context was deleted while it was working"));
                    }
                    // Ended without an outcome: the stored record says
                    // what became of it.
                    break;
                };
                translator.on_event(&event, &mut discard);
                discard.clear();
            }
            input_required = translator.input_required().cloned();
        }
        let (mut task, status) = self.task(&call, &id, history_length).await?;
        if status.is_some_and(|s| s != TurnStatus::Running)
            && let Some(caller) = &mut caller
        {
            caller.ended();
        }
        drop(caller);
        if status == Some(TurnStatus::Running) && input_required.is_some() {
            task.status = input_required;
        }
        Ok(Response::new(a2a::SendMessageResponse {
            payload: Some(a2a::send_message_response::Payload::Task(task)),
        }))
    }

    async fn send_streaming_message(
        &self,
        req: Request<a2a::SendMessageRequest>,
    ) -> Result<Response<Self::SendStreamingMessageStream>, Status> {
        let (call, r) = accept(req)?;
        let kept = self.forwardable(&r);
        let sent = match (self.start(&call, r).await, kept) {
            (Ok(sent), _) => sent,
            (Err(Refused::Elsewhere(err)), Some(r)) => {
                let events = call
                    .forward_stream_or(
                        self.forwarder(),
                        err,
                        from_runtime,
                        r,
                        |mut c: Owner, r| async move { c.send_streaming_message(r).await },
                    )
                    .await?;
                return Ok(Response::new(events.boxed()));
            }
            (Err(Refused::Elsewhere(err)), None) => return Err(from_runtime(err)),
            (Err(Refused::Status(status)), _) => return Err(status),
        };
        let mut pending = VecDeque::new();
        let (id, live) = sent.into_parts(&mut pending);
        match live {
            Some((turn, translator)) => {
                let caller = self
                    .detached
                    .guard(&call.who, turn.session_id(), turn.turn_id());
                Ok(Response::new(events(
                    turn,
                    translator,
                    pending,
                    Some(caller),
                )))
            }
            // The task ended as soon as it had the tool result: its final
            // state is all there is to send.
            None => {
                let detail = self.lookup(&call, &id).await?;
                let task = a2a::StreamResponse {
                    payload: Some(a2a::stream_response::Payload::Task(task_of(&detail, None))),
                };
                Ok(Response::new(futures::stream::iter([Ok(task)]).boxed()))
            }
        }
    }

    async fn get_task(
        &self,
        req: Request<a2a::GetTaskRequest>,
    ) -> Result<Response<a2a::Task>, Status> {
        let (call, r) = accept(req)?;
        let (task, _) = self.task(&call, &r.id, r.history_length).await?;
        Ok(Response::new(task))
    }

    async fn list_tasks(
        &self,
        req: Request<a2a::ListTasksRequest>,
    ) -> Result<Response<a2a::ListTasksResponse>, Status> {
        let (call, r) = accept(req)?;
        if context_id_ok(&r.context_id) {
            call.session(&r.context_id);
        }
        let page = list::list_tasks(&self.runtime, &call.who, &r).await?;
        Ok(Response::new(page))
    }

    async fn cancel_task(
        &self,
        req: Request<a2a::CancelTaskRequest>,
    ) -> Result<Response<a2a::Task>, Status> {
        let (call, r) = accept(req)?;
        let detail = match self.lookup(&call, &r.id).await {
            Ok(detail) => detail,
            // A task whose message still waits in the inbox: taken out.
            Err(not_found) => return self.cancel_queued(&call, &r.id, not_found).await,
        };
        let not_cancelable = |detail: &TurnDetail| {
            A2aError::TaskNotCancelable.status(format!(
                "task {} has already ended ({}); there is nothing to cancel",
                quoted(&r.id),
                tasks::state_of(detail.record.status).as_str_name()
            ))
        };
        if detail.record.status != TurnStatus::Running {
            return Err(not_cancelable(&detail));
        }
        let live = match self.stop_live(&call, &detail).await {
            Ok(live) => live,
            Err(err) => {
                let id = r.id.clone();
                return call
                    .forward_or(
                        self.forwarder(),
                        err,
                        |err| from_runtime_for_task(&id, err),
                        r,
                        |mut c: Owner, r| async move { c.cancel_task(r).await },
                    )
                    .await;
            }
        };
        let detail = self.lookup(&call, &r.id).await?;
        if !live && detail.record.status != TurnStatus::Canceled {
            return Err(not_cancelable(&detail));
        }
        Ok(Response::new(task_of(&detail, None)))
    }

    async fn subscribe_to_task(
        &self,
        req: Request<a2a::SubscribeToTaskRequest>,
    ) -> Result<Response<Self::SubscribeToTaskStream>, Status> {
        let (call, r) = accept(req)?;
        let (session, turn_id) = parse_task_id(&r.id).ok_or_else(|| task_not_found(&r.id))?;
        call.session(session);
        let live = match self.runtime.subscribe(&call.who, session, 0, false).await {
            Ok(live) => live.filter(|turn| turn.turn_id() == turn_id),
            Err(err) => {
                let id = r.id.clone();
                let events = call
                    .forward_stream_or(
                        self.forwarder(),
                        err,
                        |err| from_runtime_for_task(&id, err),
                        r,
                        |mut c: Owner, r| async move { c.subscribe_to_task(r).await },
                    )
                    .await?;
                return Ok(Response::new(events.boxed()));
            }
        };
        match live {
            Some(turn) => {
                let mut pending = VecDeque::new();
                let translator =
                    Translator::for_subscribe(r.id.clone(), session.to_owned(), &mut pending);
                Ok(Response::new(events(turn, translator, pending, None)))
            }
            None => {
                let detail = self.lookup(&call, &r.id).await?;
                Err(A2aError::UnsupportedOperation.status(format!(
                    "task {} is not working any more ({}); read its outcome with GetTask",
                    quoted(&r.id),
                    tasks::state_of(detail.record.status).as_str_name()
                )))
            }
        }
    }

    async fn create_task_push_notification_config(
        &self,
        req: Request<a2a::TaskPushNotificationConfig>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        let _ = accept(req)?;
        Err(push_not_supported())
    }

    async fn get_task_push_notification_config(
        &self,
        req: Request<a2a::GetTaskPushNotificationConfigRequest>,
    ) -> Result<Response<a2a::TaskPushNotificationConfig>, Status> {
        let _ = accept(req)?;
        Err(push_not_supported())
    }

    async fn list_task_push_notification_configs(
        &self,
        req: Request<a2a::ListTaskPushNotificationConfigsRequest>,
    ) -> Result<Response<a2a::ListTaskPushNotificationConfigsResponse>, Status> {
        let _ = accept(req)?;
        Err(push_not_supported())
    }

    async fn get_extended_agent_card(
        &self,
        req: Request<a2a::GetExtendedAgentCardRequest>,
    ) -> Result<Response<a2a::AgentCard>, Status> {
        let _ = accept(req)?;
        Ok(Response::new(self.card.as_ref().clone()))
    }

    async fn query_skill(
        &self,
        req: Request<a2a::SkillQueryRequest>,
    ) -> Result<Response<a2a::SkillQueryResult>, Status> {
        let _ = accept(req)?;
        Err(A2aError::UnsupportedOperation.status(
            "QuerySkill is not supported (the agent card says skill_query: false); the card's \
             skills list what this agent does",
        ))
    }

    async fn delete_task_push_notification_config(
        &self,
        req: Request<a2a::DeleteTaskPushNotificationConfigRequest>,
    ) -> Result<Response<()>, Status> {
        let _ = accept(req)?;
        Err(push_not_supported())
    }
}

fn push_not_supported() -> Status {
    A2aError::PushNotificationNotSupported.status(
        "push notifications are not supported (the agent card says push_notifications: false); \
         follow a task with SendStreamingMessage or SubscribeToTask",
    )
}
