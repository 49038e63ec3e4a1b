//! The `agentrt.v1` gRPC services, one file per service and named after
//! it: [`session_service`] (`SessionService`), [`agent_runtime`]
//! (`AgentRuntime`) and [`runtime_admin`] (`RuntimeAdmin`).
//!
//! Every handler is thin — authenticate ([`crate::auth::principal`]) →
//! convert ([`crate::convert`]) → call the core → map the error
//! ([`crate::status`]), or forward the call to the replica that owns the
//! session's live turn (`crate::cluster`) — so what a call does lives in the
//! runtime core, and what it looks like on the wire lives in those two
//! modules.

pub mod agent_runtime;
pub mod runtime_admin;
pub mod session_service;

pub use agent_runtime::{AgentRuntimeHandler, ChatEvents};
pub use runtime_admin::RuntimeAdminHandler;
pub use session_service::SessionServiceHandler;

/// Names the session on the RPC's span (declared empty by the server).
pub(crate) fn record_session(id: &str) {
    // Recorded before the id is validated: clipped, like every echo.
    tracing::Span::current().record("session_id", crate::clip::id(id).as_ref());
}
