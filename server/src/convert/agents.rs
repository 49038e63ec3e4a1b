//! `agentrt.v1.AgentService` messages to the core's agent values and back.

use agentrt_proto::v1 as pb;
use agentrt_runtime::RuntimeError;
use agentrt_runtime::agents::{AgentSource, AgentSpec, AgentVersion, Memory, MemoryEdit};

use super::{
    budget_from_pb, budget_to_pb, duration, duration_from_pb, thinking, thinking_from_pb, timestamp,
};

/// A spec from the wire; fields named under `spec.`.
pub fn agent_spec(s: Option<pb::AgentSpec>) -> Result<AgentSpec, RuntimeError> {
    let s = s.unwrap_or_default();
    Ok(AgentSpec {
        description: s.description,
        system_prompt: s.system_prompt,
        model: s.model,
        thinking: thinking_from_pb(s.thinking, "spec.thinking")?,
        tools: s.tools.map(|t| t.names),
        delegates: s.delegates,
        max_steps: (s.max_steps != 0).then_some(s.max_steps),
        turn_timeout: duration_from_pb(s.turn_timeout, "spec.turn_timeout")?,
        require_approval: s.require_approval,
        budget: s
            .budget
            .map(budget_from_pb)
            .transpose()?
            .unwrap_or_default(),
        auto_title: s.auto_title,
        fields: s.fields.into_iter().collect(),
    })
}

/// An agent version to the wire.
pub fn agent_to_pb(a: AgentVersion) -> pb::Agent {
    let s = a.spec;
    pb::Agent {
        agent_id: a.id,
        version: a.version,
        source: match a.source {
            AgentSource::Config => pb::AgentSource::Config,
            AgentSource::Api => pb::AgentSource::Api,
        }
        .into(),
        created_at: Some(timestamp(a.created_at)),
        spec: Some(pb::AgentSpec {
            description: s.description,
            system_prompt: s.system_prompt,
            model: s.model,
            thinking: thinking(s.thinking).into(),
            tools: s.tools.map(|names| pb::ToolList { names }),
            delegates: s.delegates,
            max_steps: s.max_steps.unwrap_or(0),
            turn_timeout: s.turn_timeout.map(duration),
            require_approval: s.require_approval,
            budget: (s.budget != agentrt_runtime::types::Budget::NONE)
                .then(|| budget_to_pb(s.budget)),
            auto_title: s.auto_title,
            fields: s.fields.into_iter().collect(),
        }),
    }
}

/// Memory edits from the wire; an edit without a change is refused.
pub fn memory_edits(edits: Vec<pb::MemoryEdit>) -> Result<Vec<MemoryEdit>, RuntimeError> {
    edits
        .into_iter()
        .enumerate()
        .map(|(i, e)| match e.change {
            Some(pb::memory_edit::Change::Set(text)) => Ok(MemoryEdit::Set {
                block: e.block,
                text,
            }),
            Some(pb::memory_edit::Change::Append(text)) => Ok(MemoryEdit::Append {
                block: e.block,
                text,
            }),
            Some(pb::memory_edit::Change::Delete(true)) => {
                Ok(MemoryEdit::Delete { block: e.block })
            }
            Some(pb::memory_edit::Change::Delete(false)) | None => Err(RuntimeError::invalid(
                format!("edits[{i}]"),
                "set one of set, append or delete (true)",
            )),
        })
        .collect()
}

/// Memory blocks to the wire.
pub fn memory_to_pb(m: Memory) -> (std::collections::HashMap<String, String>, u64) {
    (m.blocks.into_iter().collect(), m.version)
}
