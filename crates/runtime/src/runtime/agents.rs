//! Agents and memory through the runtime's API: `AgentService`'s calls,
//! the config's agents kept in the store, and what a turn takes from its
//! session's agent ([`TurnAgent`]: the version, the rendered prompt).
//!
//! A turn resolves its agent once, at admission: a turn in flight keeps the
//! version and prompt it started with whatever changes meanwhile; the next
//! turn sees the change (a session following the latest) or keeps its
//! pinned version.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use crate::agents::{
    self, AgentSource, AgentSpec, AgentVersion, Memory, MemoryEdit, PromptContext,
};
use crate::error::RuntimeError;
use crate::runtime::admin::require_admin;
use crate::runtime::{Runtime, lock};
use crate::types::{Principal, Session, SessionUpdate};

/// Most agent versions kept decoded in memory (versions are immutable;
/// when full the cache starts over).
const CACHED_VERSIONS: usize = 1024;

/// Tries of a compare-and-swap write that lost a race before giving up.
const CAS_ATTEMPTS: usize = 8;

/// Default and largest `ListAgents` page.
const DEFAULT_PAGE: usize = 50;
const MAX_PAGE: usize = 500;

/// Decoded agent versions by (id, version).
#[derive(Debug, Default)]
pub(crate) struct AgentCache {
    versions: Mutex<HashMap<(String, u64), Arc<AgentVersion>>>,
}

impl AgentCache {
    fn get(&self, id: &str, version: u64) -> Option<Arc<AgentVersion>> {
        lock(&self.versions).get(&(id.to_owned(), version)).cloned()
    }

    fn put(&self, agent: &Arc<AgentVersion>) {
        let mut versions = lock(&self.versions);
        if versions.len() >= CACHED_VERSIONS {
            versions.clear();
        }
        versions.insert((agent.id.clone(), agent.version), Arc::clone(agent));
    }
}

/// What a turn takes from its session's agent, fixed at admission.
#[derive(Debug, Clone)]
pub(crate) struct TurnAgent {
    /// The version the turn runs with.
    pub(crate) agent: Arc<AgentVersion>,
    /// The rendered system prompt (`None`: the template is empty).
    pub(crate) prompt: Option<String>,
}

impl Runtime {
    /// Creates agent `id` (version 1). Admin only.
    pub async fn create_agent(
        &self,
        who: &Principal,
        id: &str,
        spec: AgentSpec,
    ) -> Result<AgentVersion, RuntimeError> {
        require_admin(who)?;
        agents::check_agent_id(id).map_err(|e| RuntimeError::invalid("agent_id", e))?;
        check(&spec)?;
        let agent = AgentVersion {
            id: id.to_owned(),
            version: 1,
            source: AgentSource::Api,
            spec,
            created_at: SystemTime::now(),
        };
        // Version 1 is stored only when no version of the id exists.
        if !self.inner.store.agents().put_agent(&agent).await? {
            return Err(RuntimeError::AlreadyExists("an agent with this id exists"));
        }
        Ok(agent)
    }

    /// Replaces agent `id`'s spec: its next version. Admin only; agents of
    /// the config are read-only; `expected` (when set) must be the latest.
    pub async fn update_agent(
        &self,
        who: &Principal,
        id: &str,
        spec: AgentSpec,
        expected: Option<u64>,
    ) -> Result<AgentVersion, RuntimeError> {
        require_admin(who)?;
        check(&spec)?;
        let store = self.inner.store.agents();
        for _ in 0..CAS_ATTEMPTS {
            let Some(latest) = store.get_agent(id, None).await? else {
                return Err(RuntimeError::AgentNotFound);
            };
            if latest.source == AgentSource::Config {
                return Err(RuntimeError::FailedPrecondition(
                    "this agent is defined in the server's config file ([[agents]]): change it \
                     there and reload the server's config",
                ));
            }
            if expected.is_some_and(|v| v != latest.version) {
                return Err(RuntimeError::FailedPrecondition(
                    "expected_version is not the agent's latest version: read it again",
                ));
            }
            let next = AgentVersion {
                id: id.to_owned(),
                version: latest.version + 1,
                source: AgentSource::Api,
                spec: spec.clone(),
                created_at: SystemTime::now(),
            };
            if store.put_agent(&next).await? {
                return Ok(next);
            }
        }
        Err(RuntimeError::Unavailable(
            "the agent is being changed by other calls; try again",
        ))
    }

    /// Version `version` of agent `id` (the latest when `None`).
    pub async fn get_agent(
        &self,
        _who: &Principal,
        id: &str,
        version: Option<u64>,
    ) -> Result<AgentVersion, RuntimeError> {
        let found = self.inner.store.agents().get_agent(id, version).await?;
        found.ok_or(RuntimeError::AgentNotFound)
    }

    /// A page of agents (latest versions, by id) and the next page's token.
    pub async fn list_agents(
        &self,
        _who: &Principal,
        page_size: usize,
        page_token: &str,
    ) -> Result<(Vec<AgentVersion>, Option<String>), RuntimeError> {
        let limit = match page_size {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        };
        let after = (!page_token.is_empty()).then_some(page_token);
        if let Some(after) = after {
            agents::check_agent_id(after).map_err(|_| {
                RuntimeError::invalid("page_token", "is not a page token of ListAgents")
            })?;
        }
        let mut page = self
            .inner
            .store
            .agents()
            .list_agents(after, limit + 1)
            .await?;
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last().map(|a| a.id.clone()).unwrap_or_default()
        });
        Ok((page, next))
    }

    /// The memory blocks of `user` (the caller when `None`; another user's:
    /// admin only) for agent `agent`.
    pub async fn get_memory(
        &self,
        who: &Principal,
        agent: &str,
        user: Option<&str>,
    ) -> Result<Memory, RuntimeError> {
        let owner = memory_owner(who, agent, user)?;
        Ok(self.inner.store.agents().get_memory(owner, agent).await?)
    }

    /// Applies `edits` to the memory blocks of `user` for `agent`, all or
    /// none; `expected` (when set) must be the current version.
    pub async fn update_memory(
        &self,
        who: &Principal,
        agent: &str,
        user: Option<&str>,
        edits: &[MemoryEdit],
        expected: Option<u64>,
    ) -> Result<Memory, RuntimeError> {
        let owner = memory_owner(who, agent, user)?;
        if edits.is_empty() {
            return Err(RuntimeError::invalid("edits", "name at least one edit"));
        }
        if edits.len() > self.inner.config.memory.max_blocks * 4 {
            return Err(RuntimeError::invalid(
                "edits",
                format!(
                    "at most {} edits per call",
                    self.inner.config.memory.max_blocks * 4
                ),
            ));
        }
        self.edit_memory(owner, agent, edits, expected)
            .await?
            .map_err(|(i, e)| RuntimeError::invalid(format!("edits[{i}]"), e))
    }

    /// Applies `edits` by compare-and-swap; `Ok(Err((index, problem)))`
    /// when an edit does not fit the limits (nothing changed).
    pub(crate) async fn edit_memory(
        &self,
        owner: &str,
        agent: &str,
        edits: &[MemoryEdit],
        expected: Option<u64>,
    ) -> Result<Result<Memory, (usize, String)>, RuntimeError> {
        let store = self.inner.store.agents();
        let limits = self.inner.config.memory;
        for _ in 0..CAS_ATTEMPTS {
            let current = store.get_memory(owner, agent).await?;
            if expected.is_some_and(|v| v != current.version) {
                return Err(RuntimeError::FailedPrecondition(
                    "expected_version is not the memory's current version: read it again",
                ));
            }
            let mut next = current.clone();
            for (i, edit) in edits.iter().enumerate() {
                if let Err(e) = edit.apply(&mut next, &limits) {
                    return Ok(Err((i, e)));
                }
            }
            // One version per call, however many edits it made.
            next.version = current.version + 1;
            if store
                .put_memory(owner, agent, &next, current.version)
                .await?
            {
                return Ok(Ok(next));
            }
        }
        Err(RuntimeError::Unavailable(
            "the memory is being changed by other calls; try again",
        ))
    }

    /// Makes the store's agents match the config's `[[agents]]`: an agent
    /// whose spec changed (or that is new) gets a new version, marked as
    /// the config's. Run at start-up and on a config reload; turns admitted
    /// afterwards see the change, turns in flight keep theirs.
    pub async fn sync_config_agents(
        &self,
        defined: &[(String, AgentSpec)],
    ) -> Result<usize, RuntimeError> {
        let store = self.inner.store.agents();
        let mut changed = 0;
        for (id, spec) in defined {
            agents::check_agent_id(id).map_err(|e| RuntimeError::invalid("agents.id", e))?;
            check(spec)?;
            for attempt in 0..=CAS_ATTEMPTS {
                let latest = store.get_agent(id, None).await?;
                if let Some(latest) = &latest
                    && latest.source == AgentSource::Config
                    && latest.spec == *spec
                {
                    break;
                }
                if attempt == CAS_ATTEMPTS {
                    return Err(RuntimeError::Unavailable(
                        "the config's agents are being changed by other calls",
                    ));
                }
                let next = AgentVersion {
                    id: id.clone(),
                    version: latest.map_or(1, |l| l.version + 1),
                    source: AgentSource::Config,
                    spec: spec.clone(),
                    created_at: SystemTime::now(),
                };
                if store.put_agent(&next).await? {
                    changed += 1;
                    break;
                }
            }
        }
        Ok(changed)
    }

    /// The agent `session` runs with, resolved for one turn, with its
    /// rendered prompt; `None` when the session names no agent that exists
    /// (its `agent_id` is then only a label). Freezes the session's memory
    /// snapshot at its first turn when the template reads memory.
    pub(crate) async fn turn_agent(
        &self,
        session: &Session,
    ) -> Result<Option<TurnAgent>, RuntimeError> {
        let Some(agent) = self.agent_version(session).await? else {
            return Ok(None);
        };
        let template = &agent.spec.system_prompt;
        if template.is_empty() {
            return Ok(Some(TurnAgent {
                agent,
                prompt: None,
            }));
        }
        let memory = if template.contains("memory") {
            self.prompt_memory(session).await?
        } else {
            Memory::default()
        };
        let ctx = PromptContext {
            user: &session.owner,
            session_id: crate::runtime::keys::client_id(&session.id),
            title: &session.title,
            metadata: &session.metadata,
            memory: &memory.blocks,
            agent: &agent,
            now: SystemTime::now(),
        };
        let prompt = agents::render(template, &ctx).map_err(RuntimeError::AgentPrompt)?;
        Ok(Some(TurnAgent {
            agent,
            prompt: (!prompt.is_empty()).then_some(prompt),
        }))
    }

    /// The version `session` runs with: its pinned version (cached: versions
    /// never change) or the latest.
    pub(crate) async fn agent_version(
        &self,
        session: &Session,
    ) -> Result<Option<Arc<AgentVersion>>, RuntimeError> {
        if session.agent_id.is_empty() {
            return Ok(None);
        }
        let pinned = session.agent.version;
        if pinned != 0
            && let Some(cached) = self.inner.agent_cache.get(&session.agent_id, pinned)
        {
            return Ok(Some(cached));
        }
        let version = (pinned != 0).then_some(pinned);
        let found = self
            .inner
            .store
            .agents()
            .get_agent(&session.agent_id, version)
            .await?;
        match found {
            Some(agent) => {
                let agent = Arc::new(agent);
                self.inner.agent_cache.put(&agent);
                Ok(Some(agent))
            }
            // A pinned version never goes away (versions are immutable).
            None if pinned != 0 => Err(RuntimeError::AgentNotFound),
            None => Ok(None),
        }
    }

    /// The memory the prompt shows: the session's snapshot, taken (and
    /// stored) at its first turn — or the latest at every turn when the
    /// session refreshes it.
    async fn prompt_memory(&self, session: &Session) -> Result<Memory, RuntimeError> {
        if !session.agent.refresh_memory
            && let Some(snapshot) = &session.agent.memory_snapshot
        {
            return Ok(snapshot.clone());
        }
        let memory = self
            .inner
            .store
            .agents()
            .get_memory(&session.owner, &session.agent_id)
            .await?;
        if !session.agent.refresh_memory {
            let update = SessionUpdate {
                memory_snapshot: Some(memory.clone()),
                ..SessionUpdate::default()
            };
            self.inner.store.update_session(&session.id, update).await?;
        }
        Ok(memory)
    }
}

/// Whose memory a call reads or writes: the caller's, or (admin only)
/// `user`'s.
fn memory_owner<'a>(
    who: &'a Principal,
    agent: &str,
    user: Option<&'a str>,
) -> Result<&'a str, RuntimeError> {
    agents::check_agent_id(agent).map_err(|e| RuntimeError::invalid("agent_id", e))?;
    match user.filter(|u| !u.is_empty() && *u != who.user_id) {
        None => Ok(&who.user_id),
        Some(other) => {
            require_admin(who)?;
            Ok(other)
        }
    }
}

/// A spec's problems as `INVALID_ARGUMENT` naming the field (under
/// `spec.`).
fn check(spec: &AgentSpec) -> Result<(), RuntimeError> {
    agents::check_spec(spec).map_err(|(field, e)| RuntimeError::invalid(format!("spec.{field}"), e))
}
