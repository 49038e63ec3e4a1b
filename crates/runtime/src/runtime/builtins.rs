//! The built-in tools an agent profile can offer: [`MEMORY_READ`] and
//! [`MEMORY_WRITE`] over the session owner's memory blocks for the agent,
//! offered when the profile lists them, and [`DELEGATE`] (module
//! `delegate`), offered when the profile names agents to delegate to.
//! They run inside the runtime (no tool source), in the turn's tool phase
//! like a server tool.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::agents::{AgentVersion, DELEGATE, MEMORY_READ, MEMORY_WRITE, MemoryEdit};
use crate::error::RuntimeError;
use crate::model::ToolSpec;
use crate::runtime::runners::Runner;
use crate::runtime::{Inner, Runtime};
use crate::toolbox::ToolOutcome;
use crate::types::Session;

/// Whether `name` is a built-in tool's.
pub(crate) fn is_builtin(name: &str) -> bool {
    matches!(name, MEMORY_READ | MEMORY_WRITE)
}

fn spec(name: &str) -> ToolSpec {
    match name {
        MEMORY_READ => ToolSpec {
            name: MEMORY_READ.to_owned(),
            description: "Reads your memory about this user: the named block, or every block \
                          when no block is named."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "block": {"type": "string", "description": "the block's name; omit for all"}
                }
            }),
        },
        _ => ToolSpec {
            name: MEMORY_WRITE.to_owned(),
            description: "Writes your memory about this user, kept across conversations: sets, \
                          appends to or deletes a named block."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "block": {"type": "string", "description": "the block's name (letters, digits, _-.)"},
                    "text": {"type": "string", "description": "the text to set or append"},
                    "mode": {"type": "string", "enum": ["set", "append", "delete"], "description": "default set"}
                },
                "required": ["block"]
            }),
        },
    }
}

/// Narrows the turn's `tools` to what `agent` allows — its server tools
/// by pattern, the caller's own tools untouched — and adds the built-ins it
/// offers (unless the call excluded them; [`DELEGATE`] only when `may_delegate`:
/// the session is not as deep as delegations go). A caller tool named like
/// an offered built-in is refused.
pub(crate) fn restrict(
    tools: &mut Vec<ToolSpec>,
    runner: &Runner,
    agent: &AgentVersion,
    excluded: &[String],
    may_delegate: bool,
) -> Result<(), RuntimeError> {
    tools.retain(|t| {
        !runner.tools.iter().any(|s| s.name == t.name) || agent.allows_server_tool(&t.name)
    });
    for name in [MEMORY_READ, MEMORY_WRITE, DELEGATE] {
        let offered = match name {
            DELEGATE => may_delegate && !agent.spec.delegates.is_empty(),
            _ => agent.offers_builtin(name),
        };
        if !offered || excluded.iter().any(|e| e == name) {
            continue;
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(RuntimeError::invalid(
                "extra_tools",
                format!(
                    "{name:?} is the name of a built-in tool of agent {:?}",
                    agent.id
                ),
            ));
        }
        tools.push(match name {
            DELEGATE => super::delegate::spec(&agent.spec.delegates),
            _ => spec(name),
        });
    }
    Ok(())
}

impl Runtime {
    /// [`restrict`]s the tools of a turn of `session` to its `agent`'s,
    /// offering [`DELEGATE`] while the session is not as deep as
    /// delegations go; a turn without an agent keeps its tools, and a
    /// `restricted` principal's gets no built-in either.
    pub(crate) fn restrict_tools(
        &self,
        tools: &mut Vec<ToolSpec>,
        runner: &Runner,
        session: &Session,
        agent: Option<&AgentVersion>,
        excluded: &[String],
        restricted: bool,
    ) -> Result<(), RuntimeError> {
        let Some(agent) = agent.filter(|_| !restricted) else {
            return Ok(());
        };
        let may_delegate = session.agent.depth < self.inner.config.delegation.max_depth;
        restrict(tools, runner, agent, excluded, may_delegate)
    }
}

/// Runs built-in tool call `name` for `session`'s owner and agent.
pub(crate) async fn run(
    inner: Arc<Inner>,
    session: &Session,
    name: &str,
    arguments_json: &str,
) -> ToolOutcome {
    let args: Value = serde_json::from_str(arguments_json).unwrap_or(Value::Null);
    let block = args.get("block").and_then(Value::as_str).map(str::to_owned);
    let runtime = Runtime { inner };
    let store = runtime.inner.store.agents();
    match name {
        MEMORY_READ => match store.get_memory(&session.owner, &session.agent_id).await {
            Ok(memory) => match block {
                Some(b) => match memory.blocks.get(&b) {
                    Some(text) => ToolOutcome::ok(text.clone()),
                    None => ToolOutcome::ok(format!("(no block named {b:?})")),
                },
                None if memory.blocks.is_empty() => ToolOutcome::ok("(memory is empty)"),
                None => ToolOutcome::ok(
                    serde_json::to_string_pretty(&memory.blocks).unwrap_or_default(),
                ),
            },
            Err(e) => {
                tracing::warn!(error = %e, "memory_read failed");
                ToolOutcome::error("memory could not be read; try again later")
            }
        },
        _ => {
            let Some(block) = block else {
                return ToolOutcome::error("name the block to write: {\"block\": \"...\"}");
            };
            let text = args
                .get("text")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let edit = match args.get("mode").and_then(Value::as_str).unwrap_or("set") {
                "set" => MemoryEdit::Set { block, text },
                "append" => MemoryEdit::Append { block, text },
                "delete" => MemoryEdit::Delete { block },
                other => {
                    return ToolOutcome::error(format!(
                        "mode {other:?} is not one of set, append, delete"
                    ));
                }
            };
            let written = runtime
                .edit_memory(&session.owner, &session.agent_id, &[edit], None)
                .await;
            match written {
                Ok(Ok(memory)) => {
                    ToolOutcome::ok(format!("memory saved (version {})", memory.version))
                }
                Ok(Err((_, problem))) => ToolOutcome::error(problem),
                Err(e) => {
                    tracing::warn!(error = %e, "memory_write failed");
                    ToolOutcome::error("memory could not be written; try again later")
                }
            }
        }
    }
}
