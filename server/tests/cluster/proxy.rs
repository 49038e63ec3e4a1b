//! A loopback TCP proxy between one replica and PostgreSQL, so a test can
//! take the database away from that replica alone ([`Proxy::cut`]: open
//! connections are reset and new ones closed at once) and give it back
//! ([`Proxy::restore`]).

use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub(crate) struct Proxy {
    addr: std::net::SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards to `target` (`host:port`).
    pub(crate) async fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(watch::Sender::new(false));
        let task = tokio::spawn(serve(listener, target.to_owned(), Arc::clone(&cut)));
        Self { addr, cut, task }
    }

    /// `127.0.0.1:PORT`.
    pub(crate) fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The database becomes unreachable through the proxy.
    pub(crate) fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// The database is reachable again (for new connections).
    pub(crate) fn restore(&self) {
        self.cut.send_replace(false);
    }
}

async fn serve(listener: TcpListener, target: String, cut: Arc<watch::Sender<bool>>) {
    let mut links = JoinSet::new();
    let mut cut_rx = cut.subscribe();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                if *cut.borrow() {
                    drop(client);
                    continue;
                }
                links.spawn(link(client, target.clone()));
            }
            Ok(()) = cut_rx.changed() => {
                if *cut_rx.borrow_and_update() {
                    // Dropping the sockets of every open link resets them.
                    links.abort_all();
                }
            }
            Some(_) = links.join_next(), if !links.is_empty() => {}
        }
    }
}

async fn link(mut client: TcpStream, target: String) {
    let Ok(mut server) = TcpStream::connect(&target).await else {
        return;
    };
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}
