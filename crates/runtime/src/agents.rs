//! Agent profiles and memory blocks: what a session's runner is built from.
//!
//! An agent is a named, versioned profile — a system prompt *template*, a
//! default model and thinking level, the tools it may use, the agents it
//! may delegate to, its step and time limits, approval and budget defaults.
//! Every change is a new immutable [`AgentVersion`]; a session records the
//! version it was created with ([`AgentBinding::version`]) or follows the
//! latest (version 0). Agents come from the server's config
//! ([`AgentSource::Config`], read-only through the API) or from
//! `AgentService` calls ([`AgentSource::Api`]); both are kept in the store,
//! so every replica sees the same versions.
//!
//! Memory blocks are named texts per user × agent ([`Memory`]), bounded by
//! [`MemoryLimits`], rendered into the prompt by the template and — when the
//! profile lists them — read and written by the model through the built-in
//! tools [`MEMORY_READ`] and [`MEMORY_WRITE`].
//!
//! - `template`: rendering a profile's system prompt (minijinja, fuel-bounded).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::types::{Budget, ThinkingLevel};

mod template;

pub use crate::types::{AgentBinding, Memory};

pub use template::{FUEL, MAX_RENDERED_BYTES, PromptContext, check_template, render};

/// The built-in tool that reads the user's memory blocks for the agent.
pub const MEMORY_READ: &str = "memory_read";
/// The built-in tool that writes one of the user's memory blocks.
pub const MEMORY_WRITE: &str = "memory_write";
/// The built-in tool that runs a task in a delegate (child) session.
pub const DELEGATE: &str = "delegate";

/// Longest agent id, in bytes.
pub const MAX_AGENT_ID_BYTES: usize = 64;
/// Longest description, in bytes.
pub const MAX_DESCRIPTION_BYTES: usize = 4 * 1024;
/// Longest system prompt template, in bytes.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;
/// Most entries of `tools` and of `delegates`.
pub const MAX_LIST_ENTRIES: usize = 64;
/// Longest entry of `tools` / `delegates`, in bytes.
pub const MAX_ENTRY_BYTES: usize = 128;
/// Most custom `fields` of a profile.
pub const MAX_FIELDS: usize = 32;
/// Longest custom field value, in bytes.
pub const MAX_FIELD_BYTES: usize = 4 * 1024;

/// Where an agent is defined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentSource {
    /// `[[agents]]` in the server's config: read-only through the API.
    Config,
    /// Created through `AgentService`.
    Api,
}

/// What one version of an agent defines. Every field is optional in the
/// sense that an empty value leaves the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentSpec {
    /// What the agent is for (shown to people and to delegating models).
    pub description: String,
    /// The system prompt, a template (see [`render`]); empty: none.
    pub system_prompt: String,
    /// `provider/model`; empty: the server's default.
    pub model: String,
    /// Default reasoning effort; `None`: the server's default.
    pub thinking: Option<ThinkingLevel>,
    /// The tools the agent may use: exact names (`search__web`), a source's
    /// every tool (`search__*`), `*` for every server tool, and the
    /// built-ins [`MEMORY_READ`] / [`MEMORY_WRITE`]. `None`: every server
    /// tool and no built-in.
    pub tools: Option<Vec<String>>,
    /// Agents this one may delegate to (offers [`DELEGATE`] when non-empty).
    pub delegates: Vec<String>,
    /// Most model steps of a turn; `None`: the server's default.
    pub max_steps: Option<u32>,
    /// Time limit of a turn whose call sets none; `None`: the server's.
    #[serde(with = "opt_millis")]
    pub turn_timeout: Option<Duration>,
    /// Server tools whose calls wait for an approval (`*`: all), added to
    /// the server's list.
    pub require_approval: Vec<String>,
    /// The budget of sessions created with this agent that name none.
    pub budget: Budget,
    /// Whether turns title their sessions (`None`: the server's setting).
    pub auto_title: Option<bool>,
    /// Free-form fields the template can use as `agent.fields.NAME`.
    pub fields: BTreeMap<String, String>,
}

/// One immutable version of an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentVersion {
    /// The agent's id.
    pub id: String,
    /// Its version, from 1, one more per change.
    pub version: u64,
    /// Where it is defined.
    pub source: AgentSource,
    /// What it defines.
    pub spec: AgentSpec,
    /// When this version was made.
    pub created_at: SystemTime,
}

impl AgentVersion {
    /// Whether the profile offers the built-in tool `name`.
    pub fn offers_builtin(&self, name: &str) -> bool {
        self.spec
            .tools
            .as_ref()
            .is_some_and(|tools| tools.iter().any(|t| t == name))
    }

    /// Whether the profile allows the server tool `name`.
    pub fn allows_server_tool(&self, name: &str) -> bool {
        let Some(patterns) = &self.spec.tools else {
            return true;
        };
        patterns.iter().any(|p| tool_matches(p, name))
    }
}

/// What separates a tool source's name from its tool's in the names the
/// model sees (`search__web`); the toolbox's `SEPARATOR` (a test holds them
/// equal), spelled here so that profiles need not know the toolbox.
const SOURCE_SEPARATOR: &str = "__";

/// Whether `pattern` (an exact name, `source__*`, or `*`) names `tool`.
pub fn tool_matches(pattern: &str, tool: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => {
            (prefix.is_empty() || prefix.ends_with(SOURCE_SEPARATOR)) && tool.starts_with(prefix)
        }
        None => pattern == tool,
    }
}

/// One change to memory blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemoryEdit {
    /// Sets the block's text (creates it).
    Set {
        /// Block name.
        block: String,
        /// Its new text.
        text: String,
    },
    /// Appends to the block's text (creates it).
    Append {
        /// Block name.
        block: String,
        /// The text appended (after a newline when the block is not empty).
        text: String,
    },
    /// Removes the block.
    Delete {
        /// Block name.
        block: String,
    },
}

impl MemoryEdit {
    /// The block the edit changes.
    pub fn block(&self) -> &str {
        match self {
            Self::Set { block, .. } | Self::Append { block, .. } | Self::Delete { block } => block,
        }
    }

    /// Applies the edit to `memory` within `limits`; on `Err` (naming the
    /// limit) `memory` is unchanged.
    pub fn apply(&self, memory: &mut Memory, limits: &MemoryLimits) -> Result<(), String> {
        check_block_name(self.block())?;
        let mut blocks = memory.blocks.clone();
        match self {
            Self::Set { block, text } => {
                blocks.insert(block.clone(), text.clone());
            }
            Self::Append { block, text } => {
                let entry = blocks.entry(block.clone()).or_default();
                if !entry.is_empty() && !text.is_empty() {
                    entry.push('\n');
                }
                entry.push_str(text);
            }
            Self::Delete { block } => {
                blocks.remove(block);
            }
        }
        if let Some(text) = blocks.get(self.block())
            && text.len() > limits.max_block_bytes
        {
            return Err(format!(
                "block {:?} would hold {} bytes; the limit is {} bytes per block",
                self.block(),
                text.len(),
                limits.max_block_bytes
            ));
        }
        if blocks.len() > limits.max_blocks {
            return Err(format!(
                "at most {} memory blocks per user and agent",
                limits.max_blocks
            ));
        }
        memory.blocks = blocks;
        memory.version += 1;
        Ok(())
    }
}

/// Checks a memory block's name: 1–64 bytes of letters, digits, `_-.`.
pub fn check_block_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("a block name has 1 to 64 bytes".to_owned());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err("a block name has only ASCII letters, digits, '_', '-' and '.'".to_owned());
    }
    Ok(())
}

/// Bounds on memory blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most blocks per user × agent. Default 16.
    pub max_blocks: usize,
    /// Most bytes of one block's text. Default 8 KiB.
    pub max_block_bytes: usize,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_blocks: 16,
            max_block_bytes: 8 * 1024,
        }
    }
}

/// Bounds on the built-in [`DELEGATE`] tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelegationLimits {
    /// How deep delegate sessions nest: a session this many delegations
    /// below one a caller created is not offered the tool. Default 2.
    pub max_depth: u32,
    /// Most delegate calls of one model step that run (at once); the
    /// step's further calls are refused with a result saying so.
    /// Default 4.
    pub max_parallel: usize,
}

impl Default for DelegationLimits {
    fn default() -> Self {
        Self {
            max_depth: 2,
            max_parallel: 4,
        }
    }
}

/// Checks an agent id: 1–64 bytes of ASCII letters, digits, `_-.`.
pub fn check_agent_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_AGENT_ID_BYTES {
        return Err(format!("has 1 to {MAX_AGENT_ID_BYTES} bytes"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    {
        return Err("has only ASCII letters, digits, '_', '-' and '.'".to_owned());
    }
    Ok(())
}

/// Checks a spec's fields and template; `Err((field, problem))`.
pub fn check_spec(spec: &AgentSpec) -> Result<(), (String, String)> {
    let too_long = |field: &str, len: usize, max: usize| {
        (len > max).then(|| {
            (
                field.to_owned(),
                format!("has {len} bytes; the limit is {max}"),
            )
        })
    };
    for (field, len, max) in [
        ("description", spec.description.len(), MAX_DESCRIPTION_BYTES),
        (
            "system_prompt",
            spec.system_prompt.len(),
            MAX_TEMPLATE_BYTES,
        ),
        ("model", spec.model.len(), MAX_ENTRY_BYTES * 2),
    ] {
        if let Some(e) = too_long(field, len, max) {
            return Err(e);
        }
    }
    let lists = [
        ("tools", spec.tools.as_deref().unwrap_or_default()),
        ("delegates", &spec.delegates[..]),
        ("require_approval", &spec.require_approval[..]),
    ];
    for (field, list) in lists {
        if list.len() > MAX_LIST_ENTRIES {
            return Err((
                field.to_owned(),
                format!(
                    "has {} entries; the limit is {MAX_LIST_ENTRIES}",
                    list.len()
                ),
            ));
        }
        for (i, entry) in list.iter().enumerate() {
            if entry.is_empty() {
                return Err((format!("{field}[{i}]"), "is empty".to_owned()));
            }
            if let Some(e) = too_long(&format!("{field}[{i}]"), entry.len(), MAX_ENTRY_BYTES) {
                return Err(e);
            }
        }
    }
    for (i, d) in spec.delegates.iter().enumerate() {
        check_agent_id(d).map_err(|e| (format!("delegates[{i}]"), e))?;
    }
    if spec.fields.len() > MAX_FIELDS {
        return Err((
            "fields".to_owned(),
            format!(
                "has {} entries; the limit is {MAX_FIELDS}",
                spec.fields.len()
            ),
        ));
    }
    for (k, v) in &spec.fields {
        if k.is_empty() || k.len() > 64 {
            return Err((
                "fields".to_owned(),
                "a field name has 1 to 64 bytes".to_owned(),
            ));
        }
        if let Some(e) = too_long(&format!("fields.{k}"), v.len(), MAX_FIELD_BYTES) {
            return Err(e);
        }
    }
    if spec.max_steps == Some(0) {
        return Err(("max_steps".to_owned(), "must be at least 1".to_owned()));
    }
    if spec.turn_timeout == Some(Duration::ZERO) {
        return Err(("turn_timeout".to_owned(), "must be positive".to_owned()));
    }
    check_template(&spec.system_prompt).map_err(|e| ("system_prompt".to_owned(), e))
}

/// `Option<Duration>` as milliseconds.
mod opt_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_patterns_name_exact_tools_a_sources_tools_or_all() {
        assert_eq!(SOURCE_SEPARATOR, crate::toolbox::SEPARATOR);
        assert!(tool_matches("search__web", "search__web"));
        assert!(!tool_matches("search__web", "search__webx"));
        assert!(tool_matches("search__*", "search__web"));
        assert!(!tool_matches("search__*", "searchx__web"));
        assert!(!tool_matches("sea*", "search__web"));
        assert!(tool_matches("*", "files__read"));
    }

    #[test]
    fn memory_edits_stay_within_the_limits_or_change_nothing() {
        let limits = MemoryLimits {
            max_blocks: 2,
            max_block_bytes: 8,
        };
        let mut m = Memory::default();
        MemoryEdit::Set {
            block: "a".into(),
            text: "1234".into(),
        }
        .apply(&mut m, &limits)
        .unwrap();
        MemoryEdit::Append {
            block: "a".into(),
            text: "567".into(),
        }
        .apply(&mut m, &limits)
        .unwrap();
        assert_eq!(m.blocks["a"], "1234\n567");
        assert_eq!(m.version, 2);
        let err = MemoryEdit::Append {
            block: "a".into(),
            text: "89".into(),
        }
        .apply(&mut m, &limits)
        .unwrap_err();
        assert!(err.contains("8 bytes"), "{err}");
        MemoryEdit::Set {
            block: "b".into(),
            text: String::new(),
        }
        .apply(&mut m, &limits)
        .unwrap();
        let err = MemoryEdit::Set {
            block: "c".into(),
            text: String::new(),
        }
        .apply(&mut m, &limits)
        .unwrap_err();
        assert!(err.contains("at most 2"), "{err}");
        assert_eq!(m.version, 3);
        assert!(
            MemoryEdit::Delete {
                block: "no/".into()
            }
            .apply(&mut m, &limits)
            .is_err()
        );
    }

    #[test]
    fn specs_are_checked_field_by_field() {
        let mut spec = AgentSpec {
            system_prompt: "Hello {{ user }}".into(),
            ..AgentSpec::default()
        };
        assert!(check_spec(&spec).is_ok());
        spec.system_prompt = "{% if %}".into();
        assert_eq!(check_spec(&spec).unwrap_err().0, "system_prompt");
        spec.system_prompt.clear();
        spec.delegates = vec!["bad id".into()];
        assert_eq!(check_spec(&spec).unwrap_err().0, "delegates[0]");
        spec.delegates.clear();
        spec.max_steps = Some(0);
        assert_eq!(check_spec(&spec).unwrap_err().0, "max_steps");
    }

    #[test]
    fn a_spec_round_trips_through_its_stored_form() {
        let spec = AgentSpec {
            turn_timeout: Some(Duration::from_millis(1500)),
            tools: Some(vec!["memory_read".into()]),
            ..AgentSpec::default()
        };
        let json = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<AgentSpec>(&json).unwrap(), spec);
        // Records written before a field existed still read.
        assert_eq!(
            serde_json::from_str::<AgentSpec>("{}").unwrap(),
            AgentSpec::default()
        );
    }
}
