//! Rust client for agentrt.
//!
//! [`Client`] wraps the generated gRPC stubs in a small facade: connect
//! (optionally with a bearer token and timeouts), manage sessions, and run
//! turns whose events arrive as a typed [`ChatEvent`] stream. The raw
//! generated code stays available as [`proto`] for anything the facade does
//! not cover.
//!
//! ```no_run
//! use agentrt_client::{ChatEvent, Client};
//! use futures::StreamExt as _;
//!
//! # async fn demo() -> Result<(), agentrt_client::Error> {
//! let client = Client::connect("http://127.0.0.1:50051").await?;
//! let session = client.create_session(Default::default()).await?;
//! let mut events = client.chat(&session.session_id, "hello").await?;
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
//! TLS: an `https://` URL with [`ClientBuilder::ca_file`] (the CA that
//! signed the server's certificate; system roots are not used) and, for
//! mTLS, [`ClientBuilder::identity_files`].
//!
//! Every session-scoped call carries the metadata header
//! [`SESSION_HEADER`] (`x-agentrt-session: <session id>`), so a service mesh
//! can route a session's calls consistently (e.g. Istio's
//! `consistentHash.httpHeaderName`). The raw generated clients do not add
//! it.
//!
//! Modules: [`events`] (the typed events and the stream), [`proto`] (the
//! generated stubs).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub mod events;

pub use agentrt_proto::v1 as proto;
pub use events::{ChatEvent, Event, EventStream, TurnSummary};

use proto::agent_runtime_client::AgentRuntimeClient;
use proto::runtime_admin_client::RuntimeAdminClient;
use proto::session_service_client::SessionServiceClient;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with a non-OK status.
    #[error("{}: {}", .0.code(), .0.message())]
    Status(#[from] tonic::Status),
    /// The connection failed.
    #[error("transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The server sent something this client does not understand (e.g. an
    /// event with no kind).
    #[error("protocol: {0}")]
    Protocol(String),
    /// A bad URL or token.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// The metadata header naming the session of a session-scoped call
/// (docs/contract.md §7).
pub const SESSION_HEADER: &str = "x-agentrt-session";

/// PEM read now or from a file at connect time.
#[derive(Debug, Clone)]
enum Pem {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl Pem {
    fn read(&self, what: &str) -> Result<Vec<u8>, Error> {
        match self {
            Pem::Bytes(b) => Ok(b.clone()),
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                Error::InvalidArgument(format!("cannot read {what} {}: {e}", path.display()))
            }),
        }
    }
}

/// Adds `authorization: Bearer <token>` to every call.
#[derive(Debug, Clone)]
pub struct Auth {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<Channel, Auth>;

/// Configures a [`Client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    token: Option<String>,
    connect_timeout: Duration,
    request_timeout: Option<Duration>,
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    domain: Option<String>,
}

impl ClientBuilder {
    /// Trusts the PEM CA certificate(s) in `path` for an `https://` URL.
    pub fn ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.ca = Some(Pem::File(path.as_ref().to_path_buf()));
        self
    }

    /// Trusts the PEM CA certificate(s) `pem` for an `https://` URL.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(Pem::Bytes(pem.into()));
        self
    }

    /// Presents the PEM client certificate `cert` with its key `key`
    /// (mTLS).
    pub fn identity_files(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.identity = Some((
            Pem::File(cert.as_ref().to_path_buf()),
            Pem::File(key.as_ref().to_path_buf()),
        ));
        self
    }

    /// Presents the PEM client certificate `cert` with its key `key`
    /// (mTLS).
    pub fn identity_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((Pem::Bytes(cert.into()), Pem::Bytes(key.into())));
        self
    }

    /// The name the server's certificate must carry. Default: the URL's
    /// host.
    pub fn tls_domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    fn tls(&self) -> Result<Option<ClientTlsConfig>, Error> {
        let https = self.url.starts_with("https://");
        let wanted = self.ca.is_some() || self.identity.is_some() || self.domain.is_some();
        if !https {
            return if wanted {
                Err(Error::InvalidArgument(format!(
                    "TLS options (CA, client certificate) need an https:// URL, not {:?}",
                    self.url
                )))
            } else {
                Ok(None)
            };
        }
        let Some(ca) = &self.ca else {
            return Err(Error::InvalidArgument(
                "an https:// URL needs the CA that signed the server's certificate (ca_file, \
                 --ca); system roots are not used"
                    .to_owned(),
            ));
        };
        let mut tls =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca.read("CA file")?));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(
                cert.read("client certificate file")?,
                key.read("client key file")?,
            ));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(Some(tls))
    }

    /// Sends `authorization: Bearer <token>` with every call.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Bounds connection set-up. Default 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Deadline for unary calls (not for event streams). Default none.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Connects.
    pub async fn connect(self) -> Result<Client, Error> {
        let header = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::InvalidArgument("token must be printable ASCII".into()))?,
            ),
            None => None,
        };
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Error::InvalidArgument(format!("url {:?}: {e}", self.url)))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = self.tls()? {
            endpoint = endpoint.tls_config(tls)?;
        }
        let channel = endpoint.connect().await?;
        let auth = Auth { header };
        Ok(Client {
            sessions: SessionServiceClient::with_interceptor(channel.clone(), auth.clone()),
            runtime: AgentRuntimeClient::with_interceptor(channel.clone(), auth.clone()),
            admin: RuntimeAdminClient::with_interceptor(channel, auth),
            request_timeout: self.request_timeout,
        })
    }
}

/// A connection to an agentrt server. Cheap to clone (one HTTP/2 channel).
#[derive(Debug, Clone)]
pub struct Client {
    sessions: SessionServiceClient<Svc>,
    runtime: AgentRuntimeClient<Svc>,
    admin: RuntimeAdminClient<Svc>,
    request_timeout: Option<Duration>,
}

impl Client {
    /// A builder for `url` (e.g. `http://127.0.0.1:50051`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            token: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            ca: None,
            identity: None,
            domain: None,
        }
    }

    /// Connects without credentials.
    pub async fn connect(url: impl Into<String>) -> Result<Self, Error> {
        Self::builder(url).connect().await
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

    /// The generated SessionService client.
    pub fn sessions_raw(&self) -> SessionServiceClient<Svc> {
        self.sessions.clone()
    }

    /// The generated AgentRuntime client.
    pub fn runtime_raw(&self) -> AgentRuntimeClient<Svc> {
        self.runtime.clone()
    }

    /// The generated RuntimeAdmin client (admin principals only).
    pub fn admin(&self) -> RuntimeAdminClient<Svc> {
        self.admin.clone()
    }

    /// Creates a session (idempotent with a client-chosen `session_id`).
    pub async fn create_session(
        &self,
        req: proto::CreateSessionRequest,
    ) -> Result<proto::Session, Error> {
        // Only a client-chosen id is known before the call.
        let session_id = req.session_id.clone();
        Ok(self
            .sessions
            .clone()
            .create_session(self.session_request(&session_id, req))
            .await?
            .into_inner())
    }

    /// One session.
    pub async fn get_session(&self, session_id: &str) -> Result<proto::Session, Error> {
        let req = proto::GetSessionRequest {
            session_id: session_id.to_owned(),
        };
        Ok(self
            .sessions
            .clone()
            .get_session(self.session_request(session_id, req))
            .await?
            .into_inner())
    }

    /// A page of the caller's sessions, newest activity first.
    pub async fn list_sessions(
        &self,
        req: proto::ListSessionsRequest,
    ) -> Result<proto::ListSessionsResponse, Error> {
        Ok(self
            .sessions
            .clone()
            .list_sessions(self.request(req))
            .await?
            .into_inner())
    }

    /// Updates the fields set in `req`.
    pub async fn update_session(
        &self,
        req: proto::UpdateSessionRequest,
    ) -> Result<proto::Session, Error> {
        let session_id = req.session_id.clone();
        Ok(self
            .sessions
            .clone()
            .update_session(self.session_request(&session_id, req))
            .await?
            .into_inner())
    }

    /// Deletes a session and its history.
    pub async fn delete_session(&self, session_id: &str) -> Result<bool, Error> {
        let req = proto::DeleteSessionRequest {
            session_id: session_id.to_owned(),
        };
        Ok(self
            .sessions
            .clone()
            .delete_session(self.session_request(session_id, req))
            .await?
            .into_inner()
            .deleted)
    }

    /// One page of history.
    pub async fn history_page(
        &self,
        req: proto::GetHistoryRequest,
    ) -> Result<proto::GetHistoryResponse, Error> {
        let session_id = req.session_id.clone();
        Ok(self
            .sessions
            .clone()
            .get_history(self.session_request(&session_id, req))
            .await?
            .into_inner())
    }

    /// The whole stored history (every page), compacted messages included.
    pub async fn history(&self, session_id: &str) -> Result<Vec<proto::Message>, Error> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self
                .history_page(proto::GetHistoryRequest {
                    session_id: session_id.to_owned(),
                    page_size: 1_000,
                    include_compacted: true,
                    page_token: std::mem::take(&mut page_token),
                    ..Default::default()
                })
                .await?;
            out.extend(page.messages);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            page_token = page.next_page_token;
        }
    }

    /// Runs a turn with one text block.
    pub async fn chat(&self, session_id: &str, text: &str) -> Result<EventStream, Error> {
        self.chat_with(proto::ChatRequest {
            session_id: session_id.to_owned(),
            content: vec![proto::ContentBlock {
                block: Some(proto::content_block::Block::Text(proto::TextBlock {
                    text: text.to_owned(),
                })),
            }],
            ..Default::default()
        })
        .await
    }

    /// Runs a turn from a full request. Admission errors (busy, not found,
    /// invalid) are returned here; later failures arrive in the stream.
    pub async fn chat_with(&self, req: proto::ChatRequest) -> Result<EventStream, Error> {
        let session_id = req.session_id.clone();
        let stream = self
            .runtime
            .clone()
            .chat(with_session(tonic::Request::new(req), &session_id))
            .await?
            .into_inner();
        Ok(EventStream::new(stream))
    }

    /// Watches the session's live turn from `after_seq` (0 = from its
    /// start). With no live turn the stream ends at once, unless
    /// `wait_for_turn`.
    pub async fn subscribe(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<EventStream, Error> {
        let req = proto::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_seq,
            wait_for_turn,
        };
        let stream = self
            .runtime
            .clone()
            .subscribe(with_session(tonic::Request::new(req), session_id))
            .await?
            .into_inner();
        Ok(EventStream::new(stream))
    }

    /// Stops the live turn; `false` when nothing was live.
    pub async fn stop_session(&self, session_id: &str) -> Result<bool, Error> {
        let req = proto::StopSessionRequest {
            session_id: session_id.to_owned(),
        };
        Ok(self
            .runtime
            .clone()
            .stop_session(self.session_request(session_id, req))
            .await?
            .into_inner()
            .stopped)
    }

    /// The session's live-turn status.
    pub async fn session_status(&self, session_id: &str) -> Result<proto::SessionStatus, Error> {
        let req = proto::GetSessionStatusRequest {
            session_id: session_id.to_owned(),
        };
        Ok(self
            .runtime
            .clone()
            .get_session_status(self.session_request(session_id, req))
            .await?
            .into_inner())
    }

    /// Evicts the session's cached runner (`force` stops a live turn first).
    pub async fn close_session(&self, session_id: &str, force: bool) -> Result<bool, Error> {
        let req = proto::CloseSessionRequest {
            session_id: session_id.to_owned(),
            force,
        };
        Ok(self
            .runtime
            .clone()
            .close_session(self.session_request(session_id, req))
            .await?
            .into_inner()
            .closed)
    }

    /// Compacts the session now (summary + the last user turns verbatim).
    pub async fn compact_session(
        &self,
        session_id: &str,
    ) -> Result<proto::CompactSessionResponse, Error> {
        let req = proto::CompactSessionRequest {
            session_id: session_id.to_owned(),
        };
        Ok(self
            .runtime
            .clone()
            .compact_session(self.session_request(session_id, req))
            .await?
            .into_inner())
    }

    /// Delivers the result of a caller-executed tool call of a live turn.
    pub async fn submit_tool_result(
        &self,
        session_id: &str,
        turn_id: &str,
        call_id: &str,
        content: &str,
        is_error: bool,
    ) -> Result<(), Error> {
        let req = proto::SubmitToolResultRequest {
            session_id: session_id.to_owned(),
            turn_id: turn_id.to_owned(),
            call_id: call_id.to_owned(),
            content: content.to_owned(),
            is_error,
        };
        self.runtime
            .clone()
            .submit_tool_result(self.session_request(session_id, req))
            .await?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(builder: ClientBuilder) -> String {
        match builder.tls() {
            Err(Error::InvalidArgument(message)) => message,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn tls_options_need_an_https_url_and_https_needs_a_ca() {
        let message = refused(Client::builder("http://127.0.0.1:1").ca_pem(b"pem".to_vec()));
        assert!(message.contains("https://"), "{message}");
        let message = refused(Client::builder("https://127.0.0.1:1"));
        assert!(message.contains("--ca"), "{message}");
        let message = refused(Client::builder("https://127.0.0.1:1").ca_file("/no/such/ca.pem"));
        assert!(message.contains("/no/such/ca.pem"), "{message}");
        assert!(
            Client::builder("http://127.0.0.1:1")
                .tls()
                .unwrap()
                .is_none()
        );
        assert!(
            Client::builder("https://127.0.0.1:1")
                .ca_pem(b"pem".to_vec())
                .tls()
                .unwrap()
                .is_some()
        );
    }
}
