//! `agentrt`: the command-line client — sessions, streamed chats, watching,
//! stopping, history, compaction, caller-executed tool results and the
//! operator calls.
//!
//! A binary crate of its own on the `agentrt-client` library: every call
//! goes through its [`Client`] facade, so the library carries no
//! command-line code. Output is text for people or, with `--output json`,
//! one JSON document per result (one JSON object per line for event
//! streams) for scripts, in the protobuf JSON mapping.
//!
//! Modules: `args` (the command line), `commands` (one module per command
//! group), `output` (text and JSON printing; stdout closed under us ends
//! the command quietly), `json` (the protobuf JSON mapping), `failure`
//! (errors in the user's terms, exit codes, connecting).
//!
//! [`Client`]: agentrt_client::Client

/// `println!` for results: a closed stdout ends the command with exit
/// code 0 instead of a panic.
macro_rules! outln {
    () => {
        $crate::output::write_stdout(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*), true)
    };
}

/// `print!` for results (see [`outln!`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_stdout(format_args!($($arg)*), false)
    };
}

mod args;
mod commands;
mod failure;
mod json;
mod output;

use std::process::ExitCode;

use clap::{CommandFactory as _, Parser as _};

use args::{Cli, Command, Format, SessionsCommand};
use commands::history::{history, turns};
use commands::stream::{Follow, stream};
use commands::{admin::admin, blob::blob, chat::chat, sessions::sessions};
use failure::{Outcome, connect, text_or_stdin};
use output::Out;

async fn run(cli: Cli) -> Outcome {
    let out = Out::new(cli.output == Format::Json);
    if let Command::Completions { shell } = cli.command {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "agentrt", &mut script);
        out!("{}", String::from_utf8_lossy(&script));
        return Ok(());
    }
    let client = connect(&cli).await?;
    match cli.command {
        Command::Completions { .. } => Ok(()),
        Command::Health { service, wait } => {
            commands::health::health(&client, &out, service, wait).await
        }
        Command::Version => commands::health::version(&client, &out).await,
        Command::Sessions(cmd) => sessions(&client, &out, cmd).await,
        Command::Create(args) => sessions(&client, &out, SessionsCommand::Create(args)).await,
        Command::List(args) => sessions(&client, &out, SessionsCommand::List(args)).await,
        Command::Chat(args) => chat(&client, &out, args).await,
        Command::Watch {
            session,
            after_seq,
            wait,
        } => {
            let events = client.watch(&session, after_seq, wait).await?;
            let seen = stream(&out, events, &Follow::watching(&client)).await?;
            if seen.events == 0 && !out.json {
                eprintln!("no live turn in session {session}");
            }
            Ok(())
        }
        Command::Stop {
            session,
            clear_inbox,
        } => {
            let (stopped, cleared) = if clear_inbox {
                client.stop_session_and_clear_inbox(&session).await?
            } else {
                (client.stop_session(&session).await?, 0)
            };
            out.stopped(&session, stopped, cleared);
            Ok(())
        }
        Command::Status { session } => {
            let status = client.session_status(&session).await?;
            out.status(&session, &status);
            Ok(())
        }
        Command::History(args) => history(&client, &out, args).await,
        Command::Turns(args) => turns(&client, &out, args).await,
        Command::Compact { session } => {
            let done = client.compact_session(&session).await?;
            out.compacted(&session, &done);
            Ok(())
        }
        Command::ToolResult {
            session,
            turn,
            call,
            error,
            content,
        } => {
            let parts: Vec<String> = content.into_iter().collect();
            let content = text_or_stdin(&parts, "tool result")?;
            client
                .submit_tool_result(&session, &turn, &call, &content, error)
                .await?;
            out.tool_result(&session, &call);
            Ok(())
        }
        Command::Approve {
            session,
            call,
            deny,
            reason,
        } => {
            client
                .submit_tool_approval(&session, &call, !deny, &reason)
                .await?;
            out.approval(&session, &call, !deny);
            Ok(())
        }
        Command::Blob(cmd) => blob(&client, &out, cmd).await,
        Command::Show { session } => {
            let s = client.get_session(&session).await?;
            let messages = client.history(&session).await?;
            out.show(&s, &messages);
            Ok(())
        }
        Command::Agents(cmd) => commands::agents::agents(&client, &out, cmd).await,
        Command::Memory(cmd) => commands::agents::memory(&client, &out, cmd).await,
        Command::Admin(cmd) => admin(&client, &out, cmd).await,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("agentrt: {}", failure.message);
            ExitCode::from(failure.code)
        }
    }
}
