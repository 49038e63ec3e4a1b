//! `agentrt`: the command-line client — sessions, streamed chats, watching,
//! stopping, history, compaction, caller-executed tool results and the
//! operator calls.
//!
//! A binary crate of its own on the `agentrt-client` library: every call
//! goes through its [`Client`] facade, so the library carries no
//! command-line code. Output is text for people or, with `--output json`,
//! one JSON document per result (one JSON object per line for event
//! streams) for scripts.

mod output;

use std::io::{IsTerminal as _, Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use agentrt_client::{
    ChatEvent, ChatOptions, Client, Error, EventStream, OnDisconnect, ThinkingLevel, proto,
};
use clap::{Args, Parser, Subcommand, ValueEnum};
use futures::StreamExt as _;

use output::Out;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  the turn ended without success (error, cancelled, timed out) or another failure
  2  bad command line
  3  cannot connect, or an unusable URL / TLS / token setting
  4  not found (session, turn, tool call)
  5  the session is busy with a live turn (watch it or stop it)
  6  the request was refused (invalid argument, failed precondition, already exists)
  7  not allowed (unauthenticated, permission denied)
  8  the server is unavailable, overloaded or the deadline passed (retry later)";

#[derive(Debug, Parser)]
#[command(
    name = "agentrt",
    version,
    about = "Command-line client for an agentrt server",
    after_help = EXIT_CODES
)]
struct Cli {
    /// Server URL, with its scheme: http://host:port or https://host:port.
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
    /// Allow sending the token over plaintext http:// to a host that is not
    /// loopback.
    #[arg(long, global = true)]
    insecure: bool,
    /// Output format: text for people, json for scripts.
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create, list, read, update and delete sessions.
    #[command(subcommand)]
    Sessions(SessionsCommand),
    /// Send a message and stream the answer. Without --session a new session
    /// is created (and deleted again if the message is refused).
    Chat(ChatArgs),
    /// Watch a session's live turn (resumes after a dropped connection).
    Watch {
        /// The session.
        session: String,
        /// Only the events after this seq.
        #[arg(long, default_value_t = 0)]
        after_seq: u64,
        /// With no live turn, wait for the next one instead of ending.
        #[arg(long)]
        wait: bool,
    },
    /// Stop a session's live turn.
    Stop {
        /// The session.
        session: String,
    },
    /// Show whether a session has a live turn, and what it is doing.
    Status {
        /// The session.
        session: String,
    },
    /// Print a session's stored messages (all, or one page).
    History(HistoryArgs),
    /// Compact a session's history now.
    Compact {
        /// The session.
        session: String,
    },
    /// Answer a caller-executed tool call of a live turn.
    ToolResult {
        /// The session.
        session: String,
        /// The turn that made the call.
        #[arg(long)]
        turn: String,
        /// The call id.
        #[arg(long)]
        call: String,
        /// Report the result as an error.
        #[arg(long)]
        error: bool,
        /// The result; read from stdin when absent or `-`.
        content: Option<String>,
    },
    /// Show a session and its history.
    Show {
        /// The session.
        session: String,
    },
    /// Operator calls (admin principals only).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// Same as `sessions create`.
    #[command(hide = true)]
    Create(CreateArgs),
    /// Same as `sessions list`.
    #[command(hide = true)]
    List(ListArgs),
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// Create a session and print its id.
    Create(CreateArgs),
    /// List your sessions, newest activity first.
    List(ListArgs),
    /// Show one session.
    Get {
        /// The session.
        session: String,
    },
    /// Change a session's title, model, system prompt or archived flag.
    Update {
        /// The session.
        session: String,
        /// New title.
        #[arg(long)]
        title: Option<String>,
        /// New provider/model.
        #[arg(long)]
        model: Option<String>,
        /// New system prompt.
        #[arg(long)]
        system: Option<String>,
        /// Archive (true) or unarchive (false).
        #[arg(long)]
        archived: Option<bool>,
    },
    /// Delete a session and its history.
    Delete {
        /// The session.
        session: String,
    },
}

#[derive(Debug, Args)]
struct CreateArgs {
    /// Client-chosen id (idempotent).
    #[arg(long)]
    id: Option<String>,
    /// Title.
    #[arg(long, default_value = "")]
    title: String,
    /// provider/model for this session.
    #[arg(long, default_value = "")]
    model: String,
    /// System prompt.
    #[arg(long, default_value = "")]
    system: String,
}

#[derive(Debug, Args)]
struct ListArgs {
    /// Include archived sessions.
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Args)]
struct HistoryArgs {
    /// The session.
    session: String,
    /// One page of at most this many messages (default: every page).
    #[arg(long)]
    limit: Option<u32>,
    /// Only the messages after this seq.
    #[arg(long, default_value_t = 0)]
    after_seq: u64,
    /// Leave out messages replaced by a compaction summary.
    #[arg(long)]
    no_compacted: bool,
}

#[derive(Debug, Args)]
struct ChatArgs {
    /// The session (default: a new one).
    #[arg(long, short)]
    session: Option<String>,
    /// provider/model for this turn.
    #[arg(long)]
    model: Option<String>,
    /// System prompt for this turn only.
    #[arg(long)]
    system: Option<String>,
    /// Thinking level.
    #[arg(long, value_enum)]
    thinking: Option<Thinking>,
    /// The turn's time limit, e.g. 90, 90s, 2m, 500ms.
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// What the server does with the turn if this connection drops;
    /// `continue` also makes this command resume the stream.
    #[arg(long, value_enum, default_value_t = Disconnect::Cancel)]
    on_disconnect: Disconnect,
    /// Do not show reasoning.
    #[arg(long)]
    no_reasoning: bool,
    /// The message; read from stdin when absent (and stdin is not a
    /// terminal) or `-`.
    text: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Thinking {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl From<Thinking> for ThinkingLevel {
    fn from(t: Thinking) -> Self {
        match t {
            Thinking::None => ThinkingLevel::None,
            Thinking::Minimal => ThinkingLevel::Minimal,
            Thinking::Low => ThinkingLevel::Low,
            Thinking::Medium => ThinkingLevel::Medium,
            Thinking::High => ThinkingLevel::High,
            Thinking::Xhigh => ThinkingLevel::Xhigh,
        }
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Disconnect {
    Cancel,
    Continue,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Live turns, cached runners, watchers, stored sessions, uptime.
    Stats,
    /// Stop admitting turns and wait until none is live.
    Drain {
        /// How long to wait, e.g. 30s.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Close cached runners (all, or one user's).
    Reset {
        /// Only this user's runners.
        #[arg(long, default_value = "")]
        user: String,
    },
}

/// `90`, `90s`, `2m`, `500ms`, `1.5s`.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 90, 90s, 2m, 500ms)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))
}

/// A failure of the command: what to print and the exit code.
#[derive(Debug)]
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code,
        }
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        use tonic::Code;
        let code = match err.code() {
            None if err.is_connection() => 3,
            None => 1,
            Some(Code::NotFound) => 4,
            Some(Code::Aborted) if err.is_busy() => 5,
            Some(Code::InvalidArgument | Code::FailedPrecondition | Code::AlreadyExists) => 6,
            Some(Code::Unauthenticated | Code::PermissionDenied) => 7,
            Some(Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded) => 8,
            Some(
                Code::Ok
                | Code::Cancelled
                | Code::Unknown
                | Code::Aborted
                | Code::OutOfRange
                | Code::Unimplemented
                | Code::Internal
                | Code::DataLoss,
            ) => 1,
        };
        let message = if let Error::Busy {
            session_id,
            turn_id,
            ..
        } = &err
        {
            format!(
                "session {session_id} is running turn {turn_id}; watch it with `agentrt watch \
                 {session_id}` or stop it with `agentrt stop {session_id}`"
            )
        } else if let Error::NotFound { message, .. } = &err {
            format!("{message} (list your sessions with `agentrt sessions list`)")
        } else {
            err.to_string()
        };
        Self { message, code }
    }
}

type Outcome = Result<(), Failure>;

async fn connect(cli: &Cli) -> Result<Client, Failure> {
    let mut builder = Client::builder(cli.url.clone()).allow_insecure_token(cli.insecure);
    if let Some(t) = &cli.token {
        builder = builder.token(t.clone());
    }
    if let Some(ca) = &cli.ca {
        builder = builder.ca_file(ca);
    }
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        builder = builder.identity_files(cert, key);
    }
    Ok(builder.connect().await?)
}

/// The text of a command that reads it from its arguments or stdin.
fn text_or_stdin(parts: &[String], what: &str) -> Result<String, Failure> {
    let joined = parts.join(" ");
    if !(joined.is_empty() || joined == "-") {
        return Ok(joined);
    }
    let stdin = std::io::stdin();
    if joined.is_empty() && stdin.is_terminal() {
        return Err(Failure::new(
            2,
            format!("no {what}: give it as an argument, or pipe it on stdin"),
        ));
    }
    let mut text = String::new();
    stdin
        .lock()
        .read_to_string(&mut text)
        .map_err(|e| Failure::new(1, format!("cannot read the {what} from stdin: {e}")))?;
    let text = text.trim_end_matches(['\n', '\r']).to_owned();
    if text.is_empty() {
        return Err(Failure::new(2, format!("the {what} on stdin is empty")));
    }
    Ok(text)
}

async fn run(cli: Cli) -> Outcome {
    let out = Out::new(cli.output == Format::Json);
    let client = connect(&cli).await?;
    match cli.command {
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
            let seen = stream(&out, events, true).await?;
            if seen.events == 0 && !out.json {
                eprintln!("no live turn in session {session}");
            }
            Ok(())
        }
        Command::Stop { session } => {
            let stopped = client.stop_session(&session).await?;
            out.stopped(&session, stopped);
            Ok(())
        }
        Command::Status { session } => {
            let status = client.session_status(&session).await?;
            out.status(&session, &status);
            Ok(())
        }
        Command::History(args) => history(&client, &out, args).await,
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
        Command::Show { session } => {
            let s = client.get_session(&session).await?;
            let messages = client.history(&session).await?;
            out.show(&s, &messages);
            Ok(())
        }
        Command::Admin(cmd) => admin(&client, &out, cmd).await,
    }
}

async fn sessions(client: &Client, out: &Out, cmd: SessionsCommand) -> Outcome {
    match cmd {
        SessionsCommand::Create(CreateArgs {
            id,
            title,
            model,
            system,
        }) => {
            let s = client
                .create_session(proto::CreateSessionRequest {
                    session_id: id.unwrap_or_default(),
                    title,
                    model,
                    system_prompt: system,
                    ..Default::default()
                })
                .await?;
            out.session_id(&s);
        }
        SessionsCommand::List(ListArgs { all }) => {
            let mut token = String::new();
            let mut sessions = Vec::new();
            loop {
                let page = client
                    .list_sessions(proto::ListSessionsRequest {
                        page_token: std::mem::take(&mut token),
                        include_archived: all,
                        ..Default::default()
                    })
                    .await?;
                sessions.extend(page.sessions);
                if page.next_page_token.is_empty() {
                    break;
                }
                token = page.next_page_token;
            }
            out.sessions(&sessions);
        }
        SessionsCommand::Get { session } => {
            let s = client.get_session(&session).await?;
            out.session(&s);
        }
        SessionsCommand::Update {
            session,
            title,
            model,
            system,
            archived,
        } => {
            let s = client
                .update_session(proto::UpdateSessionRequest {
                    session_id: session,
                    title,
                    model,
                    system_prompt: system,
                    archived,
                    ..Default::default()
                })
                .await?;
            out.session(&s);
        }
        SessionsCommand::Delete { session } => {
            let deleted = client.delete_session(&session).await?;
            out.deleted(&session, deleted);
            if !deleted {
                return Err(Failure::new(4, format!("no session {session}")));
            }
        }
    }
    Ok(())
}

async fn history(client: &Client, out: &Out, args: HistoryArgs) -> Outcome {
    let HistoryArgs {
        session,
        limit,
        after_seq,
        no_compacted,
    } = args;
    let mut messages = Vec::new();
    let mut page_token = String::new();
    let next = loop {
        let page = client
            .history_page(proto::GetHistoryRequest {
                session_id: session.clone(),
                after_seq,
                page_size: limit.unwrap_or(1_000),
                include_compacted: !no_compacted,
                page_token: std::mem::take(&mut page_token),
            })
            .await?;
        messages.extend(page.messages);
        if limit.is_some() || page.next_page_token.is_empty() {
            break page.next_page_token;
        }
        page_token = page.next_page_token;
    };
    out.history(&session, &messages, &next);
    Ok(())
}

async fn admin(client: &Client, out: &Out, cmd: AdminCommand) -> Outcome {
    match cmd {
        AdminCommand::Stats => out.stats(&client.runtime_stats().await?),
        AdminCommand::Drain { timeout } => out.drained(client.drain(timeout).await?),
        AdminCommand::Reset { user } => out.reset(client.reset_runners(&user).await?),
    }
    Ok(())
}

async fn chat(client: &Client, out: &Out, args: ChatArgs) -> Outcome {
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
    let (session_id, created) = match args.session {
        Some(s) => (s, false),
        None => {
            let s = client
                .create_session(proto::CreateSessionRequest::default())
                .await?;
            (s.session_id, true)
        }
    };
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
    let seen = stream(&out.with_reasoning(!args.no_reasoning), events, false).await?;
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

/// What a streamed turn showed.
#[derive(Debug, Default)]
struct Seen {
    events: usize,
    outcome: Option<proto::TurnOutcome>,
}

/// Prints a turn's events until it ends. A trailing status after
/// `turn_finished` was already reported by the events and is not an error
/// here; a failure before it is.
async fn stream(out: &Out, mut events: EventStream, watching: bool) -> Result<Seen, Failure> {
    let mut seen = Seen::default();
    while let Some(item) = events.next().await {
        match item {
            Ok(event) => {
                seen.events += 1;
                if let ChatEvent::TurnFinished { outcome, .. } = &event.kind {
                    seen.outcome = Some(*outcome);
                }
                out.event(&event);
            }
            Err(_) if seen.outcome.is_some() => {}
            Err(err) => {
                out.end_line();
                return Err(err.into());
            }
        }
    }
    if watching
        && seen
            .outcome
            .is_some_and(|o| o != proto::TurnOutcome::Success)
    {
        return Err(Failure::new(1, "the watched turn did not succeed"));
    }
    let _ = std::io::stdout().flush();
    Ok(seen)
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
            "sessions",
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

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3d").is_err());
    }
}
