//! A loopback TCP proxy a test can cut and restore: put it between a server
//! and its database (or a replica and its peer) to make the far side
//! unreachable without stopping it.
//!
//! [`TcpProxy::start`] listens on `127.0.0.1:0` and forwards each
//! connection to the target. [`TcpProxy::cut`] closes every open connection
//! and refuses new ones (accepted, then closed at once) until
//! [`TcpProxy::restore`]; the port stays the same throughout.

use std::net::SocketAddr;

use tokio::io::copy_bidirectional;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// See the module docs. Dropping it stops the proxy and its connections.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// A proxy to `target` (`host:port`), open.
    pub async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (open, watching) = watch::channel(true);
        let target = target.to_owned();
        let accept = tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                if !*watching.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut cut = watching.clone();
                let target = target.clone();
                tasks.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(&target).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut.wait_for(|open| !*open) => {}
                    }
                });
                while tasks.try_join_next().is_some() {}
            }
        });
        Self { addr, open, accept }
    }

    /// Where clients connect instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection and refuses new ones until
    /// [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.open.send_replace(false);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
