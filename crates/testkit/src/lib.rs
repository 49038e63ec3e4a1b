//! `agentrt-testkit`: the test support the workspace's test crates share,
//! kept out of the libraries so no production crate ships (or documents)
//! test scaffolding. Every crate uses it through its `[dev-dependencies]`;
//! nothing outside tests depends on it.
//!
//! Modules:
//! - [`contract`]: the store contract suite — the behaviour every
//!   `agentrt_runtime::store::Store` must have — and
//!   [`store_contract_tests!`], which runs it against one store.
//! - [`fake_openai`]: a scripted OpenAI-compatible upstream on a loopback
//!   port (faults included: statuses, cut streams, hangs, endless bodies).
//! - [`fake_anthropic`]: the same server with Anthropic's stream events.
//! - [`provider`]: driving a `ModelProvider` directly, under a time guard.
//! - [`gate`]: [`gate::GateProvider`], a provider whose reply the test
//!   releases, for turns that must stay live.
//! - [`pg`]: a real PostgreSQL for tests (a throwaway cluster from the
//!   system's binaries, or `AGENTRT_TEST_PG_URL`), one database per test.
//! - [`tcp_proxy`]: a loopback TCP proxy a test cuts and restores (a
//!   database that goes away and comes back).
//! - [`tools`]: server tools for tests ([`tools::Recorder`]).
//! - `server` (feature `server`): an in-process agentrt server on
//!   `127.0.0.1:0`.
//! - `local_model` (feature `local-model`): the real local model file for
//!   tests, loaded once per test binary.
//!
//! Crates below the server (the runtime core) use it without features, so
//! their tests do not build the server.

pub mod contract;
pub mod fake_anthropic;
pub mod fake_openai;
pub mod gate;
#[cfg(feature = "local-model")]
pub mod local_model;
pub mod pg;
pub mod provider;
#[cfg(feature = "server")]
pub mod server;
pub mod tcp_proxy;
pub mod tools;
