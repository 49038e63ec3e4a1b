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
