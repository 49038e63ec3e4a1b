//! [`LocalProvider`]: the `local` provider, serving one model (`smollm2`)
//! from a GGUF file loaded once at start-up.

use std::sync::Arc;

use agentrt_runtime::model::{
    ModelError, ModelProvider, ModelRequest, ModelStream, NoCapacity, Reservation,
};
use async_trait::async_trait;

use crate::engine::{Engine, Job, SamplingParams, Slot, SubmitError};
use crate::load::{LoadError, LoadedModel};
use crate::{LocalModelConfig, MODEL};

/// Events buffered between the inference thread and the turn. A turn that
/// stops reading makes the thread wait (and a dropped stream ends the job).
const EVENT_BUFFER: usize = 64;

/// The local model provider. Cheap to share (`Arc` it once); the weights
/// are loaded once and every turn clones them with its own KV cache.
#[derive(Debug)]
pub struct LocalProvider {
    engine: Engine,
    config: LocalModelConfig,
}

/// Why the provider could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The model file could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The inference thread could not be spawned.
    #[error("cannot start the local model's inference thread: {0}")]
    Thread(#[from] std::io::Error),
}

impl LocalProvider {
    /// Loads `config.path` (writing its Q8_0 cache on first use) and starts
    /// the inference threads. Blocks for about half a second: call it from
    /// a blocking context.
    pub fn load(config: LocalModelConfig) -> Result<Self, StartError> {
        let model = crate::load::load(&config.path)?;
        Self::with_model(Arc::new(model), config)
    }

    /// Serves an already loaded model (tests share one between providers).
    pub fn with_model(
        model: Arc<LoadedModel>,
        config: LocalModelConfig,
    ) -> Result<Self, StartError> {
        let engine = Engine::start(model, config.threads, config.queue_depth)?;
        Ok(Self { engine, config })
    }

    /// The loaded model.
    pub fn model(&self) -> &Arc<LoadedModel> {
        self.engine.model()
    }

    /// The configuration in use.
    pub fn config(&self) -> &LocalModelConfig {
        &self.config
    }

    /// Turns running or waiting for an inference thread.
    pub fn in_flight(&self) -> usize {
        self.engine.in_flight()
    }
}

#[async_trait]
impl ModelProvider for LocalProvider {
    async fn stream(&self, mut request: ModelRequest) -> Result<ModelStream, ModelError> {
        // The slot admission reserved for this step, if it did.
        let slot = request
            .reservation
            .take()
            .and_then(Reservation::slot::<Slot>);
        if !request.tools.is_empty() && !self.config.allow_without_tools {
            // Admission rejects such turns (supports_tools is false); this
            // guards direct callers of the provider.
            return Err(ModelError::Rejected(format!(
                "model {}/{MODEL} cannot call tools",
                crate::PROVIDER
            )));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(EVENT_BUFFER);
        let job = Job {
            system: request.system_prompt.clone(),
            messages: crate::prompt::chat_messages(&request),
            sampling: SamplingParams {
                temperature: self.config.temperature,
                top_p: self.config.top_p,
                seed: self.config.seed,
                max_tokens: request
                    .max_output_tokens
                    .map_or(self.config.max_tokens, |n| n as usize),
            },
            events: tx,
            slot,
        };
        match self.engine.submit(job) {
            Ok(()) => Ok(Box::pin(tokio_stream_from(rx))),
            Err(e @ SubmitError::Busy(_)) => Err(ModelError::RateLimited(e.to_string())),
            Err(e @ SubmitError::Stopped) => Err(ModelError::Unavailable(e.to_string())),
        }
    }

    fn serves(&self, model: &str) -> bool {
        model == MODEL
    }

    fn supports_tools(&self, _model: &str) -> bool {
        // With the opt-in the turn runs and the tools are not shown to the
        // model (it cannot call them).
        self.config.allow_without_tools
    }

    fn has_capacity(&self, _model: &str) -> bool {
        self.engine.has_capacity()
    }

    /// A slot of the inference queue, taken atomically, so a burst of turns
    /// never admits more than the queue holds.
    fn reserve(&self, _model: &str) -> Result<Option<Reservation>, NoCapacity> {
        match self.engine.reserve() {
            Ok(slot) => Ok(Some(Reservation::new(slot))),
            Err(_) => Err(NoCapacity),
        }
    }

    /// The model's context window: no step can generate more.
    fn max_output_tokens_limit(&self, _model: &str) -> Option<u32> {
        Some(u32::try_from(self.model().context_length).unwrap_or(u32::MAX))
    }
}

/// The receiver as a stream; dropping the stream drops the receiver, which
/// the inference thread notices before its next token.
fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
