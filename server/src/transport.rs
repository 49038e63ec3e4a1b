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
//! - [`CatchPanicLayer`]: a handler that panics answers INTERNAL instead of
//!   resetting the stream.
//! - [`raise_fd_limit`]: the fd soft limit goes up to the hard limit.
//!
//! HTTP/2 stream and keepalive limits are set on tonic's builder where
//! the router is assembled (`serve.rs`, behind [`crate::Prepared::serve`]).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::FutureExt as _;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::body::Body;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};

use crate::config::TransportSettings;
use crate::tls::{ClientCertificate, ServerTls};

/// What every HTTP/2 connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connections that finished their handshake and wait for tonic to pick
/// them up (bounded; handshake tasks wait when it is full).
const HANDED_OVER: usize = 64;

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

/// Connections per peer address, when capped.
#[derive(Debug, Clone)]
struct PeerCounts {
    max: usize,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One connection's place in [`PeerCounts`], given back on drop.
#[derive(Debug)]
struct PeerSlot {
    ip: IpAddr,
    counts: Option<Arc<Mutex<HashMap<IpAddr, usize>>>>,
}

impl PeerCounts {
    fn new(max: usize) -> Self {
        Self {
            max,
            counts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn claim(&self, ip: IpAddr) -> Option<PeerSlot> {
        let ip = ip.to_canonical();
        if self.max == 0 {
            return Some(PeerSlot { ip, counts: None });
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            ip,
            counts: Some(Arc::clone(&self.counts)),
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Some(counts) = &self.counts {
            let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(n) = counts.get_mut(&self.ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&self.ip);
                }
            }
        }
    }
}

/// The byte stream of a connection: plain TCP, or TLS over it.
#[derive(Debug)]
enum Io {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl AsyncRead for Io {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_flush(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Io::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Io::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl Io {
    fn tcp(&self) -> &TcpStream {
        match self {
            Io::Plain(s) => s,
            Io::Tls(s) => s.get_ref().0,
        }
    }
}

/// What tonic puts in every request's extensions for a connection of
/// ours: the addresses, and the verified client certificate when the
/// connection is mTLS. [`RequestLimitsLayer`] also inserts the
/// [`TcpConnectInfo`] and the [`ClientCertificate`] on their own, so
/// `tonic::Request::remote_addr` works in the layers inside it and in the
/// handlers.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Local and remote address.
    pub tcp: TcpConnectInfo,
    /// The client certificate (mTLS only).
    pub client: Option<Arc<ClientCertificate>>,
}

/// A connection that sent the HTTP/2 preface: the preface is read again
/// first, then the socket. Holds the connection's cap permit and peer slot
/// until hyper drops it.
#[derive(Debug)]
pub struct Conn {
    stream: Io,
    client: Option<Arc<ClientCertificate>>,
    replayed: usize,
    _permit: OwnedSemaphorePermit,
    _peer: PeerSlot,
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.replayed < PREFACE.len() {
            let rest = &PREFACE[this.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            tcp: self.stream.tcp().connect_info(),
            client: self.client.clone(),
        }
    }
}

/// The connections for tonic's `serve_with_incoming_shutdown`. Dropping it
/// (tonic does when shutdown begins) stops the accept loop and closes the
/// listener.
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::Receiver<Conn>,
}

impl futures::Stream for Incoming {
    type Item = Result<Conn, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx).map(|c| c.map(Ok))
    }
}

/// Starts accepting on `listener` under `settings`, with TLS when `tls` is
/// given (then SIGHUP also reloads its files, until the [`Incoming`] is
/// dropped).
pub fn incoming(
    listener: TcpListener,
    settings: &TransportSettings,
    tls: Option<Arc<ServerTls>>,
) -> Incoming {
    let (tx, rx) = mpsc::channel(HANDED_OVER);
    if let Some(tls) = &tls {
        tracing::info!(
            client_certificates = tls.requires_client_certificates(),
            "TLS on the gRPC listener; its files are reloaded when they change and on SIGHUP"
        );
        reload_on_sighup(Arc::clone(tls), tx.clone());
    }
    tokio::spawn(accept_loop(listener, settings.clone(), tls, tx));
    Incoming { rx }
}

/// Reloads `tls` on every SIGHUP until `tx`'s receiver is gone.
#[cfg(unix)]
fn reload_on_sighup(tls: Arc<ServerTls>, tx: mpsc::Sender<Conn>) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGHUP; TLS files are still reloaded when they change");
            return;
        }
    };
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hangups.recv() => match got {
                    // The file reads are small and local.
                    Some(()) => tls.reload("SIGHUP"),
                    None => return,
                },
                () = tx.closed() => return,
            }
        }
    });
}

#[cfg(not(unix))]
fn reload_on_sighup(_tls: Arc<ServerTls>, _tx: mpsc::Sender<Conn>) {}

/// Errors of one connection that was gone before it was accepted: accept
/// again at once.
fn is_per_connection(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, Interrupted};
    matches!(
        err.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted
    )
}

fn configure(stream: &TcpStream, settings: &TransportSettings) {
    // Nagle would hold small frames (a text delta, a trailer) behind the
    // client's delayed ACK for ~40 ms.
    if let Err(err) = stream.set_nodelay(true) {
        tracing::debug!(error = %err, "cannot set TCP_NODELAY");
    }
    let keepalive = socket2::TcpKeepalive::new().with_time(settings.tcp_keepalive);
    if let Err(err) = socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %err, "cannot set TCP keepalive");
    }
}

async fn accept_loop(
    listener: TcpListener,
    settings: TransportSettings,
    tls: Option<Arc<ServerTls>>,
    tx: mpsc::Sender<Conn>,
) {
    let slots = Arc::new(Semaphore::new(settings.max_connections));
    let peers = PeerCounts::new(settings.max_connections_per_ip);
    let mut last_warning: Option<Instant> = None;
    let mut unreported = 0u64;
    loop {
        // At the cap nothing is accepted (no descriptor is spent) until a
        // connection closes; the kernel's backlog holds the newcomers.
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
            () = tx.closed() => return,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = tx.closed() => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) if is_per_connection(&err) => continue,
            Err(err) => {
                // EMFILE, ENFILE, ENOBUFS, ENOMEM: retrying at once spins
                // a core and frees nothing.
                unreported += 1;
                if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(5)) {
                    tracing::warn!(
                        error = %err,
                        errors = unreported,
                        pause_ms = u64::try_from(settings.accept_error_backoff.as_millis()).unwrap_or(u64::MAX),
                        "cannot accept connections; pausing before the next try \
                         (out of file descriptors? see transport.max_connections and ulimit -n)"
                    );
                    last_warning = Some(Instant::now());
                    unreported = 0;
                }
                drop(permit);
                tokio::select! {
                    () = tokio::time::sleep(settings.accept_error_backoff) => {}
                    () = tx.closed() => return,
                }
                continue;
            }
        };
        let Some(peer_slot) = peers.claim(peer.ip()) else {
            tracing::debug!(peer = %peer.ip(), limit = settings.max_connections_per_ip,
                "closing a connection over transport.max_connections_per_ip");
            continue;
        };
        configure(&stream, &settings);
        let tx = tx.clone();
        let handshake_timeout = settings.handshake_timeout;
        let tls = tls.clone();
        tokio::spawn(async move {
            let done = tokio::time::timeout(handshake_timeout, handshake(stream, tls, peer)).await;
            let Ok(Some((stream, client))) = done else {
                if done.is_err() {
                    tracing::debug!(peer = %peer, timeout_ms = u64::try_from(handshake_timeout.as_millis()).unwrap_or(u64::MAX),
                        "closing a connection that did not finish its handshake (TLS, HTTP/2 preface) in time");
                }
                return;
            };
            let conn = Conn {
                stream,
                client,
                replayed: 0,
                _permit: permit,
                _peer: peer_slot,
            };
            let _ = tx.send(conn).await;
        });
    }
}

/// The TLS handshake (when configured), then the HTTP/2 preface; `None`
/// closes the connection.
async fn handshake(
    stream: TcpStream,
    tls: Option<Arc<ServerTls>>,
    peer: std::net::SocketAddr,
) -> Option<(Io, Option<Arc<ClientCertificate>>)> {
    let (mut stream, client) = match tls {
        None => (Io::Plain(stream), None),
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.config());
            let stream = match acceptor.accept(stream).await {
                Ok(s) => s,
                Err(err) => {
                    tracing::debug!(peer = %peer, error = %err, "closing a connection whose TLS handshake failed");
                    return None;
                }
            };
            // Only verified certificates get here: without a client CA
            // none is asked for.
            let client = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|leaf| Arc::new(ClientCertificate::from_der(leaf)));
            (Io::Tls(Box::new(stream)), client)
        }
    };
    let mut preface = [0u8; PREFACE.len()];
    match stream.read_exact(&mut preface).await {
        Ok(_) if &preface == PREFACE => Some((stream, client)),
        Ok(_) => {
            tracing::debug!(peer = %peer, "closing a connection that did not start HTTP/2");
            None
        }
        Err(_) => None,
    }
}

/// The gRPC paths whose requests are streams (client or bidi streaming),
/// from the descriptor sets of every service served here.
pub(crate) fn streaming_request_paths(descriptor_sets: &[&[u8]]) -> HashSet<String> {
    use prost::Message as _;
    let mut paths = HashSet::new();
    for bytes in descriptor_sets {
        let Ok(set) = prost_types::FileDescriptorSet::decode(*bytes) else {
            continue;
        };
        for file in &set.file {
            let package = file.package();
            for service in &file.service {
                for method in &service.method {
                    if method.client_streaming() {
                        let service_name = if package.is_empty() {
                            service.name().to_owned()
                        } else {
                            format!("{package}.{}", service.name())
                        };
                        paths.insert(format!("/{service_name}/{}", method.name()));
                    }
                }
            }
        }
    }
    paths
}

/// Bounds how long a request takes to arrive and how large its messages
/// may be (see [`TransportSettings::request_timeout`] and
/// [`TransportSettings::max_request_bytes`]).
#[derive(Debug, Clone)]
pub struct RequestLimitsLayer {
    timeout: Duration,
    max_message: usize,
    streaming: Arc<HashSet<String>>,
    /// Calls per peer address whose request is still arriving.
    pending: PeerCounts,
}

impl RequestLimitsLayer {
    /// From the settings; `streaming` are the paths whose requests are
    /// streams (they get an idle timeout instead of a total one).
    pub fn new(settings: &TransportSettings, streaming: HashSet<String>) -> Self {
        Self {
            timeout: settings.request_timeout,
            max_message: settings.max_request_bytes,
            streaming: Arc::new(streaming),
            pending: PeerCounts::new(settings.max_pending_requests_per_ip),
        }
    }
}

impl<S> tower::Layer<S> for RequestLimitsLayer {
    type Service = RequestLimits<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestLimits {
            inner,
            limits: self.clone(),
        }
    }
}

/// The service of [`RequestLimitsLayer`].
#[derive(Debug, Clone)]
pub struct RequestLimits<S> {
    inner: S,
    limits: RequestLimitsLayer,
}

impl<S> tower::Service<http::Request<Body>> for RequestLimits<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = futures::future::Either<
        S::Future,
        futures::future::Ready<Result<http::Response<Body>, S::Error>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let streaming = self.limits.streaming.contains(req.uri().path());
        let timeout = self.limits.timeout;
        let max_message = self.limits.max_message;
        let mut req = req;
        if let Some(info) = req.extensions().get::<ConnInfo>().cloned() {
            req.extensions_mut().insert(info.tcp);
            if let Some(client) = info.client {
                req.extensions_mut().insert(client);
            }
        }
        if req.body().is_end_stream() {
            return futures::future::Either::Left(self.inner.call(req));
        }
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(TcpConnectInfo::remote_addr)
            .map(|a| a.ip());
        let slot = match peer {
            Some(ip) => match self.limits.pending.claim(ip) {
                Some(slot) => Some(slot),
                None => {
                    tracing::debug!(peer = %ip, "refusing a call over transport.max_pending_requests_per_ip");
                    return futures::future::Either::Right(futures::future::ready(Ok(
                        Status::resource_exhausted(format!(
                            "too many calls from this address are still sending their request \
                             (transport.max_pending_requests_per_ip = {}); finish sending requests \
                             before starting more",
                            self.limits.pending.max
                        ))
                        .into_http(),
                    )));
                }
            },
            None => None,
        };
        let req = req.map(|body| {
            Body::new(LimitedBody {
                inner: body,
                slot,
                deadline: Some(Box::pin(tokio::time::sleep(timeout))),
                idle: streaming.then_some(timeout),
                timeout,
                max_message,
                header: [0; 5],
                header_len: 0,
                remaining: 0,
            })
        });
        futures::future::Either::Left(self.inner.call(req))
    }
}

/// A request body with a deadline and a message-size check.
struct LimitedBody {
    inner: Body,
    /// This call's place among its peer's pending requests, given back
    /// when the request has arrived (or failed, or was dropped).
    slot: Option<PeerSlot>,
    /// None once the body has ended or failed.
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Streaming requests: each frame renews the deadline by this much.
    idle: Option<Duration>,
    timeout: Duration,
    max_message: usize,
    /// The gRPC message prefix being read (flag + 4-byte length).
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message still to come.
    remaining: u64,
}

impl LimitedBody {
    /// The request has arrived, failed or timed out.
    fn finish(&mut self) {
        self.deadline = None;
        self.slot = None;
    }

    /// Follows the gRPC framing through `data`; the length of the first
    /// message over the limit.
    fn scan(&mut self, mut data: &[u8]) -> Result<(), u64> {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = data
                    .len()
                    .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.remaining -= n as u64;
                data = &data[n..];
                continue;
            }
            let n = (self.header.len() - self.header_len).min(data.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
            self.header_len += n;
            data = &data[n..];
            if self.header_len == self.header.len() {
                self.header_len = 0;
                let len = u64::from(u32::from_be_bytes([
                    self.header[1],
                    self.header[2],
                    self.header[3],
                    self.header[4],
                ]));
                if len > self.max_message as u64 {
                    return Err(len);
                }
                self.remaining = len;
            }
        }
        Ok(())
    }

    fn too_large(&self, len: u64) -> Status {
        let description = format!(
            "the request message is {len} bytes; the largest accepted is {} bytes (transport.max_request_bytes)",
            self.max_message
        );
        Status::with_error_details(
            Code::InvalidArgument,
            format!("request: {description}"),
            ErrorDetails::with_bad_request_violation("request", description),
        )
    }

    fn timed_out(&self) -> Status {
        let what = if self.idle.is_some() {
            "the request stream sent nothing for"
        } else {
            "the request did not arrive completely within"
        };
        Status::deadline_exceeded(format!(
            "{what} {:?} (transport.request_timeout); send the whole request at once",
            self.timeout
        ))
    }
}

impl HttpBody for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.deadline.is_none() {
            return Pin::new(&mut this.inner).poll_frame(cx);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if this.idle.is_none() && this.deadline.as_ref().is_some_and(|d| d.is_elapsed()) {
                    this.finish();
                    return Poll::Ready(Some(Err(this.timed_out())));
                }
                if let Some(Err(len)) = frame.data_ref().map(|data| this.scan(data)) {
                    this.finish();
                    return Poll::Ready(Some(Err(this.too_large(len))));
                }
                if let (Some(idle), Some(deadline)) = (this.idle, this.deadline.as_mut()) {
                    deadline.as_mut().reset(tokio::time::Instant::now() + idle);
                }
                if this.inner.is_end_stream() {
                    this.finish();
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                this.finish();
                Poll::Ready(other)
            }
            Poll::Pending => {
                if this
                    .deadline
                    .as_mut()
                    .is_some_and(|deadline| deadline.as_mut().poll(cx).is_ready())
                {
                    this.finish();
                    return Poll::Ready(Some(Err(this.timed_out())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Turns a panic of the service future (a unary handler, an interceptor,
/// the start of a streaming one) into an INTERNAL status; the panic is
/// logged with the method, the client learns nothing internal.
#[derive(Debug, Clone, Copy, Default)]
pub struct CatchPanicLayer;

impl<S> tower::Layer<S> for CatchPanicLayer {
    type Service = CatchPanic<S>;

    fn layer(&self, inner: S) -> Self::Service {
        CatchPanic { inner }
    }
}

/// The service of [`CatchPanicLayer`].
#[derive(Debug, Clone)]
pub struct CatchPanic<S> {
    inner: S,
}

/// The text of a panic payload, when it has one.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

impl<S> tower::Service<http::Request<Body>> for CatchPanic<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let method = req.uri().path().to_owned();
        let call = std::panic::catch_unwind(AssertUnwindSafe(|| self.inner.call(req)));
        Box::pin(async move {
            let outcome = match call {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(payload) => Err(payload),
            };
            outcome.unwrap_or_else(|payload| {
                tracing::error!(
                    method = %method,
                    panic = panic_text(payload.as_ref()),
                    "a handler panicked; the call ends INTERNAL"
                );
                Ok(Status::internal(
                    "internal error: the server failed while handling this call (it has been logged); \
                     retrying may work",
                )
                .into_http())
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reflection_is_the_only_streaming_request_served() {
        let paths = streaming_request_paths(&[
            agentrt_proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
            tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
        ]);
        let mut paths: Vec<_> = paths.into_iter().collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
            ]
        );
    }

    #[test]
    fn peer_slots_are_capped_and_given_back() {
        let peers = PeerCounts::new(2);
        let ip: IpAddr = "127.0.0.2".parse().unwrap();
        let a = peers.claim(ip).unwrap();
        let _b = peers.claim(ip).unwrap();
        assert!(peers.claim(ip).is_none());
        assert!(peers.claim("127.0.0.1".parse().unwrap()).is_some());
        drop(a);
        assert!(peers.claim(ip).is_some());
    }
}
