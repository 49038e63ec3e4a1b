//! A loopback TCP proxy in front of the test PostgreSQL, so a test can cut
//! the database away from a store (and give it back) without touching the
//! server the other tests share.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// What the proxy does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Forwards them to the server.
    Forward,
    /// Accepts them and never answers (a partition, a hung server).
    Blackhole,
}

/// The proxy; dropping it stops it and drops every connection.
#[derive(Debug)]
pub(super) struct Proxy {
    /// Where clients connect.
    pub(super) addr: SocketAddr,
    upstream: String,
    state: Arc<Mutex<Option<Running>>>,
}

#[derive(Debug)]
struct Running {
    mode: Mode,
    tasks: JoinSet<()>,
}

impl Proxy {
    /// A proxy on `127.0.0.1:0` forwarding to `upstream` (`host:port`).
    pub(super) async fn start(upstream: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let proxy = Self {
            addr,
            upstream: upstream.to_owned(),
            state: Arc::default(),
        };
        proxy.serve(listener, Mode::Forward);
        proxy
    }

    /// Drops every connection and stops listening: connects are refused.
    pub(super) async fn cut(&self) {
        let running = self.state.lock().expect("proxy state").take();
        if let Some(mut running) = running {
            // Waits until the listener and every pipe are closed.
            running.tasks.shutdown().await;
        }
    }

    /// Cuts, then listens again on the same port in `mode`.
    pub(super) async fn resume(&self, mode: Mode) {
        self.cut().await;
        let listener = TcpListener::bind(self.addr)
            .await
            .expect("rebind the proxy's port");
        self.serve(listener, mode);
    }

    fn serve(&self, listener: TcpListener, mode: Mode) {
        let mut tasks = JoinSet::new();
        let (state, upstream) = (Arc::clone(&self.state), self.upstream.clone());
        tasks.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let mut guard = state.lock().expect("proxy state");
                let Some(running) = guard.as_mut() else {
                    return;
                };
                let upstream = upstream.clone();
                running.tasks.spawn(pipe(client, upstream, running.mode));
            }
        });
        *self.state.lock().expect("proxy state") = Some(Running { mode, tasks });
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Dropping the JoinSet aborts the accept loop and every pipe.
        if let Ok(mut state) = self.state.lock() {
            drop(state.take());
        }
    }
}

async fn pipe(mut client: TcpStream, upstream: String, mode: Mode) {
    match mode {
        Mode::Forward => {
            let Ok(mut server) = TcpStream::connect(&upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
        }
        // Hold the socket open, read nothing, answer nothing.
        Mode::Blackhole => std::future::pending::<()>().await,
    }
}
