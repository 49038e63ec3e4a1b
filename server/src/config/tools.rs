//! The `[[mcp_servers]]` entries and the `[tools]` policy table.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{Config, ConfigError, parse_duration};

/// Whether an MCP server is shared by every session or started per
/// session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum McpScope {
    /// One server (process) for the whole server. The default.
    #[default]
    Global,
    /// One process per session, started when the session's runner is
    /// built (its first turn on this replica), in a working directory of
    /// its own, stopped when the runner is evicted (idle, reset, close,
    /// delete, shutdown); the files it reported are exported as blobs
    /// first. `command` servers only.
    Session,
}

/// One `[[mcp_servers]]` entry: an MCP server whose tools are offered as
/// `name__tool`. Exactly one of `command` (a stdio child process) and `url`
/// (a streamable HTTP endpoint).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The namespace of its tools: 1-32 characters of `a-z 0-9 _ -`,
    /// without `__`, not ending in `_`; unique.
    pub name: String,
    /// Program to start (stdio transport).
    #[serde(default)]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Variables added to its environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Streamable HTTP endpoint.
    #[serde(default)]
    pub url: Option<String>,
    /// Environment variable holding a bearer token for `url` (optional).
    #[serde(default)]
    pub bearer_env: Option<String>,
    /// `global` (default) or `session`: see [`McpScope`].
    #[serde(default)]
    pub scope: McpScope,
    /// The process's memory limit in bytes (`RLIMIT_DATA`: heap and private
    /// writable mappings), a number or a string such as `"512MiB"`.
    /// Default: none. `command` servers only.
    #[serde(default, deserialize_with = "de_bytes")]
    pub memory_limit: Option<u64>,
    /// The process's CPU time limit (`RLIMIT_CPU`, whole seconds), e.g.
    /// `"10m"`. Default: none. `command` servers only.
    #[serde(default, deserialize_with = "de_duration_option")]
    pub cpu_time_limit: Option<Duration>,
    /// Most open files of the process (`RLIMIT_NOFILE`). Default: none.
    /// `command` servers only.
    #[serde(default)]
    pub open_files_limit: Option<u64>,
    /// Whether the process may use the network. Default `true`; `false`
    /// (Linux only) starts it in a network namespace of its own, and the
    /// server refuses to start it where the system allows none.
    #[serde(default = "yes")]
    pub network: bool,
}

fn yes() -> bool {
    true
}

/// As an entry with only `name` would parse (no command or url yet).
impl Default for McpServerConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            url: None,
            bearer_env: None,
            scope: McpScope::Global,
            memory_limit: None,
            cpu_time_limit: None,
            open_files_limit: None,
            network: true,
        }
    }
}

impl std::fmt::Debug for McpServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServerConfig")
            .field("name", &self.name)
            .field("command", &self.command)
            .field("args", &self.args)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("url", &self.url)
            .field("bearer_env", &self.bearer_env)
            .field("scope", &self.scope)
            .field("memory_limit", &self.memory_limit)
            .field("cpu_time_limit", &self.cpu_time_limit)
            .field("open_files_limit", &self.open_files_limit)
            .field("network", &self.network)
            .finish()
    }
}

/// The `[tools]` table: the policy applied to tool calls.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Tool names (as the model sees them, e.g. `files__delete`) never run;
    /// the model receives a denial as the result.
    pub deny: Vec<String>,
    /// Longest a server tool call may take. Default 60 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub timeout: Duration,
    /// Per-tool overrides of `timeout`, e.g. `{ "search__web" = "2m" }`.
    #[serde(deserialize_with = "de_duration_map")]
    pub timeouts: BTreeMap<String, Duration>,
    /// Longest tool result in bytes; longer ones are cut and marked.
    /// Default 65536.
    pub max_result_bytes: usize,
    /// Most server tool calls of one step running at once. Default 4.
    pub max_parallel: usize,
    /// Server tools (as the model sees them) whose every call waits for an
    /// approval (`SubmitToolApproval`); `"*"` for all. Default: none.
    pub require_approval: Vec<String>,
    /// Longest a turn waits for an approval or a caller-executed tool's
    /// result before it times out (its deadline bounds it too). Default 1 h.
    #[serde(deserialize_with = "de_duration_value")]
    pub approval_timeout: Duration,
    /// Where session-scoped MCP servers get their working directories:
    /// `<workspace_root>/<sha256(owner)>/<sha256(session id)>/<instance>`.
    /// Default: `<data_dir>/workspaces`.
    pub workspace_root: Option<PathBuf>,
    /// Longest the export of a closing workspace's reported files may take.
    /// Default 5 s.
    #[serde(deserialize_with = "de_duration_value")]
    pub export_timeout: Duration,
    /// Largest reported file exported as a blob; larger ones are left
    /// out. Default 16 MiB.
    pub export_max_file_bytes: u64,
    /// Most bytes exported per closing workspace. Default 64 MiB.
    pub export_max_total_bytes: u64,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        Self {
            deny: Vec::new(),
            timeout: Duration::from_secs(60),
            timeouts: BTreeMap::new(),
            max_result_bytes: 64 << 10,
            max_parallel: 4,
            require_approval: Vec::new(),
            approval_timeout: Duration::from_secs(3600),
            workspace_root: None,
            export_timeout: Duration::from_secs(5),
            export_max_file_bytes: 16 << 20,
            export_max_total_bytes: 64 << 20,
        }
    }
}

impl McpServerConfig {
    /// The limits its process is started under (see
    /// `agentrt_runtime::toolbox::sandbox`).
    pub fn limits(&self) -> agentrt_runtime::toolbox::sandbox::Limits {
        agentrt_runtime::toolbox::sandbox::Limits {
            memory_bytes: self.memory_limit,
            // Whole seconds, at least one.
            cpu_seconds: self.cpu_time_limit.map(|t| t.as_secs().max(1)),
            open_files: self.open_files_limit,
            network: self.network,
        }
    }
}

impl McpServerConfig {
    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let fail = |what: &str| Err(ConfigError(format!("{at}: {what}")));
        if !agentrt_runtime::toolbox::valid_source_name(&self.name) {
            return fail(
                "name must be 1-32 characters of a-z 0-9 _ -, without \"__\" and not ending \
                 in '_' (it prefixes the server's tool names as name__tool)",
            );
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) | (None, None) => fail(
                "set exactly one of command (a stdio server) and url (a streamable HTTP server)",
            ),
            (Some(command), None) if command.trim().is_empty() => fail("command is empty"),
            (Some(_), None) if self.bearer_env.is_some() => {
                fail("bearer_env applies to url servers only")
            }
            (None, Some(url)) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                fail("url must start with http:// or https://")
            }
            (None, Some(_)) if !self.args.is_empty() || !self.env.is_empty() => {
                fail("args and env apply to command servers only")
            }
            (None, Some(_)) if self.scope == McpScope::Session => {
                fail("scope = \"session\" applies to command servers only")
            }
            (None, Some(_)) if self.limits() != Default::default() => fail(
                "memory_limit, cpu_time_limit, open_files_limit and network apply to command \
                 servers only",
            ),
            _ if self.memory_limit == Some(0)
                || self.open_files_limit == Some(0)
                || self.cpu_time_limit.is_some_and(|t| t.is_zero()) =>
            {
                fail("memory_limit, cpu_time_limit and open_files_limit must be positive")
            }
            _ if !self.network && !cfg!(target_os = "linux") => {
                fail("network = false needs Linux (network namespaces)")
            }
            _ => Ok(()),
        }
    }
}

impl Config {
    /// Checks `[[mcp_servers]]` and `[tools]`.
    pub(super) fn validate_tools(&self) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, m) in self.mcp_servers.iter().enumerate() {
            let at = format!("mcp_servers[{i}] ({:?})", m.name);
            m.validate(&at)?;
            if !names.insert(m.name.as_str()) {
                return Err(ConfigError(format!(
                    "{at}: an MCP server of that name is configured twice"
                )));
            }
        }
        let t = &self.tools;
        if t.timeout.is_zero() || t.timeouts.values().any(Duration::is_zero) {
            return Err(ConfigError(
                "tools.timeout and tools.timeouts must be positive".to_owned(),
            ));
        }
        if t.approval_timeout.is_zero() {
            return Err(ConfigError(
                "tools.approval_timeout must be positive".to_owned(),
            ));
        }
        if let Some(bad) = t
            .require_approval
            .iter()
            .find(|n| *n != "*" && !agentrt_runtime::toolbox::valid_tool_name(n))
        {
            return Err(ConfigError(format!(
                "tools.require_approval: {bad:?} is not a tool name (1-64 characters of A-Z a-z \
                 0-9 _ -) nor \"*\""
            )));
        }
        if t.max_parallel == 0 || t.max_result_bytes == 0 {
            return Err(ConfigError(
                "tools.max_parallel and tools.max_result_bytes must be at least 1".to_owned(),
            ));
        }
        if t.export_timeout.is_zero() {
            return Err(ConfigError(
                "tools.export_timeout must be positive".to_owned(),
            ));
        }
        if t.deny.iter().any(String::is_empty) {
            return Err(ConfigError(
                "tools.deny holds an empty tool name".to_owned(),
            ));
        }
        Ok(())
    }
}

pub(super) fn de_duration_value<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map_err(serde::de::Error::custom)
}

fn de_duration_option<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    de_duration_value(d).map(Some)
}

/// A byte count: a number, or a string of a number and a unit (`B`, `K`,
/// `KiB`, `M`, `MiB`, `G`, `GiB`; powers of 1024).
fn de_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Bytes {
        Number(u64),
        Text(String),
    }
    match Bytes::deserialize(d)? {
        Bytes::Number(n) => Ok(Some(n)),
        Bytes::Text(text) => parse_bytes(&text)
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let shift = match unit.trim() {
        "" | "B" => 0,
        "K" | "KiB" | "k" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        _ => return Err(format!("{text:?} is not a size (e.g. 512MiB, 2GiB)")),
    };
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{text:?} is not a size (e.g. 512MiB, 2GiB)"))
}

fn de_duration_map<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Duration>, D::Error> {
    BTreeMap::<String, String>::deserialize(d)?
        .into_iter()
        .map(|(name, text)| {
            parse_duration(&text)
                .map(|t| (name, t))
                .map_err(serde::de::Error::custom)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_servers_and_the_tool_policy_parse() {
        let c = Config::parse_toml(
            r#"
[[mcp_servers]]
name = "files"
command = "mcp-files"
args = ["--root", "/srv"]
env = { TOKEN = "s3cret" }

[[mcp_servers]]
name = "search"
url = "https://mcp.example.invalid/mcp"
bearer_env = "SEARCH_TOKEN"

[tools]
deny = ["files__delete"]
timeout = "30s"
timeouts = { "search__web" = "2m" }
max_result_bytes = 1000
max_parallel = 2
"#,
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.mcp_servers[0].args, ["--root", "/srv"]);
        assert_eq!(c.mcp_servers[1].bearer_env.as_deref(), Some("SEARCH_TOKEN"));
        assert_eq!(c.tools.deny, ["files__delete"]);
        assert_eq!(c.tools.timeout, Duration::from_secs(30));
        assert_eq!(c.tools.timeouts["search__web"], Duration::from_secs(120));
        assert_eq!((c.tools.max_result_bytes, c.tools.max_parallel), (1000, 2));
        assert!(!format!("{c:?}").contains("s3cret"));
        let parsed = Config::parse_toml("[[mcp_servers]]\nname = \"x\"").unwrap();
        let named = McpServerConfig {
            name: "x".into(),
            ..McpServerConfig::default()
        };
        assert_eq!(parsed.mcp_servers, [named], "Default is what parsing gives");
        let defaults = Config::parse_toml("").unwrap().tools;
        assert_eq!(defaults, ToolsConfig::default());
        assert_eq!(defaults.timeout, Duration::from_secs(60));
        assert_eq!(
            (defaults.max_result_bytes, defaults.max_parallel),
            (65536, 4)
        );
    }

    #[test]
    fn session_scope_limits_and_workspaces_parse() {
        let c = Config::parse_toml(
            r#"
[[mcp_servers]]
name = "sandbox"
command = "mcp-sandbox"
scope = "session"
memory_limit = "512MiB"
cpu_time_limit = "2m"
open_files_limit = 128
network = false

[[mcp_servers]]
name = "plain"
command = "mcp-plain"
memory_limit = 1048576

[tools]
workspace_root = "/srv/agentrt/workspaces"
export_timeout = "10s"
export_max_file_bytes = 1000
export_max_total_bytes = 5000
"#,
        )
        .unwrap();
        c.validate().unwrap();
        let s = &c.mcp_servers[0];
        assert_eq!(s.scope, McpScope::Session);
        let limits = s.limits();
        assert_eq!(limits.memory_bytes, Some(512 << 20));
        assert_eq!(limits.cpu_seconds, Some(120));
        assert_eq!(limits.open_files, Some(128));
        assert!(!limits.network);
        let plain = &c.mcp_servers[1];
        assert_eq!(plain.scope, McpScope::Global);
        assert_eq!(plain.memory_limit, Some(1 << 20));
        assert!(plain.network);
        assert_eq!(
            c.tools.workspace_root.as_deref(),
            Some(std::path::Path::new("/srv/agentrt/workspaces"))
        );
        assert_eq!(c.tools.export_timeout, Duration::from_secs(10));
        assert_eq!(
            (
                c.tools.export_max_file_bytes,
                c.tools.export_max_total_bytes
            ),
            (1000, 5000)
        );
        assert_eq!(parse_bytes("2GiB"), Ok(2 << 30));
        assert_eq!(parse_bytes("17"), Ok(17));
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("99999999999999G").is_err());
    }

    #[test]
    fn bad_mcp_servers_are_refused_with_clear_messages() {
        let check = |toml: &str, expected: &str| {
            let err = Config::parse_toml(toml)
                .and_then(|c| c.validate())
                .unwrap_err()
                .0;
            assert!(err.contains(expected), "{toml}: {err}");
        };
        let server = |body: &str| format!("[[mcp_servers]]\nname = \"x\"\n{body}\n");
        check(&server(""), "exactly one of command");
        check(
            &server("command = \"a\"\nurl = \"http://h\""),
            "exactly one of command",
        );
        check(
            "[[mcp_servers]]\nname = \"Bad__Name\"\ncommand = \"a\"",
            "name must be",
        );
        check(
            &(server("command = \"a\"") + &server("command = \"b\"")),
            "configured twice",
        );
        check(&server("url = \"ftp://h\""), "http://");
        check(
            &server("command = \"a\"\nbearer_env = \"T\""),
            "url servers only",
        );
        check(
            &server("url = \"http://h\"\nargs = [\"x\"]"),
            "command servers only",
        );
        check(&server("command = \" \""), "command is empty");
        check(
            &server("url = \"http://h\"\nscope = \"session\""),
            "command servers only",
        );
        check(
            &server("url = \"http://h\"\nnetwork = false"),
            "command servers only",
        );
        check(
            &server("command = \"a\"\nscope = \"team\""),
            "unknown variant",
        );
        check(&server("command = \"a\"\nmemory_limit = 0"), "positive");
        check(
            &server("command = \"a\"\nmemory_limit = \"1XB\""),
            "not a size",
        );
        check("[tools]\nmax_parallel = 0", "at least 1");
        check("[tools]\ntimeout = \"0s\"", "positive");
        check("[tools]\ndenny = []", "unknown field");
    }
}
