//! How a session uses its agent ([`AgentBinding`]) and the memory blocks a
//! prompt shows ([`Memory`]): session-record values, so they live with the
//! other domain types (the `agents` module builds on them).

use serde::{Deserialize, Serialize};

/// How a session uses its agent, kept on the session record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentBinding {
    /// The agent version the session runs with; 0: the latest at each turn.
    /// At creation, 0 without [`AgentBinding::follow_latest`] asks for the
    /// latest version then.
    pub version: u64,
    /// Asked at creation to follow the agent's latest version (`version`
    /// stays 0).
    pub follow_latest: bool,
    /// The session that delegated this one (empty: none).
    pub parent_session_id: String,
    /// Re-read the memory blocks at every turn instead of freezing them at
    /// the session's first turn.
    pub refresh_memory: bool,
    /// The memory blocks as the session's first turn read them (the prompt
    /// snapshot); `None` until then.
    pub memory_snapshot: Option<Memory>,
    /// How many delegations deep the session is: 0 for a session a caller
    /// created, its parent's depth plus one for a delegate session.
    pub depth: u32,
}

impl AgentBinding {
    /// Bytes this binding adds to a session record (for the record bound).
    pub fn size(&self) -> usize {
        self.parent_session_id.len() + self.memory_snapshot.as_ref().map_or(0, Memory::size) + 16
    }
}

/// A user's memory blocks for one agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Memory {
    /// One more per change; 0: never written.
    pub version: u64,
    /// Block name → text.
    pub blocks: std::collections::BTreeMap<String, String>,
}

impl Memory {
    /// Bytes of the blocks' names and texts.
    pub fn size(&self) -> usize {
        self.blocks.iter().map(|(k, v)| k.len() + v.len()).sum()
    }
}
