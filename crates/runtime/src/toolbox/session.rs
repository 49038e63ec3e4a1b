//! Session-scoped tool sources: one instance per session (for MCP servers,
//! one child process per session), working in the session's own
//! [`Workspace`], owned by the session's runner and closed with it.
//!
//! [`Toolbox::session_tools`](super::Toolbox::session_tools) makes a
//! session's [`SessionTools`] from every registered
//! [`SessionSourceFactory`]; nothing starts before its first listing (the
//! runner's build). [`SessionTools::close`] stops the sources (bounded by
//! each source's own stop timeout), exports the files they reported
//! (bounded by [`ExportLimits`]) and removes the workspace directory.
//!
//! A workspace is `<root>/<sha256(owner)>/<sha256(session id)>/<instance>`:
//! caller-chosen ids never become path components, and an instance closing
//! (removing its directory) never touches the next one of the same session.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::workspace::{ExportLimits, Workspace, WorkspaceExporter};
use super::{SEPARATOR, ToolOutcome, ToolSource};
use crate::model::ToolSpec;

/// Makes a session's instance of a session-scoped tool source.
pub trait SessionSourceFactory: Send + Sync + fmt::Debug {
    /// The source of one session, working in `workspace`. It must start
    /// nothing before its first [`ToolSource::list`], report the files it
    /// returns links to ([`Workspace::report`]) and stop everything it
    /// started in [`ToolSource::close`] (and when dropped).
    fn source(&self, workspace: &Workspace) -> Arc<dyn ToolSource>;
}

/// Where session workspaces are made and what becomes of their files.
#[derive(Debug, Clone)]
pub struct WorkspaceSettings {
    /// The directory workspaces are made under (see the module docs).
    /// Default: `agentrt-workspaces` in the system's temporary directory
    /// (the server uses `<data_dir>/workspaces`).
    pub root: PathBuf,
    /// Keeps the reported files of a closing workspace. Default: none (they
    /// are removed with it).
    pub exporter: Option<Arc<dyn WorkspaceExporter>>,
    /// Bounds of the export.
    pub export: ExportLimits,
}

impl Default for WorkspaceSettings {
    fn default() -> Self {
        Self {
            root: std::env::temp_dir().join("agentrt-workspaces"),
            exporter: None,
            export: ExportLimits::default(),
        }
    }
}

impl WorkspaceSettings {
    /// A new workspace of `owner`'s session `session_id`.
    pub(crate) fn workspace_for(&self, owner: &str, session_id: &str) -> Workspace {
        let dir = self
            .root
            .join(crate::blobs::digest(owner.as_bytes()))
            .join(crate::blobs::digest(session_id.as_bytes()))
            .join(uuid::Uuid::now_v7().simple().to_string());
        Workspace::new(dir, self.export.max_files)
    }
}

#[derive(Debug)]
struct Entry {
    name: String,
    prefix: String,
    source: Arc<dyn ToolSource>,
}

/// One session's instances of the session-scoped sources, in its
/// workspace (see the module docs).
pub struct SessionTools {
    owner: String,
    session_id: String,
    incarnation: String,
    workspace: Workspace,
    entries: Vec<Entry>,
    settings: Arc<WorkspaceSettings>,
    closed: AtomicBool,
}

impl fmt::Debug for SessionTools {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTools")
            .field("session_id", &self.session_id)
            .field("workspace", &self.workspace)
            .field(
                "sources",
                &self.entries.iter().map(|e| &e.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl SessionTools {
    pub(crate) fn new(
        (owner, session_id, incarnation): (&str, &str, &str),
        factories: &[(String, Arc<dyn SessionSourceFactory>)],
        settings: Arc<WorkspaceSettings>,
    ) -> Self {
        let workspace = settings.workspace_for(owner, session_id);
        let entries = factories
            .iter()
            .map(|(name, factory)| Entry {
                name: name.clone(),
                prefix: format!("{name}{SEPARATOR}"),
                source: factory.source(&workspace),
            })
            .collect();
        Self {
            owner: owner.to_owned(),
            session_id: session_id.to_owned(),
            incarnation: incarnation.to_owned(),
            workspace,
            entries,
            settings,
            closed: AtomicBool::new(false),
        }
    }

    /// The session incarnation these tools belong to.
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// The workspace.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Whether [`SessionTools::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Lists every source (starting it when needed), namespaced as
    /// `name__tool`; a source that fails is logged and its tools absent.
    pub async fn list(&self) -> Vec<ToolSpec> {
        if self.is_closed() {
            return Vec::new();
        }
        if let Err(err) = self.workspace.create().await {
            tracing::warn!(dir = %self.workspace.dir().display(), error = %err,
                "cannot create a session's tool workspace; its session-scoped tools are absent");
            return Vec::new();
        }
        let answers = futures::future::join_all(self.entries.iter().map(|e| e.source.list())).await;
        let mut tools = Vec::new();
        for (entry, answer) in self.entries.iter().zip(answers) {
            match answer {
                Ok(listed) => tools.extend(super::namespaced(&entry.name, &entry.prefix, listed)),
                Err(err) => tracing::warn!(source = %entry.name, session_id = %self.session_id,
                    error = %err, "session tool source unavailable; its tools are absent"),
            }
        }
        tools
    }

    /// Whether a source's listing is no longer valid.
    pub fn needs_refresh(&self) -> bool {
        !self.is_closed() && self.entries.iter().any(|e| e.source.needs_refresh())
    }

    /// Runs the namespaced tool `name` when it is one of these sources';
    /// `None` when it is not.
    pub async fn call_as(
        &self,
        call_id: &str,
        name: &str,
        arguments_json: &str,
    ) -> Option<ToolOutcome> {
        let (entry, tool) = self
            .entries
            .iter()
            .find_map(|e| name.strip_prefix(&e.prefix).map(|tool| (e, tool)))?;
        if tool.is_empty() {
            return Some(ToolOutcome::error(format!("unknown tool {name:?}")));
        }
        Some(entry.source.call_as(call_id, tool, arguments_json).await)
    }

    /// Stops the sources, exports the reported files and removes the
    /// workspace (see the module docs). Later calls do nothing.
    pub async fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let started = Instant::now();
        futures::future::join_all(self.entries.iter().map(|e| e.source.close())).await;
        let stopped = started.elapsed();
        self.export().await;
        let dir = self.workspace.dir();
        match tokio::fs::remove_dir_all(dir).await {
            Ok(()) => {
                // The session's and the owner's directories go once empty.
                for parent in dir.ancestors().skip(1).take(2) {
                    if tokio::fs::remove_dir(parent).await.is_err() {
                        break;
                    }
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => tracing::warn!(dir = %dir.display(), error = %err,
                "cannot remove a closed tool workspace"),
        }
        tracing::debug!(session_id = %self.session_id, stopped_ms = stopped.as_millis(),
            total_ms = started.elapsed().as_millis(), "session tools closed");
    }

    async fn export(&self) {
        let Some(exporter) = &self.settings.exporter else {
            return;
        };
        if self.workspace.reported() == 0 {
            return;
        }
        let limits = &self.settings.export;
        let export = async {
            let files = self.workspace.collect(limits).await;
            if !files.is_empty() {
                exporter.export(&self.owner, &self.session_id, files).await;
            }
        };
        if tokio::time::timeout(limits.timeout, export).await.is_err() {
            tracing::warn!(session_id = %self.session_id, timeout = ?limits.timeout,
                "exporting a session's workspace files timed out; the rest are lost");
        }
    }
}

#[cfg(test)]
mod tests;
