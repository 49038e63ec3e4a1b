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
//! [`ClientBuilder::ca_file`] — the CA that signed the server's
//! certificate; system roots are not used — and, for mTLS,
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
//! (the generated stubs).

#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::Status;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub mod error;
pub mod events;
pub mod options;

pub use agentrt_proto::v1 as proto;
pub use error::Error;
pub use events::{ChatEvent, Event, EventStream, TurnSummary};
pub use options::{ChatOptions, OnDisconnect, ResumeNotice, ResumePolicy, ThinkingLevel, WhenBusy};

use proto::agent_runtime_client::AgentRuntimeClient;
use proto::runtime_admin_client::RuntimeAdminClient;
use proto::session_service_client::SessionServiceClient;

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
            Pem::File(path) => std::fs::read(path)
                .map_err(|e| Error::Config(format!("cannot read {what} {}: {e}", path.display()))),
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
    chat_deadline: Option<Duration>,
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
    domain: Option<String>,
    insecure_token: bool,
    resume: ResumePolicy,
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
                Err(Error::Config(format!(
                    "TLS options (CA, client certificate) need an https:// URL, not {:?}",
                    self.url
                )))
            } else {
                Ok(None)
            };
        }
        let Some(ca) = &self.ca else {
            return Err(Error::Config(format!(
                "{}: an https:// URL needs the CA that signed the server's certificate \
                 (ClientBuilder::ca_file, --ca); system roots are not used, and the call is \
                 never sent as plaintext instead",
                self.url
            )));
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

    /// Allows a bearer token over plaintext `http://` to a host that is not
    /// loopback (refused by default: anyone on the path could read it).
    pub fn allow_insecure_token(mut self, allow: bool) -> Self {
        self.insecure_token = allow;
        self
    }

    /// Bounds connection set-up. Default 10 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Default deadline of unary calls (not of event streams). Default
    /// none; [`Client::with_timeout`] overrides it per call.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Default gRPC deadline of chats (it bounds the turn too). Default
    /// none; [`ChatOptions::deadline`] overrides it per call.
    pub fn chat_deadline(mut self, deadline: Duration) -> Self {
        self.chat_deadline = Some(deadline);
        self
    }

    /// How resuming chats and watches reconnect by default.
    pub fn resume_policy(mut self, policy: ResumePolicy) -> Self {
        self.resume = policy;
        self
    }

    /// Checks the URL and the credentials before anything is sent: a
    /// scheme is required, and a token goes in plaintext only to loopback
    /// (or when allowed).
    fn check(&self) -> Result<http::Uri, Error> {
        let url = &self.url;
        if !url.contains("://") {
            return Err(Error::Config(format!(
                "server URL {url:?} has no scheme: write http://{url} (plaintext) or \
                 https://{url} (TLS)"
            )));
        }
        let uri: http::Uri = url
            .parse()
            .map_err(|e| Error::Config(format!("server URL {url:?} is not a URL: {e}")))?;
        let host = uri.host().unwrap_or_default();
        if host.is_empty() {
            return Err(Error::Config(format!("server URL {url:?} has no host")));
        }
        match uri.scheme_str() {
            Some("http") => {
                if self.token.is_some() && !self.insecure_token && !is_loopback(host) {
                    return Err(Error::Config(format!(
                        "refusing to send the bearer token in plaintext to {url}: use an \
                         https:// URL (with its CA), or allow it explicitly \
                         (ClientBuilder::allow_insecure_token, --insecure)"
                    )));
                }
            }
            Some("https") => {}
            Some(other) => {
                return Err(Error::Config(format!(
                    "server URL {url:?} has scheme {other:?}; use http:// or https://"
                )));
            }
            None => {
                return Err(Error::Config(format!(
                    "server URL {url:?} has no scheme: write http://{url} or https://{url}"
                )));
            }
        }
        Ok(uri)
    }

    /// Checks the configuration and connects.
    pub async fn connect(self) -> Result<Client, Error> {
        self.check()?;
        let header = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| Error::Config("the token must be printable ASCII".into()))?,
            ),
            None => None,
        };
        let mut endpoint = Endpoint::from_shared(self.url.clone())
            .map_err(|e| Error::Config(format!("server URL {:?}: {e}", self.url)))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        if let Some(tls) = self.tls()? {
            endpoint = endpoint.tls_config(tls).map_err(|e| {
                Error::Config(format!("TLS for {}: {}", self.url, error::cause_chain(&e)))
            })?;
        }
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| Error::connect(&self.url, &e))?;
        let auth = Auth { header };
        Ok(Client {
            url: self.url,
            sessions: SessionServiceClient::with_interceptor(channel.clone(), auth.clone()),
            runtime: AgentRuntimeClient::with_interceptor(channel.clone(), auth.clone()),
            admin: RuntimeAdminClient::with_interceptor(channel, auth),
            request_timeout: self.request_timeout,
            chat_deadline: self.chat_deadline,
            resume: self.resume,
        })
    }
}

/// `localhost`, 127.0.0.0/8 or ::1.
fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// A connection to an agentrt server. Cheap to clone (one HTTP/2 channel).
#[derive(Debug, Clone)]
pub struct Client {
    url: String,
    sessions: SessionServiceClient<Svc>,
    runtime: AgentRuntimeClient<Svc>,
    admin: RuntimeAdminClient<Svc>,
    request_timeout: Option<Duration>,
    chat_deadline: Option<Duration>,
    resume: ResumePolicy,
}

impl Client {
    /// A builder for `url` (e.g. `http://127.0.0.1:50051`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            token: None,
            connect_timeout: Duration::from_secs(10),
            request_timeout: None,
            chat_deadline: None,
            ca: None,
            identity: None,
            domain: None,
            insecure_token: false,
            resume: ResumePolicy::default(),
        }
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
        self.sessions
            .clone()
            .create_session(self.session_request(&session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(&session_id))
    }

    /// One session.
    pub async fn get_session(&self, session_id: &str) -> Result<proto::Session, Error> {
        let req = proto::GetSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.sessions
            .clone()
            .get_session(self.session_request(session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(session_id))
    }

    /// A page of the caller's sessions, newest activity first.
    pub async fn list_sessions(
        &self,
        req: proto::ListSessionsRequest,
    ) -> Result<proto::ListSessionsResponse, Error> {
        self.sessions
            .clone()
            .list_sessions(self.request(req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(""))
    }

    /// Updates the fields set in `req`.
    pub async fn update_session(
        &self,
        req: proto::UpdateSessionRequest,
    ) -> Result<proto::Session, Error> {
        let session_id = req.session_id.clone();
        self.sessions
            .clone()
            .update_session(self.session_request(&session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(&session_id))
    }

    /// Deletes a session and its history; `false` when there was none.
    pub async fn delete_session(&self, session_id: &str) -> Result<bool, Error> {
        let req = proto::DeleteSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.sessions
            .clone()
            .delete_session(self.session_request(session_id, req))
            .await
            .map(|r| r.into_inner().deleted)
            .map_err(self.fail(session_id))
    }

    /// One page of history.
    pub async fn history_page(
        &self,
        req: proto::GetHistoryRequest,
    ) -> Result<proto::GetHistoryResponse, Error> {
        let session_id = req.session_id.clone();
        self.sessions
            .clone()
            .get_history(self.session_request(&session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(&session_id))
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

    /// Runs a turn: `options` is a [`ChatOptions`] (or just the text, as
    /// `&str` / `String`). Admission errors (busy, not found, invalid) are
    /// returned here, typed; later failures arrive in the stream.
    ///
    /// With [`OnDisconnect::Continue`] the stream resumes after a dropped
    /// connection (see [`EventStream`]) per the options' or the client's
    /// [`ResumePolicy`]; a `request_id` is generated when none is set. The
    /// first call itself is not retried: if it cannot be sent, that error
    /// is returned. With [`WhenBusy::Wait`] a busy session is waited for
    /// instead of refused.
    pub async fn chat(
        &self,
        session_id: &str,
        options: impl Into<ChatOptions>,
    ) -> Result<EventStream, Error> {
        let mut options = options.into();
        options.ensure_request_id();
        let request = options.to_request(session_id);
        let metadata: Vec<(String, String)> = options
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let deadline = options.deadline.or(self.chat_deadline);
        let deadline_at = deadline.map(|d| Instant::now() + d);
        let left = || deadline_at.map(|at| at.saturating_duration_since(Instant::now()));
        let policy = options
            .resume
            .clone()
            .unwrap_or_else(|| self.resume.clone());
        let mut backoff = policy.initial_backoff;
        let mut waited = 0;
        let stream = loop {
            let status = match self.chat_raw(request.clone(), &metadata, left()).await {
                Ok(stream) => break stream,
                Err(status) => status,
            };
            let err = Error::from_status(status, session_id, &self.url);
            if options.when_busy != WhenBusy::Wait || !err.is_busy() || waited >= policy.attempts {
                return Err(err);
            }
            waited += 1;
            let turn_id = if let Error::Busy { turn_id, .. } = &err {
                turn_id.clone()
            } else {
                String::new()
            };
            policy.notify(ResumeNotice::WaitingForTurn { turn_id });
            // Follow the live turn to its end (a compaction has none to
            // follow: the backoff below spaces the retries).
            if let Ok(mut watching) = self.subscribe_raw(session_id, 0, false, left()).await {
                while let Ok(Some(_)) = watching.message().await {}
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.max_backoff);
        };
        let attach = options.resumes().then(|| events::Attach {
            client: self.clone(),
            request: Some(request),
            metadata,
            policy,
            deadline_at,
        });
        Ok(EventStream::with_attach(
            stream, &self.url, session_id, attach,
        ))
    }

    /// Runs a turn from a raw request, for power users who need a field
    /// [`ChatOptions`] does not cover. No resuming, no deadline (set one on
    /// the request yourself through [`Client::runtime_raw`] if needed).
    pub async fn chat_with(&self, req: proto::ChatRequest) -> Result<EventStream, Error> {
        let session_id = req.session_id.clone();
        let stream = self
            .chat_raw(req, &[], None)
            .await
            .map_err(self.fail(&session_id))?;
        Ok(EventStream::new(stream, &self.url, &session_id))
    }

    /// The Chat call on the wire.
    pub(crate) async fn chat_raw(
        &self,
        req: proto::ChatRequest,
        metadata: &[(String, String)],
        deadline: Option<Duration>,
    ) -> Result<tonic::Streaming<proto::ChatEvent>, Status> {
        let session_id = req.session_id.clone();
        let mut request = with_session(tonic::Request::new(req), &session_id);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        for (k, v) in metadata {
            let key =
                tonic::metadata::AsciiMetadataKey::from_bytes(k.as_bytes()).map_err(|_| {
                    Status::invalid_argument(format!("metadata key {k:?} is not valid"))
                })?;
            let value = v.parse().map_err(|_| {
                Status::invalid_argument(format!("metadata value of {k:?} is not ASCII"))
            })?;
            request.metadata_mut().insert(key, value);
        }
        Ok(self.runtime.clone().chat(request).await?.into_inner())
    }

    /// Watches the session's live turn from `after_seq` (0 = from its
    /// start). With no live turn the stream ends at once, unless
    /// `wait_for_turn`. Does not resume; see [`Client::watch`].
    pub async fn subscribe(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<EventStream, Error> {
        let stream = self
            .subscribe_raw(session_id, after_seq, wait_for_turn, None)
            .await
            .map_err(self.fail(session_id))?;
        Ok(EventStream::new(stream, &self.url, session_id))
    }

    /// Like [`Client::subscribe`], and resuming: after a dropped
    /// connection it re-subscribes from the last seq it yielded (per the
    /// client's [`ResumePolicy`]), so every event arrives once. If the turn
    /// ended while disconnected, the stream ends (read the outcome from
    /// the history or [`Client::get_session`]).
    pub async fn watch(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
    ) -> Result<EventStream, Error> {
        let stream = self
            .subscribe_raw(session_id, after_seq, wait_for_turn, None)
            .await
            .map_err(self.fail(session_id))?;
        let attach = events::Attach {
            client: self.clone(),
            request: None,
            metadata: Vec::new(),
            policy: self.resume.clone(),
            deadline_at: None,
        };
        Ok(EventStream::watching(
            stream, &self.url, session_id, after_seq, attach,
        ))
    }

    /// The Subscribe call on the wire (for [`Client::subscribe`],
    /// [`Client::watch`] and a resuming stream's re-attachment).
    pub(crate) async fn subscribe_raw(
        &self,
        session_id: &str,
        after_seq: u64,
        wait_for_turn: bool,
        deadline: Option<Duration>,
    ) -> Result<tonic::Streaming<proto::ChatEvent>, Status> {
        let req = proto::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_seq,
            wait_for_turn,
        };
        let mut request = with_session(tonic::Request::new(req), session_id);
        if let Some(d) = deadline {
            request.set_timeout(d);
        }
        Ok(self.runtime.clone().subscribe(request).await?.into_inner())
    }

    /// Stops the live turn; `false` when nothing was live.
    pub async fn stop_session(&self, session_id: &str) -> Result<bool, Error> {
        let req = proto::StopSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.runtime
            .clone()
            .stop_session(self.session_request(session_id, req))
            .await
            .map(|r| r.into_inner().stopped)
            .map_err(self.fail(session_id))
    }

    /// The session's live-turn status.
    pub async fn session_status(&self, session_id: &str) -> Result<proto::SessionStatus, Error> {
        let req = proto::GetSessionStatusRequest {
            session_id: session_id.to_owned(),
        };
        self.runtime
            .clone()
            .get_session_status(self.session_request(session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(session_id))
    }

    /// Evicts the session's cached runner (`force` stops a live turn first).
    pub async fn close_session(&self, session_id: &str, force: bool) -> Result<bool, Error> {
        let req = proto::CloseSessionRequest {
            session_id: session_id.to_owned(),
            force,
        };
        self.runtime
            .clone()
            .close_session(self.session_request(session_id, req))
            .await
            .map(|r| r.into_inner().closed)
            .map_err(self.fail(session_id))
    }

    /// Compacts the session now (summary + the last user turns verbatim).
    pub async fn compact_session(
        &self,
        session_id: &str,
    ) -> Result<proto::CompactSessionResponse, Error> {
        let req = proto::CompactSessionRequest {
            session_id: session_id.to_owned(),
        };
        self.runtime
            .clone()
            .compact_session(self.session_request(session_id, req))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(session_id))
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
            .await
            .map(|_| ())
            .map_err(self.fail(session_id))
    }

    /// The server's runtime statistics (admin principals only).
    pub async fn runtime_stats(&self) -> Result<proto::RuntimeStats, Error> {
        self.admin
            .clone()
            .get_runtime_stats(self.request(proto::GetRuntimeStatsRequest {}))
            .await
            .map(tonic::Response::into_inner)
            .map_err(self.fail(""))
    }

    /// Stops admitting turns and waits up to `timeout` until none is live;
    /// returns how many are still live (admin principals only).
    pub async fn drain(&self, timeout: Option<Duration>) -> Result<u32, Error> {
        let req = proto::DrainRequest {
            timeout: timeout.and_then(|t| prost_types::Duration::try_from(t).ok()),
        };
        self.admin
            .clone()
            .drain(self.request(req))
            .await
            .map(|r| r.into_inner().remaining)
            .map_err(self.fail(""))
    }

    /// Closes cached runners — all, or `user_id`'s — and returns how many
    /// (admin principals only).
    pub async fn reset_runners(&self, user_id: &str) -> Result<u32, Error> {
        let req = proto::ResetRunnersRequest {
            user_id: user_id.to_owned(),
        };
        self.admin
            .clone()
            .reset_runners(self.request(req))
            .await
            .map(|r| r.into_inner().count)
            .map_err(self.fail(""))
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
            Err(Error::Config(message)) => message,
            other => panic!("expected Config, got {other:?}"),
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
