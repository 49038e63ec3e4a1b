//! The `chat` command: send a message and stream the answer.

use agentrt_client::{ChatOptions, Client, OnBusy, OnDisconnect, proto};

use crate::args::{ChatArgs, Disconnect};
use crate::commands::stream::{Follow, stream};
use crate::failure::{Failure, Outcome, text_or_stdin};
use crate::output::Out;

pub(crate) async fn chat(client: &Client, out: &Out, args: ChatArgs) -> Outcome {
    let text = text_or_stdin(&args.text, "message")?;
    let mut options = ChatOptions::new(text);
    if let Some(m) = args.model {
        options = options.model(m);
    }
    if let Some(s) = args.system {
        options = options.system(s);
    }
    if let Some(t) = args.thinking {
        options = options.thinking(t.into());
    }
    if let Some(t) = args.timeout {
        options = options.timeout(t);
    }
    if let Disconnect::Continue = args.on_disconnect {
        options = options.on_disconnect(OnDisconnect::Continue);
    }
    options = options.on_busy(if args.wait_when_busy {
        OnBusy::Enqueue
    } else {
        args.on_busy.into()
    });
    if let Some(id) = args.request_id {
        options = options.request_id(id);
    }
    if let Some(n) = args.max_steps {
        options = options.max_steps(n);
    }
    let mut tools = Vec::new();
    for (name, file) in &args.tools {
        let (description, schema) = tool_schema(name, file)?;
        options = options.extra_tool(name, description, schema);
        tools.push(name.clone());
    }
    if !args.require_approval.is_empty() {
        options = options.require_approval(args.require_approval);
    }
    if let Some((id, display_name)) = args.speaker {
        options = options.speaker(id, display_name);
    }
    let (session_id, created) = match args.session {
        Some(s) => (s, false),
        None => {
            let s = client
                .create_session(proto::CreateSessionRequest {
                    agent_id: args.agent.unwrap_or_default(),
                    ..Default::default()
                })
                .await?;
            (s.session_id, true)
        }
    };
    for path in &args.attach {
        match super::blob::upload(client, &session_id, path, None).await {
            Ok(blob) => options = options.blob(&blob),
            Err(err) => {
                if created {
                    let _ = client.delete_session(&session_id).await;
                }
                return Err(err);
            }
        }
    }
    let events = match client.chat(&session_id, options).await {
        Ok(events) => events,
        Err(err) => {
            if created {
                // Refused at admission: leave no empty session behind.
                if let Err(cleanup) = client.delete_session(&session_id).await {
                    eprintln!("agentrt: could not delete the new session {session_id}: {cleanup}");
                }
            }
            return Err(err.into());
        }
    };
    if created {
        out.created(&session_id);
    }
    let follow = Follow {
        client,
        watching: false,
        save_dir: args.save_dir.as_deref(),
        tools: &tools,
        continues: matches!(args.on_disconnect, Disconnect::Continue),
    };
    let seen = stream(&out.with_reasoning(!args.no_reasoning), events, &follow).await?;
    match seen.outcome {
        Some(proto::TurnOutcome::Success) => Ok(()),
        Some(other) => Err(Failure::new(
            1,
            format!(
                "the turn ended {}",
                other.as_str_name().trim_start_matches("TURN_OUTCOME_")
            ),
        )),
        None => Err(Failure::new(1, "the stream ended before the turn finished")),
    }
}

/// A `--tool`'s description (the schema's top-level `description`, if
/// any) and its JSON Schema, read from `file`.
fn tool_schema(name: &str, file: &std::path::Path) -> Result<(String, String), Failure> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        Failure::new(
            2,
            format!(
                "cannot read the schema of tool {name} ({}): {e}",
                file.display()
            ),
        )
    })?;
    let schema: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Failure::new(
            2,
            format!(
                "the schema of tool {name} ({}) is not JSON: {e}",
                file.display()
            ),
        )
    })?;
    if !schema.is_object() {
        return Err(Failure::new(
            2,
            format!(
                "the schema of tool {name} ({}) must be a JSON object (a JSON Schema)",
                file.display()
            ),
        ));
    }
    let description = schema["description"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    Ok((description, text))
}
