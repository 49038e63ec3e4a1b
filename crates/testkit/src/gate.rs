//! A [`ModelProvider`] whose reply the test releases: a turn that stays live
//! (admitted, first text relayed, not finished) for exactly as long as the
//! test needs — to stop it, watch it, reload certificates or drain the
//! server under it — with no sleeps.
//!
//! Register it under a provider name (`gate`, say) and chat with
//! `gate/<any model>`. Each step streams `"gated "`, then waits for a
//! permit, then streams `"answer"` and finishes with `stop`;
//! [`GateProvider::release`] hands out permits, one per step.

use std::sync::Arc;

use agentrt_runtime::model::{ModelError, ModelEvent, ModelProvider, ModelRequest, ModelStream};
use agentrt_runtime::types::StopReason;
use async_trait::async_trait;
use tokio::sync::Semaphore;

/// The text streamed before the gate.
pub const BEFORE: &str = "gated ";
/// The text streamed once released.
pub const AFTER: &str = "answer";

/// Streams [`BEFORE`], waits for a permit, then [`AFTER`] and finishes.
#[derive(Debug)]
pub struct GateProvider {
    permits: Arc<Semaphore>,
}

impl Default for GateProvider {
    fn default() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(0)),
        }
    }
}

impl GateProvider {
    /// Lets `n` waiting (or future) steps through the gate.
    pub fn release(&self, n: usize) {
        self.permits.add_permits(n);
    }
}

#[async_trait]
impl ModelProvider for GateProvider {
    async fn stream(&self, _request: ModelRequest) -> Result<ModelStream, ModelError> {
        let permits = Arc::clone(&self.permits);
        let stream = futures::stream::unfold(0u8, move |step| {
            let permits = Arc::clone(&permits);
            async move {
                let item = match step {
                    0 => ModelEvent::TextDelta(BEFORE.into()),
                    1 => {
                        permits.acquire().await.ok()?.forget();
                        ModelEvent::TextDelta(AFTER.into())
                    }
                    2 => ModelEvent::Finished(StopReason::Stop),
                    _ => return None,
                };
                Some((Ok(item), step + 1))
            }
        });
        Ok(Box::pin(stream))
    }
}
