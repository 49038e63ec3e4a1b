//! `agentrt.v1.RuntimeAdmin`: operator calls, admin principals only (the
//! core refuses others with PERMISSION_DENIED).

use std::time::Duration;

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::runtime_admin_server::RuntimeAdmin;
use agentrt_runtime::Runtime;
use tonic::{Request, Response, Status};

use crate::call::Call;
use crate::convert;
use crate::status::from_runtime;

/// Default wait of `Drain` when the request names none.
const DEFAULT_DRAIN: Duration = Duration::from_secs(30);
/// Longest `Drain` wait accepted.
const MAX_DRAIN: Duration = Duration::from_secs(3600);

/// The `RuntimeAdmin` implementation.
#[derive(Debug, Clone)]
pub struct RuntimeAdminHandler {
    runtime: Runtime,
}

impl RuntimeAdminHandler {
    /// Administers `runtime`.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
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
        let user = r.user_id;
        let user = (!user.is_empty()).then_some(user);
        let n = self
            .runtime
            .reset_runners(&call.who, user.as_deref())
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ResetRunnersResponse { count: count(n) }))
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
            .map_err(from_runtime)?;
        Ok(Response::new(pb::SetDefaultModelResponse {
            previous_model,
        }))
    }

    async fn invalidate_runners(
        &self,
        req: Request<pb::InvalidateRunnersRequest>,
    ) -> Result<Response<pb::InvalidateRunnersResponse>, Status> {
        let (call, _) = Call::open(req)?;
        let n = self
            .runtime
            .invalidate_runners(&call.who)
            .map_err(from_runtime)?;
        Ok(Response::new(pb::InvalidateRunnersResponse {
            count: count(n),
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
}
