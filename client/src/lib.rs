//! Rust client for agentrt.
//!
//! [`Client`] wraps the generated gRPC stubs in a typed facade: connect
//! (optionally with a bearer token, TLS and timeouts), manage sessions, and
//! run turns whose events arrive as a typed [`ChatEvent`] stream. Errors are
//! typed ([`Error::Busy`], [`Error::NotFound`], ...), decoded from the
//! status and its details. The raw generated code stays available as
//! [`proto`] (and [`Client::sessions_raw`] etc.) for anything the facade
//! does not cover.
//!
//! ```no_run
//! use std::time::Duration;
//! use agentrt_client::{ChatEvent, ChatOptions, Client, OnDisconnect};
//! use futures::StreamExt as _;
//!
//! # async fn demo() -> Result<(), agentrt_client::Error> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let session = client.create_session(Default::default()).await?;
//! let options = ChatOptions::new("hello")
//!     .timeout(Duration::from_secs(60))
//!     .on_disconnect(OnDisconnect::Continue); // survives a dropped connection
//! let mut events = client.chat(&session.session_id, options).await?;
//! while let Some(event) = events.next().await {
//!     match event?.kind {
//!         ChatEvent::Text(delta) => print!("{delta}"),
//!         ChatEvent::TurnFinished { outcome, .. } => println!("\n[{outcome:?}]"),
//!         _ => {}
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! URLs need a scheme: `http://` (plaintext) or `https://` (TLS with
//! the system's trust roots, plus [`ClientBuilder::ca_file`] for a CA of
//! your own — and, for mTLS,
//! [`ClientBuilder::identity_files`]). A bearer token is not sent in
//! plaintext to a host other than loopback unless
//! [`ClientBuilder::allow_insecure_token`] says so.
//!
//! Deadlines: [`ClientBuilder::request_timeout`] (unary calls) and
//! [`ClientBuilder::chat_deadline`] (chats) are client-wide defaults;
//! [`Client::with_timeout`] and [`ChatOptions::deadline`] override them per
//! call.
//!
//! Every session-scoped call carries the metadata header
//! [`SESSION_HEADER`] (`x-agentrt-session: <session id>`), so a service mesh
//! can route a session's calls consistently (e.g. Istio's
//! `consistentHash.httpHeaderName`). The raw generated clients do not add
//! it.
//!
//! Modules: [`events`] (the typed events and the stream), [`error`] (the
//! errors), [`options`] (chat options and the resume policy), [`proto`]
//! (the generated stubs). The calls of each service are in a file of their
//! own (`session_service.rs`, `agent_runtime.rs`, `runtime_admin.rs`, `health.rs`), each
//! unary one through [`Client`]'s one private call helper.

#![deny(missing_docs)]

use std::future::Future;
use std::time::Duration;

use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

mod agent_runtime;
mod agent_service;
mod blobs;
mod builder;
pub mod error;
pub mod events;
mod health;
pub mod options;
mod runtime_admin;
mod session_service;

pub use agentrt_proto::v1 as proto;
pub use blobs::sha256_hex;
pub use builder::{Auth, ClientBuilder};
pub use error::Error;
pub use events::{ChatEvent, Event, EventStream, TurnSummary};
pub use health::Health;
pub use options::{
    ChatOptions, OnBusy, OnDisconnect, ResumeNotice, ResumePolicy, ThinkingLevel, WhenBusy,
};

use proto::agent_runtime_client::AgentRuntimeClient;
use proto::agent_service_client::AgentServiceClient;
use proto::runtime_admin_client::RuntimeAdminClient;
use proto::session_service_client::SessionServiceClient;
use tonic_health::pb::health_client::HealthClient;

/// The metadata header naming the session of a session-scoped call
/// (docs/contract.md §7).
pub const SESSION_HEADER: &str = "x-agentrt-session";

type Svc = InterceptedService<Channel, Auth>;

/// A connection to an agentrt server. Cheap to clone (one HTTP/2 channel).
#[derive(Debug, Clone)]
pub struct Client {
    url: String,
    sessions: SessionServiceClient<Svc>,
    runtime: AgentRuntimeClient<Svc>,
    admin: RuntimeAdminClient<Svc>,
    agents: AgentServiceClient<Svc>,
    health: HealthClient<Svc>,
    request_timeout: Option<Duration>,
    chat_deadline: Option<Duration>,
    resume: ResumePolicy,
}

impl Client {
    /// A builder for `url` (e.g. `http://127.0.0.1:50051`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url.into())
    }

    /// Connects without credentials.
    pub async fn connect(url: impl Into<String>) -> Result<Self, Error> {
        Self::builder(url).connect().await
    }

    /// The server URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// This client with `timeout` as the deadline of its unary calls
    /// (a per-call override: `client.with_timeout(d).get_session(id)`).
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            request_timeout: Some(timeout),
            ..self.clone()
        }
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        if let Some(t) = self.request_timeout {
            req.set_timeout(t);
        }
        req
    }

    /// A unary request of `session_id`'s: the deadline and the routing
    /// header.
    fn session_request<T>(&self, session_id: &str, message: T) -> tonic::Request<T> {
        with_session(self.request(message), session_id)
    }

    /// Maps a status of a call on `session_id`.
    fn fail(&self, session_id: &str) -> impl Fn(Status) -> Error + '_ {
        let session_id = session_id.to_owned();
        move |status| Error::from_status(status, &session_id, &self.url)
    }

    /// One unary call: the client's deadline, the routing header of the
    /// session it belongs to (`None`: not a session's call), and its status
    /// mapped to [`Error`]. `rpc` sends the request on a stub.
    async fn call<Req, Resp, Fut>(
        &self,
        session_id: Option<&str>,
        message: Req,
        rpc: impl FnOnce(tonic::Request<Req>) -> Fut,
    ) -> Result<Resp, Error>
    where
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let request = match session_id {
            Some(id) => self.session_request(id, message),
            None => self.request(message),
        };
        rpc(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(session_id.unwrap_or_default()))
    }

    /// The generated SessionService client.
    pub fn sessions_raw(&self) -> SessionServiceClient<Svc> {
        self.sessions.clone()
    }

    /// The generated AgentRuntime client.
    pub fn runtime_raw(&self) -> AgentRuntimeClient<Svc> {
        self.runtime.clone()
    }

    /// The generated AgentService client.
    pub fn agents_raw(&self) -> AgentServiceClient<Svc> {
        self.agents.clone()
    }

    /// The generated RuntimeAdmin client (admin principals only).
    pub fn admin(&self) -> RuntimeAdminClient<Svc> {
        self.admin.clone()
    }
}

/// Adds [`SESSION_HEADER`] to `req`. An empty id or one that is not a
/// valid header value (the server refuses such ids anyway) is left out
/// rather than failing the call here.
fn with_session<T>(mut req: tonic::Request<T>, session_id: &str) -> tonic::Request<T> {
    if session_id.is_empty() {
        return req;
    }
    if let Ok(value) = session_id.parse::<MetadataValue<tonic::metadata::Ascii>>() {
        req.metadata_mut().insert(SESSION_HEADER, value);
    }
    req
}
