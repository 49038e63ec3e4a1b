//! The agentrt gRPC server: the tonic adapter around the runtime core.
//!
//! [`run`] (or [`ServerBuilder::serve`]) is the one entry point: it opens the
//! store, serves on a listener the caller bound, and drains gracefully when
//! the caller's shutdown future completes. The binary splits it in two —
//! [`ServerBuilder::prepare`], then [`Prepared::serve`] — to bind and print
//! its "listening" line only once everything that can fail at start-up has
//! succeeded.
//!
//! Modules, from the entry point down:
//! - `builder.rs`: [`ServerBuilder`] → [`Prepared`]: the config validated,
//!   the local model, providers, tools, keys and store ready, before any
//!   port is bound.
//! - `serve.rs`: [`run`] and [`Prepared::serve`]: the services mounted, the
//!   accept loop, then drain and shutdown in order.
//! - `health.rs`: the health service; every readiness/liveness transition
//!   ([`READINESS`], [`LIVENESS`]) is set there.
//! - `error.rs`: [`ServerError`].
//! - `agents_reload.rs`: the config's `[[agents]]` into the store, at
//!   start-up and on SIGHUP.
//! - `hooks.rs`: the `[[hooks]]` as the runtime's hooks — the gRPC
//!   `agentrt.hooks.v1.HookService` client, or the core's HTTP JSON one.
//! - `call.rs`: the context every handler opens (principal, deadline,
//!   session span) and the one decision to forward a call.
//! - [`services`]: the thin handlers, one file per proto service.
//! - [`a2a`]: the A2A protocol's gRPC binding (`lf.a2a.v1.A2AService`) on
//!   the same port: contexts are sessions, tasks are turns.
//! - `cluster.rs`: replicas on one PostgreSQL store — the internal
//!   listener's peer check and the forwarding of public calls to the
//!   replica that owns a session's live turn.
//! - [`convert`]: protobuf ↔ domain conversions.
//! - [`status`]: core errors → gRPC statuses (exhaustive).
//! - [`clip`]: the bound on every echo of a caller's string in an error
//!   or log line.
//! - [`auth`]: bearer keys and client certificates → principals, as a
//!   tonic interceptor.
//! - [`config`]: the typed, layered configuration.
//! - [`local`]: the built-in local model (`local/smollm2`): loading,
//!   provisioning, the defaults it implies.
//! - [`transport`]: the accept loop, connection and request limits, and the
//!   catch-panic layer, between the listener and the handlers.
//! - [`tls`]: the listener's TLS material (reloaded when its files change)
//!   and client-certificate identities.
//! - [`telemetry`]: logs, OpenTelemetry traces and metrics, the RPC span
//!   layer and the Prometheus endpoint.

mod agents_reload;
mod builder;
mod call;
mod cluster;
mod error;
mod health;
mod hooks;
mod serve;

pub mod a2a;
pub mod auth;
pub mod clip;
pub mod config;
pub mod convert;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod local;
pub mod process;
pub mod services;
pub mod status;
pub mod telemetry;
pub mod tls;
pub mod transport;

pub use builder::{Prepared, ServerBuilder};
pub use config::{Cli, Config, ConfigError};
pub use error::ServerError;
pub use health::{HealthProbe, LIVENESS, READINESS};
pub use serve::run;
