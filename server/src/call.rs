//! [`Call`]: what every handler of every public service starts with — the
//! caller's principal, the caller's deadline, the session named on the
//! RPC's span — and, for a call the core says belongs to a live turn on
//! another replica, the one place that decides whether and how to forward
//! it ([`Call::forward_or`]).

use std::future::Future;
use std::time::Duration;

use agentrt_runtime::RuntimeError;
use agentrt_runtime::store::{Lease, Replica};
use agentrt_runtime::types::Principal;
use tonic::{Request, Response, Status, Streaming};

use crate::cluster::{Forwarded, ForwardedCall, Forwarder, Peer, To};

/// One call's context; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    /// Who is calling (authenticated here, or by the replica that
    /// forwarded the call).
    pub(crate) who: Principal,
    /// What is left of the caller's deadline when the call arrived.
    pub(crate) deadline: Option<Duration>,
    /// Forwarded here by another replica: answered here, never forwarded.
    forwarded: bool,
}

impl Call {
    /// The call's context and its message.
    pub(crate) fn open<T>(req: Request<T>) -> Result<(Self, T), Status> {
        let who = crate::auth::principal(&req)?;
        let deadline = crate::convert::grpc_deadline(req.metadata());
        let forwarded = req.extensions().get::<ForwardedCall>().is_some();
        let call = Self {
            who,
            deadline,
            forwarded,
        };
        Ok((call, req.into_inner()))
    }

    /// Names the session on the RPC's span (declared empty by the server).
    pub(crate) fn session(&self, id: &str) {
        // Recorded before the id is validated: clipped, like every echo.
        tracing::Span::current().record("session_id", crate::clip::id(id).as_ref());
    }

    /// Where `err` says the session's live turn runs on another replica and
    /// this call may go there: the owner's lease; otherwise the status the
    /// call fails with (`fail` maps every other error).
    fn owner<'f>(
        &self,
        forward: Option<&'f Forwarder>,
        err: RuntimeError,
        fail: impl FnOnce(RuntimeError) -> Status,
    ) -> Result<(&'f Forwarder, Lease), Status> {
        match (err, forward) {
            // It moved since the forwarding replica read the lease: the
            // caller retries (no second hop, so no loop between replicas).
            (RuntimeError::Elsewhere(_), _) if self.forwarded => Err(Status::unavailable(
                "the turn moved to another replica meanwhile; retry",
            )),
            (RuntimeError::Elsewhere(lease), Some(forward)) => Ok((forward, lease)),
            (other, _) => Err(fail(other)),
        }
    }

    /// The call's answer when the core refused it with `err`: for a turn
    /// on another replica, `message` sent there with `send` (the same RPC
    /// on the owner's client `P`) and its answer as the owner gave it;
    /// otherwise `fail(err)`.
    pub(crate) async fn forward_or<P, T, R, F, Fut>(
        &self,
        forward: Option<&Forwarder>,
        err: RuntimeError,
        fail: impl FnOnce(RuntimeError) -> Status,
        message: T,
        send: F,
    ) -> Result<Response<R>, Status>
    where
        P: Peer,
        F: FnOnce(P, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let to_owner = self.to_owner(forward, err, fail, message, send);
        to_owner.await.map(|(answer, _)| Response::new(answer))
    }

    /// [`forward_or`](Self::forward_or) for a server-streaming RPC: the
    /// owner's stream, its error status mapped as the forwarder maps it.
    pub(crate) async fn forward_stream_or<P, T, I, F, Fut>(
        &self,
        forward: Option<&Forwarder>,
        err: RuntimeError,
        fail: impl FnOnce(RuntimeError) -> Status,
        message: T,
        send: F,
    ) -> Result<Forwarded<I>, Status>
    where
        P: Peer,
        F: FnOnce(P, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<I>>, Status>>,
    {
        let to_owner = self.to_owner(forward, err, fail, message, send);
        to_owner
            .await
            .map(|(items, lease)| Forwarded::new(items, lease))
    }

    /// The one body of both: the owner's answer with its lease.
    async fn to_owner<P, T, R, F, Fut>(
        &self,
        forward: Option<&Forwarder>,
        err: RuntimeError,
        fail: impl FnOnce(RuntimeError) -> Status,
        message: T,
        send: F,
    ) -> Result<(R, Lease), Status>
    where
        P: Peer,
        F: FnOnce(P, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let (forward, lease) = self.owner(forward, err, fail)?;
        let answer = forward
            .call(To::Owner(&lease), &self.who, self.deadline, message, send)
            .await?;
        Ok((answer, lease))
    }
}

/// What an operator call did on the replicas it reached: per replica, its
/// id and its answer.
pub(crate) type Acted<R> = Vec<(String, R)>;

impl Call {
    /// Sends an operator call that acts cluster-wide to every replica in
    /// `replicas` but this one (`own`), concurrently, with `send`; their
    /// answers. Nothing is sent for a call another replica forwarded here
    /// (it is that replica's fan-out), or without a forwarder. A replica
    /// that cannot be reached fails the call with UNAVAILABLE naming it and
    /// the replicas that did act (such calls are safe to repeat).
    pub(crate) async fn on_other_replicas<P, T, R, F, Fut>(
        &self,
        forward: Option<&Forwarder>,
        replicas: &[Replica],
        own: Option<&str>,
        message: &T,
        send: F,
    ) -> Result<Acted<R>, Status>
    where
        P: Peer,
        T: Clone,
        F: Fn(P, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let Some(forward) = forward.filter(|_| !self.forwarded) else {
            return Ok(Vec::new());
        };
        let calls = replicas
            .iter()
            .filter(|r| Some(r.id.as_str()) != own)
            .map(|r| async {
                let answer = forward
                    .call(
                        To::Replica(r),
                        &self.who,
                        self.deadline,
                        message.clone(),
                        &send,
                    )
                    .await;
                (r.id.clone(), answer)
            });
        let mut acted = Vec::new();
        let mut failed = Vec::new();
        for (id, answer) in futures::future::join_all(calls).await {
            match answer {
                Ok(answer) => acted.push((id, answer)),
                Err(status) => {
                    failed.push(format!("{} ({})", crate::clip::id(&id), status.message()))
                }
            }
        }
        if failed.is_empty() {
            return Ok(acted);
        }
        let mut done: Vec<&str> = acted.iter().map(|(id, _)| id.as_str()).collect();
        done.extend(own);
        Err(Status::unavailable(format!(
            "acted on replicas [{}] but could not reach {}; the call is safe to repeat",
            done.join(", "),
            failed.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::cluster::WireKey;
    use crate::config::ClusterKey;

    fn call(forwarded: bool) -> Call {
        Call {
            who: Principal::local(),
            deadline: None,
            forwarded,
        }
    }

    fn elsewhere() -> RuntimeError {
        RuntimeError::Elsewhere(Lease {
            replica_id: "r-2".to_owned(),
            address: "http://127.0.0.1:1".to_owned(),
            turn_id: "t-1".to_owned(),
            expires_at: SystemTime::now(),
        })
    }

    #[test]
    fn a_turn_elsewhere_is_forwarded_once_and_only_with_a_forwarder() {
        let forward = Forwarder::new(WireKey::new(&ClusterKey::new("k")).unwrap(), None, 1 << 20);
        let fail = crate::status::from_runtime;
        // A caller's call, on a replica that can forward: to the owner.
        let (_, lease) = call(false)
            .owner(Some(&forward), elsewhere(), fail)
            .expect("forwarded");
        assert_eq!(lease.replica_id, "r-2");
        // A call another replica forwarded here: never a second hop.
        let moved = call(true)
            .owner(Some(&forward), elsewhere(), fail)
            .unwrap_err();
        assert_eq!(moved.code(), tonic::Code::Unavailable);
        assert!(moved.message().contains("moved"), "{}", moved.message());
        // No forwarder (no [cluster]): the core's error, saying so.
        let alone = call(false).owner(None, elsewhere(), fail).unwrap_err();
        assert_eq!(alone.code(), tonic::Code::Unavailable);
        assert!(alone.message().contains("[cluster]"), "{}", alone.message());
        // Any other error is the caller's map of it.
        let other = call(false)
            .owner(Some(&forward), RuntimeError::SessionNotFound, fail)
            .unwrap_err();
        assert_eq!(other.code(), tonic::Code::NotFound);
    }
}
