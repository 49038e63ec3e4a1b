//! `[[agents]]` (agent profiles defined by the operator, read-only through
//! `AgentService`), `[memory]` (the bounds on memory blocks) and
//! `[delegation]` (the bounds on delegate sessions).
//!
//! ```toml
//! [[agents]]
//! id = "helper"                      # 1-64 bytes of [A-Za-z0-9._-]
//! description = "Answers questions about the user's projects"
//! system_prompt = """You help {{ user }}. Today is {{ date }}.
//! What you remember: {{ memory.notes }}"""   # a minijinja template
//! model = "openai/gpt-4.1"           # default: the server's default model
//! thinking = "low"                   # none, minimal, low, medium, high, xhigh
//! tools = ["search__*", "memory_read", "memory_write"]  # default: every server tool
//! delegates = ["researcher"]         # agents the `delegate` tool may run
//! max_steps = 8
//! turn_timeout = "5m"
//! require_approval = ["files__delete"]
//! budget = { max_tokens = 100000, max_cost = 0.5 }
//! fields = { tone = "friendly" }     # the template's agent.fields.tone
//!
//! [memory]
//! max_blocks = 16                    # per user and agent
//! max_block_bytes = 8192
//!
//! [delegation]
//! max_depth = 2      # delegate sessions of delegate sessions, at most this deep
//! max_parallel = 4   # delegate calls of one model step that run at once
//! ```
//!
//! The config's agents are written to the store at start-up and on SIGHUP
//! (a new version when one changed); turns admitted afterwards use them,
//! turns in flight keep the version they started with.

use std::collections::BTreeMap;
use std::time::Duration;

use agentrt_runtime::agents::{self, AgentSpec, DelegationLimits, MemoryLimits};
use agentrt_runtime::types::{Budget, ThinkingLevel};
use serde::Deserialize;

use super::ConfigError;

/// One `[[agents]]` entry (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The agent's id.
    pub id: String,
    /// What it is for.
    #[serde(default)]
    pub description: String,
    /// The system prompt template.
    #[serde(default)]
    pub system_prompt: String,
    /// `provider/model`; empty: the server's default.
    #[serde(default)]
    pub model: String,
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    #[serde(default)]
    pub thinking: Option<String>,
    /// Tools it may use; absent: every server tool.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// Agents it may delegate to.
    #[serde(default)]
    pub delegates: Vec<String>,
    /// Most model steps of a turn.
    #[serde(default)]
    pub max_steps: Option<u32>,
    /// Time limit of a turn whose call sets none (`"5m"`).
    #[serde(default, deserialize_with = "super::de_duration")]
    pub turn_timeout: Option<Duration>,
    /// Server tools whose calls wait for an approval.
    #[serde(default)]
    pub require_approval: Vec<String>,
    /// The budget of its sessions that set none.
    #[serde(default)]
    pub budget: Option<BudgetConfig>,
    /// Whether its turns title their sessions.
    #[serde(default)]
    pub auto_title: Option<bool>,
    /// Values for the template (`agent.fields.NAME`).
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

/// An agent's default budget.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetConfig {
    /// Most tokens.
    pub max_tokens: Option<u64>,
    /// Most cost in US dollars.
    pub max_cost: Option<f64>,
}

/// The `[memory]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySettings {
    /// Most blocks per user and agent. Default 16.
    pub max_blocks: usize,
    /// Most bytes of one block. Default 8192.
    pub max_block_bytes: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        let d = MemoryLimits::default();
        Self {
            max_blocks: d.max_blocks,
            max_block_bytes: d.max_block_bytes,
        }
    }
}

impl MemorySettings {
    /// The runtime's limits; refuses values that cannot work.
    pub fn limits(&self) -> Result<MemoryLimits, ConfigError> {
        if !(1..=1024).contains(&self.max_blocks) {
            return Err(ConfigError(
                "memory.max_blocks must be between 1 and 1024".to_owned(),
            ));
        }
        if !(1..=1 << 20).contains(&self.max_block_bytes) {
            return Err(ConfigError(
                "memory.max_block_bytes must be between 1 and 1048576".to_owned(),
            ));
        }
        Ok(MemoryLimits {
            max_blocks: self.max_blocks,
            max_block_bytes: self.max_block_bytes,
        })
    }
}

/// The `[delegation]` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DelegationSettings {
    /// How deep delegate sessions nest (0: no delegation). Default 2.
    pub max_depth: u32,
    /// Delegate calls of one model step that run at once. Default 4.
    pub max_parallel: usize,
}

impl Default for DelegationSettings {
    fn default() -> Self {
        let d = DelegationLimits::default();
        Self {
            max_depth: d.max_depth,
            max_parallel: d.max_parallel,
        }
    }
}

impl DelegationSettings {
    /// The runtime's limits; refuses values that cannot work.
    pub fn limits(&self) -> Result<DelegationLimits, ConfigError> {
        if self.max_depth > 8 {
            return Err(ConfigError(
                "delegation.max_depth must be between 0 and 8".to_owned(),
            ));
        }
        if !(1..=64).contains(&self.max_parallel) {
            return Err(ConfigError(
                "delegation.max_parallel must be between 1 and 64".to_owned(),
            ));
        }
        Ok(DelegationLimits {
            max_depth: self.max_depth,
            max_parallel: self.max_parallel,
        })
    }
}

fn thinking(name: &str) -> Option<ThinkingLevel> {
    [
        ThinkingLevel::None,
        ThinkingLevel::Minimal,
        ThinkingLevel::Low,
        ThinkingLevel::Medium,
        ThinkingLevel::High,
        ThinkingLevel::XHigh,
    ]
    .into_iter()
    .find(|t| t.as_str() == name)
}

/// The config's agents as (id, spec), checked; an error names the agent
/// and the field.
pub fn agent_specs(agents: &[AgentConfig]) -> Result<Vec<(String, AgentSpec)>, ConfigError> {
    let mut seen = std::collections::BTreeSet::new();
    agents
        .iter()
        .map(|a| {
            let bad = |what: String| ConfigError(format!("agents: agent {:?}: {what}", a.id));
            agents::check_agent_id(&a.id).map_err(|e| bad(format!("its id {e}")))?;
            if !seen.insert(a.id.as_str()) {
                return Err(bad("is defined twice".to_owned()));
            }
            let thinking = match &a.thinking {
                None => None,
                Some(name) => Some(thinking(name).ok_or_else(|| {
                    bad(format!(
                        "thinking {name:?} is not one of none, minimal, low, medium, high, xhigh"
                    ))
                })?),
            };
            let budget = match &a.budget {
                None => Budget::NONE,
                Some(b) => Budget {
                    max_tokens: b.max_tokens,
                    max_cost_nano_usd: b
                        .max_cost
                        .map(|usd| {
                            agentrt_runtime::prices::nano_usd(usd)
                                .ok_or_else(|| bad(format!("budget.max_cost {usd} is not a cost")))
                        })
                        .transpose()?,
                },
            };
            let spec = AgentSpec {
                description: a.description.clone(),
                system_prompt: a.system_prompt.clone(),
                model: a.model.clone(),
                thinking,
                tools: a.tools.clone(),
                delegates: a.delegates.clone(),
                max_steps: a.max_steps,
                turn_timeout: a.turn_timeout,
                require_approval: a.require_approval.clone(),
                budget,
                auto_title: a.auto_title,
                fields: a.fields.clone(),
            };
            agents::check_spec(&spec).map_err(|(field, e)| bad(format!("{field} {e}")))?;
            Ok((a.id.clone(), spec))
        })
        .collect()
}
