//! `agentrt.v1.AgentRuntime`: thin handlers over the runtime core, and the
//! adapter that turns a [`TurnStream`] into the Chat response stream with
//! the trailing status the contract asks for. A call the core answers with
//! `RuntimeError::Elsewhere` (the session's live turn runs on another
//! replica) goes to that replica — the same RPC, named in its handler's
//! error arm (`Call::forward_or`) — and its answer, a stream included,
//! comes back unchanged.
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_client::AgentRuntimeClient;
use agentrt_proto::v1::agent_runtime_server::AgentRuntime;
use agentrt_runtime::events::{ErrorCode, EventKind, TurnOutcome};
use agentrt_runtime::runtime::TurnStream;
use agentrt_runtime::store::Lease;
use agentrt_runtime::{Runtime, RuntimeError};
use futures::{Stream, StreamExt as _};
use std::future::Future;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::call::Call;
use crate::cluster::{Forwarded, Forwarder, To};
use crate::convert;
use crate::status::{from_runtime, trailing_status};

/// The `AgentRuntime` implementation.
#[derive(Debug, Clone)]
pub struct AgentRuntimeHandler {
    runtime: Runtime,
    /// Sends calls for turns of other replicas to their owner (`[cluster]`).
    forward: Option<Arc<Forwarder>>,
}

impl AgentRuntimeHandler {
    /// Serves turns of `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self {
            runtime,
            forward: None,
        }
    }

    /// Serves turns of `runtime`, forwarding calls for turns of other
    /// replicas with `forward`.
    pub(crate) fn with_forwarder(runtime: Runtime, forward: Option<Arc<Forwarder>>) -> Self {
        Self { runtime, forward }
    }
}

/// The Chat (and Subscribe) response stream: every turn event, then — when
/// the outcome is not SUCCESS — the matching error status as the trailer;
/// or, for a call forwarded to the replica owning the turn, that replica's
/// events and trailer as they come.
#[derive(Debug)]
pub struct ChatEvents(Source);

#[derive(Debug)]
enum Source {
    /// A turn of this replica.
    Local(LocalEvents),
    /// A wait for the next turn that another replica admitted: the
    /// Subscribe being sent there.
    Following(Following),
    /// The owner's stream; dropping it cancels the forwarded call.
    Forwarded(futures::stream::Peekable<Forwarded<pb::ChatEvent>>),
    /// The events of a turn followed to another replica.
    Followed(Box<ChatEvents>),
    /// Ended.
    Done,
}

/// A turn of this replica as events.
#[derive(Debug)]
struct LocalEvents {
    turn: Option<TurnStream>,
    error: Option<(ErrorCode, String)>,
    trailer: Option<Status>,
    done: bool,
    /// How to follow the next turn to the replica that admitted it (a
    /// `Subscribe` with `wait_for_turn` on a replica that can forward).
    follow: Option<Follow>,
    /// Set when the wait ended because another replica admitted the turn.
    moved: Option<Lease>,
}

/// What a waiting Subscribe needs to follow the next turn elsewhere.
#[derive(Debug)]
pub(crate) struct Follow {
    runtime: Runtime,
    forward: Arc<Forwarder>,
    call: Call,
    session_id: String,
    after_seq: u64,
    /// The one turn to follow (a queued Chat's message's), when not
    /// whichever runs next.
    turn_id: Option<String>,
}

impl Follow {
    /// The same watch, on the replica `lease` names (the turn is live
    /// there: no wait) — or, when it ended before the watch got there, its
    /// stored events.
    async fn start(self, lease: Lease) -> Result<ChatEvents, Status> {
        let request = pb::SubscribeRequest {
            session_id: self.session_id.clone(),
            after_seq: self.after_seq,
            wait_for_turn: false,
        };
        let turn_id = lease.turn_id.clone();
        let items = self
            .forward
            .call(
                To::Owner(&lease),
                &self.call.who,
                self.call.deadline,
                request,
                |mut c: Owner, r| async move { c.subscribe(r).await },
            )
            .await?;
        let mut events = Forwarded::new(items, lease).peekable();
        let first = Pin::new(&mut events).peek().await;
        let wanted = match (&self.turn_id, first) {
            (_, None) => false,
            (None, Some(_)) => true,
            // A later turn is live there: the one wanted has ended.
            (Some(want), Some(Ok(event))) => &event.turn_id == want,
            (Some(_), Some(Err(_))) => true,
        };
        if wanted {
            return Ok(ChatEvents(Source::Forwarded(events)));
        }
        // Nothing live there any more: the turn ended meanwhile.
        let replayed = self
            .runtime
            .replay_finished(&self.call.who, &self.session_id, &turn_id)
            .await
            .map_err(from_runtime)?;
        Ok(ChatEvents::new(replayed))
    }
}

/// The Subscribe under way to the replica that admitted the next turn.
struct Following(Pin<Box<dyn Future<Output = Result<ChatEvents, Status>> + Send>>);

impl std::fmt::Debug for Following {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Following")
    }
}

impl ChatEvents {
    pub(crate) fn new(turn: Option<TurnStream>) -> Self {
        Self::local(turn, None)
    }

    fn local(turn: Option<TurnStream>, follow: Option<Follow>) -> Self {
        Self(Source::Local(LocalEvents {
            done: turn.is_none(),
            turn,
            error: None,
            trailer: None,
            follow,
            moved: None,
        }))
    }

    /// The events of a call forwarded to the turn's owner.
    pub(crate) fn forwarded(events: Forwarded<pb::ChatEvent>) -> Self {
        Self(Source::Forwarded(events.peekable()))
    }
}

impl Stream for ChatEvents {
    type Item = Result<pb::ChatEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match &mut self.0 {
                Source::Local(local) => {
                    let polled = local.poll_next(cx);
                    let Some(lease) = local.moved.take() else {
                        return polled;
                    };
                    self.0 = match local.follow.take() {
                        Some(follow) => Source::Following(Following(Box::pin(follow.start(lease)))),
                        None => {
                            // A replica that cannot forward (no [cluster]).
                            self.0 = Source::Done;
                            return Poll::Ready(Some(Err(from_runtime(RuntimeError::Elsewhere(
                                lease,
                            )))));
                        }
                    };
                }
                Source::Following(following) => match following.0.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(events)) => self.0 = Source::Followed(Box::new(events)),
                    Poll::Ready(Err(status)) => {
                        self.0 = Source::Done;
                        return Poll::Ready(Some(Err(status)));
                    }
                },
                Source::Forwarded(events) => return Pin::new(events).poll_next(cx),
                Source::Followed(events) => return Pin::new(&mut **events).poll_next(cx),
                Source::Done => return Poll::Ready(None),
            }
        }
    }
}

impl LocalEvents {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<pb::ChatEvent, Status>>> {
        let this = self;
        let Some(turn) = this.turn.as_mut().filter(|_| !this.done) else {
            return Poll::Ready(this.trailer.take().map(Err));
        };
        match Pin::new(&mut *turn).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) if turn.moved_to().is_some() => {
                // Followed there by `ChatEvents`.
                this.done = true;
                this.moved = turn.moved_to().cloned();
                Poll::Ready(None)
            }
            Poll::Ready(None) if let Some((code, why)) = turn.not_run() => {
                this.done = true;
                Poll::Ready(Some(Err(crate::status::not_run(code, why))))
            }
            Poll::Ready(None) if turn.session_deleted() => {
                this.done = true;
                Poll::Ready(Some(Err(Status::not_found(
                    "the session was deleted while waiting for its next turn",
                ))))
            }
            Poll::Ready(None) if let Some((code, why)) = this.error.take() => {
                // Ended without a final event but with an error: a turn
                // suspended (paused) by a drain.
                this.done = true;
                Poll::Ready(trailing_status(TurnOutcome::Error, Some((code, &why))).map(Err))
            }
            Poll::Ready(None) => {
                // The turn ended without a final event: a joined turn that
                // failed admission, a caller dropped for not reading, or the
                // runtime torn down under us.
                this.done = true;
                Poll::Ready(Some(Err(Status::unavailable(
                    "the turn ended without an outcome; check GetSession and retry",
                ))))
            }
            Poll::Ready(Some(event)) => {
                match &event.kind {
                    EventKind::Error { code, message } => {
                        this.error = Some((*code, message.clone()))
                    }
                    EventKind::TurnFinished { outcome, .. } => {
                        this.done = true;
                        this.trailer = trailing_status(
                            *outcome,
                            this.error.as_ref().map(|(c, m)| (*c, m.as_str())),
                        );
                    }
                    _ => {}
                }
                let pb = convert::event_to_pb(turn.session_id(), turn.turn_id(), &event);
                Poll::Ready(Some(Ok(pb)))
            }
        }
    }
}

impl AgentRuntimeHandler {
    fn forwarder(&self) -> Option<&Forwarder> {
        self.forward.as_deref()
    }
}

/// The owner's client, the one forwarded calls of this service go through.
type Owner = AgentRuntimeClient<Channel>;

#[tonic::async_trait]
impl AgentRuntime for AgentRuntimeHandler {
    type ChatStream = ChatEvents;
    type SubscribeStream = ChatEvents;

    async fn chat(
        &self,
        req: Request<pb::ChatRequest>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let (call, request) = Call::open(req)?;
        let on_busy = pb::OnBusy::try_from(request.on_busy);
        // Kept only where a retry may join a turn on another replica, or
        // the Chat interrupt or steer a turn there.
        let elsewhere = !request.request_id.is_empty()
            || matches!(on_busy, Ok(pb::OnBusy::Interrupt | pb::OnBusy::Steer));
        // A queued (or requeued steering) message's turn may run on
        // another replica: its stream follows it there.
        let may_follow = matches!(on_busy, Ok(pb::OnBusy::Enqueue | pb::OnBusy::Steer));
        let join = (self.forward.is_some() && elsewhere).then(|| request.clone());
        let input = convert::chat_input(request, call.deadline).map_err(from_runtime)?;
        call.session(&input.session_id);
        let session_id = input.session_id.clone();
        match (self.runtime.chat(&call.who, input).await, join) {
            (Ok(turn), _) => {
                let follow = self
                    .forward
                    .as_ref()
                    .filter(|_| may_follow)
                    .map(|forward| Follow {
                        runtime: self.runtime.clone(),
                        forward: Arc::clone(forward),
                        call: call.clone(),
                        session_id,
                        after_seq: 0,
                        turn_id: Some(turn.turn_id().to_owned()),
                    });
                Ok(Response::new(ChatEvents::local(Some(turn), follow)))
            }
            (Err(err), Some(join)) => call
                .forward_stream_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    join,
                    |mut c: Owner, r| async move { c.chat(r).await },
                )
                .await
                .map(|events| Response::new(ChatEvents::forwarded(events))),
            (Err(err), None) => Err(from_runtime(err)),
        }
    }

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let subscribed = self
            .runtime
            .subscribe(&call.who, &r.session_id, r.after_seq, r.wait_for_turn)
            .await;
        match subscribed {
            Ok(turn) => {
                let follow = self
                    .forward
                    .as_ref()
                    .filter(|_| r.wait_for_turn)
                    .map(|forward| Follow {
                        runtime: self.runtime.clone(),
                        forward: Arc::clone(forward),
                        call: call.clone(),
                        session_id: r.session_id.clone(),
                        after_seq: r.after_seq,
                        turn_id: None,
                    });
                Ok(Response::new(ChatEvents::local(turn, follow)))
            }
            Err(err) => call
                .forward_stream_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    r,
                    |mut c: Owner, r| async move { c.subscribe(r).await },
                )
                .await
                .map(|events| Response::new(ChatEvents::forwarded(events))),
        }
    }

    async fn stop_session(
        &self,
        req: Request<pb::StopSessionRequest>,
    ) -> Result<Response<pb::StopSessionResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        // The inbox first: a stopped turn's end would start the next one.
        let cleared = if r.clear_inbox {
            self.runtime
                .clear_inbox(&call.who, &r.session_id)
                .await
                .map_err(from_runtime)?
        } else {
            0
        };
        match self.runtime.stop_session(&call.who, &r.session_id).await {
            Ok(stopped) => Ok(Response::new(pb::StopSessionResponse { stopped, cleared })),
            Err(err) => {
                // The owner finds the inbox cleared already: what was
                // cleared here is added to its answer.
                let mut stopped = call
                    .forward_or(
                        self.forwarder(),
                        err,
                        from_runtime,
                        r,
                        |mut c: Owner, r| async move { c.stop_session(r).await },
                    )
                    .await?;
                stopped.get_mut().cleared += cleared;
                Ok(stopped)
            }
        }
    }

    async fn get_session_status(
        &self,
        req: Request<pb::GetSessionStatusRequest>,
    ) -> Result<Response<pb::SessionStatus>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        match self.runtime.session_status(&call.who, &r.session_id).await {
            Ok(status) => Ok(Response::new(convert::session_status(status))),
            Err(err) => {
                call.forward_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    r,
                    |mut c: Owner, r| async move { c.get_session_status(r).await },
                )
                .await
            }
        }
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let closed = self
            .runtime
            .close_session(&call.who, &r.session_id, r.force)
            .await;
        match closed {
            Ok(closed) => Ok(Response::new(pb::CloseSessionResponse { closed })),
            Err(err) => {
                call.forward_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    r,
                    |mut c: Owner, r| async move { c.close_session(r).await },
                )
                .await
            }
        }
    }

    async fn submit_tool_result(
        &self,
        req: Request<pb::SubmitToolResultRequest>,
    ) -> Result<Response<pb::SubmitToolResultResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        // The content goes to the core; it is kept only where the call may
        // have to be forwarded.
        let forwardable = self.forward.is_some().then(|| r.clone());
        let submitted = self
            .runtime
            .submit_tool_result(
                &call.who,
                &r.session_id,
                &r.turn_id,
                &r.call_id,
                r.content,
                r.is_error,
                convert::content_from_pb(r.media, "media").map_err(from_runtime)?,
            )
            .await;
        match (submitted, forwardable) {
            (Ok(()), _) => Ok(Response::new(pb::SubmitToolResultResponse {})),
            (Err(err), Some(r)) => {
                call.forward_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    r,
                    |mut c: Owner, r| async move { c.submit_tool_result(r).await },
                )
                .await
            }
            (Err(err), None) => Err(from_runtime(err)),
        }
    }

    async fn submit_tool_approval(
        &self,
        req: Request<pb::SubmitToolApprovalRequest>,
    ) -> Result<Response<pb::SubmitToolApprovalResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let forwardable = self.forward.is_some().then(|| r.clone());
        let decided = self
            .runtime
            .submit_tool_approval(&call.who, &r.session_id, &r.call_id, r.approved, r.reason)
            .await;
        match (decided, forwardable) {
            (Ok(()), _) => Ok(Response::new(pb::SubmitToolApprovalResponse {})),
            (Err(err), Some(r)) => {
                call.forward_or(
                    self.forwarder(),
                    err,
                    from_runtime,
                    r,
                    |mut c: Owner, r| async move { c.submit_tool_approval(r).await },
                )
                .await
            }
            (Err(err), None) => Err(from_runtime(err)),
        }
    }

    async fn compact_session(
        &self,
        req: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        let (call, r) = Call::open(req)?;
        call.session(&r.session_id);
        let report = self
            .runtime
            .compact_session(&call.who, &r.session_id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::CompactSessionResponse {
            compacted: report.compacted,
            tokens_before: report.tokens_before,
            tokens_after: report.tokens_after,
            summary_seq: report.summary_seq,
            messages_compacted: report.messages_compacted,
        }))
    }
}
