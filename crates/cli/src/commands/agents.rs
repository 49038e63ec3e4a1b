//! The `agents` and `memory` commands: agent profiles and memory blocks.

use agentrt_client::{Client, proto};

use crate::args::{AgentSpecArgs, AgentsCommand, MemoryCommand};
use crate::failure::{Failure, Outcome, text_or_stdin};
use crate::output::Out;

pub(crate) async fn agents(client: &Client, out: &Out, cmd: AgentsCommand) -> Outcome {
    match cmd {
        AgentsCommand::List => out.agents(&client.agents().await?),
        AgentsCommand::Get { agent, version } => out.agent(&client.agent(&agent, version).await?),
        AgentsCommand::Create(args) => {
            let id = args.agent.clone();
            let spec = spec(args, proto::AgentSpec::default())?;
            out.agent(&client.create_agent(&id, spec).await?);
        }
        AgentsCommand::Update(args) => {
            let latest = client.agent(&args.agent, None).await?;
            let id = args.agent.clone();
            let spec = spec(args, latest.spec.unwrap_or_default())?;
            out.agent(&client.update_agent(&id, spec, Some(latest.version)).await?);
        }
    }
    Ok(())
}

/// `base` with the flags given; `@FILE` reads the system prompt from a
/// file.
fn spec(args: AgentSpecArgs, mut base: proto::AgentSpec) -> Result<proto::AgentSpec, Failure> {
    if let Some(d) = args.description {
        base.description = d;
    }
    if let Some(system) = args.system {
        base.system_prompt = match system.strip_prefix('@') {
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| Failure::new(2, format!("cannot read {path}: {e}")))?,
            None => system,
        };
    }
    if let Some(m) = args.model {
        base.model = m;
    }
    if !args.tools.is_empty() {
        let names = if args.tools == ["none"] {
            Vec::new()
        } else {
            args.tools
        };
        base.tools = Some(proto::ToolList { names });
    }
    if let Some(n) = args.max_steps {
        base.max_steps = n;
    }
    Ok(base)
}

pub(crate) async fn memory(client: &Client, out: &Out, cmd: MemoryCommand) -> Outcome {
    match cmd {
        MemoryCommand::Get { agent, user } => {
            let m = client.memory(&agent, user.as_deref()).await?;
            out.memory(&agent, &m.blocks, m.version);
        }
        MemoryCommand::Set {
            agent,
            block,
            text,
            delete,
            user,
        } => {
            let change = if delete {
                proto::memory_edit::Change::Delete(true)
            } else {
                let parts: Vec<String> = text.into_iter().collect();
                proto::memory_edit::Change::Set(text_or_stdin(&parts, "block's text")?)
            };
            let m = client
                .update_memory(proto::UpdateMemoryRequest {
                    agent_id: agent.clone(),
                    user_id: user.unwrap_or_default(),
                    edits: vec![proto::MemoryEdit {
                        block,
                        change: Some(change),
                    }],
                    expected_version: 0,
                })
                .await?;
            out.memory(&agent, &m.blocks, m.version);
        }
    }
    Ok(())
}
