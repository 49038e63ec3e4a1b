//! Server tools for tests, registered with `ServerBuilder::tool_source`.

use std::sync::{Mutex, PoisonError};

use agentrt_runtime::model::ToolSpec;
use agentrt_runtime::toolbox::{ToolError, ToolOutcome, ToolSource};
use async_trait::async_trait;

/// Tool `act` (as `SOURCE__act`): answers "acted" and records the
/// arguments of every call, so a test sees whether (and how often) a call
/// ran.
#[derive(Debug, Default)]
pub struct Recorder(Mutex<Vec<String>>);

impl Recorder {
    /// The arguments of every call so far, in order.
    pub fn calls(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[async_trait]
impl ToolSource for Recorder {
    async fn list(&self) -> Result<Vec<ToolSpec>, ToolError> {
        Ok(vec![ToolSpec {
            name: "act".into(),
            description: "does something with effects".into(),
            parameters: serde_json::json!({"type": "object"}),
        }])
    }

    async fn call(&self, _name: &str, arguments_json: &str) -> ToolOutcome {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(arguments_json.to_owned());
        ToolOutcome::ok("acted")
    }
}

/// The MCP test server (`crates/runtime/examples/mcp_test_server.rs`).
/// `cargo test` builds the workspace's examples next to the test binaries
/// (`target/<profile>/examples`); a run that did not (e.g. `cargo test
/// --test e2e`) builds it here, in the same profile.
pub fn mcp_test_server() -> &'static std::path::Path {
    use std::path::{Path, PathBuf};
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps");
        let name = format!("mcp_test_server{}", std::env::consts::EXE_SUFFIX);
        let path = profile.join("examples").join(name);
        if !path.exists() {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
            let mut build = std::process::Command::new(cargo);
            build.args([
                "build",
                "-p",
                "agentrt-runtime",
                "--example",
                "mcp_test_server",
            ]);
            if profile.file_name().is_some_and(|p| p == "release") {
                build.arg("--release");
            }
            let status = build.status().expect("running cargo build");
            assert!(status.success(), "building the MCP test server failed");
        }
        path
    })
}
