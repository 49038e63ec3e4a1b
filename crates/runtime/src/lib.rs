//! The agentrt runtime core. It runs agent conversation turns and keeps their
//! state; it knows nothing of gRPC (this crate must not depend on tonic or
//! prost — CI checks the dependency tree).
//!
//! Modules:
//! - [`agents`]: agent profiles (versioned, templated prompts) and memory
//!   blocks.
//! - [`types`]: domain values (sessions, messages, turn records, usage).
//! - [`store`]: the [`store::Store`] trait, with sled and in-memory stores.
//! - [`model`]: the [`model::ModelProvider`] trait, the `provider/model`
//!   registry, the echo model and the OpenAI-compatible HTTP provider.
//! - [`runtime`]: [`Runtime`], admission, turns, the runner cache.
//! - [`toolbox`]: server-side tools ([`toolbox::ToolSource`], MCP servers)
//!   and the policy hooks around tool calls.
//! - [`compaction`]: token estimates, cut points and the summariser of
//!   long conversations.
//! - [`events`]: the typed events a turn emits.
//! - [`hooks`]: operator hooks around turns, model calls and tool calls
//!   (the [`hooks::HookClient`] trait, the HTTP JSON transport).
//! - [`hub`]: per-turn event fan-out with a bounded replay.
//! - [`error`]: [`RuntimeError`], the one error type of the core API.
//! - [`limits`]: the bounds on every field a caller sends.
//! - [`prices`]: the price table and what a turn's usage costs.
//! - [`telemetry`]: span and metric names, the core's instruments, and the
//!   `traceparent` of outgoing provider requests (OpenTelemetry API only).

pub mod agents;
pub mod blobs;
pub mod compaction;
pub mod error;
pub mod events;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod hooks;
pub mod hub;
pub mod limits;
pub mod media;
pub mod model;
pub mod prices;
pub mod quota;
pub mod runtime;
pub mod store;
pub mod telemetry;
pub mod toolbox;
pub mod types;

pub use error::RuntimeError;
pub use runtime::{
    ChatInput, CompactionReport, DeletedSessions, HistoryPage, OnBusy, OnDisconnect, Runtime,
    RuntimeConfig, RuntimeStats, SessionList, SessionStatus, StoreHealth, TurnStream, load_context,
};
