//! The config's `[[agents]]` into the store: at start-up, and again on
//! SIGHUP (the config file read anew). A file that no longer parses, or an
//! agent that does not check, is logged and changes nothing; turns admitted
//! after a reload use the new versions, turns in flight keep theirs.

use std::path::PathBuf;

use agentrt_runtime::Runtime;
use tokio_util::task::AbortOnDropHandle;

use crate::config::{Config, agent_specs};

/// Reads `path` and syncs its agents; what went wrong, for the log.
async fn reload(runtime: &Runtime, path: &PathBuf) -> Result<usize, String> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let config = Config::parse_toml(&text).map_err(|e| e.0)?;
    let specs = agent_specs(&config.agents).map_err(|e| e.0)?;
    runtime
        .sync_config_agents(&specs)
        .await
        .map_err(|e| e.to_string())
}

/// Listens for SIGHUP and reloads the agents of `path`; the task ends when
/// the handle is dropped.
#[cfg(unix)]
pub(crate) fn on_sighup(runtime: Runtime, path: PathBuf) -> Option<AbortOnDropHandle<()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGHUP; agents are not reloaded");
            return None;
        }
    };
    Some(AbortOnDropHandle::new(tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match reload(&runtime, &path).await {
                Ok(changed) => tracing::info!(changed, "agents reloaded from the config file"),
                Err(why) => {
                    tracing::error!(error = %why, "agents not reloaded; the previous ones stay");
                }
            }
        }
    })))
}

#[cfg(not(unix))]
pub(crate) fn on_sighup(_: Runtime, _: PathBuf) -> Option<AbortOnDropHandle<()>> {
    None
}
