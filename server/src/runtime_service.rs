//! `agentrt.v1.AgentRuntime`: thin handlers over the runtime core, and the
//! adapter that turns a [`TurnStream`] into the Chat response stream with
//! the trailing status the contract asks for.

use std::pin::Pin;
use std::task::{Context, Poll};

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_runtime_server::AgentRuntime;
use agentrt_runtime::events::{ErrorCode, EventKind};
use agentrt_runtime::runtime::TurnStream;
use agentrt_runtime::Runtime;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::auth::principal;
use crate::convert;
use crate::status::{from_runtime, trailing_status};

/// The AgentRuntime implementation.
#[derive(Debug, Clone)]
pub struct Turns {
    runtime: Runtime,
}

impl Turns {
    /// Serves turns of `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

/// The Chat response stream: every turn event, then — when the outcome is
/// not SUCCESS — the matching error status as the trailer.
#[derive(Debug)]
pub struct ChatEvents {
    turn: TurnStream,
    error: Option<(ErrorCode, String)>,
    trailer: Option<Status>,
    done: bool,
}

impl Stream for ChatEvents {
    type Item = Result<pb::ChatEvent, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(this.trailer.take().map(Err));
        }
        match Pin::new(&mut this.turn).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => {
                // The turn task ended without a final event: only possible if
                // the runtime is being torn down under us.
                this.done = true;
                Poll::Ready(Some(Err(Status::unavailable("the turn ended unexpectedly; the server is shutting down"))))
            }
            Poll::Ready(Some(event)) => {
                match &event.kind {
                    EventKind::Error { code, message } => this.error = Some((*code, message.clone())),
                    EventKind::TurnFinished { outcome, .. } => {
                        this.done = true;
                        this.trailer = trailing_status(
                            *outcome,
                            this.error.as_ref().map(|(c, m)| (*c, m.as_str())),
                        );
                    }
                    _ => {}
                }
                let pb = convert::event_to_pb(this.turn.session_id(), this.turn.turn_id(), &event);
                Poll::Ready(Some(Ok(pb)))
            }
        }
    }
}

#[tonic::async_trait]
impl AgentRuntime for Turns {
    type ChatStream = ChatEvents;

    async fn chat(&self, req: Request<pb::ChatRequest>) -> Result<Response<Self::ChatStream>, Status> {
        let who = principal(&req)?;
        let input = convert::chat_input(req.into_inner()).map_err(from_runtime)?;
        let turn = self.runtime.chat(&who, input).await.map_err(from_runtime)?;
        Ok(Response::new(ChatEvents {
            turn,
            error: None,
            trailer: None,
            done: false,
        }))
    }
}
