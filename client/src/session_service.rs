//! `SessionService`: sessions and their history.

use crate::{Client, Error, proto};

impl Client {
    /// Creates a session (idempotent with a client-chosen `session_id`).
    pub async fn create_session(
        &self,
        req: proto::CreateSessionRequest,
    ) -> Result<proto::Session, Error> {
        // Only a client-chosen id is known before the call.
        let session_id = req.session_id.clone();
        let mut stub = self.sessions.clone();
        self.call(Some(&session_id), req, |r| async move {
            stub.create_session(r).await
        })
        .await
    }

    /// One session.
    pub async fn get_session(&self, session_id: &str) -> Result<proto::Session, Error> {
        let req = proto::GetSessionRequest {
            session_id: session_id.to_owned(),
        };
        let mut stub = self.sessions.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.get_session(r).await
        })
        .await
    }

    /// A page of the caller's sessions, newest activity first.
    pub async fn list_sessions(
        &self,
        req: proto::ListSessionsRequest,
    ) -> Result<proto::ListSessionsResponse, Error> {
        let mut stub = self.sessions.clone();
        self.call(None, req, |r| async move { stub.list_sessions(r).await })
            .await
    }

    /// Updates the fields set in `req`.
    pub async fn update_session(
        &self,
        req: proto::UpdateSessionRequest,
    ) -> Result<proto::Session, Error> {
        let session_id = req.session_id.clone();
        let mut stub = self.sessions.clone();
        self.call(Some(&session_id), req, |r| async move {
            stub.update_session(r).await
        })
        .await
    }

    /// Deletes a session and its history; `false` when there was none.
    pub async fn delete_session(&self, session_id: &str) -> Result<bool, Error> {
        let req = proto::DeleteSessionRequest {
            session_id: session_id.to_owned(),
        };
        let mut stub = self.sessions.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.delete_session(r).await
        })
        .await
        .map(|r| r.deleted)
    }

    /// One page of history.
    pub async fn history_page(
        &self,
        req: proto::GetHistoryRequest,
    ) -> Result<proto::GetHistoryResponse, Error> {
        let session_id = req.session_id.clone();
        let mut stub = self.sessions.clone();
        self.call(Some(&session_id), req, |r| async move {
            stub.get_history(r).await
        })
        .await
    }

    /// The whole stored history (every page), compacted messages included.
    pub async fn history(&self, session_id: &str) -> Result<Vec<proto::Message>, Error> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self
                .history_page(proto::GetHistoryRequest {
                    session_id: session_id.to_owned(),
                    page_size: 1_000,
                    include_compacted: true,
                    page_token: std::mem::take(&mut page_token),
                    ..Default::default()
                })
                .await?;
            out.extend(page.messages);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = page.next_page_token;
        }
    }

    /// One page of a session's turns, newest first.
    pub async fn list_turns(
        &self,
        req: proto::ListTurnsRequest,
    ) -> Result<proto::ListTurnsResponse, Error> {
        let session_id = req.session_id.clone();
        let mut stub = self.sessions.clone();
        self.call(Some(&session_id), req, |r| async move {
            stub.list_turns(r).await
        })
        .await
    }

    /// One turn's record: outcome, times, model, steps, usage, cost.
    pub async fn get_turn(&self, session_id: &str, turn_id: &str) -> Result<proto::Turn, Error> {
        let req = proto::GetTurnRequest {
            session_id: session_id.to_owned(),
            turn_id: turn_id.to_owned(),
        };
        let mut stub = self.sessions.clone();
        self.call(
            Some(session_id),
            req,
            |r| async move { stub.get_turn(r).await },
        )
        .await
    }
}
