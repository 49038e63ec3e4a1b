//! What happens between the TCP listener and the gRPC handlers, bounded so
//! that a client without credentials (they are checked only inside a
//! request) cannot exhaust the server:
//!
//! - [`incoming`]: our accept loop. It holds a connection-cap permit (and a
//!   per-peer-address slot) for every connection until its socket is
//!   dropped, stops accepting at the cap instead of spending descriptors,
//!   pauses after accept errors such as EMFILE instead of spinning, and
//!   hands a connection to tonic only once its HTTP/2 preface arrived within
//!   the handshake timeout (the preface is then replayed to hyper). With
//!   `[tls]` the TLS handshake runs first, inside the same timeout, and the
//!   preface is read from the decrypted stream; a verified client
//!   certificate's identity travels with the connection ([`ConnInfo`]) to
//!   every request, where [`crate::auth`] reads it.
//! - [`RequestLimitsLayer`]: every request body must arrive within the
//!   request timeout (for streaming requests: no silence longer than it),
//!   and a request message longer than the limit is refused with
//!   INVALID_ARGUMENT naming the limit before it is buffered.
//!   Calls to health and reflection (answered without credentials) whose
//!   request is still arriving have a pool of their own that evicts its
//!   oldest member; so do connections that never carried an
//!   authenticated call. A connection is closed after `idle_timeout`
//!   without calls, and `max_connection_age` plus its grace after it was
//!   accepted (tonic sends the GOAWAY at the age).
//! - [`PrincipalStreams`]: inside the authenticator, the calls one
//!   principal has open at once, across connections.
//! - [`CatchPanicLayer`]: a handler that panics answers INTERNAL instead of
//!   resetting the stream.
//! - [`raise_fd_limit`]: the fd soft limit goes up to the hard limit.
//!
//! One file each: `accept.rs` (the accept loop and the connection type),
//! `lifetime.rs` (a connection's open calls and timers), `limits.rs` (the
//! request limits), `principals.rs`, `catch_panic.rs`, `peers.rs` (the
//! per-address caps, off behind a proxy) and `pool.rs` (the evicting pools
//! of callers without credentials); the open-files limit is here.
//!
//! HTTP/2 stream and keepalive limits are set on tonic's builder where
//! the router is assembled (`serve.rs`, behind [`crate::Prepared::serve`]).

mod accept;
mod catch_panic;
mod lifetime;
mod limits;
mod peers;
mod pool;
mod principals;

use crate::config::TransportSettings;

pub use accept::{Conn, ConnInfo, Incoming, incoming};
pub use catch_panic::{CatchPanic, CatchPanicLayer};
pub use lifetime::OpenCall;
pub use limits::{HeldResponse, RequestLimits, RequestLimitsLayer};
pub(crate) use limits::{anonymous_services, streaming_request_paths};
pub use principals::{PerPrincipal, PrincipalSlot, PrincipalStreams};

/// File descriptors the server needs besides its connections: the store,
/// the listener, the runtime, model and MCP clients.
const FD_RESERVE: u64 = 256;

/// Raises the soft limit on open files to the hard limit and logs both.
/// Returns the soft limit in force afterwards, when it could be read.
#[cfg(unix)]
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the open-files limit (RLIMIT_NOFILE)");
            return None;
        }
    };
    if soft >= hard {
        tracing::info!(soft, hard, "open-files limit (RLIMIT_NOFILE)");
        return Some(soft);
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => {
            tracing::info!(
                from = soft,
                to = hard,
                "raised the open-files soft limit (RLIMIT_NOFILE) to the hard limit"
            );
            Some(hard)
        }
        Err(err) => {
            tracing::warn!(soft, hard, error = %err, "cannot raise the open-files soft limit (RLIMIT_NOFILE)");
            Some(soft)
        }
    }
}

/// Without rlimits there is nothing to raise.
#[cfg(not(unix))]
pub fn raise_fd_limit() -> Option<u64> {
    None
}

/// The open-files soft limit, when it can be read.
#[cfg(unix)]
fn fd_soft_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

#[cfg(not(unix))]
fn fd_soft_limit() -> Option<u64> {
    None
}

/// Warns when the connection cap cannot be reached within the open-files
/// limit: the server then meets EMFILE first (and backs off), which refuses
/// connections less gracefully than the cap does.
pub(crate) fn check_fd_limit(settings: &TransportSettings) {
    if let Some(soft) = fd_soft_limit() {
        let wanted = settings.max_connections as u64 + FD_RESERVE;
        if wanted > soft {
            tracing::warn!(
                fd_limit = soft,
                max_connections = settings.max_connections,
                "transport.max_connections plus {FD_RESERVE} reserved descriptors exceeds the open-files limit; \
                 raise the limit (ulimit -n) or lower transport.max_connections"
            );
        }
    }
}
