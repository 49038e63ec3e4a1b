//! Agent versions and memory blocks ([`AgentStore`]): every engine keeps
//! them, so every replica of a shared store sees the same agents and the
//! same memory.
//!
//! Versions are immutable: [`AgentStore::put_agent`] adds the next version
//! only (two writers racing for a version: one wins, the other is told and
//! re-reads). Memory is one record per owner × agent, replaced by
//! compare-and-swap on its version.

use async_trait::async_trait;

use super::StoreError;
use crate::agents::{AgentVersion, Memory};

/// Agents and memory blocks (see the module doc). Every engine has them.
#[async_trait]
pub trait AgentStore: Send + Sync + std::fmt::Debug {
    /// Stores `agent` as its id's next version: `agent.version` must be one
    /// more than the latest stored (1 for a new id). `Ok(false)`: that
    /// version exists already (someone else's change won).
    async fn put_agent(&self, agent: &AgentVersion) -> Result<bool, StoreError>;

    /// Version `version` of agent `id`, or its latest (`None`).
    async fn get_agent(
        &self,
        id: &str,
        version: Option<u64>,
    ) -> Result<Option<AgentVersion>, StoreError>;

    /// The latest version of up to `limit` agents whose ids sort after
    /// `after`, in id order.
    async fn list_agents(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AgentVersion>, StoreError>;

    /// `owner`'s memory blocks for `agent` (empty, version 0, when never
    /// written).
    async fn get_memory(&self, owner: &str, agent: &str) -> Result<Memory, StoreError>;

    /// Replaces `owner`'s memory for `agent` with `memory` if the stored
    /// version is still `expected`; `Ok(false)` when it moved on.
    async fn put_memory(
        &self,
        owner: &str,
        agent: &str,
        memory: &Memory,
        expected: u64,
    ) -> Result<bool, StoreError>;

    /// Deletes `owner`'s memory for `agent`, or for every agent (`None`);
    /// how many records went.
    async fn delete_memory(&self, owner: &str, agent: Option<&str>) -> Result<u64, StoreError>;

    /// Deletes every owner's memory for `agent`; how many records went.
    async fn delete_agent_memory(&self, agent: &str) -> Result<u64, StoreError>;
}
