//! Printing a turn's event stream, shared by `chat` and `watch`, and
//! answering the calls of the caller tools `chat --tool` declared.

use std::io::{BufRead as _, IsTerminal as _};
use std::path::Path;

use agentrt_client::{ChatEvent, Client, Event, EventStream, proto};
use futures::StreamExt as _;

use crate::failure::Failure;
use crate::output::{Out, flush_stdout};

/// What a streamed turn showed.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub(crate) events: usize,
    pub(crate) outcome: Option<proto::TurnOutcome>,
}

/// How a stream is followed.
#[derive(Debug)]
pub(crate) struct Follow<'a> {
    pub(crate) client: &'a Client,
    /// `watch`: a turn that did not succeed fails the command.
    pub(crate) watching: bool,
    /// `chat --save-dir`.
    pub(crate) save_dir: Option<&'a Path>,
    /// The caller tools of `chat --tool`: their calls are answered here.
    pub(crate) tools: &'a [String],
    /// `chat --on-disconnect continue`: the turn outlives this command.
    pub(crate) continues: bool,
}

impl<'a> Follow<'a> {
    pub(crate) fn watching(client: &'a Client) -> Self {
        Self {
            client,
            watching: true,
            save_dir: None,
            tools: &[],
            continues: true,
        }
    }
}

/// Prints a turn's events until it ends. A trailing status after
/// `turn_finished` was already reported by the events and is not an error
/// here; a failure before it is.
pub(crate) async fn stream(
    out: &Out,
    mut events: EventStream,
    follow: &Follow<'_>,
) -> Result<Seen, Failure> {
    let mut seen = Seen::default();
    while let Some(item) = events.next().await {
        match item {
            Ok(event) => {
                seen.events += 1;
                if let ChatEvent::TurnFinished { outcome, .. } = &event.kind {
                    seen.outcome = Some(*outcome);
                }
                let ours = matches!(&event.kind,
                    ChatEvent::ToolCall { name, .. } if follow.tools.contains(name));
                // A call of a --tool is shown by `answer` (the JSON line
                // is printed all the same).
                if !ours || out.json {
                    out.event(&event);
                }
                if let Some(dir) = follow.save_dir {
                    let blob = match &event.kind {
                        ChatEvent::Image(i) => i.blob.as_ref(),
                        ChatEvent::File(f) => f.blob.as_ref(),
                        _ => None,
                    };
                    if let Some(blob) = blob {
                        let path =
                            super::blob::save_into(follow.client, &event.session_id, blob, dir)
                                .await?;
                        out.saved(&path);
                    }
                }
                if ours {
                    answer(out, follow, &event).await?;
                }
            }
            Err(_) if seen.outcome.is_some() => {}
            Err(err) => {
                out.end_line();
                return Err(err.into());
            }
        }
    }
    if follow.watching
        && seen
            .outcome
            .is_some_and(|o| o != proto::TurnOutcome::Success)
    {
        return Err(Failure::new(1, "the watched turn did not succeed"));
    }
    flush_stdout();
    Ok(seen)
}

/// Answers a call of a `--tool` the model made: its result is read from
/// the terminal (one line; `!` first reports an error), or, with no
/// terminal to ask, the command ends saying how to answer it.
async fn answer(out: &Out, follow: &Follow<'_>, event: &Event) -> Result<(), Failure> {
    let ChatEvent::ToolCall {
        call_id,
        name,
        arguments_json,
    } = &event.kind
    else {
        return Ok(());
    };
    let answer_with = format!(
        "agentrt tool-result {} --turn {} --call {call_id} RESULT",
        event.session_id, event.turn_id
    );
    if !std::io::stdin().is_terminal() {
        out.end_line();
        let waits = if follow.continues {
            "the turn waits for it"
        } else {
            "with --on-disconnect continue the turn would wait for it"
        };
        return Err(Failure::new(
            9,
            format!(
                "the model called your tool {name}({arguments_json}) and stdin is not a terminal \
                 to answer it; {waits}: answer with `{answer_with}`"
            ),
        ));
    }
    eprint!("\n[{name}({arguments_json})] result (one line; start with ! for an error): ");
    let line = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| Failure::new(1, format!("cannot read the tool result: {e}")))?
    .map_err(|e| Failure::new(1, format!("cannot read the tool result: {e}")))?;
    let line = line.trim_end_matches(['\n', '\r']);
    let (content, is_error) = match line.strip_prefix('!') {
        Some(error) => (error.trim_start(), true),
        None => (line, false),
    };
    follow
        .client
        .submit_tool_result(
            &event.session_id,
            &event.turn_id,
            call_id,
            content,
            is_error,
        )
        .await?;
    Ok(())
}
