//! The inference engine: dedicated OS threads (one by default) fed through
//! a bounded queue, so CPU-heavy generation never runs on tokio's workers.
//!
//! - Capacity is `threads + queue_depth` [`Slot`]s. Admission takes one with
//!   [`Engine::reserve`] before the turn stores anything, and the job
//!   carries it until it is done; [`Engine::submit`] takes one itself for a
//!   job without. Either refuses when every slot is taken — the caller gets
//!   an error now instead of an unbounded wait — and a slot is given back
//!   when it is dropped, whether or not its job ever ran.
//! - Each job clones the shared weights (the tensors are reference-counted;
//!   the clone only gets its own, empty KV cache).
//! - Output goes to the job's bounded tokio channel. After every token (and
//!   every prefill chunk) the loop checks whether the receiver was dropped —
//!   which is how Stop, the turn deadline and a client disconnect reach it —
//!   and then ends the job, so cancellation takes at most one token.
//! - Text deltas come from the tokenizer's decode stream: every delta is
//!   whole UTF-8, and control tokens are never shown.
//! - Usage is exact and sent as it grows: the prompt's tokens once the
//!   prefill is done, then the count so far with every text delta, so a
//!   step stopped mid-generation still reports what it used.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, Mutex};

use agentrt_runtime::model::{ModelError, ModelEvent};
use agentrt_runtime::types::{StopReason, Usage};
use candle_core::{Device, Tensor};
use candle_transformers::generation::{LogitsProcessor, Sampling};
use tokio::sync::mpsc;

use crate::load::LoadedModel;
use crate::prompt::{self, ChatMessage};

/// Prompt tokens run through the model at once; cancellation is checked
/// between chunks, so a long prompt stops quickly too.
const PREFILL_CHUNK: usize = 64;

/// How one job samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy.
    pub temperature: f64,
    /// Nucleus cut-off when sampling.
    pub top_p: f64,
    /// Sampler seed.
    pub seed: u64,
    /// Most generated tokens.
    pub max_tokens: usize,
}

/// One model step to run.
#[derive(Debug)]
pub struct Job {
    /// The system prompt, if any (the model's default otherwise).
    pub system: Option<String>,
    /// The conversation in ChatML roles.
    pub messages: Vec<ChatMessage>,
    /// How to sample.
    pub sampling: SamplingParams,
    /// Where the events go; dropping the receiver cancels the job.
    pub events: mpsc::Sender<Result<ModelEvent, ModelError>>,
    /// The job's share of the engine's capacity, reserved at admission
    /// ([`Engine::reserve`]); `None` takes one at [`Engine::submit`].
    pub slot: Option<Arc<Slot>>,
}

/// One unit of the engine's capacity (`threads + queue_depth` of them),
/// given back when dropped.
#[derive(Debug)]
pub struct Slot {
    taken: Arc<AtomicUsize>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Why a job was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Every thread is busy and the queue is full.
    #[error("the local model is busy: {0} turns are running or queued")]
    Busy(usize),
    /// The inference threads are gone.
    #[error("the local model's inference threads have stopped")]
    Stopped,
}

/// The inference threads and their queue. Dropping the engine closes the
/// queue; the threads finish their current job and exit.
#[derive(Debug)]
pub struct Engine {
    queue: SyncSender<Job>,
    accepted: Arc<AtomicUsize>,
    capacity: usize,
    model: Arc<LoadedModel>,
}

impl Engine {
    /// Starts `threads` inference threads over `model`, with room for
    /// `queue_depth` waiting jobs.
    pub fn start(
        model: Arc<LoadedModel>,
        threads: usize,
        queue_depth: usize,
    ) -> std::io::Result<Self> {
        let threads = threads.max(1);
        let capacity = threads + queue_depth;
        let (queue, rx) = sync_channel::<Job>(capacity);
        let rx = Arc::new(Mutex::new(rx));
        let accepted = Arc::new(AtomicUsize::new(0));
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            let model = Arc::clone(&model);
            std::thread::Builder::new()
                .name(format!("local-model-{i}"))
                .spawn(move || worker(&rx, &model))?;
        }
        Ok(Self {
            queue,
            accepted,
            capacity,
            model,
        })
    }

    /// The model the threads run.
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// Whether a job submitted now would be accepted.
    pub fn has_capacity(&self) -> bool {
        self.accepted.load(Ordering::Acquire) < self.capacity
    }

    /// Jobs running or waiting.
    pub fn in_flight(&self) -> usize {
        self.accepted.load(Ordering::Acquire)
    }

    /// Takes one slot of capacity, atomically: `Busy` when all
    /// `threads + queue_depth` are taken (by running, queued or reserved
    /// jobs).
    pub fn reserve(&self) -> Result<Slot, SubmitError> {
        let before = self.accepted.fetch_add(1, Ordering::AcqRel);
        // From here the slot gives itself back if it is not kept.
        let slot = Slot {
            taken: Arc::clone(&self.accepted),
        };
        if before >= self.capacity {
            return Err(SubmitError::Busy(before));
        }
        Ok(slot)
    }

    /// Queues `job` with its reserved slot, or with one taken now (refused
    /// when the engine is full).
    pub fn submit(&self, mut job: Job) -> Result<(), SubmitError> {
        if job.slot.is_none() {
            job.slot = Some(Arc::new(self.reserve()?));
        }
        // At most `capacity` slots exist, so the queue (of that size)
        // cannot be full; a failure drops the job and with it the slot.
        self.queue.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => SubmitError::Busy(self.capacity),
            TrySendError::Disconnected(_) => SubmitError::Stopped,
        })
    }
}

fn worker(rx: &Mutex<Receiver<Job>>, model: &LoadedModel) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        let Ok(job) = job else { return };
        // The job's slot is given back when the job is dropped, however it
        // ends.
        if job.events.is_closed() {
            continue;
        }
        let events = job.events.clone();
        // A panic inside candle must not take the thread (and with it the
        // whole local model) down: the job fails, the thread goes on.
        let outcome =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| generate(model, job)));
        let failure = match outcome {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e,
            Err(_) => "inference panicked".to_owned(),
        };
        tracing::error!(error = %failure, "local model step failed");
        let _ = events.blocking_send(Err(ModelError::Unavailable(format!(
            "local model inference failed: {failure}"
        ))));
    }
}

/// What the loop should do after sending.
enum Flow {
    Go,
    Cancelled,
}

fn send(events: &mpsc::Sender<Result<ModelEvent, ModelError>>, event: ModelEvent) -> Flow {
    match events.blocking_send(Ok(event)) {
        Ok(()) if !events.is_closed() => Flow::Go,
        _ => Flow::Cancelled,
    }
}

fn sampler(p: SamplingParams) -> LogitsProcessor {
    let sampling = if p.temperature <= 1e-7 {
        Sampling::ArgMax
    } else if p.top_p > 0.0 && p.top_p < 1.0 {
        Sampling::TopP {
            p: p.top_p,
            temperature: p.temperature,
        }
    } else {
        Sampling::All {
            temperature: p.temperature,
        }
    };
    LogitsProcessor::from_sampling(p.seed, sampling)
}

/// Runs one job to its end: finished, cancelled (receiver dropped), or an
/// error (returned).
fn generate(model: &LoadedModel, job: Job) -> Result<(), String> {
    let events = job.events;
    let max_tokens = job
        .sampling
        .max_tokens
        .clamp(1, model.context_length.saturating_sub(16).max(1));
    let prompt = prompt::build(model, job.system.as_deref(), &job.messages, max_tokens)
        .map_err(|e| e.to_string())?;
    if prompt.dropped_messages > 0 {
        tracing::info!(
            dropped = prompt.dropped_messages,
            "oldest messages left out to fit the local model's context"
        );
    }
    let err = |e: candle_core::Error| e.to_string();
    let mut weights = model.weights.clone();
    let mut logits = None;
    for (i, chunk) in prompt.ids.chunks(PREFILL_CHUNK).enumerate() {
        if events.is_closed() {
            return Ok(());
        }
        let input = Tensor::new(chunk, &Device::Cpu)
            .and_then(|t| t.unsqueeze(0))
            .map_err(err)?;
        logits = Some(
            weights
                .forward(&input, i * PREFILL_CHUNK)
                .map_err(err)?
                .squeeze(0)
                .map_err(err)?,
        );
    }
    let mut logits = logits.ok_or("empty prompt")?;
    let usage = |generated: usize| Usage {
        input_tokens: prompt.ids.len() as u64,
        output_tokens: generated as u64,
        ..Usage::default()
    };
    if let Flow::Cancelled = send(&events, ModelEvent::Usage(usage(0))) {
        return Ok(());
    }
    let mut sampler = sampler(job.sampling);
    let mut decoder = model.tokenizer.decode_stream(true);
    let mut generated = 0usize;
    let stop = loop {
        if events.is_closed() {
            return Ok(());
        }
        let next = sampler.sample(&logits).map_err(err)?;
        if model.stop_ids.contains(&next) {
            break StopReason::Stop;
        }
        generated += 1;
        if let Some(text) = decoder.step(next).map_err(|e| e.to_string())?
            && !text.is_empty()
            && (matches!(send(&events, ModelEvent::TextDelta(text)), Flow::Cancelled)
                || matches!(
                    send(&events, ModelEvent::Usage(usage(generated))),
                    Flow::Cancelled
                ))
        {
            return Ok(());
        }
        if generated >= max_tokens || prompt.ids.len() + generated >= model.context_length {
            break StopReason::Length;
        }
        let input = Tensor::new(&[next], &Device::Cpu)
            .and_then(|t| t.unsqueeze(0))
            .map_err(err)?;
        logits = weights
            .forward(&input, prompt.ids.len() + generated - 1)
            .map_err(err)?
            .squeeze(0)
            .map_err(err)?;
    };
    if let Flow::Go = send(&events, ModelEvent::Usage(usage(generated))) {
        let _ = events.blocking_send(Ok(ModelEvent::Finished(stop)));
    }
    Ok(())
}
