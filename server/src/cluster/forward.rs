//! The [`Forwarder`]: sends a public call to the replica that owns the
//! session's live turn, over its internal `Cluster` service.
//!
//! Channels are cached by address — at most [`MAX_CHANNELS`], the least
//! recently used dropped first — and connect lazily, each attempt bounded
//! by [`CONNECT_TIMEOUT`]. Every call carries the cluster key and the
//! caller's remaining deadline. The owner's answer comes back unchanged;
//! only a failure to reach the owner at all becomes UNAVAILABLE naming the
//! replica (its id, never its key).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use agentrt_proto::cluster::v1 as cpb;
use agentrt_proto::cluster::v1::cluster_client::ClusterClient;
use agentrt_proto::v1 as pb;
use agentrt_runtime::store::Lease;
use agentrt_runtime::types::Principal;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status, Streaming};

use super::{KEY_HEADER, NO_LISTENER, WireKey, principal_to_pb};
use crate::clip;

/// Most cached channels (one per owner address).
pub(crate) const MAX_CHANNELS: usize = 64;
/// How long connecting to an owner may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 pings on a connection to an owner, so a forwarded stream to a
/// replica cut off by the network ends (UNAVAILABLE) instead of hanging.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Forwarder {
    key: WireKey,
    /// Most recently used last.
    channels: Mutex<VecDeque<(String, Channel)>>,
    /// Largest message a forwarded call may send or receive.
    max_message: usize,
}

/// Whether `status` says the owner could not be reached (made by this
/// side's transport, not sent by the owner).
fn unreachable(status: &Status) -> bool {
    status.code() == tonic::Code::Unavailable && std::error::Error::source(status).is_some()
}

/// The owner's status unchanged, or — when the owner could not be reached
/// — UNAVAILABLE naming the replica.
pub(crate) fn owner_status(lease: &Lease, status: Status) -> Status {
    if !unreachable(&status) {
        // The owner's own error map bounds it; bounded again all the same.
        return clip::status(status);
    }
    tracing::warn!(
        replica_id = %clip::id(&lease.replica_id),
        address = %clip::id(&lease.address),
        error = %clip::message(status.message().to_owned()),
        "cannot reach the replica that owns the session's live turn"
    );
    Status::unavailable(format!(
        "the session's live turn {} runs on replica {}, which cannot be reached from here; retry",
        clip::id(&lease.turn_id),
        clip::id(&lease.replica_id)
    ))
}

impl Forwarder {
    /// A forwarder whose calls carry `key`, sending and receiving messages
    /// up to `max_message` bytes.
    pub(crate) fn new(key: WireKey, max_message: usize) -> Self {
        Self {
            key,
            channels: Mutex::new(VecDeque::new()),
            max_message,
        }
    }

    /// The channel to `lease`'s owner: cached, or made (lazily connecting).
    fn client(&self, lease: &Lease) -> Result<ClusterClient<Channel>, Status> {
        let channel = {
            let mut cache = self.channels.lock().unwrap_or_else(|p| p.into_inner());
            match cache.iter().position(|(a, _)| *a == lease.address) {
                Some(i) => {
                    let entry = cache.remove(i).expect("the position just found");
                    let channel = entry.1.clone();
                    cache.push_back(entry);
                    channel
                }
                None if lease.address == NO_LISTENER => {
                    return Err(Status::unavailable(format!(
                        "the session's live turn {} runs on replica {}, which has no cluster \
                         listener to forward the call to; send it to that replica, or retry \
                         when the turn has ended",
                        clip::id(&lease.turn_id),
                        clip::id(&lease.replica_id)
                    )));
                }
                None => {
                    let endpoint = Endpoint::from_shared(lease.address.clone()).map_err(|_| {
                        Status::unavailable(format!(
                            "replica {} advertises an address that is not a URL; retry later",
                            clip::id(&lease.replica_id)
                        ))
                    })?;
                    let channel = endpoint
                        .connect_timeout(CONNECT_TIMEOUT)
                        .tcp_nodelay(true)
                        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
                        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                        .connect_lazy();
                    cache.push_back((lease.address.clone(), channel.clone()));
                    while cache.len() > MAX_CHANNELS {
                        cache.pop_front();
                    }
                    channel
                }
            }
        };
        Ok(ClusterClient::new(channel)
            .max_decoding_message_size(self.max_message)
            .max_encoding_message_size(self.max_message))
    }

    /// `message` with the key and the caller's deadline.
    fn request<T>(&self, message: T, deadline: Option<Duration>) -> Request<T> {
        let mut req = Request::new(message);
        req.metadata_mut()
            .insert(KEY_HEADER, self.key.value().clone());
        if let Some(left) = deadline {
            req.set_timeout(left);
        }
        req
    }

    /// `StopSession` on the owner.
    pub(crate) async fn stop_session(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::StopSessionRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::StopSessionResponse, Status> {
        let message = cpb::ForwardedStopSession {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .stop_session(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }

    /// `GetSessionStatus` on the owner.
    pub(crate) async fn session_status(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::GetSessionStatusRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::SessionStatus, Status> {
        let message = cpb::ForwardedGetSessionStatus {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .get_session_status(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }

    /// `CloseSession` on the owner.
    pub(crate) async fn close_session(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::CloseSessionRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::CloseSessionResponse, Status> {
        let message = cpb::ForwardedCloseSession {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .close_session(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }

    /// `SubmitToolResult` on the owner.
    pub(crate) async fn submit_tool_result(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::SubmitToolResultRequest,
        deadline: Option<Duration>,
    ) -> Result<pb::SubmitToolResultResponse, Status> {
        let message = cpb::ForwardedSubmitToolResult {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .submit_tool_result(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }

    /// `Subscribe` on the owner: its events, then its trailer.
    pub(crate) async fn subscribe(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::SubscribeRequest,
        deadline: Option<Duration>,
    ) -> Result<Streaming<pb::ChatEvent>, Status> {
        let message = cpb::ForwardedSubscribe {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .subscribe(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }

    /// A `Chat` retry joining the owner's turn of the same request id.
    pub(crate) async fn join_chat(
        &self,
        lease: &Lease,
        who: &Principal,
        request: pb::ChatRequest,
        deadline: Option<Duration>,
    ) -> Result<Streaming<pb::ChatEvent>, Status> {
        let message = cpb::ForwardedChat {
            principal: Some(principal_to_pb(who)),
            request: Some(request),
        };
        let mut client = self.client(lease)?;
        client
            .join_chat(self.request(message, deadline))
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| owner_status(lease, s))
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

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
        let f = Forwarder::new(key, 1 << 20);
        f.client(&lease("http://127.0.0.1:1")).unwrap();
        for port in 2..=(MAX_CHANNELS as u16 + 5) {
            // Touch the first one now and then: it must survive.
            f.client(&lease("http://127.0.0.1:1")).unwrap();
            f.client(&lease(&format!("http://127.0.0.1:{port}")))
                .unwrap();
        }
        let cache = f.channels.lock().unwrap();
        assert_eq!(cache.len(), MAX_CHANNELS);
        assert!(cache.iter().any(|(a, _)| a == "http://127.0.0.1:1"));
        assert!(!cache.iter().any(|(a, _)| a == "http://127.0.0.1:2"));
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
        let f = Forwarder::new(key, 1 << 20);
        let who = Principal::local();
        let err = f
            .stop_session(
                &lease(&format!("http://127.0.0.1:{port}")),
                &who,
                pb::StopSessionRequest {
                    session_id: "s".to_owned(),
                },
                Some(Duration::from_secs(5)),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unavailable);
        assert!(err.message().contains("replica r-1"), "{}", err.message());
        assert!(!err.message().contains("sekrit"), "{}", err.message());
        let bad = f.client(&lease("not a url")).err().map(|s| s.code());
        assert_eq!(bad, Some(tonic::Code::Unavailable));
    }
}
