//! Offboarding: `RuntimeAdmin.DeleteSessions` — every session of an owner
//! (of one agent only, when named), or of an agent across owners, deleted
//! as `DeleteSession` deletes one: its live turn stopped first (reason
//! SESSION_DELETED), then its history, turns, inbox and blobs. Then what
//! the stores keep of the owner beyond sessions
//! ([`Runtime::forget_owner_data`]).
//!
//! Sessions are read in pages of [`PAGE`], never all at once. A session
//! whose live turn runs on another replica is left to that replica: the
//! adapter sends the same call there (its turn is stopped where it runs),
//! so the result says how many were left so ([`DeletedSessions`]).

use super::Runtime;
use super::admin::require_admin;
use super::sessions::Deleted;
use crate::error::RuntimeError;
use crate::limits::{MAX_ID_BYTES, check_short};
use crate::store::ListQuery;
use crate::types::{Principal, Session};

/// Sessions read (and deleted) per page.
const PAGE: usize = 100;

/// What `DeleteSessions` did on this replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeletedSessions {
    /// Sessions deleted here.
    pub deleted: u64,
    /// Sessions left alone because their live turn runs on another replica
    /// (which deletes them when the call reaches it).
    pub live_elsewhere: u64,
    /// Sessions left alone because their live turn did not stop within
    /// 5 s (calling again deletes them once it has).
    pub still_ending: u64,
}

impl DeletedSessions {
    /// Whether every matching session is gone (none was left alone).
    pub fn complete(&self) -> bool {
        self.live_elsewhere == 0 && self.still_ending == 0
    }
}

impl Runtime {
    /// Deletes every session of `owner` (only those of `agent_id` when it
    /// is non-empty), or with an empty `owner` every session of `agent_id`
    /// whoever owns it (admin principals only; at least one of the two is
    /// required). See the module docs.
    pub async fn delete_sessions(
        &self,
        who: &Principal,
        owner: &str,
        agent_id: &str,
    ) -> Result<DeletedSessions, RuntimeError> {
        require_admin(who)?;
        if owner.is_empty() && agent_id.is_empty() {
            return Err(RuntimeError::invalid(
                "owner",
                "is empty, and so is agent_id: name the owner whose sessions go, the agent \
                 whose sessions go, or both",
            ));
        }
        check_short("owner", owner, MAX_ID_BYTES)?;
        check_short("agent_id", agent_id, MAX_ID_BYTES)?;
        let mut done = DeletedSessions::default();
        if owner.is_empty() {
            self.delete_agent_sessions(agent_id, &mut done).await?;
        } else {
            self.delete_owner_sessions(owner, agent_id, &mut done)
                .await?;
        }
        if done.complete() {
            let agent = (!agent_id.is_empty()).then_some(agent_id);
            self.forget_owner_data((!owner.is_empty()).then_some(owner), agent)
                .await?;
        }
        tracing::info!(
            owner,
            agent_id,
            deleted = done.deleted,
            live_elsewhere = done.live_elsewhere,
            still_ending = done.still_ending,
            "sessions deleted by an operator"
        );
        Ok(done)
    }

    /// `owner`'s sessions (of `agent_id` when non-empty), page by page.
    async fn delete_owner_sessions(
        &self,
        owner: &str,
        agent_id: &str,
        done: &mut DeletedSessions,
    ) -> Result<(), RuntimeError> {
        let mut after = None;
        loop {
            let query = ListQuery {
                agent_id: (!agent_id.is_empty()).then(|| agent_id.to_owned()),
                include_archived: true,
                limit: PAGE,
                after,
                ..ListQuery::default()
            };
            let page = self.inner.store.list_sessions(owner, &query).await?;
            for session in &page.sessions {
                self.delete_one(session, done).await?;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// Every owner's sessions of `agent_id`, page by page.
    async fn delete_agent_sessions(
        &self,
        agent_id: &str,
        done: &mut DeletedSessions,
    ) -> Result<(), RuntimeError> {
        let mut after: Option<String> = None;
        loop {
            let page = self
                .inner
                .store
                .sessions_of_agent(agent_id, after.as_deref(), PAGE)
                .await?;
            for session in &page.sessions {
                self.delete_one(session, done).await?;
            }
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// One matching session: deleted here unless its live turn runs on
    /// another replica or does not stop.
    async fn delete_one(
        &self,
        session: &Session,
        done: &mut DeletedSessions,
    ) -> Result<(), RuntimeError> {
        if self.live_of(session).is_none() && self.lease_elsewhere(&session.id).await?.is_some() {
            done.live_elsewhere += 1;
            return Ok(());
        }
        match self.delete_stored(session).await? {
            Deleted::Deleted(true) => done.deleted += 1,
            // Deleted meanwhile by someone else.
            Deleted::Deleted(false) => {}
            Deleted::StillEnding => done.still_ending += 1,
        }
        Ok(())
    }

    /// Removes what is kept of `owner` (of their data with `agent`, when
    /// named) beyond their sessions, once every matching session is gone —
    /// the one place `DeleteSessions` does so; data kept per user × agent
    /// goes here too. Today: with an owner and no agent, the stores' quota
    /// counts and daily spending of the owner ([`crate::store::Store::forget_owner`]).
    /// Per-owner accounting is not per agent, so a call naming an agent
    /// keeps it.
    async fn forget_owner_data(
        &self,
        owner: Option<&str>,
        agent: Option<&str>,
    ) -> Result<(), RuntimeError> {
        if let (Some(owner), None) = (owner, agent) {
            self.inner.store.forget_owner(owner).await?;
        }
        // Memory blocks: the owner's (for the agent, or every agent's), or
        // every owner's for the agent.
        let memory = self.inner.store.agents();
        match (owner, agent) {
            (Some(owner), agent) => memory.delete_memory(owner, agent).await?,
            (None, Some(agent)) => memory.delete_agent_memory(agent).await?,
            (None, None) => 0,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::Models;
    use crate::runtime::RuntimeConfig;
    use crate::store::{MemoryStore, Store as _};
    use crate::types::{ActorKind, NewSession};

    async fn runtime() -> (Runtime, Arc<MemoryStore>) {
        let store = Arc::new(MemoryStore::new());
        let rt = Runtime::open(
            RuntimeConfig::default(),
            Arc::clone(&store) as Arc<dyn crate::store::Store>,
            Models::with_builtin(),
        )
        .await
        .unwrap();
        (rt, store)
    }

    async fn sessions(rt: &Runtime, user: &str, agent: &str, n: usize) {
        let who = Principal::new(user, false, ActorKind::ApiKey);
        for _ in 0..n {
            let new = NewSession {
                agent_id: agent.to_owned(),
                ..NewSession::default()
            };
            rt.create_session(&who, new).await.unwrap();
        }
    }

    async fn count(store: &MemoryStore, owner: &str, agent: Option<&str>) -> usize {
        let query = ListQuery {
            agent_id: agent.map(str::to_owned),
            include_archived: true,
            limit: 1000,
            ..ListQuery::default()
        };
        store
            .list_sessions(owner, &query)
            .await
            .unwrap()
            .sessions
            .len()
    }

    #[tokio::test]
    async fn by_owner_by_agent_and_by_both_delete_exactly_the_matching_sessions() {
        let (rt, store) = runtime().await;
        let admin = Principal::new("ops", true, ActorKind::ApiKey);
        // More than a page of one owner's, to cross pages.
        sessions(&rt, "alice", "helper", PAGE + 3).await;
        sessions(&rt, "alice", "coder", 2).await;
        sessions(&rt, "bob", "helper", 2).await;
        sessions(&rt, "bob", "coder", 1).await;

        let done = rt.delete_sessions(&admin, "bob", "coder").await.unwrap();
        assert_eq!(done.deleted, 1);
        assert_eq!(count(&store, "bob", None).await, 2);

        let done = rt.delete_sessions(&admin, "", "helper").await.unwrap();
        assert_eq!(done.deleted, PAGE as u64 + 3 + 2);
        assert!(done.complete());
        assert_eq!(count(&store, "alice", Some("helper")).await, 0);
        assert_eq!(count(&store, "alice", None).await, 2);
        assert_eq!(count(&store, "bob", None).await, 0);

        let done = rt.delete_sessions(&admin, "alice", "").await.unwrap();
        assert_eq!(done.deleted, 2);
        assert_eq!(store.count_sessions().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn it_needs_an_admin_and_a_filter() {
        let (rt, _) = runtime().await;
        let user = Principal::new("u", false, ActorKind::ApiKey);
        let guest = Principal {
            restricted: true,
            ..Principal::new("g", true, ActorKind::ApiKey)
        };
        for who in [user, guest] {
            assert!(matches!(
                rt.delete_sessions(&who, "u", "").await,
                Err(RuntimeError::PermissionDenied(_))
            ));
        }
        let admin = Principal::local();
        assert!(matches!(
            rt.delete_sessions(&admin, "", "").await,
            Err(RuntimeError::InvalidArgument(v)) if v[0].field == "owner"
        ));
    }
}
