//! An agentrt server in this process, on an ephemeral loopback port: the
//! real server (tonic, runtime core, store) that the end-to-end and the
//! server's own tests talk to through the client crate.
//!
//! The listener is bound (`127.0.0.1:0`) before the server task starts, so
//! a client may connect at once: no sleeps, no fixed ports. A test builds
//! the [`ServerBuilder`] it needs (config, extra providers, tool sources),
//! hands it to [`InProcessServer::start`], and ends with
//! [`InProcessServer::stop`], which drains the server and waits until its
//! store is closed; dropping the handle only asks the server to stop.

use std::net::SocketAddr;

use agentrt_server::{Prepared, ServerBuilder, ServerError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A running in-process server.
#[derive(Debug)]
pub struct InProcessServer {
    addr: SocketAddr,
    cluster_addr: Option<SocketAddr>,
    replica_id: Option<String>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), ServerError>>>,
}

impl InProcessServer {
    /// Binds `127.0.0.1:0` and serves `builder` on it until stopped. The
    /// config's own `listen` address is not used.
    pub async fn start(builder: ServerBuilder) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the test server");
        let addr = listener.local_addr().expect("local address of the server");
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(builder.serve(listener, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            cluster_addr: None,
            replica_id: None,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Prepares `builder` (panicking with the server's message when that
    /// fails), binds `127.0.0.1:0` and serves it there until stopped; the
    /// internal cluster listener (`[cluster]`) and replica id are known.
    pub async fn start_prepared(builder: ServerBuilder) -> Self {
        let prepared: Prepared = builder
            .prepare()
            .await
            .unwrap_or_else(|e| panic!("the test server did not start: {e}"));
        let cluster_addr = prepared.cluster_addr();
        let replica_id = prepared.replica_id().map(str::to_owned);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the test server");
        let addr = listener.local_addr().expect("local address of the server");
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(prepared.serve(listener, async {
            let _ = stopped.await;
        }));
        Self {
            addr,
            cluster_addr,
            replica_id,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Where its internal cluster service listens (servers started with
    /// [`InProcessServer::start_prepared`] and a `[cluster]` table).
    pub fn cluster_addr(&self) -> Option<SocketAddr> {
        self.cluster_addr
    }

    /// Its replica id on a shared store (servers started with
    /// [`InProcessServer::start_prepared`]).
    pub fn replica_id(&self) -> Option<&str> {
        self.replica_id.as_deref()
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, for a plaintext client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drains and stops the server, waiting until the store is closed;
    /// panics when the server failed.
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle
                .await
                .expect("the server task")
                .expect("the server ran and stopped cleanly");
        }
    }
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
