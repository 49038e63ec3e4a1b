//! Server-side tools: the [`ToolSource`] trait (MCP servers, test fakes),
//! the [`Toolbox`] registry that namespaces their tools as `source__tool`
//! and routes calls back by that prefix, and the policy hooks every call
//! goes through ([`hooks`]).
//!
//! - [`mcp`]: MCP servers (stdio child processes, streamable HTTP) with the
//!   official SDK.
//! - [`hooks`]: the [`ToolHook`] trait and the config-driven [`ToolPolicy`].
//! - [`session`]: session-scoped sources — one instance (process) per
//!   session, in its own [`workspace`], owned by the session's runner.
//! - [`sandbox`]: the limits a stdio tool server is started under.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::model::ToolSpec;
use crate::types::MediaKind;

pub mod hooks;
pub mod mcp;
pub mod sandbox;
pub mod session;
pub mod workspace;

pub use hooks::{HookDecision, ToolCallInfo, ToolHook, ToolKind, ToolPolicy};
pub use session::{SessionSourceFactory, SessionTools, WorkspaceSettings};
pub use workspace::{BlobExporter, ExportLimits, Workspace, WorkspaceExporter, WorkspaceFile};

/// Separates a source's name from its tool's name in the names the model
/// sees: `search__web` is tool `web` of source `search`.
pub const SEPARATOR: &str = "__";

/// The result of one tool call, as the model will see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutcome {
    /// The result text.
    pub content: String,
    /// Whether the call failed (the model is told so).
    pub is_error: bool,
    /// Images, files and links the result carried: the turn stores the
    /// bytes as blobs of the session's owner, shows them as `image` /
    /// `file` / `references` events and gives the model what it can read.
    pub media: Vec<ToolMedia>,
}

/// Media a tool's result carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMedia {
    /// Bytes: an image, audio, an embedded resource.
    Bytes {
        /// Image or file.
        kind: MediaKind,
        /// The bytes.
        data: bytes::Bytes,
        /// Their media type.
        mime_type: String,
        /// A file name (may be empty).
        name: String,
        /// Where the tool said they come from (may be empty).
        uri: String,
    },
    /// A blob of the session (uploaded by the caller) by reference.
    Blob(crate::types::MediaRef),
    /// A link to a resource.
    Link {
        /// Where it is.
        uri: String,
        /// Its name or title.
        name: String,
        /// A short description.
        description: String,
        /// Its media type, when the tool said.
        mime_type: String,
    },
}

impl ToolOutcome {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: false,
            media: Vec::new(),
        }
    }

    /// A failed call, with a message for the model.
    pub fn error(content: impl Into<String>) -> Self {
        Self {
            content: content.into(),
            is_error: true,
            media: Vec::new(),
        }
    }
}

/// Why a source could not list its tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The source could not be reached or started.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The source answered something unusable.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A source was registered under an unusable or duplicate name.
    #[error("invalid tool source name {0:?}: {1}")]
    InvalidName(String, &'static str),
}

/// A provider of server-executed tools.
#[async_trait]
pub trait ToolSource: Send + Sync + fmt::Debug {
    /// The tools offered now, with names *without* the namespace prefix.
    /// Called when a session's runner is built; a source that lost its
    /// connection reconnects here.
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError>;

    /// Runs tool `name` (without the prefix). Failures are error outcomes.
    /// Dropping the future cancels the call.
    async fn call(&self, name: &str, arguments_json: &str) -> ToolOutcome;

    /// [`ToolSource::call`] for the turn's tool call `call_id` (the model's
    /// id of it): a source that can hand the id to the tool — as an
    /// idempotency key, so a tool that sees a call again can recognise it —
    /// does (MCP: `_meta`); the others ignore it.
    async fn call_as(&self, call_id: &str, name: &str, arguments_json: &str) -> ToolOutcome {
        let _ = call_id;
        self.call(name, arguments_json).await
    }

    /// True when the source knows its last listing is no longer valid (e.g.
    /// its connection is gone): runners are then rebuilt, which lists again.
    fn needs_refresh(&self) -> bool {
        false
    }

    /// Releases the source's resources (child processes, connections).
    async fn close(&self) {}
}

/// Whether `name` can name a source: 1–32 characters of `a-z 0-9 _ -`,
/// without `__` and not ending in `_`, so every `source__` prefix is
/// unambiguous.
pub fn valid_source_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && !name.contains(SEPARATOR)
        && !name.ends_with('_')
}

/// Names the model may call: 1–64 characters of `A-Z a-z 0-9 _ -` (the
/// rule for server tools and for the tools a caller declares).
pub fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

struct Entry {
    name: String,
    prefix: String,
    source: Arc<dyn ToolSource>,
    /// The source's last successful listing, namespaced; `None` while it
    /// is unavailable.
    cached: Mutex<Option<Vec<ToolSpec>>>,
    /// Why the last listing failed (logged once per distinct reason).
    last_error: Mutex<Option<String>>,
}

/// The server tools offered at one moment, and the toolbox generation they
/// belong to.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// Namespaced tools of every available source.
    pub tools: Vec<ToolSpec>,
    /// [`Toolbox::generation`] after this listing.
    pub generation: u64,
}

/// The registry of tool sources, with the hooks and limits every server
/// call goes through.
pub struct Toolbox {
    entries: Vec<Entry>,
    /// Session-scoped sources: an instance per session
    /// ([`Toolbox::session_tools`]).
    session_sources: Vec<(String, Arc<dyn SessionSourceFactory>)>,
    workspaces: Arc<WorkspaceSettings>,
    policy: Arc<ToolPolicy>,
    hooks: Vec<Arc<dyn ToolHook>>,
    /// Bumped whenever a source's listing changes (or it becomes
    /// unavailable), so runners built from an older listing are rebuilt.
    generation: AtomicU64,
}

impl fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toolbox")
            .field(
                "sources",
                &self.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .field(
                "session_sources",
                &self
                    .session_sources
                    .iter()
                    .map(|(n, _)| n)
                    .collect::<Vec<_>>(),
            )
            .field("workspaces", &self.workspaces)
            .field("policy", &self.policy)
            .field("hooks", &self.hooks)
            .finish()
    }
}

impl Default for Toolbox {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            session_sources: Vec::new(),
            workspaces: Arc::default(),
            policy: Arc::new(ToolPolicy::default()),
            hooks: Vec::new(),
            generation: AtomicU64::new(0),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Toolbox {
    /// An empty toolbox with the default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `source`; its tools are offered as `name__tool`.
    pub fn add_source(
        &mut self,
        name: impl Into<String>,
        source: Arc<dyn ToolSource>,
    ) -> Result<(), ToolError> {
        let name = self.new_source_name(name.into())?;
        self.entries.push(Entry {
            prefix: format!("{name}{SEPARATOR}"),
            name,
            source,
            cached: Mutex::new(None),
            last_error: Mutex::new(None),
        });
        Ok(())
    }

    fn new_source_name(&self, name: String) -> Result<String, ToolError> {
        if !valid_source_name(&name) {
            return Err(ToolError::InvalidName(
                name,
                "use 1-32 characters of a-z 0-9 _ -, without \"__\" and not ending in '_'",
            ));
        }
        if self.entries.iter().any(|e| e.name == name)
            || self.session_sources.iter().any(|(n, _)| *n == name)
        {
            return Err(ToolError::InvalidName(name, "registered twice"));
        }
        Ok(name)
    }

    /// Registers a session-scoped source: each session gets its own
    /// instance from `factory` (see [`session`]), its tools offered as
    /// `name__tool`.
    pub fn add_session_source(
        &mut self,
        name: impl Into<String>,
        factory: Arc<dyn SessionSourceFactory>,
    ) -> Result<(), ToolError> {
        let name = self.new_source_name(name.into())?;
        self.session_sources.push((name, factory));
        Ok(())
    }

    /// Sets where session workspaces live and what becomes of their files.
    pub fn set_workspaces(&mut self, settings: WorkspaceSettings) {
        self.workspaces = Arc::new(settings);
    }

    /// Whether any session-scoped source is registered.
    pub fn has_session_sources(&self) -> bool {
        !self.session_sources.is_empty()
    }

    /// New instances of the session-scoped sources for `owner`'s session
    /// `session_id` of `incarnation`, in a new workspace; `None` when there
    /// are none. Nothing starts before [`SessionTools::list`].
    pub fn session_tools(
        &self,
        owner: &str,
        session_id: &str,
        incarnation: &str,
    ) -> Option<SessionTools> {
        self.has_session_sources().then(|| {
            SessionTools::new(
                (owner, session_id, incarnation),
                &self.session_sources,
                Arc::clone(&self.workspaces),
            )
        })
    }

    /// Replaces the policy (deny list, timeouts, result size, parallelism).
    pub fn set_policy(&mut self, policy: ToolPolicy) {
        self.policy = Arc::new(policy);
    }

    /// The policy in force.
    pub fn policy(&self) -> &ToolPolicy {
        &self.policy
    }

    /// Adds a hook; hooks run in the order added, after the policy's
    /// checks (before a call) and before its size limit (after a call).
    pub fn add_hook(&mut self, hook: Arc<dyn ToolHook>) {
        self.hooks.push(hook);
    }

    /// Whether no source (global or session-scoped) is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.session_sources.is_empty()
    }

    /// The registered source names (global, then session-scoped).
    pub fn source_names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .map(|e| e.name.as_str())
            .chain(self.session_sources.iter().map(|(n, _)| n.as_str()))
            .collect()
    }

    /// The current generation (see [`Listing::generation`]).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether a listing of `generation` should be refreshed.
    pub fn is_stale(&self, generation: u64) -> bool {
        generation != self.generation() || self.entries.iter().any(|e| e.source.needs_refresh())
    }

    /// Asks every source (concurrently) for its tools and caches the
    /// answers. A source that fails is logged and its tools are absent.
    pub async fn list(&self) -> Listing {
        let answers = futures::future::join_all(self.entries.iter().map(|e| e.source.list())).await;
        let mut tools = Vec::new();
        for (entry, answer) in self.entries.iter().zip(answers) {
            let listed = match answer {
                Ok(listed) => {
                    *lock(&entry.last_error) = None;
                    Some(namespaced(&entry.name, &entry.prefix, listed))
                }
                Err(err) => {
                    let why = err.to_string();
                    if lock(&entry.last_error).replace(why.clone()).as_ref() != Some(&why) {
                        tracing::warn!(source = %entry.name, error = %why, "tool source unavailable; its tools are absent until it can be reached");
                    }
                    None
                }
            };
            let mut cached = lock(&entry.cached);
            if *cached != listed {
                if let Some(listed) = &listed {
                    tracing::info!(source = %entry.name, tools = listed.len(), "tool source listed");
                }
                *cached = listed;
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            tools.extend(cached.iter().flatten().cloned());
        }
        Listing {
            tools,
            generation: self.generation(),
        }
    }

    /// The sources whose last listing failed (or that were never listed).
    pub fn unavailable(&self) -> Vec<&str> {
        self.entries
            .iter()
            .filter(|e| lock(&e.cached).is_none())
            .map(|e| e.name.as_str())
            .collect()
    }

    /// The last listing of every available source, without asking them.
    pub fn cached(&self) -> Vec<ToolSpec> {
        self.entries
            .iter()
            .flat_map(|e| lock(&e.cached).clone().unwrap_or_default())
            .collect()
    }

    /// Routes a namespaced call to its source, without hooks or limits.
    pub async fn call(&self, name: &str, arguments_json: &str) -> ToolOutcome {
        self.call_as("", name, arguments_json).await
    }

    /// [`Toolbox::call`] for the turn's tool call `call_id` (see
    /// [`ToolSource::call_as`]).
    pub async fn call_as(&self, call_id: &str, name: &str, arguments_json: &str) -> ToolOutcome {
        self.call_in(None, call_id, name, arguments_json).await
    }

    /// [`Toolbox::call_as`] where the session's own sources (`session`)
    /// are reachable too.
    pub async fn call_in(
        &self,
        session: Option<&SessionTools>,
        call_id: &str,
        name: &str,
        arguments_json: &str,
    ) -> ToolOutcome {
        if let Some(session) = session
            && let Some(outcome) = session.call_as(call_id, name, arguments_json).await
        {
            return outcome;
        }
        let routed = self
            .entries
            .iter()
            .find_map(|e| name.strip_prefix(&e.prefix).map(|tool| (e, tool)));
        match routed {
            Some((entry, tool)) if !tool.is_empty() => {
                entry.source.call_as(call_id, tool, arguments_json).await
            }
            _ => ToolOutcome::error(format!("unknown tool {name:?}")),
        }
    }

    /// Runs the before-call hooks: the arguments to use, or the outcome of
    /// a denied call.
    pub async fn before(&self, call: ToolCallInfo<'_>) -> Result<String, ToolOutcome> {
        let mut arguments = call.arguments_json.to_owned();
        let policy: &dyn ToolHook = self.policy.as_ref();
        for hook in std::iter::once(policy).chain(self.hooks.iter().map(|h| h.as_ref())) {
            let current = ToolCallInfo {
                arguments_json: &arguments,
                ..call
            };
            match hook.before_call(&current).await {
                HookDecision::Allow => {}
                HookDecision::Deny(reason) => return Err(ToolOutcome::error(reason)),
                HookDecision::Rewrite(rewritten) => arguments = rewritten,
            }
        }
        Ok(arguments)
    }

    /// Runs the after-call hooks (observe, redact), then the size limit.
    pub async fn after(&self, call: ToolCallInfo<'_>, mut outcome: ToolOutcome) -> ToolOutcome {
        for hook in &self.hooks {
            hook.after_call(&call, &mut outcome).await;
        }
        self.policy.after_call(&call, &mut outcome).await;
        outcome
    }

    /// Runs one server tool call through the whole pipeline: hooks before,
    /// one of `permits` (the parallelism limit), the per-tool timeout, hooks
    /// after. `started` is set once the tool is called (a call dropped
    /// before then never reached it). Dropping the future cancels the call.
    pub async fn run(
        &self,
        call: ToolCallInfo<'_>,
        permits: &Semaphore,
        started: &std::sync::atomic::AtomicBool,
    ) -> ToolOutcome {
        self.run_in(None, call, permits, started).await
    }

    /// [`Toolbox::run`] where the session's own sources (`session`) are
    /// reachable too.
    pub async fn run_in(
        &self,
        session: Option<&SessionTools>,
        call: ToolCallInfo<'_>,
        permits: &Semaphore,
        started: &std::sync::atomic::AtomicBool,
    ) -> ToolOutcome {
        let outcome = match self.before(call).await {
            Err(denied) => denied,
            Ok(arguments) => {
                let _permit = permits.acquire().await;
                let limit = self.policy.timeout_for(call.name);
                started.store(true, std::sync::atomic::Ordering::Release);
                let called = self.call_in(session, call.call_id, call.name, &arguments);
                match tokio::time::timeout(limit, called).await {
                    Ok(outcome) => outcome,
                    Err(_) => ToolOutcome::error(format!(
                        "the tool call timed out after {}",
                        hooks::show_duration(limit)
                    )),
                }
            }
        };
        self.after(call, outcome).await
    }

    /// A semaphore sized for one step's parallel calls.
    pub fn permits(&self) -> Semaphore {
        Semaphore::new(self.policy.max_parallel.max(1))
    }

    /// Closes every global source (child processes are stopped); session
    /// sources close with their session's runner.
    pub async fn close(&self) {
        futures::future::join_all(self.entries.iter().map(|e| e.source.close())).await;
    }
}

/// `listed` under `prefix` (`source__`), skipping unusable and repeated
/// names.
fn namespaced(source: &str, prefix: &str, listed: Vec<ToolSpec>) -> Vec<ToolSpec> {
    let mut seen = BTreeSet::new();
    listed
        .into_iter()
        .filter_map(|tool| {
            let name = format!("{prefix}{}", tool.name);
            if !valid_tool_name(&name) || !seen.insert(name.clone()) {
                tracing::warn!(source, tool = %tool.name, "skipping a tool whose name is unusable or repeated");
                return None;
            }
            Some(ToolSpec { name, ..tool })
        })
        .collect()
}

#[cfg(test)]
mod tests;
