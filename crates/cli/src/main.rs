//! `agentrt`: a small command-line client — create and list sessions, chat
//! with live streamed output, show history.
//!
//! A binary crate of its own on the `agentrt-client` library: every call
//! goes through its [`Client`] facade, so the library carries no
//! command-line code.

use std::io::Write as _;
use std::process::ExitCode;

use agentrt_client::{ChatEvent, Client, Error, proto};
use clap::{Parser, Subcommand};
use futures::StreamExt as _;

#[derive(Debug, Parser)]
#[command(
    name = "agentrt",
    version,
    about = "Command-line client for an agentrt server"
)]
struct Cli {
    /// Server URL.
    #[arg(
        long,
        env = "AGENTRT_URL",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    url: String,
    /// Bearer API key (not needed for a loopback server without keys).
    #[arg(long, env = "AGENTRT_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// PEM CA certificate that signed the server's certificate (https:// URLs).
    #[arg(long, env = "AGENTRT_CA", global = true)]
    ca: Option<std::path::PathBuf>,
    /// PEM client certificate for mTLS (with --key).
    #[arg(long, env = "AGENTRT_CLIENT_CERT", global = true, requires = "key")]
    cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "AGENTRT_CLIENT_KEY", global = true, requires = "cert")]
    key: Option<std::path::PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create a session and print its id.
    Create {
        /// Client-chosen id (idempotent).
        #[arg(long)]
        id: Option<String>,
        #[arg(long, default_value = "")]
        title: String,
        /// provider/model for this session.
        #[arg(long, default_value = "")]
        model: String,
        #[arg(long, default_value = "")]
        system: String,
    },
    /// List your sessions, newest activity first.
    List {
        #[arg(long)]
        all: bool,
    },
    /// Send a message and stream the answer. Without --session a new session
    /// is created (its id is printed on stderr).
    Chat {
        #[arg(long, short)]
        session: Option<String>,
        /// Show reasoning deltas too.
        #[arg(long)]
        reasoning: bool,
        /// provider/model override for this turn.
        #[arg(long)]
        model: Option<String>,
        /// The message.
        #[arg(required = true, num_args = 1..)]
        text: Vec<String>,
    },
    /// Print a session's stored messages.
    History { session: String },
}

fn text_of(m: &proto::Message) -> String {
    m.content
        .iter()
        .filter_map(|b| match &b.block {
            Some(proto::content_block::Block::Text(t)) => Some(t.text.clone()),
            Some(proto::content_block::Block::Thinking(t)) => {
                Some(format!("(thinking: {})", t.thinking))
            }
            Some(proto::content_block::Block::Image(i)) => {
                Some(format!("[image {} bytes]", i.data.len()))
            }
            _ => None,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn chat(
    client: &Client,
    session: Option<String>,
    model: Option<String>,
    reasoning: bool,
    text: String,
) -> Result<bool, Error> {
    let session_id = match session {
        Some(s) => s,
        None => {
            let s = client
                .create_session(proto::CreateSessionRequest::default())
                .await?;
            eprintln!("session {}", s.session_id);
            s.session_id
        }
    };
    let mut events = client
        .chat_with(proto::ChatRequest {
            session_id,
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock { text })),
            }],
            model: model.unwrap_or_default(),
            ..Default::default()
        })
        .await?;
    let mut stdout = std::io::stdout();
    let mut success = false;
    while let Some(event) = events.next().await {
        match event?.kind {
            ChatEvent::Text(t) => {
                print!("{t}");
                let _ = stdout.flush();
            }
            ChatEvent::Reasoning(t) if reasoning => {
                eprint!("{t}");
            }
            ChatEvent::Error { message, .. } => eprintln!("\nerror: {message}"),
            ChatEvent::TurnFinished { outcome, usage, .. } => {
                println!();
                eprintln!(
                    "[{} · {} in / {} out tokens]",
                    outcome.as_str_name(),
                    usage.input_tokens,
                    usage.output_tokens
                );
                success = outcome == proto::TurnOutcome::Success;
            }
            _ => {}
        }
    }
    Ok(success)
}

async fn run(cli: Cli) -> Result<bool, Error> {
    let mut builder = Client::builder(cli.url);
    if let Some(t) = cli.token {
        builder = builder.token(t);
    }
    if let Some(ca) = &cli.ca {
        builder = builder.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        builder = builder.identity_files(cert, key);
    }
    let client = builder.connect().await?;
    match cli.command {
        Command::Create {
            id,
            title,
            model,
            system,
        } => {
            let s = client
                .create_session(proto::CreateSessionRequest {
                    session_id: id.unwrap_or_default(),
                    title,
                    model,
                    system_prompt: system,
                    ..Default::default()
                })
                .await?;
            println!("{}", s.session_id);
        }
        Command::List { all } => {
            let mut token = String::new();
            loop {
                let page = client
                    .list_sessions(proto::ListSessionsRequest {
                        page_token: std::mem::take(&mut token),
                        include_archived: all,
                        ..Default::default()
                    })
                    .await?;
                for s in page.sessions {
                    println!(
                        "{}\t{} messages\t{}",
                        s.session_id, s.message_count, s.title
                    );
                }
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
        }
        Command::Chat {
            session,
            reasoning,
            model,
            text,
        } => {
            return chat(&client, session, model, reasoning, text.join(" ")).await;
        }
        Command::History { session } => {
            for m in client.history(&session).await? {
                let role = proto::Role::try_from(m.role).unwrap_or_default();
                println!(
                    "#{} {}: {}",
                    m.seq,
                    role.as_str_name()
                        .trim_start_matches("ROLE_")
                        .to_lowercase(),
                    text_of(&m)
                );
            }
        }
    }
    Ok(true)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("agentrt: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_flags_parse_and_a_client_certificate_needs_its_key() {
        let cli = Cli::try_parse_from([
            "agentrt",
            "--url",
            "https://h:1",
            "--ca",
            "ca.pem",
            "--cert",
            "me.pem",
            "--key",
            "me.key",
            "list",
        ])
        .unwrap();
        assert_eq!(cli.ca.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert_eq!(cli.cert.as_deref(), Some(std::path::Path::new("me.pem")));
        assert_eq!(cli.key.as_deref(), Some(std::path::Path::new("me.key")));
        for lone in [["--cert", "me.pem"], ["--key", "me.key"]] {
            let args = ["agentrt", lone[0], lone[1], "list"];
            assert!(
                Cli::try_parse_from(args).is_err(),
                "{lone:?} alone was accepted"
            );
        }
    }
}
