//! `agentrt.v1.SessionService`: thin handlers (authenticate → convert → call
//! the core → map the error).

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::session_service_server::SessionService;
use agentrt_runtime::Runtime;
use tonic::{Request, Response, Status};

use crate::auth::principal;

/// Names the session on the RPC's span (declared empty by the server).
pub(crate) fn record_session(id: &str) {
    tracing::Span::current().record("session_id", id);
}
use crate::convert;
use crate::status::from_runtime;

/// The SessionService implementation.
#[derive(Debug, Clone)]
pub struct Sessions {
    runtime: Runtime,
}

impl Sessions {
    /// Serves sessions of `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

#[tonic::async_trait]
impl SessionService for Sessions {
    async fn create_session(
        &self,
        req: Request<pb::CreateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let who = principal(&req)?;
        let new = convert::new_session(req.into_inner());
        let session = self
            .runtime
            .create_session(&who, new)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn get_session(
        &self,
        req: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let who = principal(&req)?;
        let id = req.into_inner().session_id;
        let session = self
            .runtime
            .get_session(&who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        let page = self
            .runtime
            .list_sessions(
                &who,
                r.page_size as usize,
                &r.page_token,
                Some(r.agent_id),
                r.include_archived,
            )
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ListSessionsResponse {
            sessions: page
                .sessions
                .into_iter()
                .map(convert::session_to_pb)
                .collect(),
            next_page_token: page.next_page_token,
        }))
    }

    async fn update_session(
        &self,
        req: Request<pb::UpdateSessionRequest>,
    ) -> Result<Response<pb::Session>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        let id = r.session_id.clone();
        record_session(&id);
        let update = convert::session_update(r);
        let session = self
            .runtime
            .update_session(&who, &id, update)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::session_to_pb(session)))
    }

    async fn delete_session(
        &self,
        req: Request<pb::DeleteSessionRequest>,
    ) -> Result<Response<pb::DeleteSessionResponse>, Status> {
        let who = principal(&req)?;
        let id = req.into_inner().session_id;
        record_session(&id);
        let deleted = self
            .runtime
            .delete_session(&who, &id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::DeleteSessionResponse { deleted }))
    }

    async fn get_history(
        &self,
        req: Request<pb::GetHistoryRequest>,
    ) -> Result<Response<pb::GetHistoryResponse>, Status> {
        let who = principal(&req)?;
        let r = req.into_inner();
        record_session(&r.session_id);
        let page = self
            .runtime
            .history(
                &who,
                &r.session_id,
                r.after_seq,
                r.page_size as usize,
                &r.page_token,
                r.include_compacted,
            )
            .await
            .map_err(from_runtime)?;
        let last_seq = page.messages.last().map_or(r.after_seq, |m| m.seq);
        Ok(Response::new(pb::GetHistoryResponse {
            messages: page
                .messages
                .into_iter()
                .map(convert::message_to_pb)
                .collect(),
            next_page_token: page.next_page_token,
            last_seq,
        }))
    }
}
