//! The [`Forwarder`]: sends a public call to the replica that owns the
//! session's live turn, on that replica's internal listener.
//!
//! Channels are cached by address — at most [`MAX_CHANNELS`], the least
//! recently used dropped first — and connect lazily, each attempt bounded
//! by [`CONNECT_TIMEOUT`]. With `[tls]` every channel is https with the
//! client side of the internal listener's material (this replica's
//! certificate, the cluster's CA); when its files change the cache is
//! emptied, so new calls connect with the new material. Every call carries the cluster key, the caller's
//! principal and the caller's remaining deadline. The owner's answer comes
//! back unchanged; only a failure to reach the owner at all becomes
//! UNAVAILABLE naming the replica (its id, never its key). Each call is
//! counted in `agentrt.cluster.forwarded`, by outcome.
//!
//! One generic call ([`Forwarder::call`]) serves every RPC of every
//! service: a [`Peer`] is a generated client the forwarder can make from a
//! channel, and the handler names the RPC.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use agentrt_proto::a2a::v1::a2a_service_client::A2aServiceClient;
use agentrt_proto::v1::agent_runtime_client::AgentRuntimeClient;
use agentrt_proto::v1::runtime_admin_client::RuntimeAdminClient;
use agentrt_runtime::store::{Lease, Replica};
use agentrt_runtime::telemetry::metrics::METER;
use agentrt_runtime::types::Principal;
use futures::Stream;
use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use super::{NO_LISTENER, WireKey, sign};
use crate::clip;
use crate::tls::{Material, ServerTls};

/// Most cached channels (one per owner address).
pub(crate) const MAX_CHANNELS: usize = 64;
/// How long connecting to an owner may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest message a forwarded call may receive: an owner's answers stay
/// under 4 MiB by design (an A2A task's texts are budgeted, see
/// `a2a::budget`); a little room above that.
pub(crate) const MAX_ANSWER: usize = 8 << 20;
/// HTTP/2 pings on a connection to an owner, so a forwarded stream to a
/// replica cut off by the network ends (UNAVAILABLE) instead of hanging.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Forwarder {
    key: WireKey,
    /// The internal listener's material (`[tls]`): calls go over https
    /// with its client side.
    tls: Option<Arc<ServerTls>>,
    channels: Mutex<Channels>,
    /// Largest message a forwarded call may send (the public request limit).
    max_message: usize,
}

/// The cached channels and the TLS material they were made with: when the
/// files change (a renewed certificate) the cache is emptied, so new calls
/// connect with the new material while calls in flight finish on theirs.
#[derive(Debug, Default)]
struct Channels {
    /// Most recently used last.
    cache: VecDeque<(String, Channel)>,
    material: Option<Arc<Material>>,
}

/// Whether `status` says the owner could not be reached (made by this
/// side's transport, not sent by the owner).
fn unreachable(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable && std::error::Error::source(status).is_some()
}

/// Where a forwarded call goes: the replica owning a session's live turn,
/// or a replica an operator call reaches.
#[derive(Debug, Clone, Copy)]
pub(crate) enum To<'a> {
    /// The owner of a live turn, as its lease names it.
    Owner(&'a Lease),
    /// A live replica, as its heartbeat row names it.
    Replica(&'a Replica),
}

impl To<'_> {
    fn address(&self) -> &str {
        match self {
            Self::Owner(lease) => &lease.address,
            Self::Replica(replica) => &replica.address,
        }
    }

    fn replica_id(&self) -> &str {
        match self {
            Self::Owner(lease) => &lease.replica_id,
            Self::Replica(replica) => &replica.id,
        }
    }

    /// The start of a message about it: "… replica R, which".
    fn which(&self) -> String {
        match self {
            Self::Owner(lease) => format!(
                "the session's live turn {} runs on replica {}, which",
                clip::id(&lease.turn_id),
                clip::id(&lease.replica_id)
            ),
            Self::Replica(replica) => format!("replica {}, which", clip::id(&replica.id)),
        }
    }
}

/// The answering replica's status unchanged, or — when it could not be
/// reached, or runs a version without the call — UNAVAILABLE naming it.
pub(crate) fn peer_status(to: To<'_>, status: Status) -> Status {
    if status.code() == tonic::Code::Unimplemented && status.message().is_empty() {
        // Its router knows no such service: a replica of another agentrt
        // version, during a rolling upgrade.
        return Status::unavailable(format!(
            "{} runs an agentrt version that does not take this forwarded call; retry when \
             the rollout is over",
            to.which()
        ));
    }
    if !unreachable(&status) {
        // Its own error map bounds it; bounded again all the same.
        return clip::status(status);
    }
    // The causes say why (refused, a TLS handshake or certificate
    // failure); none of them carries the key.
    let mut cause = String::new();
    let mut source = std::error::Error::source(&status);
    while let Some(err) = source {
        cause.push_str(": ");
        cause.push_str(&err.to_string());
        source = err.source();
    }
    tracing::warn!(
        replica_id = %clip::id(to.replica_id()),
        address = %clip::id(to.address()),
        error = %clip::message(format!("{}{cause}", status.message())),
        "cannot reach another replica"
    );
    Status::unavailable(format!("{} cannot be reached from here; retry", to.which()))
}

impl Forwarder {
    /// A forwarder whose calls carry `key`, over https with the client
    /// side of `tls` when given, sending messages up to `max_message`
    /// bytes (receiving up to [`MAX_ANSWER`]).
    pub(crate) fn new(key: WireKey, tls: Option<Arc<ServerTls>>, max_message: usize) -> Self {
        Self {
            key,
            tls,
            channels: Mutex::new(Channels::default()),
            max_message,
        }
    }

    /// The channel to `to`: cached, or made (lazily connecting).
    fn channel(&self, to: To<'_>) -> Result<Channel, Status> {
        let address = to.address();
        // Looked at before the lock: a reload reads files.
        let material = self.tls.as_ref().map(|tls| tls.material());
        let channel = {
            let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            let same = match (&channels.material, &material) {
                (Some(was), Some(now)) => Arc::ptr_eq(was, now),
                (None, None) => true,
                _ => false,
            };
            if !same {
                channels.cache.clear();
                channels.material = material.clone();
            }
            let cache = &mut channels.cache;
            match cache.iter().position(|(a, _)| *a == address) {
                Some(i) => {
                    let entry = cache.remove(i).expect("the position just found");
                    let channel = entry.1.clone();
                    cache.push_back(entry);
                    channel
                }
                None if address == NO_LISTENER => {
                    return Err(Status::unavailable(format!(
                        "{} has no cluster listener to forward the call to; send it to that \
                         replica, or retry when the turn has ended",
                        to.which()
                    )));
                }
                None => {
                    let endpoint = Endpoint::from_shared(address.to_owned()).map_err(|_| {
                        Status::unavailable(format!(
                            "replica {} advertises an address that is not a URL; retry later",
                            clip::id(to.replica_id())
                        ))
                    })?;
                    let endpoint = secure(endpoint, material.as_deref(), to)?;
                    let channel = endpoint
                        .connect_timeout(CONNECT_TIMEOUT)
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                        .connect_lazy();
                    cache.push_back((address.to_owned(), channel.clone()));
                    while cache.len() > MAX_CHANNELS {
                        cache.pop_front();
                    }
                    channel
                }
            }
        };
        Ok(channel)
    }

    /// Sends `message` to `to` as `who`, within `deadline`, with `send`
    /// (the RPC on its client `P`); its answer, or its status as
    /// [`peer_status`] says.
    pub(crate) async fn call<P, T, R, F, Fut>(
        &self,
        to: To<'_>,
        who: &Principal,
        deadline: Option<Duration>,
        message: T,
        send: F,
    ) -> Result<R, Status>
    where
        P: Peer,
        F: FnOnce(P, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let channel = self.channel(to).inspect_err(|_| count("unreachable"))?;
        let client = P::connect(channel, self.max_message, MAX_ANSWER);
        let mut req = Request::new(message);
        sign(&mut req, &self.key, who);
        if let Some(left) = deadline {
            req.set_timeout(left);
        }
        let answer = send(client, req).await;
        count(match &answer {
            Ok(_) => "ok",
            Err(status) if unreachable(status) => "unreachable",
            Err(_) => "error",
        });
        answer
            .map(Response::into_inner)
            .map_err(|s| peer_status(to, s))
    }
}

/// `endpoint` with the TLS of `material` (https only), or plaintext
/// without (http only): a replica with `[tls]` never sends the key and a
/// call in plaintext, and one without cannot speak TLS.
fn secure(endpoint: Endpoint, material: Option<&Material>, to: To<'_>) -> Result<Endpoint, Status> {
    let https = endpoint.uri().scheme_str() == Some("https");
    let replica = clip::id(to.replica_id());
    match material.and_then(Material::client) {
        Some(tls) if https => endpoint.tls_config(tls.clone()).map_err(|err| {
            tracing::warn!(error = %err, "the cluster's TLS material cannot be used");
            Status::unavailable(format!(
                "this replica's cluster TLS material cannot be used to reach replica \
                 {replica}; retry later"
            ))
        }),
        Some(_) => Err(Status::unavailable(format!(
            "replica {replica} advertises a plaintext (http://) address, and this replica \
             forwards only over mTLS; retry when every replica serves [tls]"
        ))),
        None if https => Err(Status::unavailable(format!(
            "replica {replica} serves its internal listener over TLS, and this replica has no \
             [tls] to reach it with; retry when every replica serves [tls]"
        ))),
        None => Ok(endpoint),
    }
}

/// Counts one forwarded call in `agentrt.cluster.forwarded` by `outcome`:
/// `ok` (the owner answered; a stream counts when it starts), `error` (the
/// owner answered with an error status) or `unreachable` (the owner could
/// not be reached, or advertises no address to reach it at).
fn count(outcome: &'static str) {
    static FORWARDED: OnceLock<Counter<u64>> = OnceLock::new();
    FORWARDED
        .get_or_init(|| {
            opentelemetry::global::meter(METER)
                .u64_counter("agentrt.cluster.forwarded")
                .with_unit("{call}")
                .with_description(
                    "Calls forwarded to the replica that owns the session's live turn, by outcome",
                )
                .build()
        })
        .add(1, &[KeyValue::new("outcome", outcome)]);
}

/// A generated client a forwarded call can go through.
pub(crate) trait Peer: Sized {
    /// The client on `channel`, sending up to `send` bytes per message
    /// and receiving up to `receive`.
    fn connect(channel: Channel, send: usize, receive: usize) -> Self;
}

macro_rules! peer {
    ($($client:ident),*) => {$(
        impl Peer for $client<Channel> {
            fn connect(channel: Channel, send: usize, receive: usize) -> Self {
                Self::new(channel)
                    .max_encoding_message_size(send)
                    .max_decoding_message_size(receive)
            }
        }
    )*};
}

peer!(AgentRuntimeClient, RuntimeAdminClient, A2aServiceClient);

/// The owner's stream of a forwarded call: its items as they come, and its
/// error status as [`peer_status`] says; dropping it cancels the call.
#[derive(Debug)]
pub(crate) struct Forwarded<T> {
    items: Streaming<T>,
    lease: Lease,
    done: bool,
}

impl<T> Forwarded<T> {
    /// The stream `items` of a call forwarded to `lease`'s owner.
    pub(crate) fn new(items: Streaming<T>, lease: Lease) -> Self {
        Self {
            items,
            lease,
            done: false,
        }
    }
}

impl<T> Stream for Forwarded<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.items).poll_next(cx) {
            Poll::Ready(Some(Err(status))) => {
                self.done = true;
                Poll::Ready(Some(Err(peer_status(To::Owner(&self.lease), status))))
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use agentrt_proto::v1 as pb;

    use super::*;
    use crate::config::ClusterKey;

    fn lease(address: &str) -> Lease {
        Lease {
            replica_id: "r-1".to_owned(),
            address: address.to_owned(),
            turn_id: "t-1".to_owned(),
            expires_at: SystemTime::now(),
        }
    }

    #[tokio::test]
    async fn the_channel_cache_is_bounded_and_keeps_the_recently_used() {
        let key = WireKey::new(&ClusterKey::new("k")).unwrap();
        let f = Forwarder::new(key, None, 1 << 20);
        f.channel(To::Owner(&lease("http://127.0.0.1:1"))).unwrap();
        for port in 2..=(MAX_CHANNELS as u16 + 5) {
            // Touch the first one now and then: it must survive.
            f.channel(To::Owner(&lease("http://127.0.0.1:1"))).unwrap();
            f.channel(To::Owner(&lease(&format!("http://127.0.0.1:{port}"))))
                .unwrap();
        }
        let cache = &f.channels.lock().unwrap().cache;
        assert_eq!(cache.len(), MAX_CHANNELS);
        assert!(cache.iter().any(|(a, _)| a == "http://127.0.0.1:1"));
        assert!(!cache.iter().any(|(a, _)| a == "http://127.0.0.1:2"));
    }

    /// Writes a new self-signed certificate and key into `dir` (renamed
    /// into place, as a Secret update does) and returns `[tls]` for them.
    fn certificate(dir: &std::path::Path) -> crate::config::TlsSettings {
        let pair = rcgen::generate_simple_self_signed(vec!["replica.test".to_owned()]).unwrap();
        for (name, pem) in [
            ("cert.pem", pair.cert.pem()),
            ("key.pem", pair.signing_key.serialize_pem()),
        ] {
            let staged = dir.join(format!("{name}.new"));
            std::fs::write(&staged, pem).unwrap();
            std::fs::rename(&staged, dir.join(name)).unwrap();
        }
        crate::config::TlsSettings {
            cert: Some(dir.join("cert.pem")),
            key: Some(dir.join("key.pem")),
            client_ca: None,
        }
    }

    #[tokio::test]
    async fn with_tls_only_https_replicas_are_reached_and_new_material_empties_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let settings = certificate(dir.path());
        // The certificate is its own CA here: only the material matters.
        let tls = ServerTls::for_cluster(&settings, &dir.path().join("cert.pem"), None)
            .unwrap()
            .map(Arc::new);
        let key = WireKey::new(&ClusterKey::new("k")).unwrap();
        let f = Forwarder::new(key.clone(), tls, 1 << 20);
        let err = f
            .channel(To::Owner(&lease("http://127.0.0.1:1")))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("plaintext"), "{}", err.message());
        f.channel(To::Owner(&lease("https://127.0.0.1:1"))).unwrap();
        f.channel(To::Owner(&lease("https://127.0.0.1:2"))).unwrap();
        assert_eq!(f.channels.lock().unwrap().cache.len(), 2);
        // A renewed certificate: channels made with the old one go.
        certificate(dir.path());
        f.channel(To::Owner(&lease("https://127.0.0.1:3"))).unwrap();
        let cached: Vec<String> = f
            .channels
            .lock()
            .unwrap()
            .cache
            .iter()
            .map(|(a, _)| a.clone())
            .collect();
        assert_eq!(cached, ["https://127.0.0.1:3"]);

        let plain = Forwarder::new(key, None, 1 << 20);
        let err = plain
            .channel(To::Owner(&lease("https://127.0.0.1:1")))
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("no [tls]"), "{}", err.message());
    }

    #[tokio::test]
    async fn an_unreachable_owner_is_unavailable_naming_the_replica_not_the_key() {
        // A port nothing listens on: bind one, then close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let key = WireKey::new(&ClusterKey::new("sekrit-key")).unwrap();
        let f = Forwarder::new(key, None, 1 << 20);
        let who = Principal::local();
        let err = f
            .call(
                To::Owner(&lease(&format!("http://127.0.0.1:{port}"))),
                &who,
                Some(Duration::from_secs(5)),
                pb::StopSessionRequest {
                    session_id: "s".to_owned(),
                    clear_inbox: false,
                },
                |mut c: AgentRuntimeClient<Channel>, r| async move { c.stop_session(r).await },
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("replica r-1"), "{}", err.message());
        assert!(!err.message().contains("sekrit"), "{}", err.message());
        let bad = f
            .channel(To::Owner(&lease("not a url")))
            .err()
            .map(|s| s.code());
        assert_eq!(bad, Some(tonic::Code::Unavailable));
    }
}
