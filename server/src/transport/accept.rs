//! Our accept loop ([`incoming`]): connection caps (overall and per peer
//! address), back-off on accept errors, TCP options, the TLS handshake and
//! the HTTP/2 preface within the handshake timeout, and the connection
//! type ([`Conn`], with its [`ConnInfo`]) handed to tonic.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tonic::transport::server::{Connected, TcpConnectInfo};

use super::lifetime::{ConnState, Lifetime, guarded};
use super::peers::{PeerCounts, PeerSlot};
use super::pool::{EvictingPool, PoolSlot};
use crate::config::TransportSettings;
use crate::tls::{ClientCertificate, ServerTls};

/// What every HTTP/2 connection starts with (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connections that finished their handshake and wait for tonic to pick
/// them up (bounded; handshake tasks wait when it is full).
const HANDED_OVER: usize = 64;

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
/// connection is mTLS. [`RequestLimitsLayer`](super::RequestLimitsLayer)
/// also inserts the [`TcpConnectInfo`] and the [`ClientCertificate`] on
/// their own, so `tonic::Request::remote_addr` works in the layers inside
/// it and in the handlers.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// Local and remote address.
    pub tcp: TcpConnectInfo,
    /// The client certificate (mTLS only).
    pub client: Option<Arc<ClientCertificate>>,
    /// Open calls and authentication of the connection (for its idle
    /// timeout and the pool of connections that never authenticated).
    pub(crate) state: Arc<ConnState>,
}

/// A connection that sent the HTTP/2 preface: the preface is read again
/// first, then the socket. Holds the connection's cap permit and peer slot
/// until hyper drops it.
#[derive(Debug)]
pub struct Conn {
    stream: Io,
    client: Option<Arc<ClientCertificate>>,
    replayed: usize,
    life: Lifetime,
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
        let stream = &mut this.stream;
        guarded(&mut this.life, cx, |cx| Pin::new(stream).poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let stream = &mut this.stream;
        guarded(&mut this.life, cx, |cx| {
            Pin::new(stream).poll_write(cx, buf)
        })
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let stream = &mut this.stream;
        guarded(&mut this.life, cx, |cx| {
            Pin::new(stream).poll_write_vectored(cx, bufs)
        })
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let stream = &mut this.stream;
        guarded(&mut this.life, cx, |cx| Pin::new(stream).poll_flush(cx))
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
            state: Arc::clone(self.life.state()),
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
    let unauthenticated = EvictingPool::new(
        "connections that never authenticated",
        settings.max_unauthenticated_connections,
    );
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
        // Until its first authenticated call the connection is in the
        // pool that evicts its oldest (handshaking ones included).
        let slot = unauthenticated.join();
        let tx = tx.clone();
        let handshake_timeout = settings.handshake_timeout;
        let tls = tls.clone();
        let timers = (
            settings.idle_timeout,
            settings.max_connection_age,
            settings.max_connection_age_grace,
        );
        tokio::spawn(async move {
            let done = tokio::select! {
                done = tokio::time::timeout(handshake_timeout, handshake(stream, tls, peer)) => done,
                () = slot.evicted() => return,
            };
            let Ok(Some((stream, client))) = done else {
                if done.is_err() {
                    tracing::debug!(peer = %peer, timeout_ms = u64::try_from(handshake_timeout.as_millis()).unwrap_or(u64::MAX),
                        "closing a connection that did not finish its handshake (TLS, HTTP/2 preface) in time");
                }
                return;
            };
            let conn = Conn::new(stream, client, slot, timers, permit, peer_slot);
            let _ = tx.send(conn).await;
        });
    }
}

impl Conn {
    fn new(
        stream: Io,
        client: Option<Arc<ClientCertificate>>,
        slot: PoolSlot,
        (idle, age, grace): (Duration, Duration, Duration),
        permit: OwnedSemaphorePermit,
        peer: PeerSlot,
    ) -> Self {
        let evicted = slot.evicted();
        let state = Arc::new(ConnState::new(slot));
        Self {
            stream,
            client,
            replayed: 0,
            life: Lifetime::new(state, evicted, idle, age, grace),
            _permit: permit,
            _peer: peer,
        }
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
