//! `RuntimeAdmin`: statistics, drain and undrain, the default model,
//! runner resets, offboarding, the replicas and their leases (admin
//! principals only).

use std::time::Duration;

use crate::{Client, Error, proto};

impl Client {
    /// The server's runtime statistics (admin principals only).
    pub async fn runtime_stats(&self) -> Result<proto::RuntimeStats, Error> {
        let mut stub = self.admin.clone();
        self.call(None, proto::GetRuntimeStatsRequest {}, |r| async move {
            stub.get_runtime_stats(r).await
        })
        .await
    }

    /// Stops admitting turns and waits up to `timeout` until none is live;
    /// returns how many are still live (admin principals only).
    pub async fn drain(&self, timeout: Option<Duration>) -> Result<u32, Error> {
        let req = proto::DrainRequest {
            timeout: timeout.and_then(|t| prost_types::Duration::try_from(t).ok()),
        };
        let mut stub = self.admin.clone();
        self.call(None, req, |r| async move { stub.drain(r).await })
            .await
            .map(|r| r.remaining)
    }

    /// Undoes [`Client::drain`] on the replica the call reaches: turns are
    /// admitted again and readiness reports SERVING again (unless its store
    /// is down). Returns whether it was draining. Refused (unavailable) once
    /// the server's shutdown began (admin principals only).
    pub async fn undrain(&self) -> Result<bool, Error> {
        let mut stub = self.admin.clone();
        self.call(None, proto::UndrainRequest {}, |r| async move {
            stub.undrain(r).await
        })
        .await
        .map(|r| r.was_draining)
    }

    /// Sets the default model (`provider/model`) and thinking level of the
    /// runners built from now on; returns the previous default model
    /// (admin principals only).
    pub async fn set_default_model(
        &self,
        model: &str,
        thinking: Option<crate::ThinkingLevel>,
    ) -> Result<String, Error> {
        let req = proto::SetDefaultModelRequest {
            model: model.to_owned(),
            thinking: thinking.unwrap_or(proto::ThinkingLevel::Unspecified) as i32,
        };
        let mut stub = self.admin.clone();
        self.call(
            None,
            req,
            |r| async move { stub.set_default_model(r).await },
        )
        .await
        .map(|r| r.previous_model)
    }

    /// Marks every runner for rebuild before its next turn (turns in
    /// flight keep theirs); returns how many (admin principals only).
    pub async fn invalidate_runners(&self) -> Result<u32, Error> {
        let mut stub = self.admin.clone();
        self.call(None, proto::InvalidateRunnersRequest {}, |r| async move {
            stub.invalidate_runners(r).await
        })
        .await
        .map(|r| r.count)
    }

    /// Closes cached runners — all, or `user_id`'s — and returns how many
    /// (admin principals only).
    pub async fn reset_runners(&self, user_id: &str) -> Result<u32, Error> {
        let req = proto::ResetRunnersRequest {
            user_id: user_id.to_owned(),
        };
        let mut stub = self.admin.clone();
        self.call(None, req, |r| async move { stub.reset_runners(r).await })
            .await
            .map(|r| r.count)
    }

    /// What `user_id`'s sessions spent: sessions, tokens and cost summed
    /// (admin principals only).
    pub async fn user_usage(&self, user_id: &str) -> Result<proto::UserUsage, Error> {
        let req = proto::GetUserUsageRequest {
            user_id: user_id.to_owned(),
        };
        let mut stub = self.admin.clone();
        self.call(None, req, |r| async move { stub.get_user_usage(r).await })
            .await
    }

    /// Deletes every session of `owner` (of `agent_id` only, when it is
    /// non-empty), or with `owner` empty every session of `agent_id`:
    /// live turns stopped first, then history, turns, inbox and blobs
    /// (admin principals only). The answer says how many went and how
    /// many remain.
    pub async fn delete_sessions(
        &self,
        owner: &str,
        agent_id: &str,
    ) -> Result<proto::DeleteSessionsResponse, Error> {
        let req = proto::DeleteSessionsRequest {
            owner: owner.to_owned(),
            agent_id: agent_id.to_owned(),
        };
        let mut stub = self.admin.clone();
        self.call(None, req, |r| async move { stub.delete_sessions(r).await })
            .await
    }

    /// One page of the replicas on the server's store and the leases of
    /// the live turns they hold: every replica on each page, and
    /// `page_size` leases (0: the server's default, 100) after
    /// `page_token` (empty: the first page). Follow `next_page_token` to
    /// the end for every lease (admin principals only).
    pub async fn list_replicas(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<proto::ListReplicasResponse, Error> {
        let req = proto::ListReplicasRequest {
            page_size,
            page_token: page_token.to_owned(),
        };
        let mut stub = self.admin.clone();
        self.call(None, req, |r| async move { stub.list_replicas(r).await })
            .await
    }
}
