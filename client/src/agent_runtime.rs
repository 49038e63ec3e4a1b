//! `AgentRuntime`: turns (Chat, and watching a live turn with Subscribe),
//! stopping them, a session's live status, closing and compacting, and
//! caller-executed tool results.

use std::time::{Duration, Instant};

use tonic::Status;

use crate::{
    ChatOptions, Client, Error, EventStream, ResumeNotice, WhenBusy, events, proto, with_session,
};

impl Client {
    /// Runs a turn: `options` is a [`ChatOptions`] (or just the text, as
    /// `&str` / `String`). Admission errors (busy, not found, invalid) are
    /// returned here, typed; later failures arrive in the stream.
    ///
    /// With [`OnDisconnect::Continue`](crate::OnDisconnect::Continue) the stream resumes after a dropped
    /// connection (see [`EventStream`]) per the options' or the client's
    /// [`ResumePolicy`](crate::ResumePolicy); a `request_id` is generated when none is set. The
    /// first call itself is not retried: if it cannot be sent, that error
    /// is returned. With [`WhenBusy::Wait`] a busy session is waited for
    /// instead of refused.
    pub async fn chat(
        &self,
        session_id: &str,
        options: impl Into<ChatOptions>,
    ) -> Result<EventStream, Error> {
        let mut options = options.into();
        options.ensure_request_id();
        let request = options.to_request(session_id);
        let metadata: Vec<(String, String)> = options
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let deadline = options.deadline.or(self.chat_deadline);
        let deadline_at = deadline.map(|d| Instant::now() + d);
        let left = || deadline_at.map(|at| at.saturating_duration_since(Instant::now()));
        let policy = options
            .resume
            .clone()
            .unwrap_or_else(|| self.resume.clone());
        let mut backoff = policy.initial_backoff;
        let mut waited = 0;
        let stream = loop {
            let status = match self.chat_raw(request.clone(), &metadata, left()).await {
                Ok(stream) => break stream,
                Err(status) => status,
            };
            let err = Error::from_status(status, session_id, &self.url);
            if options.when_busy != WhenBusy::Wait || !err.is_busy() || waited >= policy.attempts {
                return Err(err);
            }
            waited += 1;
            let turn_id = if let Error::Busy { turn_id, .. } = &err {
                turn_id.clone()
            } else {
                String::new()
            };
            policy.notify(ResumeNotice::WaitingForTurn { turn_id });
            // Follow the live turn to its end (a compaction has none to
            // follow: the backoff below spaces the retries).
            if let Ok(mut watching) = self.subscribe_raw(session_id, 0, false, left()).await {
                while let Ok(Some(_)) = watching.message().await {}
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.max_backoff);
        };
        let attach = options.resumes().then(|| events::Attach {
            client: self.clone(),
            request: Some(request),
            metadata,
            policy,
            deadline_at,
        });
        Ok(EventStream::with_attach(
            stream, &self.url, session_id, attach,
        ))
    }

    /// Runs a turn from a raw request, for power users who need a field
    /// [`ChatOptions`] does not cover. No resuming, no deadline (set one on
    /// the request yourself through [`Client::runtime_raw`] if needed).
    pub async fn chat_with(&self, req: proto::ChatRequest) -> Result<EventStream, Error> {
        let session_id = req.session_id.clone();
        let stream = self
            .chat_raw(req, &[], None)
            .await
            .map_err(self.fail(&session_id))?;
        Ok(EventStream::new(stream, &self.url, &session_id))
    }

    /// The Chat call on the wire.
    pub(crate) async fn chat_raw(
        &self,
        req: proto::ChatRequest,
        metadata: &[(String, String)],
        deadline: Option<Duration>,
    ) -> Result<tonic::Streaming<proto::ChatEvent>, Status> {
        let session_id = req.session_id.clone();
        let mut request = with_session(tonic::Request::new(req), &session_id);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        for (k, v) in metadata {
            let key =
                tonic::metadata::AsciiMetadataKey::from_bytes(k.as_bytes()).map_err(|_| {
                    Status::invalid_argument(format!("metadata key {k:?} is not valid"))
                })?;
            let value = v.parse().map_err(|_| {
                Status::invalid_argument(format!("metadata value of {k:?} is not ASCII"))
            })?;
            request.metadata_mut().insert(key, value);
        }
        Ok(self.runtime.clone().chat(request).await?.into_inner())
    }

    /// Watches the session's live turn from `after_seq` (0 = from its
    /// start). With no live turn the stream ends at once, unless
    /// `wait_for_turn`. Does not resume; see [`Client::watch`].
    pub async fn subscribe(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<EventStream, Error> {
        let stream = self
            .subscribe_raw(session_id, after_seq, wait_for_turn, None)
            .await
            .map_err(self.fail(session_id))?;
        Ok(EventStream::new(stream, &self.url, session_id))
    }

    /// Like [`Client::subscribe`], and resuming: after a dropped
    /// connection it re-subscribes from the last seq it yielded (per the
    /// client's [`ResumePolicy`](crate::ResumePolicy)), so every event arrives once. If the turn
    /// ended while disconnected, the stream ends (read the outcome from
    /// the history or [`Client::get_session`]).
    pub async fn watch(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<EventStream, Error> {
        let stream = self
            .subscribe_raw(session_id, after_seq, wait_for_turn, None)
            .await
            .map_err(self.fail(session_id))?;
        let attach = events::Attach {
            client: self.clone(),
            request: None,
            metadata: Vec::new(),
            policy: self.resume.clone(),
            deadline_at: None,
        };
        Ok(EventStream::watching(
            stream, &self.url, session_id, after_seq, attach,
        ))
    }

    /// The Subscribe call on the wire (for [`Client::subscribe`],
    /// [`Client::watch`] and a resuming stream's re-attachment).
    pub(crate) async fn subscribe_raw(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
        deadline: Option<Duration>,
    ) -> Result<tonic::Streaming<proto::ChatEvent>, Status> {
        let req = proto::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_seq,
            wait_for_turn,
        };
        let mut request = with_session(tonic::Request::new(req), session_id);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        Ok(self.runtime.clone().subscribe(request).await?.into_inner())
    }

    /// Stops the live turn; `false` when nothing was live.
    pub async fn stop_session(&self, session_id: &str) -> Result<bool, Error> {
        self.stop(session_id, false).await.map(|r| r.stopped)
    }

    /// Stops the session's live turn and takes every queued message out
    /// of its inbox: (whether a turn was stopped, how many messages were
    /// taken out).
    pub async fn stop_session_and_clear_inbox(
        &self,
        session_id: &str,
    ) -> Result<(bool, u64), Error> {
        self.stop(session_id, true)
            .await
            .map(|r| (r.stopped, r.cleared))
    }

    async fn stop(
        &self,
        session_id: &str,
        clear_inbox: bool,
    ) -> Result<proto::StopSessionResponse, Error> {
        let req = proto::StopSessionRequest {
            session_id: session_id.to_owned(),
            clear_inbox,
        };
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.stop_session(r).await
        })
        .await
    }

    /// The session's live-turn status.
    pub async fn session_status(&self, session_id: &str) -> Result<proto::SessionStatus, Error> {
        let req = proto::GetSessionStatusRequest {
            session_id: session_id.to_owned(),
        };
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.get_session_status(r).await
        })
        .await
    }

    /// Evicts the session's cached runner (`force` stops a live turn first).
    pub async fn close_session(&self, session_id: &str, force: bool) -> Result<bool, Error> {
        let req = proto::CloseSessionRequest {
            session_id: session_id.to_owned(),
            force,
        };
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.close_session(r).await
        })
        .await
        .map(|r| r.closed)
    }

    /// Compacts the session now (summary + the last user turns verbatim).
    pub async fn compact_session(
        &self,
        session_id: &str,
    ) -> Result<proto::CompactSessionResponse, Error> {
        let req = proto::CompactSessionRequest {
            session_id: session_id.to_owned(),
        };
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.compact_session(r).await
        })
        .await
    }

    /// Delivers the result of a caller-executed tool call of a live turn.
    pub async fn submit_tool_result(
        &self,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
        content: &str,
        is_error: bool,
    ) -> Result<(), Error> {
        let req = proto::SubmitToolResultRequest {
            session_id: session_id.to_owned(),
            turn_id: turn_id.to_owned(),
            call_id: call_id.to_owned(),
            content: content.to_owned(),
            is_error,
            media: Vec::new(),
        };
        self.send_tool_result(req).await
    }

    /// [`Client::submit_tool_result`] with images and files the tool
    /// returned: image / file blocks, inline (small) or by the `blob_id` of
    /// a blob uploaded to the session ([`Client::upload_blob`]).
    pub async fn submit_tool_result_with_media(
        &self,
        req: proto::SubmitToolResultRequest,
    ) -> Result<(), Error> {
        self.send_tool_result(req).await
    }

    async fn send_tool_result(&self, req: proto::SubmitToolResultRequest) -> Result<(), Error> {
        let session_id = req.session_id.clone();
        let session_id = session_id.as_str();
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.submit_tool_result(r).await
        })
        .await
        .map(drop)
    }

    /// Decides a server tool call that waits for an approval
    /// ([`crate::ChatEvent::ApprovalRequired`]) in the session's live or
    /// paused turn: `approved` runs it, otherwise the model is told it was
    /// denied, with `reason`.
    pub async fn submit_tool_approval(
        &self,
        session_id: &str,
        call_id: &str,
        approved: bool,
        reason: &str,
    ) -> Result<(), Error> {
        let req = proto::SubmitToolApprovalRequest {
            session_id: session_id.to_owned(),
            call_id: call_id.to_owned(),
            approved,
            reason: reason.to_owned(),
        };
        let mut stub = self.runtime.clone();
        self.call(Some(session_id), req, |r| async move {
            stub.submit_tool_approval(r).await
        })
        .await
        .map(drop)
    }
}
