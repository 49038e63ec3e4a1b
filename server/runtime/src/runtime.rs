//! [`Runtime`]: admission of turns, the live-turn registry (one turn per
//! session), the per-session runner cache, and shutdown. The turn body is in
//! [`crate::runtime::turn`]; session registry calls are in `sessions`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RuntimeError;
use crate::events::TurnEvent;
use crate::hub::{ReplayLimits, TurnHub};
use crate::model::{ModelProvider, Models};
use crate::store::Store;
use crate::types::{
    CancelReason, ContentBlock, NewMessage, Principal, Role, ThinkingLevel, TurnRecord,
    TurnStatus, Usage,
};

mod sessions;
mod stream;
mod turn;

pub use sessions::{HistoryPage, SessionList};
pub use stream::TurnStream;

/// Settings of the runtime core. Every field has a documented default.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `provider/model` used when neither the call nor the session names
    /// one. Default `builtin/echo`.
    pub default_model: String,
    /// Thinking level used when the call names none. Default: none set.
    pub default_thinking: Option<ThinkingLevel>,
    /// Largest accepted user message, summing text and image bytes.
    /// Default 1 MiB.
    pub max_input_bytes: usize,
    /// Events buffered towards a Chat caller before the turn waits for it.
    /// Default 256.
    pub event_buffer: usize,
    /// Replay bounds of each turn's hub.
    pub replay: ReplayLimits,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            default_model: "builtin/echo".to_owned(),
            default_thinking: None,
            max_input_bytes: 1 << 20,
            event_buffer: 256,
            replay: ReplayLimits::default(),
        }
    }
}

/// A turn request, after transport decoding.
#[derive(Debug, Clone, Default)]
pub struct ChatInput {
    /// Target session.
    pub session_id: String,
    /// The user message (text and image blocks).
    pub content: Vec<ContentBlock>,
    /// `provider/model` override.
    pub model: Option<String>,
    /// Thinking override.
    pub thinking: Option<ThinkingLevel>,
    /// System prompt replacing the session's for this call.
    pub system_override: Option<String>,
}

/// The model selection a runner was built with; a turn asking for another
/// one rebuilds the session's runner.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RunnerKey {
    model: String,
    thinking: Option<ThinkingLevel>,
}

/// A session's cached, resolved model selection. A turn keeps the `Arc` it
/// was admitted with, so replacing the cache entry never affects it.
#[derive(Debug)]
pub(crate) struct Runner {
    key: RunnerKey,
    provider: Arc<dyn ModelProvider>,
    provider_model: String,
    last_used: Mutex<Instant>,
}

/// A turn in flight, as seen by admission, stop and watchers.
#[derive(Debug)]
pub(crate) struct LiveTurn {
    pub(crate) turn_id: String,
    pub(crate) hub: Arc<TurnHub>,
    pub(crate) cancel: CancellationToken,
    cancel_reason: Mutex<Option<CancelReason>>,
    /// Cancelled when the turn task has ended (whatever the outcome).
    pub(crate) done: CancellationToken,
}

impl LiveTurn {
    /// Cancels the turn; the first reason wins.
    pub(crate) fn cancel(&self, reason: CancelReason) {
        {
            let mut slot = self.cancel_reason.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(reason);
            }
        }
        self.cancel.cancel();
    }

    pub(crate) fn cancel_reason(&self) -> Option<CancelReason> {
        *self.cancel_reason.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: RuntimeConfig,
    pub(crate) store: Arc<dyn Store>,
    models: Models,
    live: Mutex<HashMap<String, Arc<LiveTurn>>>,
    runners: Mutex<HashMap<String, Arc<Runner>>>,
    tasks: TaskTracker,
    closed: std::sync::atomic::AtomicBool,
    started: Instant,
}

/// The runtime core. Cheap to clone (an `Arc`).
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a few map operations that leave the map
    // consistent even if a panic interrupted a previous holder.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Frees the session's live slot when dropped — on every path out of a turn,
/// panics included.
#[derive(Debug)]
pub(crate) struct BusyGuard {
    inner: Arc<Inner>,
    session_id: String,
    live: Arc<LiveTurn>,
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        let mut live = lock(&self.inner.live);
        if live
            .get(&self.session_id)
            .is_some_and(|l| Arc::ptr_eq(l, &self.live))
        {
            live.remove(&self.session_id);
        }
        drop(live);
        self.live.done.cancel();
    }
}

impl Runtime {
    /// Opens the runtime over `store`: marks turns left running by a previous
    /// process as interrupted, then accepts turns.
    pub async fn open(
        config: RuntimeConfig,
        store: Arc<dyn Store>,
        models: Models,
    ) -> Result<Self, RuntimeError> {
        models
            .resolve(&config.default_model)
            .map_err(|e| RuntimeError::unknown_model("default_model", &e))?;
        let interrupted = store.recover_interrupted().await?;
        for turn in &interrupted {
            tracing::warn!(session_id = %turn.session_id, turn_id = %turn.turn_id, "turn interrupted by a previous shutdown");
        }
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                store,
                models,
                live: Mutex::new(HashMap::new()),
                runners: Mutex::new(HashMap::new()),
                tasks: TaskTracker::new(),
                closed: std::sync::atomic::AtomicBool::new(false),
                started: Instant::now(),
            }),
        })
    }

    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Time since [`Runtime::open`].
    pub fn uptime(&self) -> Duration {
        self.inner.started.elapsed()
    }

    /// Number of live turns.
    pub fn live_turns(&self) -> usize {
        lock(&self.inner.live).len()
    }

    /// Number of cached runners.
    pub fn cached_runners(&self) -> usize {
        lock(&self.inner.runners).len()
    }

    /// Admits and starts a turn. On `Ok` the user message is durable and the
    /// stream's first event is `TurnStarted`; on `Err` nothing was stored.
    pub async fn chat(&self, who: &Principal, input: ChatInput) -> Result<TurnStream, RuntimeError> {
        let inner = &self.inner;
        if inner.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(RuntimeError::Unavailable("the server is shutting down"));
        }
        sessions::validate_session_id("session_id", &input.session_id)?;
        validate_content(&input.content, inner.config.max_input_bytes)?;
        if let Some(system) = &input.system_override {
            if system.len() > inner.config.max_input_bytes {
                return Err(RuntimeError::invalid(
                    "system_override",
                    format!("is longer than {} bytes", inner.config.max_input_bytes),
                ));
            }
        }
        let session = self.owned_session(who, &input.session_id).await?;
        if session.archived {
            return Err(RuntimeError::SessionArchived);
        }
        let (model, model_field) = match input.model.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => (m.to_owned(), "model"),
            None if !session.model.is_empty() => (session.model.clone(), "session.model"),
            None => (inner.config.default_model.clone(), "default_model"),
        };
        let key = RunnerKey {
            model,
            thinking: input.thinking.or(inner.config.default_thinking),
        };
        let runner = self.runner_for(&session.id, key, model_field)?;
        let system_overridden = input.system_override.is_some();
        let system_prompt = input
            .system_override
            .or_else(|| (!session.system_prompt.is_empty()).then(|| session.system_prompt.clone()));

        let turn_id = crate::types::new_id();
        let live = Arc::new(LiveTurn {
            turn_id: turn_id.clone(),
            hub: Arc::new(TurnHub::new(inner.config.replay)),
            cancel: CancellationToken::new(),
            cancel_reason: Mutex::new(None),
            done: CancellationToken::new(),
        });
        let guard = {
            let mut map = lock(&inner.live);
            if let Some(busy) = map.get(&session.id) {
                return Err(RuntimeError::SessionBusy {
                    turn_id: busy.turn_id.clone(),
                });
            }
            map.insert(session.id.clone(), Arc::clone(&live));
            BusyGuard {
                inner: Arc::clone(inner),
                session_id: session.id.clone(),
                live: Arc::clone(&live),
            }
        };

        let record = TurnRecord {
            turn_id: turn_id.clone(),
            session_id: session.id.clone(),
            status: TurnStatus::Running,
            started_at: SystemTime::now(),
            finished_at: None,
            model: runner.key.model.clone(),
            thinking: runner.key.thinking,
            system_overridden,
            usage: Usage::default(),
            user_message_seq: 0,
            error: None,
            cancel_reason: None,
            request_id: None,
        };
        let user_message = NewMessage::new(&turn_id, Role::User, input.content);
        // On failure the guard frees the slot: a rejected admission leaves no
        // trace.
        let stored_user = inner.store.begin_turn(record.clone(), user_message).await?;

        let (tx, rx) = mpsc::channel(inner.config.event_buffer.max(1));
        let turn = turn::Turn {
            inner: Arc::clone(inner),
            live: Arc::clone(&live),
            runner,
            record: TurnRecord {
                user_message_seq: stored_user.seq,
                ..record
            },
            user_message: stored_user,
            system_prompt,
            guard: Some(guard),
            started: Instant::now(),
        };
        let emitter = turn::Emitter::new(Arc::clone(&live.hub), tx);
        let span = tracing::info_span!("turn", session_id = %session.id, turn_id = %turn_id);
        inner
            .tasks
            .spawn(tracing::Instrument::instrument(turn.run(emitter), span));
        Ok(TurnStream::new(session.id, turn_id, rx, live))
    }

    /// The session if it exists and belongs to `who`.
    pub(crate) async fn owned_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<crate::types::Session, RuntimeError> {
        match self.inner.store.get_session(session_id).await? {
            Some(s) if s.owner == who.user_id => Ok(s),
            _ => Err(RuntimeError::SessionNotFound),
        }
    }

    fn runner_for(
        &self,
        session_id: &str,
        key: RunnerKey,
        model_field: &str,
    ) -> Result<Arc<Runner>, RuntimeError> {
        let mut runners = lock(&self.inner.runners);
        if let Some(r) = runners.get(session_id) {
            if r.key == key {
                *lock(&r.last_used) = Instant::now();
                return Ok(Arc::clone(r));
            }
        }
        let (provider, provider_model) = self
            .inner
            .models
            .resolve(&key.model)
            .map_err(|e| RuntimeError::unknown_model(model_field, &e))?;
        let runner = Arc::new(Runner {
            key,
            provider,
            provider_model,
            last_used: Mutex::new(Instant::now()),
        });
        runners.insert(session_id.to_owned(), Arc::clone(&runner));
        Ok(runner)
    }

    /// Cancels the session's live turn with `reason` and waits (at most
    /// `wait`) until it has ended. `false` when nothing was live.
    pub(crate) async fn cancel_live(&self, session_id: &str, reason: CancelReason, wait: Duration) -> bool {
        let live = lock(&self.inner.live).get(session_id).cloned();
        let Some(live) = live else { return false };
        live.cancel(reason);
        let _ = tokio::time::timeout(wait, live.done.cancelled()).await;
        true
    }

    /// Evicts the session's cached runner.
    pub(crate) fn evict_runner(&self, session_id: &str) {
        lock(&self.inner.runners).remove(session_id);
    }

    /// Stops admitting turns, gives live turns `grace` to finish, cancels the
    /// rest (outcome CANCELED, reason SHUTDOWN, partial output stored), waits
    /// for them (bounded by `hard_limit` more), and flushes the store.
    pub async fn shutdown(&self, grace: Duration, hard_limit: Duration) {
        let inner = &self.inner;
        inner.closed.store(true, std::sync::atomic::Ordering::Release);
        inner.tasks.close();
        if tokio::time::timeout(grace, inner.tasks.wait()).await.is_err() {
            let live: Vec<_> = lock(&inner.live).values().cloned().collect();
            tracing::warn!(live_turns = live.len(), "grace period over, cancelling live turns");
            for turn in live {
                turn.cancel(CancelReason::Shutdown);
            }
            if tokio::time::timeout(hard_limit, inner.tasks.wait()).await.is_err() {
                tracing::error!("live turns did not end within the hard limit");
            }
        }
        if let Err(err) = inner.store.flush().await {
            tracing::error!(error = %err, "final store flush failed");
        }
    }

    /// True once [`Runtime::shutdown`] started.
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Checks a user message: at least one non-empty text or image block, only
/// text and image blocks, images with an `image/*` type, bounded size.
fn validate_content(content: &[ContentBlock], max_bytes: usize) -> Result<(), RuntimeError> {
    let mut violations = Vec::new();
    let mut total = 0usize;
    let mut has_payload = false;
    for (i, block) in content.iter().enumerate() {
        match block {
            ContentBlock::Text { text } => {
                total += text.len();
                has_payload |= !text.trim().is_empty();
            }
            ContentBlock::Image { data, mime_type } => {
                total += data.len();
                has_payload |= !data.is_empty();
                if data.is_empty() {
                    violations.push(crate::error::FieldViolation::new(
                        format!("content[{i}].image.data"),
                        "is empty",
                    ));
                }
                if !mime_type.starts_with("image/") {
                    violations.push(crate::error::FieldViolation::new(
                        format!("content[{i}].image.mime_type"),
                        format!("must be an image/* type, got {mime_type:?}"),
                    ));
                }
            }
            ContentBlock::Thinking { .. }
            | ContentBlock::ToolCall { .. }
            | ContentBlock::ToolResult { .. } => {
                violations.push(crate::error::FieldViolation::new(
                    format!("content[{i}]"),
                    "a user message may only hold text and image blocks",
                ));
            }
        }
    }
    if !has_payload && violations.is_empty() {
        violations.push(crate::error::FieldViolation::new(
            "content",
            "must hold at least one non-empty text or image block",
        ));
    }
    if total > max_bytes {
        violations.push(crate::error::FieldViolation::new(
            "content",
            format!("is {total} bytes; the limit is {max_bytes}"),
        ));
    }
    if violations.is_empty() {
        Ok(())
    } else {
        Err(RuntimeError::InvalidArgument(violations))
    }
}

/// Holds a turn's event receiver for [`TurnStream`].
pub(crate) type EventRx = mpsc::Receiver<Arc<TurnEvent>>;
