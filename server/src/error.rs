//! [`ServerError`]: why the server could not start or stopped on its own.
//! Start-up ([`crate::ServerBuilder::prepare`]) and serving
//! ([`crate::Prepared::serve`]) share it, so the binary maps one type to
//! its exit codes.

use crate::config::ConfigError;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The store could not be opened.
    #[error("cannot open the store in {path}: {source}")]
    Store {
        /// The store directory.
        path: String,
        /// The cause.
        source: agentrt_runtime::store::StoreError,
    },
    /// The PostgreSQL store could not be opened (`url` has no password).
    #[error("cannot open the PostgreSQL store at {url}: {source}")]
    Database {
        /// The database URL, its password redacted.
        url: String,
        /// The cause.
        source: agentrt_runtime::store::StoreError,
    },
    /// A listener the server binds itself could not be bound.
    #[error("cannot listen on {addr} ({what}): {source}")]
    Listen {
        /// Which listener (the config key).
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[from] agentrt_runtime::RuntimeError),
    /// The gRPC transport failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// Reflection could not be built.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}
