//! The `agentrt.v1` gRPC services, one file per service and named after
//! it: [`session_service`] (`SessionService`), [`agent_runtime`]
//! (`AgentRuntime`), [`agent_service`] (`AgentService`) and
//! [`runtime_admin`] (`RuntimeAdmin`).
//!
//! Every handler is thin — open the call (`call::Call`: the
//! principal, the deadline, the session on the span) → convert
//! ([`crate::convert`]) → call the core → map the error ([`crate::status`]),
//! or forward the same call to the replica that owns the session's live
//! turn (`Call::forward_or`) — so what a call does lives in
//! the runtime core, and what it looks like on the wire lives in those two
//! modules.

pub mod agent_runtime;
pub mod agent_service;
pub mod runtime_admin;
pub mod session_service;

pub use agent_runtime::{AgentRuntimeHandler, ChatEvents};
pub use agent_service::AgentServiceHandler;
pub use runtime_admin::RuntimeAdminHandler;
pub use session_service::SessionServiceHandler;
