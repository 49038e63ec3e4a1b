//! The `chat` command: send a message and stream the answer.

use agentrt_client::{ChatOptions, Client, OnDisconnect, proto};

use crate::args::{ChatArgs, Disconnect};
use crate::commands::stream::stream;
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
    options = options.on_busy(args.on_busy.into());
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
    let save = args.save_dir.as_deref().map(|dir| (client, dir));
    let seen = stream(&out.with_reasoning(!args.no_reasoning), events, false, save).await?;
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
