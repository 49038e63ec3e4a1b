//! `agentrt.v1.RuntimeAdmin`: operator calls, admin principals only (the
//! core refuses others with PERMISSION_DENIED).
//!
//! With several replicas, `ResetRunners` and `InvalidateRunners` act here
//! and then on every other live replica (the same call, sent to each
//! one's internal listener; a call that arrived so acts only where it
//! arrived); `SetDefaultModel` is stored by the core and every replica
//! applies it; `Drain` and `Undrain` act on this replica; `DeleteSessions` acts here
//! and, when a matching session's live turn runs on another replica, there
//! too (where that turn is stopped). Each response names the replicas it
//! acted on. `ListReplicas` reads the store: any replica answers for all.

use std::time::Duration;

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::runtime_admin_client::RuntimeAdminClient;
use agentrt_proto::v1::runtime_admin_server::RuntimeAdmin;
use agentrt_runtime::Runtime;
use agentrt_runtime::store::Replica;
use std::future::Future;
use std::sync::Arc;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::call::{Acted, Call};
use crate::cluster::Forwarder;
use crate::convert;
use crate::status::from_runtime;

/// Default wait of `Drain` when the request names none.
const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// Longest `Drain` wait accepted.
const MAX_DRAIN: Duration = Duration::from_secs(3600);

/// The other replicas' client, the one cluster-wide calls go through.
type Peer = RuntimeAdminClient<Channel>;

/// The `RuntimeAdmin` implementation.
#[derive(Debug, Clone)]
pub struct RuntimeAdminHandler {
    runtime: Runtime,
    /// Reaches the other replicas (`[cluster]`).
    forward: Option<Arc<Forwarder>>,
}

impl RuntimeAdminHandler {
    /// Administers `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self::with_forwarder(runtime, None)
    }

    /// Administers `runtime` and, with `forward`, the other live replicas.
    pub(crate) fn with_forwarder(runtime: Runtime, forward: Option<Arc<Forwarder>>) -> Self {
        Self { runtime, forward }
    }

    /// The live replicas a cluster-wide call reaches (none on a store one
    /// process owns).
    async fn replicas(&self, call: &Call) -> Result<Vec<Replica>, Status> {
        self.runtime
            .live_replicas(&call.who)
            .await
            .map_err(from_runtime)
    }

    /// `message` sent with `send` to every other live replica (see
    /// [`Call::on_other_replicas`]): the count each reported.
    async fn everywhere<T, F, Fut>(
        &self,
        call: &Call,
        message: &T,
        send: F,
    ) -> Result<Acted<u32>, Status>
    where
        T: Clone,
        F: Fn(Peer, Request<T>) -> Fut,
        Fut: Future<Output = Result<Response<u32>, Status>>,
    {
        let replicas = self.replicas(call).await?;
        call.on_other_replicas(
            self.forward.as_deref(),
            &replicas,
            self.runtime.replica_id(),
            message,
            send,
        )
        .await
    }

    /// The count `here` plus the others', and the replicas that acted
    /// (this one first).
    fn summed(&self, here: usize, others: Acted<u32>) -> (u32, Vec<String>) {
        let mut total = count(here);
        let mut replica_ids = self.own();
        for (id, theirs) in others {
            total = total.saturating_add(theirs);
            replica_ids.push(id);
        }
        (total, replica_ids)
    }

    /// This replica's id, as responses name it (none on a single process).
    fn own(&self) -> Vec<String> {
        self.runtime
            .replica_id()
            .map(str::to_owned)
            .into_iter()
            .collect()
    }
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[tonic::async_trait]
impl RuntimeAdmin for RuntimeAdminHandler {
    async fn reset_runners(
        &self,
        req: Request<pb::ResetRunnersRequest>,
    ) -> Result<Response<pb::ResetRunnersResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let user = (!r.user_id.is_empty()).then(|| r.user_id.clone());
        let n = self
            .runtime
            .reset_runners(&call.who, user.as_deref())
            .map_err(from_runtime)?;
        let others = self
            .everywhere(&call, &r, |mut c: Peer, r| async move {
                c.reset_runners(r).await.map(|a| a.map(|a| a.count))
            })
            .await?;
        let (count, replica_ids) = self.summed(n, others);
        Ok(Response::new(pb::ResetRunnersResponse {
            count,
            replica_ids,
        }))
    }

    async fn set_default_model(
        &self,
        req: Request<pb::SetDefaultModelRequest>,
    ) -> Result<Response<pb::SetDefaultModelResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let thinking = convert::thinking_from_pb(r.thinking, "thinking").map_err(from_runtime)?;
        let previous_model = self
            .runtime
            .set_default_model(&call.who, &r.model, thinking)
            .await
            .map_err(from_runtime)?;
        let mut replica_ids: Vec<String> = self
            .replicas(&call)
            .await?
            .into_iter()
            .map(|r| r.id)
            .collect();
        if replica_ids.is_empty() {
            replica_ids = self.own();
        }
        Ok(Response::new(pb::SetDefaultModelResponse {
            previous_model,
            replica_ids,
        }))
    }

    async fn invalidate_runners(
        &self,
        req: Request<pb::InvalidateRunnersRequest>,
    ) -> Result<Response<pb::InvalidateRunnersResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let n = self
            .runtime
            .invalidate_runners(&call.who)
            .map_err(from_runtime)?;
        let others = self
            .everywhere(&call, &r, |mut c: Peer, r| async move {
                c.invalidate_runners(r).await.map(|a| a.map(|a| a.count))
            })
            .await?;
        let (count, replica_ids) = self.summed(n, others);
        Ok(Response::new(pb::InvalidateRunnersResponse {
            count,
            replica_ids,
        }))
    }

    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let timeout = convert::duration_from_pb(r.timeout, "timeout")
            .map_err(from_runtime)?
            .unwrap_or(DEFAULT_DRAIN)
            .min(MAX_DRAIN);
        let remaining = self
            .runtime
            .drain(&call.who, timeout)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::DrainResponse {
            remaining: count(remaining),
            replica_ids: self.own(),
        }))
    }

    async fn undrain(
        &self,
        req: Request<pb::UndrainRequest>,
    ) -> Result<Response<pb::UndrainResponse>, Status> {
        let (call, _) = Call::open(req)?;
        let was_draining = self.runtime.undrain(&call.who).map_err(from_runtime)?;
        Ok(Response::new(pb::UndrainResponse {
            was_draining,
            replica_ids: self.own(),
        }))
    }

    async fn get_runtime_stats(
        &self,
        req: Request<pb::GetRuntimeStatsRequest>,
    ) -> Result<Response<pb::RuntimeStats>, Status> {
        let (call, _) = Call::open(req)?;
        let stats = self.runtime.stats(&call.who).await.map_err(from_runtime)?;
        Ok(Response::new(convert::runtime_stats(stats)))
    }

    async fn get_user_usage(
        &self,
        req: Request<pb::GetUserUsageRequest>,
    ) -> Result<Response<pb::UserUsage>, Status> {
        let (call, r) = Call::open(req)?;
        let usage = self
            .runtime
            .user_usage(&call.who, &r.user_id)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::user_usage(r.user_id, usage)))
    }

    async fn list_replicas(
        &self,
        req: Request<pb::ListReplicasRequest>,
    ) -> Result<Response<pb::ListReplicasResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let size = usize::try_from(r.page_size).unwrap_or(usize::MAX);
        let list = self
            .runtime
            .list_replicas(&call.who, size, &r.page_token)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(convert::replica_list(list)))
    }

    async fn delete_sessions(
        &self,
        req: Request<pb::DeleteSessionsRequest>,
    ) -> Result<Response<pb::DeleteSessionsResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let here = self
            .runtime
            .delete_sessions(&call.who, &r.owner, &r.agent_id)
            .await
            .map_err(from_runtime)?;
        let mut answer = pb::DeleteSessionsResponse {
            deleted: here.deleted,
            remaining: here.still_ending,
            replica_ids: self.own(),
        };
        if here.live_elsewhere == 0 {
            return Ok(Response::new(answer));
        }
        // Their turns are stopped where they run: the same call there.
        let replicas = self.replicas(&call).await?;
        let others = call
            .on_other_replicas(
                self.forward.as_deref(),
                &replicas,
                self.runtime.replica_id(),
                &r,
                |mut c: Peer, r| async move {
                    c.delete_sessions(r)
                        .await
                        .map(|a| a.map(|a| (a.deleted, a.remaining)))
                },
            )
            .await?;
        if others.is_empty() {
            // Not sent anywhere (no forwarding, or a call forwarded here).
            answer.remaining += here.live_elsewhere;
        }
        for (id, (deleted, remaining)) in others {
            answer.deleted += deleted;
            answer.remaining += remaining;
            answer.replica_ids.push(id);
        }
        Ok(Response::new(answer))
    }
}
