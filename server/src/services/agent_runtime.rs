//! `agentrt.v1.AgentRuntime`: thin handlers over the runtime core, and the
//! adapter that turns a [`TurnStream`] into the Chat response stream with
//! the trailing status the contract asks for.

use std::pin::Pin;
use std::task::{Context, Poll};

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_server::AgentRuntime;
use agentrt_runtime::Runtime;
use agentrt_runtime::events::{ErrorCode, EventKind};
use agentrt_runtime::runtime::TurnStream;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::auth::principal;
use crate::convert;
use crate::services::record_session;
use crate::status::{from_runtime, trailing_status};

/// The `AgentRuntime` implementation.
#[derive(Debug, Clone)]
pub struct AgentRuntimeHandler {
    runtime: Runtime,
}

impl AgentRuntimeHandler {
    /// Serves turns of `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

/// The Chat response stream: every turn event, then — when the outcome is
/// not SUCCESS — the matching error status as the trailer.
#[derive(Debug)]
pub struct ChatEvents {
    turn: Option<TurnStream>,
    error: Option<(ErrorCode, String)>,
    trailer: Option<Status>,
    done: bool,
}

impl ChatEvents {
    fn new(turn: Option<TurnStream>) -> Self {
        Self {
            done: turn.is_none(),
            turn,
            error: None,
            trailer: None,
        }
    }
}

impl Stream for ChatEvents {
    type Item = Result<pb::ChatEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(turn) = this.turn.as_mut().filter(|_| !this.done) else {
            return Poll::Ready(this.trailer.take().map(Err));
        };
        match Pin::new(&mut *turn).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) if turn.session_deleted() => {
                this.done = true;
                Poll::Ready(Some(Err(Status::not_found(
                    "the session was deleted while waiting for its next turn",
                ))))
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

#[tonic::async_trait]
impl AgentRuntime for AgentRuntimeHandler {
    type ChatStream = ChatEvents;
    type SubscribeStream = ChatEvents;

    async fn chat(
        &self,
        req: Request<pb::ChatRequest>,
    ) -> Result<Response<Self::ChatStream>, Status> {
        let who = principal(&req)?;
        let deadline = convert::grpc_deadline(req.metadata());
        let input = convert::chat_input(req.into_inner(), deadline).map_err(from_runtime)?;
        record_session(&input.session_id);
        let turn = self.runtime.chat(&who, input).await.map_err(from_runtime)?;
        Ok(Response::new(ChatEvents::new(Some(turn))))
    }

    async fn subscribe(
        &self,
        req: Request<pb::SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        record_session(&r.session_id);
        let turn = self
            .runtime
            .subscribe(&who, &r.session_id, r.after_seq, r.wait_for_turn)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(ChatEvents::new(turn)))
    }

    async fn stop_session(
        &self,
        req: Request<pb::StopSessionRequest>,
    ) -> Result<Response<pb::StopSessionResponse>, Status> {
        let who = principal(&req)?;
        let id = req.into_inner().session_id;
        record_session(&id);
        let stopped = self
            .runtime
            .stop_session(&who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::StopSessionResponse { stopped }))
    }

    async fn get_session_status(
        &self,
        req: Request<pb::GetSessionStatusRequest>,
    ) -> Result<Response<pb::SessionStatus>, Status> {
        let who = principal(&req)?;
        let id = req.into_inner().session_id;
        record_session(&id);
        let status = self
            .runtime
            .session_status(&who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_status(status)))
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        record_session(&r.session_id);
        let closed = self
            .runtime
            .close_session(&who, &r.session_id, r.force)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::CloseSessionResponse { closed }))
    }

    async fn submit_tool_result(
        &self,
        req: Request<pb::SubmitToolResultRequest>,
    ) -> Result<Response<pb::SubmitToolResultResponse>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        record_session(&r.session_id);
        self.runtime
            .submit_tool_result(
                &who,
                &r.session_id,
                &r.turn_id,
                &r.call_id,
                r.content,
                r.is_error,
            )
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::SubmitToolResultResponse {}))
    }

    async fn compact_session(
        &self,
        req: Request<pb::CompactSessionRequest>,
    ) -> Result<Response<pb::CompactSessionResponse>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        record_session(&r.session_id);
        let report = self
            .runtime
            .compact_session(&who, &r.session_id)
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
