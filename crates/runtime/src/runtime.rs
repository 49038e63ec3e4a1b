//! [`Runtime`]: the core's API over shared state split by what it protects.
//! Each concern has its own module:
//!
//! - `admission`: [`Runtime::chat`] — validate, resolve the session, plan,
//!   begin — and `validate`, its checks of the request;
//! - `turn`: a turn's task, from its first event to its `TurnFinished`;
//! - `context`: what a turn sends the model, and its cache between turns;
//! - `compact`, `title`: the summaries and titles turns leave behind;
//! - `slots`: which session runs a turn, is compacted or deleted, and who
//!   waits for its next turn; `runners`: the runner cache; `models`: which
//!   model runs what; `lifecycle`: draining, shutdown and every task;
//! - `leases`: what changes on a store shared by several replicas — lease
//!   renewal, the sweeper of dead replicas' turns, the store's readiness;
//!   `cluster`: heartbeats and cluster-wide settings; `replicas`: the
//!   replicas and their leases as operators list them;
//! - `control`, `sessions`, `tools`, `admin`: the other calls of the API;
//!   `stream`, `replay`: the turn streams they return; `recovery`,
//!   `spans`: start-up repair and the turn's spans; `gauges`: the gauges
//!   read off the runtime's state when metrics are collected.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::error::RuntimeError;
use crate::events::TurnEvent;
use crate::hub::ReplayLimits;
use crate::model::Models;
use crate::store::Store;
use crate::toolbox::Toolbox;
use crate::types::{CancelReason, ContentBlock, Principal, ThinkingLevel};

mod admin;
mod admission;
mod agents;
mod builtins;
mod busy;
mod caller_tools;
mod cluster;
mod compaction;
mod context;
mod control;
mod delegate;
mod gauges;
mod hooks;
mod inbox;
mod jobs;
mod keys;
mod leases;
mod lifecycle;
mod media;
mod models;
mod offboard;
mod queued;
mod recovery;
mod replay;
mod replicas;
mod restricted;
mod runners;
mod sessions;
mod slots;
mod spans;
mod store_health;
mod stream;
mod title;
mod turn;
mod turns;
mod uploads;
mod validate;

use lifecycle::Lifecycle;
use models::Selection;
use runners::Runners;
use slots::{LiveTurn, Slots};

pub use admin::{RuntimeStats, UserUsage};
pub use caller_tools::PendingCall;
pub use compaction::CompactionReport;
pub use context::load_context;
pub use control::SessionStatus;
pub use offboard::DeletedSessions;
pub use replicas::{
    LEASES_DEFAULT_PAGE, LEASES_MAX_PAGE, MAX_LISTED_REPLICAS, ReplicaList, ReplicaStatus,
    TurnLease,
};
pub use sessions::{HistoryPage, SessionList};
pub use store_health::StoreHealth;
pub use stream::TurnStream;
pub use title::{TITLE_MAX_CHARS, extract_title};
pub use turns::{TurnDetail, TurnList, page_token_after};
pub use uploads::{BlobRead, UploadStart, UploadStatus, kind_of};

/// Settings of the runtime core. Every field has a documented default.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `provider/model` used when neither the call nor the session names
    /// one. Default `builtin/echo`.
    pub default_model: String,
    /// Thinking level used when the call names none. Default: none set.
    pub default_thinking: Option<ThinkingLevel>,
    /// Largest accepted text of a user message (its text blocks together).
    /// Default 1 MiB.
    pub max_input_bytes: usize,
    /// Limits on images and files ([`crate::media`]).
    pub media: crate::media::MediaLimits,
    /// Where media bytes are stored. Default: in memory (the server opens
    /// the configured store).
    pub blobs: crate::blobs::Blobs,
    /// Events buffered towards a Chat caller before the turn waits for it.
    /// Default 256.
    pub event_buffer: usize,
    /// Replay bounds of each turn's hub.
    pub replay: ReplayLimits,
    /// A `Heartbeat` event is sent when a turn sent nothing for this long.
    /// Default 15 s.
    pub heartbeat_interval: Duration,
    /// Cached runners idle this long are closed. Default 10 min.
    pub runner_idle_timeout: Duration,
    /// How often the idle reaper runs. Default 1 min.
    pub reap_interval: Duration,
    /// Most `Subscribe(wait_for_turn)` callers waiting on one session.
    /// Default 256.
    pub max_waiters_per_session: usize,
    /// Most messages queued in one session's inbox (`OnBusy::Enqueue`);
    /// one more is refused with the inbox quota.
    pub max_queued_per_session: u64,
    /// How often the inboxes are looked at for queued messages no turn end
    /// picked up (after a restart, a dead replica, a compaction).
    pub inbox_sweep: Duration,
    /// Most model steps of one turn's agent loop. Default 32.
    pub max_steps: u32,
    /// Server tools whose every call waits for an approval
    /// (`SubmitToolApproval`); `*` for all. Default: none.
    pub require_approval: Vec<String>,
    /// Longest a turn waits for its caller — a caller-executed tool's
    /// result or an approval — before it times out (the turn's deadline
    /// bounds it too). Default 1 h.
    pub approval_timeout: Duration,
    /// `provider/model` for summaries and titles. Default: none — the
    /// session's own model summarises and titles are extracted from the
    /// first message.
    pub fast_model: Option<String>,
    /// When and how long conversations are compacted.
    pub compaction: crate::compaction::CompactionConfig,
    /// Time limit of a turn whose call sets no `timeout`. Default 30 min,
    /// so that no turn — a `CONTINUE` turn waiting for a caller-executed
    /// tool, say — holds its session busy forever.
    pub turn_timeout: Duration,
    /// Largest `timeout` a call may ask for; a larger one is refused with
    /// `INVALID_ARGUMENT` naming this maximum. Default 24 h.
    pub max_turn_timeout: Duration,
    /// A Chat caller whose stream takes no event for this long (its buffer
    /// of `event_buffer` events full, no HTTP/2 window granted) is treated
    /// as gone: `CANCEL` turns end `CLIENT_GONE`, `CONTINUE` turns run on
    /// without it. Default 30 s.
    pub stalled_reader_timeout: Duration,
    /// Put message content (model output, tool arguments) on spans, per
    /// the GenAI conventions' opt-in attributes. Default false: content
    /// may be personal data.
    pub capture_content: bool,
    /// On a store shared by several replicas: how long a turn's session
    /// lease lasts unless renewed. The live turns' leases are renewed every
    /// third of it, expired leases swept every half of it, and a replica
    /// that could not renew for this long stops its turns. Unused on a
    /// single-node store. Default 10 s.
    pub lease_ttl: Duration,
    /// Quotas per principal ([`crate::quota`]). Default: none.
    pub quotas: crate::quota::QuotaPolicy,
    /// What each model's tokens cost; turns of a model without a price
    /// have no cost. Default: empty.
    pub prices: crate::prices::Prices,
    /// Bounds on each user's memory blocks per agent.
    pub memory: crate::agents::MemoryLimits,
    /// Bounds on delegate sessions (the built-in `delegate` tool).
    pub delegation: crate::agents::DelegationLimits,
    /// The operator's hooks ([`crate::hooks`]), called around every turn.
    /// Default: none.
    pub hooks: crate::hooks::Hooks,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            default_model: "builtin/echo".to_owned(),
            default_thinking: None,
            max_input_bytes: 1 << 20,
            media: crate::media::MediaLimits::default(),
            blobs: crate::blobs::Blobs::default(),
            event_buffer: 256,
            replay: ReplayLimits::default(),
            heartbeat_interval: Duration::from_secs(15),
            runner_idle_timeout: Duration::from_secs(600),
            reap_interval: Duration::from_secs(60),
            max_waiters_per_session: 256,
            max_queued_per_session: 16,
            inbox_sweep: Duration::from_secs(2),
            max_steps: 32,
            require_approval: Vec::new(),
            approval_timeout: Duration::from_secs(3600),
            fast_model: None,
            compaction: crate::compaction::CompactionConfig::default(),
            turn_timeout: Duration::from_secs(30 * 60),
            max_turn_timeout: Duration::from_secs(24 * 3600),
            stalled_reader_timeout: Duration::from_secs(30),
            capture_content: false,
            lease_ttl: Duration::from_secs(10),
            quotas: crate::quota::QuotaPolicy::default(),
            prices: crate::prices::Prices::default(),
            memory: crate::agents::MemoryLimits::default(),
            delegation: crate::agents::DelegationLimits::default(),
            hooks: crate::hooks::Hooks::default(),
        }
    }
}

/// What happens to a turn when its Chat caller goes away.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnDisconnect {
    /// End the turn (CANCELED, CLIENT_GONE, partial output stored).
    #[default]
    Cancel,
    /// Keep running; results are stored and watchable.
    Continue,
}

/// What a Chat does when its session already runs a turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnBusy {
    /// Refused: `SessionBusy`.
    #[default]
    Reject,
    /// Queued durably in the session's inbox; runs as its own turn after
    /// the turns before it (see `Runtime::chat`).
    Enqueue,
    /// The live turn is cancelled (reason `Interrupted`, its partial output
    /// stored), then this one runs.
    Interrupt,
    /// Joins the live turn at its next step boundary as a user message.
    Steer,
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
    /// The requested turn time limit, measured from admission; at most
    /// [`RuntimeConfig::max_turn_timeout`], [`RuntimeConfig::turn_timeout`]
    /// when `None`.
    pub timeout: Option<Duration>,
    /// Time left of the caller's transport deadline (gRPC `grpc-timeout`),
    /// when it sent one: the turn ends a margin before it, so the caller
    /// still receives the TIMED_OUT outcome.
    pub transport_deadline: Option<Duration>,
    /// What to do when the caller goes away.
    pub on_disconnect: OnDisconnect,
    /// Idempotency key.
    pub request_id: Option<String>,
    /// Tool names hidden from the model for this call.
    pub excluded_tools: Vec<String>,
    /// Tools the caller executes (announced with `ToolCall` events,
    /// answered with [`Runtime::submit_tool_result`]).
    pub extra_tools: Vec<crate::model::ToolSpec>,
    /// Most model steps for this call (default from the config).
    pub max_steps: Option<u32>,
    /// Most tokens each model step may generate (the provider's default
    /// for the model when `None`), at most the provider's
    /// [`crate::model::ModelProvider::max_output_tokens_limit`].
    pub max_output_tokens: Option<u32>,
    /// What to do when the session is busy.
    pub on_busy: OnBusy,
    /// Server tools whose calls wait for an approval
    /// ([`Runtime::submit_tool_approval`]) in this call, besides those the
    /// configuration names; `*` for every server tool.
    pub require_approval: Vec<String>,
    /// Who the caller says wrote the message (a group session's
    /// participant): stored on it and shown to the model, never an
    /// identity — the owner and the input actor come from the principal.
    pub speaker: Option<crate::types::Speaker>,
}

/// The runtime's shared state, split by what it protects: each owner has
/// its own lock (or none), and no code holds two of them at once.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: RuntimeConfig,
    pub(crate) store: Arc<dyn Store>,
    /// The model registry, the default selection and the fast model.
    pub(crate) models: Selection,
    pub(crate) toolbox: Arc<Toolbox>,
    /// Each session's live turn, compaction, delete and waiting watchers.
    pub(crate) slots: Arc<Slots>,
    /// Each session's runner, and the byte budget of their contexts.
    pub(crate) runners: Runners,
    /// Admitting, draining, closed; and every task the runtime spawns.
    pub(crate) lifecycle: Lifecycle,
    /// Whether the store is shared by several replicas (leases).
    pub(crate) shared: bool,
    /// Whether the store can take writes (pinged once a second).
    pub(crate) health: store_health::HealthWatch,
    /// Live turns and the minute's turns per owner, on a store only this
    /// process writes (a shared store counts them itself).
    pub(crate) turn_meter: Arc<crate::quota::TurnMeter>,
    /// Whether a turn's end must look at its session's inbox: always on a
    /// shared store (other replicas queue messages), otherwise once this
    /// process queued one or found one queued (module `inbox`).
    pub(crate) inbox_used: std::sync::atomic::AtomicBool,
    /// Sessions whose turn (or compaction) just ended, for a look at their
    /// inbox (module `inbox`); bounded: when it is full the sweep looks.
    ended: mpsc::Sender<String>,
    /// Agent versions read from the store (immutable, so never stale).
    pub(crate) agent_cache: agents::AgentCache,
}

/// How many ended sessions wait for a look at their inbox.
const ENDED_BUFFER: usize = 1024;

impl Inner {
    /// A turn (or compaction) of session `session_id` ended and freed the
    /// session: its inbox gets a look — unless no message was ever queued
    /// that this process knows of (a store only it writes, where every
    /// enqueue is its own).
    pub(crate) fn turn_ended(&self, session_id: &str) {
        if self.inbox_used.load(std::sync::atomic::Ordering::Relaxed) {
            // Full: the sweep looks within `inbox_sweep`.
            let _ = self.ended.try_send(session_id.to_owned());
        }
    }
}

/// The runtime core. Cheap to clone (an `Arc`).
#[derive(Debug, Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

/// Locks `m`, also after a panic interrupted a previous holder: every
/// critical section of the runtime is a few map operations or assignments
/// that leave the value consistent, and none awaits.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What [`Runtime::cancel_live`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// No turn was live.
    NothingLive,
    /// The turn was cancelled and has ended: it writes nothing more.
    Ended,
    /// The turn was cancelled but had not ended when the wait was over.
    StillEnding,
}

impl Runtime {
    /// Opens the runtime over `store`: marks turns left running by a previous
    /// process as interrupted, then accepts turns. No server tools.
    pub async fn open(
        config: RuntimeConfig,
        store: Arc<dyn Store>,
        models: Models,
    ) -> Result<Self, RuntimeError> {
        Self::open_with_tools(config, store, models, Arc::new(Toolbox::new())).await
    }

    /// [`Runtime::open`] with server tools: each session's runner lists the
    /// toolbox's tools when it is built, and [`Runtime::shutdown`] closes it.
    pub async fn open_with_tools(
        config: RuntimeConfig,
        store: Arc<dyn Store>,
        models: Models,
        toolbox: Arc<Toolbox>,
    ) -> Result<Self, RuntimeError> {
        let models = Selection::new(models, &config)?;
        recovery::recover(store.as_ref()).await?;
        if let Some(cluster) = store.cluster() {
            cluster::join(cluster).await;
            // The operator's choice outlives restarts: taken before the
            // first turn is admitted.
            if let Some(stored) = cluster.default_model().await?
                && let Err(err) = models.adopt(&stored)
            {
                tracing::error!(model = %stored.model, error = %err,
                    "the cluster-wide default model is not served by this replica's \
                     configuration; keeping the configured default");
            }
        }
        let shared = store.leases().is_some();
        let (ended, ended_rx) = mpsc::channel(ENDED_BUFFER);
        let runtime = Self {
            inner: Arc::new(Inner {
                shared,
                health: store_health::HealthWatch::new(shared),
                config,
                store,
                models,
                toolbox,
                slots: Arc::default(),
                runners: Runners::default(),
                lifecycle: Lifecycle::new(),
                turn_meter: Arc::default(),
                inbox_used: std::sync::atomic::AtomicBool::new(shared),
                ended,
                agent_cache: agents::AgentCache::default(),
            }),
        };
        admin::spawn_reaper(&runtime);
        leases::spawn_jobs(&runtime);
        cluster::spawn_jobs(&runtime);
        inbox::spawn_jobs(&runtime, ended_rx);
        // The gauges exist (at 0) before the first turn or watcher.
        let metrics = crate::telemetry::metrics::get();
        metrics.live_turns.add(0, &[]);
        metrics.watchers.add(0, &[]);
        crate::telemetry::metrics::interrupted_series(shared);
        gauges::register(&runtime);
        Ok(runtime)
    }

    /// The server tools.
    pub fn toolbox(&self) -> &Arc<Toolbox> {
        &self.inner.toolbox
    }

    /// The store this runtime uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Time since [`Runtime::open`].
    pub fn uptime(&self) -> Duration {
        self.inner.lifecycle.uptime()
    }

    /// Number of live turns.
    pub fn live_turns(&self) -> usize {
        self.inner.slots.live_count()
    }

    /// Number of cached runners.
    pub fn cached_runners(&self) -> usize {
        self.inner.runners.len()
    }

    /// Number of sessions whose session-scoped tools (processes,
    /// workspaces) are open.
    pub fn open_session_tools(&self) -> usize {
        self.inner.runners.session_tools_len()
    }

    /// The live turn of `session` — of this incarnation only.
    pub(crate) fn live_of(&self, session: &crate::types::Session) -> Option<Arc<LiveTurn>> {
        self.inner.slots.live_of(session)
    }

    /// `who`'s session that `who` calls `session_id` (see [`keys`]): the
    /// one stored under that id when it is `who`'s (a server-generated or
    /// pre-scoping id), else `who`'s scoped one. Its `id` is the stored
    /// key, which everything after this call uses. Another user's session
    /// answers exactly as a missing one, after the same two reads.
    pub(crate) async fn owned_session(
        &self,
        who: &Principal,
        session_id: &str,
    ) -> Result<crate::types::Session, RuntimeError> {
        let store = &self.inner.store;
        if let Some(s) = store.get_session(session_id).await?
            && s.owner == who.user_id
        {
            return Ok(s);
        }
        let scoped = keys::scoped_key(&who.user_id, session_id);
        match store.get_session(&scoped).await? {
            Some(s) if s.owner == who.user_id => Ok(s),
            _ => Err(RuntimeError::SessionNotFound),
        }
    }

    /// Cancels `session`'s live turn with `reason` and waits (at most
    /// `wait`) until it has ended.
    pub(crate) async fn cancel_live(
        &self,
        session: &crate::types::Session,
        reason: CancelReason,
        wait: Duration,
    ) -> Cancelled {
        let Some(live) = self.live_of(session) else {
            return Cancelled::NothingLive;
        };
        live.cancel(reason);
        match tokio::time::timeout(wait, live.done.cancelled()).await {
            Ok(()) => Cancelled::Ended,
            Err(_) => Cancelled::StillEnding,
        }
    }

    /// Stops admitting turns, gives live turns `grace` to finish, cancels the
    /// rest (outcome CANCELED, reason SHUTDOWN, partial output stored), waits
    /// for them (bounded by `hard_limit` more), and flushes the store.
    ///
    /// The title jobs finished turns started are waited for within the same
    /// bound (`grace` plus `hard_limit` from the call); one still running then
    /// is cancelled. Nothing the runtime spawned is left running when this
    /// returns, so every span it opened is closed.
    pub async fn shutdown(&self, grace: Duration, hard_limit: Duration) {
        let inner = &self.inner;
        self.begin_shutdown();
        // Watchers waiting for a next turn that will never come end now.
        inner.slots.clear_waiters();
        inner
            .lifecycle
            .wind_down(grace, hard_limit, || {
                let live = inner.slots.live_turns();
                tracing::warn!(
                    live_turns = live.len(),
                    "grace period over, cancelling live turns"
                );
                for turn in live {
                    turn.cancel(CancelReason::Shutdown);
                }
            })
            .await;
        // Every turn has ended: no session tool is in use any more.
        let session_tools = inner.runners.take_all_tools();
        futures::future::join_all(session_tools.iter().map(|t| t.close())).await;
        inner.toolbox.close().await;
        self.leave_cluster().await;
        if let Err(err) = inner.store.flush().await {
            tracing::error!(error = %err, "final store flush failed");
        }
    }

    /// True once draining or shutdown started.
    pub fn is_closed(&self) -> bool {
        self.inner.lifecycle.is_closed()
    }

    /// Refuses new turns from now on (UNAVAILABLE) and reports the runtime
    /// as draining. Call it before telling anyone the server is draining,
    /// so that nobody who saw NOT_SERVING can still get a turn admitted.
    pub fn stop_admitting(&self) {
        self.inner.lifecycle.stop_admitting();
    }

    /// Refuses new turns for good (UNAVAILABLE): the shutdown began, so,
    /// unlike [`Runtime::stop_admitting`] (an admin drain), no
    /// [`Runtime::undrain`] reopens it. [`Runtime::shutdown`] calls it
    /// itself; call it earlier to refuse turns before telling anyone.
    pub fn begin_shutdown(&self) {
        self.inner.lifecycle.begin_shutdown();
    }

    /// Watches the draining flag (readiness follows it).
    pub fn draining(&self) -> watch::Receiver<bool> {
        self.inner.lifecycle.draining()
    }
}

/// Holds a turn's event receiver for [`TurnStream`].
pub(crate) type EventRx = mpsc::Receiver<Arc<TurnEvent>>;
