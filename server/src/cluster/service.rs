//! The owner's side: [`ClusterHandler`] serves `agentrt.cluster.v1.Cluster`
//! on the internal listener, behind [`key_check`].
//!
//! Each call runs the same core method the public handler would, as the
//! principal the forwarding replica authenticated, and is never forwarded
//! again: when the core says the turn lives elsewhere (it moved since the
//! caller read the lease), the call fails with UNAVAILABLE and the caller
//! retries. So no call can loop between replicas.

use agentrt_proto::cluster::v1 as cpb;
use agentrt_proto::cluster::v1::cluster_server::Cluster;
use agentrt_proto::v1 as pb;
use agentrt_runtime::{Runtime, RuntimeError};
use tonic::{Request, Response, Status};

use super::{KEY_HEADER, WireKey, principal_from_pb};
use crate::convert;
use crate::services::{ChatEvents, record_session};
use crate::status::from_runtime;

/// See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct ClusterHandler {
    runtime: Runtime,
}

impl ClusterHandler {
    /// Serves forwarded calls on `runtime`.
    pub(crate) fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

/// A core error at the owner: [`from_runtime`], except that a turn found on
/// yet another replica is not followed there.
fn owner_error(err: RuntimeError) -> Status {
    match err {
        RuntimeError::Elsewhere(_) => {
            Status::unavailable("the turn moved to another replica meanwhile; retry")
        }
        other => from_runtime(other),
    }
}

/// The request inside a forwarded call.
fn inner<T>(request: Option<T>) -> Result<T, Status> {
    request.ok_or_else(|| Status::invalid_argument("a forwarded call must carry its request"))
}

/// Refuses calls without the cluster key (UNAUTHENTICATED; compared in
/// constant time; the key is never logged, and the refusal is counted by
/// the RPC metrics under its status code).
pub(crate) fn key_check(
    key: WireKey,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |req: Request<()>| {
        let given = req.metadata().get(KEY_HEADER).map(|v| v.as_bytes());
        match given {
            Some(given) if crate::auth::same_bytes(given, key.value().as_bytes()) => Ok(req),
            Some(_) => {
                tracing::warn!("internal call refused: wrong cluster key");
                Err(Status::unauthenticated("wrong cluster key"))
            }
            None => {
                tracing::warn!("internal call refused: no cluster key");
                Err(Status::unauthenticated(format!(
                    "internal calls must carry the cluster key ({KEY_HEADER})"
                )))
            }
        }
    }
}

#[tonic::async_trait]
impl Cluster for ClusterHandler {
    type SubscribeStream = ChatEvents;
    type JoinChatStream = ChatEvents;

    async fn stop_session(
        &self,
        req: Request<cpb::ForwardedStopSession>,
    ) -> Result<Response<pb::StopSessionResponse>, Status> {
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let id = inner(r.request)?.session_id;
        record_session(&id);
        let stopped = self
            .runtime
            .stop_session(&who, &id)
            .await
            .map_err(owner_error)?;
        Ok(Response::new(pb::StopSessionResponse { stopped }))
    }

    async fn subscribe(
        &self,
        req: Request<cpb::ForwardedSubscribe>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let s = inner(r.request)?;
        record_session(&s.session_id);
        let turn = self
            .runtime
            .subscribe(&who, &s.session_id, s.after_seq, s.wait_for_turn)
            .await
            .map_err(owner_error)?;
        Ok(Response::new(ChatEvents::new(turn)))
    }

    async fn submit_tool_result(
        &self,
        req: Request<cpb::ForwardedSubmitToolResult>,
    ) -> Result<Response<pb::SubmitToolResultResponse>, Status> {
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let s = inner(r.request)?;
        record_session(&s.session_id);
        self.runtime
            .submit_tool_result(
                &who,
                &s.session_id,
                &s.turn_id,
                &s.call_id,
                s.content,
                s.is_error,
            )
            .await
            .map_err(owner_error)?;
        Ok(Response::new(pb::SubmitToolResultResponse {}))
    }

    async fn get_session_status(
        &self,
        req: Request<cpb::ForwardedGetSessionStatus>,
    ) -> Result<Response<pb::SessionStatus>, Status> {
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let id = inner(r.request)?.session_id;
        record_session(&id);
        let status = self
            .runtime
            .session_status(&who, &id)
            .await
            .map_err(owner_error)?;
        Ok(Response::new(convert::session_status(status)))
    }

    async fn close_session(
        &self,
        req: Request<cpb::ForwardedCloseSession>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let s = inner(r.request)?;
        record_session(&s.session_id);
        let closed = self
            .runtime
            .close_session(&who, &s.session_id, s.force)
            .await
            .map_err(owner_error)?;
        Ok(Response::new(pb::CloseSessionResponse { closed }))
    }

    async fn join_chat(
        &self,
        req: Request<cpb::ForwardedChat>,
    ) -> Result<Response<Self::JoinChatStream>, Status> {
        let deadline = convert::grpc_deadline(req.metadata());
        let r = req.into_inner();
        let who = principal_from_pb(r.principal)?;
        let chat = inner(r.request)?;
        if chat.request_id.is_empty() {
            return Err(Status::invalid_argument(
                "a forwarded Chat joins a turn by its request_id",
            ));
        }
        let input = convert::chat_input(chat, deadline).map_err(from_runtime)?;
        record_session(&input.session_id);
        let turn = self.runtime.chat(&who, input).await.map_err(owner_error)?;
        Ok(Response::new(ChatEvents::new(Some(turn))))
    }
}
