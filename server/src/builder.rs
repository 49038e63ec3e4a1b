//! [`ServerBuilder`]: everything that can fail before the server takes a
//! call. [`ServerBuilder::prepare`] validates the config, loads the local
//! model, builds the model providers and the toolbox, reads key and TLS
//! files, opens the store and starts the runtime — all before the caller
//! binds a port, so a bad config or model is reported first and a server
//! about to exit never prints its "listening" line. The result is a
//! [`Prepared`] server, which `serve.rs` runs.

use std::future::Future;
use std::sync::Arc;

use agentrt_runtime::model::anthropic::{AnthropicConfig, AnthropicProvider};
use agentrt_runtime::model::openai::{OpenAiConfig, OpenAiProvider};
use agentrt_runtime::model::retry::{RetryPolicy, RetryingProvider};
use agentrt_runtime::model::{ModelProvider, Models};
use agentrt_runtime::store::{SledStore, Store};
use agentrt_runtime::toolbox::mcp::{McpSessionFactory, McpSource, McpTarget};
use agentrt_runtime::toolbox::sandbox::Launcher;
use agentrt_runtime::toolbox::{
    BlobExporter, ExportLimits, ToolPolicy, ToolSource, Toolbox, WorkspaceExporter,
    WorkspaceSettings,
};
use agentrt_runtime::{Runtime, RuntimeConfig};
use tokio::net::TcpListener;

use crate::cluster::WireKey;
use crate::config::{Config, ConfigError, McpScope, ProviderKind, StoreKind, redact_url};
use crate::error::ServerError;
use crate::{auth, local, tls};

/// How long connecting to the PostgreSQL store may take.
const DATABASE_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Builds a server from a [`Config`], optionally with extra model providers
/// and tool sources (tests register scripted ones) and a store of the
/// caller's choosing.
#[derive(Clone)]
pub struct ServerBuilder {
    config: Config,
    extra_models: Vec<(String, Arc<dyn ModelProvider>)>,
    extra_tools: Vec<(String, Arc<dyn ToolSource>)>,
    store: Option<Arc<dyn Store>>,
    env: EnvLookup,
    /// Starts stdio MCP servers under their limits (the binary sets
    /// itself); without one they are started directly, unlimited.
    tool_launcher: Option<Launcher>,
    /// Keeps the files session-scoped MCP servers reported; default: blobs
    /// in `<data_dir>/blobs`.
    workspace_exporter: Option<Arc<dyn WorkspaceExporter>>,
}

impl std::fmt::Debug for ServerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBuilder")
            .field("config", &self.config)
            .field(
                "extra_models",
                &self.extra_models.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .field(
                "extra_tools",
                &self.extra_tools.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Starts the tool sources (MCP servers) by listing their tools once. One
/// that fails is logged and its tools are absent; it is tried again when a
/// session's runner is built.
async fn start_tool_sources(toolbox: &Toolbox) {
    if toolbox.is_empty() {
        return;
    }
    let listing = toolbox.list().await;
    let down = toolbox.unavailable();
    for name in &down {
        tracing::error!(
            source = %name,
            "MCP server / tool source failed to start; the server runs without its tools and retries when a session's runner is built"
        );
    }
    tracing::info!(
        sources = toolbox.source_names().len(),
        unavailable = down.len(),
        tools = listing.tools.len(),
        "server tools listed"
    );
}

impl ServerBuilder {
    /// A builder over `config`.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            extra_models: Vec::new(),
            extra_tools: Vec::new(),
            store: None,
            env: Arc::new(|name| std::env::var(name).ok()),
            tool_launcher: None,
            workspace_exporter: None,
        }
    }

    /// Starts every stdio MCP server through `launcher`, which applies its
    /// limits, gives it its own process group and makes it die with the
    /// server (`agentrt_runtime::toolbox::sandbox`). The `agentrt-server`
    /// binary passes itself. Without a launcher, limits in the config
    /// (`memory_limit`, `cpu_time_limit`, `open_files_limit`,
    /// `network = false`) are refused.
    pub fn tool_launcher(mut self, launcher: Launcher) -> Self {
        self.tool_launcher = Some(launcher);
        self
    }

    /// Keeps the files session-scoped MCP servers reported, when their
    /// workspace closes, with `exporter` instead of the default (blobs of
    /// the session's owner in `<data_dir>/blobs`).
    pub fn workspace_exporter(mut self, exporter: Arc<dyn WorkspaceExporter>) -> Self {
        self.workspace_exporter = Some(exporter);
        self
    }

    /// Registers a model provider under `name` (the part before `/`).
    pub fn model_provider(
        mut self,
        name: impl Into<String>,
        provider: Arc<dyn ModelProvider>,
    ) -> Self {
        self.extra_models.push((name.into(), provider));
        self
    }

    /// Registers a tool source whose tools are offered as `name__tool`,
    /// beside the configured MCP servers.
    pub fn tool_source(mut self, name: impl Into<String>, source: Arc<dyn ToolSource>) -> Self {
        self.extra_tools.push((name.into(), source));
        self
    }

    /// Uses `store` instead of opening sled in the data directory.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Replaces the environment lookup used for `api_key_env`, `bearer_env`
    /// (of MCP servers and hooks), `key_env`, `[store] url_env` and `[cluster] key_env`.
    pub fn env_lookup(
        mut self,
        env: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.env = Arc::new(env);
        self
    }

    fn models(&self, local: Option<Arc<dyn ModelProvider>>) -> Result<Models, ConfigError> {
        let mut models = Models::with_builtin();
        if let Some(local) = local {
            models.insert(agentrt_local_model::PROVIDER, local);
        }
        for p in &self.config.providers {
            let api_key = match &p.api_key_env {
                Some(var) => Some((self.env)(var).ok_or_else(|| {
                    ConfigError(format!(
                        "provider {:?}: environment variable {var} (api_key_env) is not set",
                        p.name
                    ))
                })?),
                None => None,
            };
            let invalid =
                |e: &dyn std::fmt::Display| ConfigError(format!("provider {:?}: {e}", p.name));
            let endpoint = p.endpoint(api_key);
            let provider: Arc<dyn ModelProvider> = match p.kind {
                ProviderKind::Anthropic => Arc::new(
                    AnthropicProvider::new(AnthropicConfig::new(endpoint))
                        .map_err(|e| invalid(&e))?,
                ),
                ProviderKind::Openai => Arc::new(
                    OpenAiProvider::new(OpenAiConfig {
                        endpoint,
                        max_tokens_param: p.max_tokens_param.map(Into::into).unwrap_or_default(),
                    })
                    .map_err(|e| invalid(&e))?,
                ),
            };
            // Every HTTP provider retries failures that happen before any
            // output (unreachable, 408/409/429/5xx) with backoff.
            let policy = RetryPolicy::with_max_retries(p.max_retries.unwrap_or(2));
            models.insert(
                p.name.clone(),
                Arc::new(RetryingProvider::new(provider, policy)),
            );
        }
        for (name, provider) in &self.extra_models {
            models.insert(name.clone(), Arc::clone(provider));
        }
        Ok(models)
    }

    /// The configured MCP servers and the registered tool sources, under
    /// the configured policy. Nothing is started yet.
    fn toolbox(&self, blobs: &agentrt_runtime::blobs::Blobs) -> Result<Toolbox, ConfigError> {
        let t = &self.config.tools;
        let mut toolbox = Toolbox::new();
        toolbox.set_policy(ToolPolicy {
            deny: t.deny.iter().cloned().collect(),
            timeout: t.timeout,
            timeouts: t.timeouts.clone(),
            max_result_bytes: t.max_result_bytes,
            max_parallel: t.max_parallel,
        });
        for m in &self.config.mcp_servers {
            let target = match (&m.command, &m.url) {
                (Some(command), _) => McpTarget::Stdio {
                    command: command.clone(),
                    args: m.args.clone(),
                    env: m.env.clone(),
                },
                (None, url) => McpTarget::Http {
                    url: url.clone().unwrap_or_default(),
                    bearer: match &m.bearer_env {
                        Some(var) => Some((self.env)(var).ok_or_else(|| {
                            ConfigError(format!(
                                "MCP server {:?}: environment variable {var} (bearer_env) is not set",
                                m.name
                            ))
                        })?),
                        None => None,
                    },
                },
            };
            let sandbox = match &self.tool_launcher {
                Some(launcher) if m.command.is_some() => Some((launcher.clone(), m.limits())),
                _ if m.limits() != Default::default() => {
                    return Err(ConfigError(format!(
                        "MCP server {:?}: resource limits and network = false need the \
                         agentrt-server binary (no tool launcher here)",
                        m.name
                    )));
                }
                _ => None,
            };
            let added = match m.scope {
                McpScope::Global => {
                    let mut source = McpSource::new(m.name.clone(), target);
                    if let Some((launcher, limits)) = sandbox {
                        source = source.with_sandbox(launcher, limits);
                    }
                    toolbox.add_source(m.name.clone(), Arc::new(source))
                }
                McpScope::Session => {
                    let mut factory = McpSessionFactory::new(m.name.clone(), target);
                    if let Some((launcher, limits)) = sandbox {
                        factory = factory.with_sandbox(launcher, limits);
                    }
                    toolbox.add_session_source(m.name.clone(), Arc::new(factory))
                }
            };
            added.map_err(|e| ConfigError(format!("MCP server {:?}: {e}", m.name)))?;
        }
        if toolbox.has_session_sources() {
            toolbox.set_workspaces(self.workspaces(blobs));
        }
        for (name, source) in &self.extra_tools {
            toolbox
                .add_source(name.clone(), Arc::clone(source))
                .map_err(|e| ConfigError(format!("tool source {name:?}: {e}")))?;
        }
        Ok(toolbox)
    }

    /// Where session-scoped MCP servers work and where their reported files
    /// go.
    fn workspaces(&self, blobs: &agentrt_runtime::blobs::Blobs) -> WorkspaceSettings {
        let t = &self.config.tools;
        let exporter = match &self.workspace_exporter {
            Some(exporter) => Arc::clone(exporter),
            // Into the session's blobs (`[blobs]`).
            None => Arc::new(BlobExporter::new(Arc::new(blobs.clone()))),
        };
        WorkspaceSettings {
            root: t
                .workspace_root
                .clone()
                .unwrap_or_else(|| self.config.data_dir.join("workspaces")),
            exporter: Some(exporter),
            export: ExportLimits {
                timeout: t.export_timeout,
                max_file_bytes: t.export_max_file_bytes,
                max_total_bytes: t.export_max_total_bytes,
                ..ExportLimits::default()
            },
        }
    }

    /// The store the config names: the one given to [`ServerBuilder::store`],
    /// else sled in the data directory or the PostgreSQL database. A
    /// database that cannot be reached fails start-up, naming the URL
    /// without its password.
    async fn open_store(&self, advertise: &str) -> Result<Arc<dyn Store>, ServerError> {
        if let Some(store) = &self.store {
            return Ok(Arc::clone(store));
        }
        match self.config.store.kind {
            StoreKind::Sled => self.open_sled().await,
            StoreKind::Postgres => self.open_postgres(advertise).await,
        }
    }

    async fn open_postgres(&self, advertise: &str) -> Result<Arc<dyn Store>, ServerError> {
        use agentrt_runtime::store::{PgConfig, PgTls, PostgresStore};
        let settings = &self.config.store;
        let url = settings.resolve_url(&*self.env)?;
        let shown = redact_url(&url);
        // Fresh per process: a restarted replica never mistakes its
        // predecessor's leases for its own.
        let replica_id = agentrt_runtime::types::new_id();
        tracing::info!(
            replica_id = %replica_id,
            database = %shown,
            advertise,
            "opening the shared PostgreSQL store"
        );
        let store = PostgresStore::connect(PgConfig {
            url,
            pool_size: settings.pool_size(),
            replica_id,
            address: advertise.to_owned(),
            lease_ttl: settings.lease_ttl(),
            connect_timeout: DATABASE_CONNECT_TIMEOUT,
            tls: PgTls {
                mode: settings.tls,
                ca_file: settings.ca_file.clone(),
            },
        })
        .await
        .map_err(|source| ServerError::Database { url: shown, source })?;
        Ok(Arc::new(store))
    }

    async fn open_sled(&self) -> Result<Arc<dyn Store>, ServerError> {
        let path = self.config.data_dir.join("store");
        let shown = path.display().to_string();
        let cache_bytes = self.config.store_cache_mb.saturating_mul(1 << 20);
        let min_free = self.config.store_min_free_mb.saturating_mul(1 << 20);
        let opened = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&path).map_err(|e| {
                agentrt_runtime::store::StoreError::Backend(format!(
                    "cannot create the directory: {e}"
                ))
            })?;
            SledStore::open_with_cache(&path, cache_bytes).map(|s| s.with_min_free(min_free))
        })
        .await
        .map_err(|e| ServerError::Store {
            path: shown.clone(),
            source: agentrt_runtime::store::StoreError::Backend(e.to_string()),
        })?;
        let store = opened.map_err(|source| ServerError::Store {
            path: shown,
            source,
        })?;
        Ok(Arc::new(store))
    }

    /// The internal listener of `[cluster]`, bound, with the key read and
    /// the advertised address settled.
    async fn bind_cluster(&self) -> Result<Option<ClusterParts>, ServerError> {
        let Some(settings) = &self.config.cluster else {
            return Ok(None);
        };
        let key = settings.resolve_key(&*self.env)?;
        let key = WireKey::new(&key).ok_or_else(|| {
            ConfigError(format!(
                "cluster.key_env: the key in {} must be printable ASCII without spaces",
                settings.key_env.as_deref().unwrap_or_default()
            ))
        })?;
        // With [tls], mTLS against the cluster's CA (validated: there is
        // one); its files are read before the port is bound. Without,
        // plaintext, as the warning says.
        let tls = match settings.ca_for(&self.config.tls) {
            Some(ca) => {
                tls::ServerTls::for_cluster(&self.config.tls, ca, settings.server_name.as_deref())?
                    .map(Arc::new)
            }
            None => None,
        };
        let listener =
            TcpListener::bind(settings.listen)
                .await
                .map_err(|source| ServerError::Listen {
                    what: "cluster.listen",
                    addr: settings.listen,
                    source,
                })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ServerError::Listen {
                what: "cluster.listen",
                addr: settings.listen,
                source,
            })?;
        if tls.is_none() {
            tracing::warn!(
                listen = %bound,
                "the internal cluster listener is plaintext: the cluster key and forwarded \
                 calls cross the network unencrypted; configure [tls] (and [cluster] ca_file) \
                 for mTLS between replicas, or keep the port on a network only replicas reach"
            );
        }
        let advertise = settings.advertise_for(bound, tls.is_some())?;
        Ok(Some(ClusterParts {
            listener,
            bound,
            key,
            advertise,
            tls,
        }))
    }

    /// Serves on `listener` until `shutdown` completes; then readiness turns
    /// NOT_SERVING, new turns are refused, live turns get the grace period,
    /// the rest are cancelled, the store is flushed and the server stops.
    /// The same as [`ServerBuilder::prepare`] then [`Prepared::serve`].
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), ServerError> {
        self.prepare().await?.serve(listener, shutdown).await
    }

    /// Everything that can fail before the server takes calls: validates
    /// the config, loads the local model, builds the providers and tools,
    /// opens the store and starts the runtime (which checks the default
    /// model). The binary prints its "listening" line only after this
    /// succeeded, so a bad model or provider is reported first.
    pub async fn prepare(mut self) -> Result<Prepared, ServerError> {
        self.config.validate()?;
        let local_model = local::load(&self.config).await?;
        self.config = local::effective(self.config, local_model.is_some())?;
        let models = self.models(local_model.map(|m| m as Arc<dyn ModelProvider>))?;
        let extra: Vec<String> = self.extra_models.iter().map(|(n, _)| n.clone()).collect();
        crate::telemetry::allow_configured_models(&self.config, &extra);
        // The URL may carry a bucket's name but never a credential; the
        // error says what is wrong without repeating it.
        let env = Arc::clone(&self.env);
        let blobs = agentrt_runtime::blobs::Blobs::open(
            &self.config.blobs.url,
            &self.config.data_dir,
            &|name| env(name),
        )
        .map_err(|e| crate::config::ConfigError(format!("blobs.url: {e}")))?;
        let toolbox = Arc::new(self.toolbox(&blobs)?);
        let hooks = crate::hooks::build(&self.config.hooks, &*self.env)?;
        // Keys and certificates are read here too, so a missing key file
        // or a bad PEM stops start-up before the listening line.
        let auth = auth::Authenticator::new(&self.config.auth, &*self.env)?;
        let tls = tls::ServerTls::from_settings(&self.config.tls)?.map(Arc::new);
        if let Some(warning) = self.config.open_access_warning() {
            tracing::warn!("{warning}");
        }
        let cluster = self.bind_cluster().await?;
        let advertise = cluster
            .as_ref()
            .map_or(crate::cluster::NO_LISTENER, |c| c.advertise.as_str());
        let store = self.open_store(advertise).await?;
        let runtime_config = RuntimeConfig {
            media: self.config.blobs.limits(),
            blobs,
            default_model: self.config.default_model.clone(),
            heartbeat_interval: self.config.heartbeat_interval,
            runner_idle_timeout: self.config.runner_idle_timeout,
            turn_timeout: self.config.turn_timeout,
            max_turn_timeout: self.config.max_turn_timeout,
            stalled_reader_timeout: self.config.stalled_reader_timeout,
            max_queued_per_session: self.config.max_queued_per_session,
            inbox_sweep: self.config.inbox_sweep,
            require_approval: self.config.tools.require_approval.clone(),
            approval_timeout: self.config.tools.approval_timeout,
            fast_model: self.config.fast_model.clone(),
            compaction: self.config.compaction.to_runtime(),
            capture_content: self.config.telemetry.capture_content,
            lease_ttl: self.config.store.lease_ttl(),
            quotas: self.config.quotas.to_policy(),
            prices: self.config.prices.clone(),
            memory: self.config.memory.limits()?,
            delegation: self.config.delegation.limits()?,
            hooks,
            ..RuntimeConfig::default()
        };
        start_tool_sources(&toolbox).await;
        let runtime = Runtime::open_with_tools(runtime_config, store, models, toolbox).await?;
        runtime
            .sync_config_agents(&crate::config::agent_specs(&self.config.agents)?)
            .await?;
        let agents_reload = self
            .config
            .file
            .clone()
            .and_then(|path| crate::agents_reload::on_sighup(runtime.clone(), path));
        Ok(Prepared {
            config: self.config,
            runtime,
            auth,
            tls,
            cluster,
            agents_reload,
            health: crate::health::HealthProbe::starting(),
        })
    }
}

/// The internal listener of a `[cluster]` replica, ready to serve.
#[derive(Debug)]
pub(crate) struct ClusterParts {
    pub(crate) listener: TcpListener,
    pub(crate) bound: std::net::SocketAddr,
    pub(crate) key: WireKey,
    pub(crate) advertise: String,
    /// mTLS on the listener and for the forwarder (with `[tls]`).
    pub(crate) tls: Option<Arc<tls::ServerTls>>,
}

/// A server whose store is open and runtime started, not yet serving; see
/// [`ServerBuilder::prepare`].
#[derive(Debug)]
pub struct Prepared {
    pub(crate) config: Config,
    pub(crate) runtime: Runtime,
    pub(crate) auth: auth::Authenticator,
    pub(crate) tls: Option<Arc<tls::ServerTls>>,
    pub(crate) cluster: Option<ClusterParts>,
    /// Reloads `[[agents]]` on SIGHUP while the server runs.
    pub(crate) agents_reload: Option<tokio_util::task::AbortOnDropHandle<()>>,
    /// What the health service reports, for `/readyz` and `/livez`.
    pub(crate) health: crate::health::HealthProbe,
}

impl Prepared {
    /// A view of readiness and liveness as the gRPC health service reports
    /// them once [`Prepared::serve`] runs (not ready until then), for the
    /// HTTP routes of the metrics listener.
    pub fn health_probe(&self) -> crate::health::HealthProbe {
        self.health.clone()
    }

    /// The effective configuration (after the local model's defaults).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Where the internal cluster service listens (`[cluster]` only).
    pub fn cluster_addr(&self) -> Option<std::net::SocketAddr> {
        self.cluster.as_ref().map(|c| c.bound)
    }

    /// This replica's id on a shared store (`[store] kind = "postgres"`).
    pub fn replica_id(&self) -> Option<&str> {
        self.runtime.replica_id()
    }

    /// The A2A public agent card as JSON, for a server bound to `addr`
    /// (its URL is `[a2a] public_url` when set); see
    /// [`crate::a2a::card::public_card_json`].
    pub fn public_agent_card(&self, addr: Option<std::net::SocketAddr>) -> String {
        crate::a2a::card::public_card_json(&crate::a2a::card::agent_card(
            &self.config,
            addr,
            &self.runtime,
        ))
    }
}
