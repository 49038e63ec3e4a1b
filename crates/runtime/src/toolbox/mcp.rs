//! [`McpSource`]: the tools of one MCP server, through the official SDK
//! (`rmcp`): a stdio child process or a streamable HTTP endpoint.
//!
//! The connection is made when the tools are first listed and remade by a
//! later listing once it is lost (the child is restarted). A call never
//! reconnects: with the server gone it is an error result. Dropping a call
//! sends `notifications/cancelled` for its request (rmcp does so for every
//! abandoned request). Dropping the source closes the connection and kills
//! the child.
//!
//! A stdio server may be started under limits through a launcher
//! ([`McpSource::with_sandbox`], [`super::sandbox`]), in its own process
//! group (stopping it stops what it started too). A session-scoped server
//! ([`McpSessionFactory`]) runs in its session's workspace, and the files
//! its results link to there (`resource_link`, `file://`) are reported to
//! the workspace for export at close. Each child process is counted in
//! `agentrt.tools.processes` while connected.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, MetaObject, RequestMetaObject,
    ResourceContents,
};

/// The `_meta` key of a `tools/call` request that carries the turn's id
/// of the call (the model's call id): the same id for a retried call.
pub const CALL_ID_META: &str = "io.agentrt/call_id";
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{Peer, ServiceError, ServiceExt as _};

use super::sandbox::{Launcher, Limits};
use super::session::SessionSourceFactory;
use super::workspace::Workspace;
use super::{ToolError, ToolMedia, ToolOutcome, ToolSource};
use crate::model::ToolSpec;
use crate::types::MediaKind;

/// How to reach an MCP server.
#[derive(Clone, PartialEq, Eq)]
pub enum McpTarget {
    /// A child process speaking MCP on its stdin/stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to the server's environment.
        env: BTreeMap<String, String>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint URL.
        url: String,
        /// Sent as `Authorization: Bearer …` when set.
        bearer: Option<String>,
    },
}

impl fmt::Debug for McpTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.keys().collect::<Vec<_>>())
                .finish(),
            Self::Http { url, bearer } => f
                .debug_struct("Http")
                .field("url", url)
                .field("bearer", &bearer.as_ref().map(|_| "<redacted>"))
                .finish(),
        }
    }
}

type Service = RunningService<RoleClient, ()>;

/// A live connection, and the child process behind it (stdio).
struct Connection {
    service: Service,
    process: Option<Process>,
}

/// A child process, counted in `agentrt.tools.processes` while held; its
/// process group is killed when it is dropped (sandboxed children lead
/// their own group), so nothing it started is left behind.
struct Process {
    pid: u32,
    /// Whether it leads its own process group.
    group: bool,
    _counted: crate::telemetry::metrics::ProcessGuard,
}

impl Process {
    /// Kills it (its group when it leads one) at once.
    fn kill(&self) {
        #[cfg(unix)]
        {
            use nix::sys::signal::{Signal, kill, killpg};
            let Ok(pid) = i32::try_from(self.pid) else {
                return;
            };
            let pid = nix::unistd::Pid::from_raw(pid);
            let _ = if self.group {
                killpg(pid, Signal::SIGKILL)
            } else {
                kill(pid, Signal::SIGKILL)
            };
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // The child itself is killed (and reaped) by rmcp's transport; the
        // rest of its group here.
        if self.group {
            self.kill();
        }
    }
}

/// One MCP server as a [`ToolSource`].
pub struct McpSource {
    name: String,
    target: McpTarget,
    /// Bounds connecting plus listing.
    list_timeout: Duration,
    /// After a failed connection attempt, listings fail at once for this
    /// long instead of trying again.
    retry_after: Duration,
    /// How long [`ToolSource::close`] lets the server exit on its own
    /// (stdin closed) before it is killed.
    stop_timeout: Duration,
    /// Starts a stdio server under limits.
    sandbox: Option<(Launcher, Limits)>,
    /// The session workspace a session-scoped server runs in.
    workspace: Option<Workspace>,
    /// Set by [`ToolSource::close`]: no reconnecting after it.
    closed: AtomicBool,
    /// Owns the connection (and the child); serialises (re)connecting.
    connection: tokio::sync::Mutex<Option<Connection>>,
    /// The connection's peer, for calls (which never wait for a reconnect).
    peer: Mutex<Option<Peer<RoleClient>>>,
    last_failure: Mutex<Option<(tokio::time::Instant, ToolError)>>,
}

impl fmt::Debug for McpSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpSource")
            .field("name", &self.name)
            .field("target", &self.target)
            .field("sandbox", &self.sandbox)
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl McpSource {
    /// A source for the server `name` (used in messages) at `target`.
    /// Nothing is started until the first listing.
    pub fn new(name: impl Into<String>, target: McpTarget) -> Self {
        Self {
            name: name.into(),
            target,
            list_timeout: Duration::from_secs(10),
            retry_after: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(2),
            sandbox: None,
            workspace: None,
            closed: AtomicBool::new(false),
            connection: tokio::sync::Mutex::new(None),
            peer: Mutex::new(None),
            last_failure: Mutex::new(None),
        }
    }

    /// Changes how long connecting and listing may take (default 10 s).
    pub fn with_list_timeout(mut self, timeout: Duration) -> Self {
        self.list_timeout = timeout;
        self
    }

    /// Changes how long a failed start is remembered (default 30 s).
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// Starts a stdio server through `launcher` under `limits` (see
    /// [`super::sandbox`]); no effect on an HTTP server.
    pub fn with_sandbox(mut self, launcher: Launcher, limits: Limits) -> Self {
        self.sandbox = Some((launcher, limits));
        self
    }

    /// Changes how long closing waits for the server to exit before it is
    /// killed (default 2 s).
    pub fn with_stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }

    /// Runs a stdio server in `workspace` (its working directory) and
    /// reports the workspace files its results link to.
    pub fn in_workspace(mut self, workspace: Workspace) -> Self {
        self.workspace = Some(workspace);
        self
    }

    fn scope(&self) -> &'static str {
        if self.workspace.is_some() {
            "session"
        } else {
            "global"
        }
    }

    async fn connect(&self) -> Result<Connection, ToolError> {
        let unavailable = |what: String| ToolError::Unavailable(what);
        match &self.target {
            McpTarget::Stdio { command, args, env } => {
                let mut cmd = match &self.sandbox {
                    Some((launcher, limits)) => launcher.command(limits, command, args),
                    None => {
                        let mut cmd = tokio::process::Command::new(command);
                        cmd.args(args);
                        cmd
                    }
                };
                cmd.envs(env).kill_on_drop(true);
                if let Some(workspace) = &self.workspace {
                    cmd.current_dir(workspace.dir());
                }
                let transport = TokioChildProcess::new(cmd)
                    .map_err(|e| unavailable(format!("cannot start {command:?}: {e}")))?;
                let process = transport.id().map(|pid| Process {
                    pid,
                    group: self.sandbox.is_some(),
                    _counted: crate::telemetry::metrics::ProcessGuard::new(self.scope()),
                });
                let service = ()
                    .serve(transport)
                    .await
                    .map_err(|e| unavailable(format!("MCP initialization failed: {e}")))?;
                Ok(Connection { service, process })
            }
            McpTarget::Http { url, bearer } => {
                let mut config = rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                    url.as_str(),
                );
                if let Some(token) = bearer {
                    config = config.auth_header(token.clone());
                }
                let transport = StreamableHttpClientTransport::from_config(config);
                let service = ().serve(transport).await.map_err(|e| {
                    unavailable(format!("MCP initialization with {url} failed: {e}"))
                })?;
                Ok(Connection {
                    service,
                    process: None,
                })
            }
        }
    }

    async fn connect_and_list(
        &self,
        slot: &mut Option<Connection>,
    ) -> Result<Vec<rmcp::model::Tool>, ToolError> {
        let alive = slot
            .as_ref()
            .is_some_and(|c| !c.service.is_transport_closed());
        if !alive {
            self.disconnect(slot);
            if self.closed.load(Ordering::Acquire) {
                return Err(ToolError::Unavailable("closed".to_owned()));
            }
            if let Some((at, why)) = lock(&self.last_failure).clone()
                && at.elapsed() < self.retry_after
            {
                return Err(why);
            }
            let connection = self.connect().await.inspect_err(|e| {
                *lock(&self.last_failure) = Some((tokio::time::Instant::now(), e.clone()));
            })?;
            *lock(&self.last_failure) = None;
            *lock(&self.peer) = Some(connection.service.peer().clone());
            *slot = Some(connection);
            tracing::info!(server = %self.name, "MCP server connected");
        }
        let Some(connection) = slot.as_ref() else {
            return Err(ToolError::Unavailable("not connected".to_owned()));
        };
        connection
            .service
            .list_all_tools()
            .await
            .map_err(|e| ToolError::Protocol(format!("tools/list failed: {e}")))
    }

    fn disconnect(&self, slot: &mut Option<Connection>) {
        *lock(&self.peer) = None;
        // Dropping the service closes the transport, which kills the child.
        slot.take();
    }
}

#[async_trait]
impl ToolSource for McpSource {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        let mut slot = self.connection.lock().await;
        let listed = tokio::time::timeout(self.list_timeout, self.connect_and_list(&mut slot))
            .await
            .unwrap_or_else(|_| {
                let err = ToolError::Unavailable(format!(
                    "no tool list within {}",
                    super::hooks::show_duration(self.list_timeout)
                ));
                // A hung server is not asked again at once either.
                *lock(&self.last_failure) = Some((tokio::time::Instant::now(), err.clone()));
                Err(err)
            });
        match listed {
            Ok(tools) => Ok(tools.into_iter().map(spec).collect()),
            Err(err) => {
                self.disconnect(&mut slot);
                Err(err)
            }
        }
    }

    async fn call(&self, name: &str, arguments_json: &str) -> ToolOutcome {
        self.call_as("", name, arguments_json).await
    }

    /// The call carries its id in `_meta` ([`CALL_ID_META`]), for a server
    /// that deduplicates retried calls.
    async fn call_as(&self, call_id: &str, name: &str, arguments_json: &str) -> ToolOutcome {
        let peer = lock(&self.peer).clone();
        let Some(peer) = peer.filter(|p| !p.is_transport_closed()) else {
            return ToolOutcome::error(format!(
                "the MCP server {:?} is not connected; the call was not made",
                self.name
            ));
        };
        let arguments = if arguments_json.trim().is_empty() {
            serde_json::Map::new()
        } else {
            match serde_json::from_str::<serde_json::Value>(arguments_json) {
                Ok(serde_json::Value::Object(map)) => map,
                _ => {
                    return ToolOutcome::error("the tool arguments must be a JSON object");
                }
            }
        };
        let mut request = CallToolRequestParams::new(name.to_owned()).with_arguments(arguments);
        if !call_id.is_empty() {
            let mut meta = MetaObject::new();
            meta.0.insert(CALL_ID_META.to_owned(), call_id.into());
            request.meta = Some(RequestMetaObject(meta));
        }
        match peer.call_tool(request).await {
            Ok(result) => {
                if let Some(workspace) = &self.workspace {
                    report_links(workspace, &result);
                }
                render(result)
            }
            Err(ServiceError::McpError(e)) => ToolOutcome::error(format!(
                "the MCP server {:?} returned an error: {}",
                self.name, e.message
            )),
            Err(ServiceError::TransportClosed | ServiceError::TransportSend(_)) => {
                ToolOutcome::error(format!(
                    "the MCP server {:?} closed the connection (it may have crashed) before answering",
                    self.name
                ))
            }
            Err(other) => ToolOutcome::error(format!(
                "the call to the MCP server {:?} failed: {other}",
                self.name
            )),
        }
    }

    fn needs_refresh(&self) -> bool {
        lock(&self.peer)
            .as_ref()
            .is_none_or(|p| p.is_transport_closed())
    }

    async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let connection = self.connection.lock().await.take();
        *lock(&self.peer) = None;
        if let Some(mut connection) = connection {
            // Stdin closed, the server exits on its own; one that does not
            // within the stop timeout is killed (not yet reaped: rmcp
            // still waits for it, so its pid is still its own).
            let closed = connection
                .service
                .close_with_timeout(self.stop_timeout)
                .await;
            if !matches!(closed, Ok(Some(_)))
                && let Some(process) = &connection.process
            {
                tracing::warn!(server = %self.name, pid = process.pid,
                    "MCP server did not exit when closed; killed");
                process.kill();
            }
        }
    }
}

/// Reports the workspace files `result` links to (`resource_link`).
fn report_links(workspace: &Workspace, result: &CallToolResult) {
    for block in &result.content {
        if let ContentBlock::ResourceLink(link) = block {
            workspace.report(&link.uri, &link.name, link.mime_type.as_deref());
        }
    }
}

/// A session-scoped MCP server: a stdio server started per session, in
/// the session's workspace (see [`super::session`]).
#[derive(Debug, Clone)]
pub struct McpSessionFactory {
    name: String,
    target: McpTarget,
    sandbox: Option<(Launcher, Limits)>,
    stop_timeout: Duration,
}

impl McpSessionFactory {
    /// Instances of the server `name` at `target` (a stdio target: an HTTP
    /// server has no working directory of ours). A session's process is
    /// given a 500 ms stop timeout, so that evicting its runner stops it
    /// within a second.
    pub fn new(name: impl Into<String>, target: McpTarget) -> Self {
        Self {
            name: name.into(),
            target,
            sandbox: None,
            stop_timeout: Duration::from_millis(500),
        }
    }

    /// Starts each instance through `launcher` under `limits`.
    pub fn with_sandbox(mut self, launcher: Launcher, limits: Limits) -> Self {
        self.sandbox = Some((launcher, limits));
        self
    }

    /// Changes how long an instance may take to exit when closed before it
    /// is killed (default 500 ms).
    pub fn with_stop_timeout(mut self, timeout: Duration) -> Self {
        self.stop_timeout = timeout;
        self
    }
}

impl SessionSourceFactory for McpSessionFactory {
    fn source(&self, workspace: &Workspace) -> Arc<dyn ToolSource> {
        let mut source = McpSource::new(self.name.clone(), self.target.clone())
            .with_stop_timeout(self.stop_timeout)
            .in_workspace(workspace.clone());
        if let Some((launcher, limits)) = &self.sandbox {
            source = source.with_sandbox(launcher.clone(), limits.clone());
        }
        Arc::new(source)
    }
}

fn spec(tool: rmcp::model::Tool) -> ToolSpec {
    ToolSpec {
        name: tool.name.into_owned(),
        description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
        parameters: serde_json::Value::Object((*tool.input_schema).clone()),
    }
}

/// Joins the text parts (and embedded text resources); images, audio and
/// embedded binary resources become [`ToolMedia::Bytes`] (stored as blobs by
/// the turn), resource links [`ToolMedia::Link`]s.
pub(crate) fn render(result: CallToolResult) -> ToolOutcome {
    use base64::Engine as _;
    let decode = |data: &str| {
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .ok()
            .map(bytes::Bytes::from)
    };
    let mut parts = Vec::with_capacity(result.content.len());
    let mut media = Vec::new();
    for block in &result.content {
        let (kind, data, mime_type, uri) = match block {
            ContentBlock::Text(t) => {
                parts.push(t.text.clone());
                continue;
            }
            ContentBlock::Image(i) => (MediaKind::Image, &i.data, &i.mime_type, ""),
            ContentBlock::Audio(a) => (MediaKind::File, &a.data, &a.mime_type, ""),
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents { text, .. } => {
                    parts.push(text.clone());
                    continue;
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let mime = mime_type.as_deref().unwrap_or("application/octet-stream");
                    let kind = if mime.starts_with("image/") {
                        MediaKind::Image
                    } else {
                        MediaKind::File
                    };
                    match decode(blob) {
                        Some(data) => media.push(ToolMedia::Bytes {
                            kind,
                            data,
                            mime_type: mime.to_owned(),
                            name: file_name(uri),
                            uri: uri.clone(),
                        }),
                        None => parts.push(format!("[resource {uri}: not valid base64]")),
                    }
                    continue;
                }
                // A kind of resource newer than this SDK (non-exhaustive).
                _ => {
                    parts.push("[resource]".to_owned());
                    continue;
                }
            },
            ContentBlock::ResourceLink(link) => {
                media.push(ToolMedia::Link {
                    uri: link.uri.clone(),
                    name: link.title.clone().unwrap_or_else(|| link.name.clone()),
                    description: link.description.clone().unwrap_or_default(),
                    mime_type: link.mime_type.clone().unwrap_or_default(),
                });
                continue;
            }
            // A kind of content newer than this SDK (non-exhaustive).
            _ => {
                parts.push("[content]".to_owned());
                continue;
            }
        };
        match decode(data) {
            Some(data) => media.push(ToolMedia::Bytes {
                kind,
                data,
                mime_type: mime_type.clone(),
                name: String::new(),
                uri: uri.to_owned(),
            }),
            None => parts.push(format!("[{mime_type} content: not valid base64]")),
        }
    }
    if parts.is_empty()
        && let Some(structured) = &result.structured_content
    {
        parts.push(structured.to_string());
    }
    ToolOutcome {
        content: parts.join("\n"),
        is_error: result.is_error.unwrap_or(false),
        media,
    }
}

/// The last path segment of `uri` (a name for a download), or "".
fn file_name(uri: &str) -> String {
    let path = uri.split(['?', '#']).next().unwrap_or("");
    path.rsplit('/').next().unwrap_or("").to_owned()
}
