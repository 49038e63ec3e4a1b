//! The command line: the clap types of every command and their arguments.

use std::time::Duration;

use agentrt_client::ThinkingLevel;
use clap::{Args, Parser, Subcommand, ValueEnum};

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
  8  the server is unavailable, overloaded or the deadline passed (retry later)
  9  `chat --tool`: the model called your tool and stdin is no terminal to answer it
     (answer with `agentrt tool-result`)
 10  `health`: a service is not SERVING

A closed stdout (e.g. `agentrt chat ... | head -c 10`) ends a command quietly with 0.";

#[derive(Debug, Parser)]
#[command(
    name = "agentrt",
    version,
    about = "Command-line client for an agentrt server",
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    /// Server URL, with its scheme: http://host:port or https://host:port.
    #[arg(
        long,
        env = "AGENTRT_URL",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub(crate) url: String,
    /// Bearer API key (not needed for a loopback server without keys).
    #[arg(long, env = "AGENTRT_TOKEN", global = true, hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// PEM CA certificate to trust for https:// URLs, beside the system's
    /// root certificates (for a server whose certificate a private CA
    /// signed).
    #[arg(long, env = "AGENTRT_CA", global = true)]
    pub(crate) ca: Option<std::path::PathBuf>,
    /// PEM client certificate for mTLS (with --key).
    #[arg(long, env = "AGENTRT_CLIENT_CERT", global = true, requires = "key")]
    pub(crate) cert: Option<std::path::PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "AGENTRT_CLIENT_KEY", global = true, requires = "cert")]
    pub(crate) key: Option<std::path::PathBuf>,
    /// Allow sending the token over plaintext http:// to a host that is not
    /// loopback.
    #[arg(long, global = true)]
    pub(crate) insecure: bool,
    /// Output format: text for people, json for scripts.
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    pub(crate) output: Format,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// `--output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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
        /// Also take every queued message out of the session's inbox.
        #[arg(long)]
        clear_inbox: bool,
    },
    /// Show whether a session has a live turn, and what it is doing.
    Status {
        /// The session.
        session: String,
    },
    /// Print a session's stored messages (all, or one page).
    History(HistoryArgs),
    /// List a session's turns, newest first: outcome, model, steps, tokens, cost.
    Turns(TurnsArgs),
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
    /// Approve (or, with --deny, refuse) a tool call that waits for an
    /// approval in a session's live or paused turn.
    Approve {
        /// The session.
        session: String,
        /// The call id (shown by `chat` and `status`).
        call: String,
        /// Refuse the call: the model is told it was denied.
        #[arg(long)]
        deny: bool,
        /// Why (told to the model on a denial).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Upload and download a session's images and files.
    #[command(subcommand)]
    Blob(BlobCommand),
    /// Show a session and its history.
    Show {
        /// The session.
        session: String,
    },
    /// Agent profiles: list, show, create and update them (creating and
    /// updating is for admin principals).
    #[command(subcommand)]
    Agents(AgentsCommand),
    /// Your memory blocks for an agent.
    #[command(subcommand)]
    Memory(MemoryCommand),
    /// Operator calls (admin principals only).
    #[command(subcommand)]
    Admin(AdminCommand),
    /// The server's health (readiness, liveness and overall, as probes
    /// see them). Exits 10 when one asked for is not SERVING.
    Health {
        /// Only this service: readiness, liveness, or "" for the server
        /// as a whole (default: all three).
        #[arg(long)]
        service: Option<String>,
        /// Wait until every service asked for is SERVING, at most this
        /// long (e.g. 30s), instead of answering at once.
        #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
        wait: Option<Duration>,
    },
    /// This client's version and the server's (the server's needs an admin
    /// principal).
    Version,
    /// Print a shell completion script, e.g.
    /// `agentrt completions bash > /etc/bash_completion.d/agentrt` or
    /// `agentrt completions zsh > "${fpath[1]}/_agentrt"`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Same as `sessions create`.
    #[command(hide = true)]
    Create(CreateArgs),
    /// Same as `sessions list`.
    #[command(hide = true)]
    List(ListArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum AgentsCommand {
    /// Every agent's latest version.
    List,
    /// One agent (its latest version, or --version).
    Get {
        /// The agent's id.
        agent: String,
        /// A version (default: the latest).
        #[arg(long)]
        version: Option<u64>,
    },
    /// Create an agent (its version 1).
    Create(AgentSpecArgs),
    /// Replace an agent's spec: its next version. Flags left out take the
    /// latest version's values.
    Update(AgentSpecArgs),
}

#[derive(Debug, Args)]
pub(crate) struct AgentSpecArgs {
    /// The agent's id.
    pub(crate) agent: String,
    /// What the agent is for.
    #[arg(long)]
    pub(crate) description: Option<String>,
    /// The system prompt template (minijinja: {{ user }}, {{ date }},
    /// {{ memory.NAME }}, ...); `@FILE` reads it from a file.
    #[arg(long)]
    pub(crate) system: Option<String>,
    /// Default provider/model.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// The tools it may use (`search__*`, `memory_read`, ...); repeat for
    /// several; `--tools none` for none.
    #[arg(long = "tools", value_name = "TOOL")]
    pub(crate) tools: Vec<String>,
    /// Most model steps of a turn.
    #[arg(long)]
    pub(crate) max_steps: Option<u32>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum MemoryCommand {
    /// Print your memory blocks for an agent.
    Get {
        /// The agent's id.
        agent: String,
        /// Another user's (admin principals only).
        #[arg(long)]
        user: Option<String>,
    },
    /// Set one memory block (an empty text keeps an empty block;
    /// --delete removes it).
    Set {
        /// The agent's id.
        agent: String,
        /// The block's name.
        block: String,
        /// Its text; read from stdin when absent or `-`.
        text: Option<String>,
        /// Remove the block instead.
        #[arg(long, conflicts_with = "text")]
        delete: bool,
        /// Another user's (admin principals only).
        #[arg(long)]
        user: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum BlobCommand {
    /// Save a blob of a session (an image or file of its history or of a
    /// tool's result) to a file.
    Get {
        /// The session.
        session: String,
        /// The blob id (shown in history and by `chat`).
        blob: String,
        /// Where to write it (default: the blob's name, or its id, in the
        /// current directory; `-` for stdout).
        #[arg(long, short)]
        out: Option<std::path::PathBuf>,
    },
    /// List the blobs a session holds: its images and files, uploads, and
    /// the files its tool workspaces kept.
    List {
        /// The session.
        session: String,
    },
    /// Upload a file to a session (resumably) and print its blob reference.
    Put {
        /// The session.
        session: String,
        /// The file.
        file: std::path::PathBuf,
        /// Its media type (default: guessed from the name and bytes).
        #[arg(long)]
        mime_type: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum SessionsCommand {
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
pub(crate) struct CreateArgs {
    /// Client-chosen id (idempotent).
    #[arg(long)]
    pub(crate) id: Option<String>,
    /// Title.
    #[arg(long, default_value = "")]
    pub(crate) title: String,
    /// provider/model for this session.
    #[arg(long, default_value = "")]
    pub(crate) model: String,
    /// System prompt.
    #[arg(long, default_value = "")]
    pub(crate) system: String,
    /// The agent the session runs with (its latest version, kept).
    #[arg(long, default_value = "")]
    pub(crate) agent: String,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Include archived sessions.
    #[arg(long)]
    pub(crate) all: bool,
    /// Only the sessions of this agent.
    #[arg(long)]
    pub(crate) agent: Option<String>,
    /// Only the delegate sessions this session started.
    #[arg(long, value_name = "SESSION")]
    pub(crate) parent: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct HistoryArgs {
    /// The session.
    pub(crate) session: String,
    /// One page of at most this many messages (default: every page).
    #[arg(long)]
    pub(crate) limit: Option<u32>,
    /// Only the messages after this seq.
    #[arg(long, default_value_t = 0)]
    pub(crate) after_seq: u64,
    /// Leave out messages replaced by a compaction summary.
    #[arg(long)]
    pub(crate) no_compacted: bool,
}

#[derive(Debug, Args)]
pub(crate) struct TurnsArgs {
    /// The session.
    pub(crate) session: String,
    /// One page of at most this many turns (default: every page).
    #[arg(long)]
    pub(crate) limit: Option<u32>,
    /// Continue from a previous page's token (printed after a page).
    #[arg(long, default_value = "")]
    pub(crate) page_token: String,
}

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    /// The session (default: a new one).
    #[arg(long, short)]
    pub(crate) session: Option<String>,
    /// The agent a new session runs with (without --session).
    #[arg(long, conflicts_with = "session")]
    pub(crate) agent: Option<String>,
    /// provider/model for this turn.
    #[arg(long)]
    pub(crate) model: Option<String>,
    /// System prompt for this turn only.
    #[arg(long)]
    pub(crate) system: Option<String>,
    /// Thinking level.
    #[arg(long, value_enum)]
    pub(crate) thinking: Option<Thinking>,
    /// The turn's time limit, e.g. 90, 90s, 2m, 500ms.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) timeout: Option<Duration>,
    /// What the server does with the turn if this connection drops;
    /// `continue` also makes this command resume the stream.
    #[arg(long, value_enum, default_value_t = Disconnect::Cancel)]
    pub(crate) on_disconnect: Disconnect,
    /// What the server does when the session already runs a turn: refuse
    /// (reject), queue the message as a later turn (enqueue), stop the live
    /// turn and run this one (interrupt), or add the message to the live
    /// turn at its next step (steer).
    #[arg(long, value_enum, default_value_t = BusyArg::Reject)]
    pub(crate) on_busy: BusyArg,
    /// When the session already runs a turn, queue this message to run
    /// after it and wait for it (the same as --on-busy enqueue).
    #[arg(long, conflicts_with = "on_busy")]
    pub(crate) wait_when_busy: bool,
    /// An idempotency key (1-128 printable ASCII characters): repeating
    /// the chat with the same key replays the turn's answer instead of
    /// running it again.
    #[arg(long, value_name = "KEY")]
    pub(crate) request_id: Option<String>,
    /// The most model steps of this turn's agent loop.
    #[arg(long, value_name = "N")]
    pub(crate) max_steps: Option<u32>,
    /// Offer the model a tool that you execute: NAME=SCHEMA_FILE, where
    /// the file holds the JSON Schema of its arguments (its top-level
    /// "description", if any, describes the tool to the model); repeat for
    /// several. When the model calls it, the call is shown and, if stdin is
    /// a terminal, its result is read from there (one line; start it with
    /// `!` to report an error). Otherwise the command ends with exit code
    /// 9 and prints the `agentrt tool-result` command that answers it
    /// (use --on-disconnect continue so the turn waits for it).
    #[arg(long = "tool", value_name = "NAME=SCHEMA_FILE", value_parser = parse_tool)]
    pub(crate) tools: Vec<(String, std::path::PathBuf)>,
    /// A server tool whose calls in this turn wait for an approval
    /// (`agentrt approve`); repeat for several, `*` for every one.
    #[arg(long = "require-approval", value_name = "TOOL")]
    pub(crate) require_approval: Vec<String>,
    /// Who wrote the message, in a group session: the participant's id,
    /// then optionally `:` and the name the model is shown (e.g.
    /// `u-17:Alice Smith`). A label only: the session's owner and the
    /// message's input actor come from your credentials.
    #[arg(long, value_name = "ID[:DISPLAY NAME]", value_parser = parse_speaker)]
    pub(crate) speaker: Option<(String, String)>,
    /// Do not show reasoning. (Shown by default: dimmed on a terminal;
    /// on stderr when stdout is a pipe or file, which then carries the
    /// answer alone.)
    #[arg(long)]
    pub(crate) no_reasoning: bool,
    /// A file to send with the message: an image (PNG, JPEG, GIF, WebP), a
    /// PDF or a text file. Uploaded to the session first (resumably);
    /// repeat for several.
    #[arg(long, value_name = "FILE")]
    pub(crate) attach: Vec<std::path::PathBuf>,
    /// Save the images and files the turn's tools return into this
    /// directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) save_dir: Option<std::path::PathBuf>,
    /// The message; read from stdin when absent (and stdin is not a
    /// terminal) or `-`.
    pub(crate) text: Vec<String>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum Thinking {
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
pub(crate) enum Disconnect {
    Cancel,
    Continue,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum BusyArg {
    Reject,
    Enqueue,
    Interrupt,
    Steer,
}

impl From<BusyArg> for agentrt_client::OnBusy {
    fn from(b: BusyArg) -> Self {
        match b {
            BusyArg::Reject => Self::Reject,
            BusyArg::Enqueue => Self::Enqueue,
            BusyArg::Interrupt => Self::Interrupt,
            BusyArg::Steer => Self::Steer,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum AdminCommand {
    /// Live turns, cached runners, watchers, stored sessions, uptime.
    Stats,
    /// Stop admitting turns (readiness turns NOT_SERVING) and wait until
    /// none is live.
    Drain {
        /// How long to wait, e.g. 30s.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Admit turns again after a drain (readiness turns SERVING again).
    Undrain,
    /// Set the default model (provider/model) of the runners built from
    /// now on; running turns keep theirs.
    SetDefaultModel {
        /// provider/model.
        model: String,
        /// The default thinking level too.
        #[arg(long, value_enum)]
        thinking: Option<Thinking>,
    },
    /// Mark every cached runner for rebuild before its next turn (e.g.
    /// after changing tools), without touching turns in flight.
    Invalidate,
    /// Close cached runners (all, or one user's).
    Reset {
        /// Only this user's runners.
        #[arg(long, default_value = "")]
        user: String,
    },
    /// What one user's sessions spent: sessions, tokens, cost.
    Usage {
        /// The user id.
        user: String,
    },
    /// The replicas on the server's store (id, address, last heartbeat,
    /// which one answered) and the leases of the live turns they hold.
    Replicas {
        /// One page of at most this many leases (default: every page).
        #[arg(long)]
        limit: Option<u32>,
        /// Continue from a previous page's token (printed after a page).
        #[arg(long, default_value = "")]
        page_token: String,
    },
}

/// `NAME=SCHEMA_FILE` of `chat --tool`.
fn parse_tool(s: &str) -> Result<(String, std::path::PathBuf), String> {
    match s.split_once('=') {
        Some((name, file)) if !name.trim().is_empty() && !file.is_empty() => {
            Ok((name.trim().to_owned(), file.into()))
        }
        _ => Err(format!(
            "{s:?}: write the tool as NAME=SCHEMA_FILE (e.g. lookup=lookup.schema.json)"
        )),
    }
}

/// `ID` or `ID:DISPLAY NAME` (the id cannot hold a `:`; the name may).
fn parse_speaker(s: &str) -> Result<(String, String), String> {
    let (id, name) = s.split_once(':').unwrap_or((s, ""));
    if id.trim().is_empty() {
        return Err("the speaker needs an id before the `:` (e.g. u-17:Alice)".to_owned());
    }
    Ok((id.to_owned(), name.to_owned()))
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
    fn a_speaker_is_an_id_with_an_optional_display_name() {
        let pair = |id: &str, name: &str| Ok((id.to_owned(), name.to_owned()));
        assert_eq!(parse_speaker("u-17"), pair("u-17", ""));
        assert_eq!(
            parse_speaker("u-17:Alice Smith"),
            pair("u-17", "Alice Smith")
        );
        assert_eq!(parse_speaker("u-17:Dr: Who"), pair("u-17", "Dr: Who"));
        assert!(parse_speaker(":Alice").is_err());
        assert!(parse_speaker("").is_err());
        let cli = Cli::try_parse_from(["agentrt", "chat", "--speaker", "u-2:Bob", "hi"]).unwrap();
        let Command::Chat(args) = cli.command else {
            panic!("not chat")
        };
        assert_eq!(args.speaker, Some(("u-2".to_owned(), "Bob".to_owned())));
    }

    #[test]
    fn a_tool_is_a_name_and_a_schema_file() {
        assert_eq!(
            parse_tool("lookup=schemas/lookup.json"),
            Ok(("lookup".to_owned(), "schemas/lookup.json".into()))
        );
        assert!(parse_tool("lookup").is_err());
        assert!(parse_tool("=x.json").is_err());
        assert!(parse_tool("lookup=").is_err());
        let both = [
            "agentrt",
            "chat",
            "--wait-when-busy",
            "--on-busy",
            "steer",
            "x",
        ];
        assert!(Cli::try_parse_from(both).is_err(), "two busy strategies");
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
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
