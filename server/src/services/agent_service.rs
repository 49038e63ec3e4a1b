//! `agentrt.v1.AgentService`: agent profiles (admin writes, anyone reads)
//! and each user's memory blocks. Agents and memory live in the store every
//! replica shares, so no call is forwarded.

use agentrt_proto::v1 as pb;
use agentrt_proto::v1::agent_service_server::AgentService;
use agentrt_runtime::Runtime;
use tonic::{Request, Response, Status};

use crate::call::Call;
use crate::convert;
use crate::status::from_runtime;

/// The `AgentService` implementation.
#[derive(Debug, Clone)]
pub struct AgentServiceHandler {
    runtime: Runtime,
}

impl AgentServiceHandler {
    /// Serves `runtime`'s agents.
    pub fn new(runtime: Runtime) -> Self {
        Self { runtime }
    }
}

#[tonic::async_trait]
impl AgentService for AgentServiceHandler {
    async fn create_agent(
        &self,
        req: Request<pb::CreateAgentRequest>,
    ) -> Result<Response<pb::CreateAgentResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let spec = convert::agent_spec(r.spec).map_err(from_runtime)?;
        let agent = self
            .runtime
            .create_agent(&call.who, &r.agent_id, spec)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::CreateAgentResponse {
            agent: Some(convert::agent_to_pb(agent)),
        }))
    }

    async fn update_agent(
        &self,
        req: Request<pb::UpdateAgentRequest>,
    ) -> Result<Response<pb::UpdateAgentResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let spec = convert::agent_spec(r.spec).map_err(from_runtime)?;
        let expected = (r.expected_version != 0).then_some(r.expected_version);
        let agent = self
            .runtime
            .update_agent(&call.who, &r.agent_id, spec, expected)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::UpdateAgentResponse {
            agent: Some(convert::agent_to_pb(agent)),
        }))
    }

    async fn get_agent(
        &self,
        req: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let version = (r.version != 0).then_some(r.version);
        let agent = self
            .runtime
            .get_agent(&call.who, &r.agent_id, version)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::GetAgentResponse {
            agent: Some(convert::agent_to_pb(agent)),
        }))
    }

    async fn list_agents(
        &self,
        req: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let size = usize::try_from(r.page_size).unwrap_or(usize::MAX);
        let (agents, next) = self
            .runtime
            .list_agents(&call.who, size, &r.page_token)
            .await
            .map_err(from_runtime)?;
        Ok(Response::new(pb::ListAgentsResponse {
            agents: agents.into_iter().map(convert::agent_to_pb).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn get_memory(
        &self,
        req: Request<pb::GetMemoryRequest>,
    ) -> Result<Response<pb::GetMemoryResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let memory = self
            .runtime
            .get_memory(&call.who, &r.agent_id, Some(&r.user_id))
            .await
            .map_err(from_runtime)?;
        let (blocks, version) = convert::memory_to_pb(memory);
        Ok(Response::new(pb::GetMemoryResponse { blocks, version }))
    }

    async fn update_memory(
        &self,
        req: Request<pb::UpdateMemoryRequest>,
    ) -> Result<Response<pb::UpdateMemoryResponse>, Status> {
        let (call, r) = Call::open(req)?;
        let edits = convert::memory_edits(r.edits).map_err(from_runtime)?;
        let expected = (r.expected_version != 0).then_some(r.expected_version);
        let memory = self
            .runtime
            .update_memory(&call.who, &r.agent_id, Some(&r.user_id), &edits, expected)
            .await
            .map_err(from_runtime)?;
        let (blocks, version) = convert::memory_to_pb(memory);
        Ok(Response::new(pb::UpdateMemoryResponse { blocks, version }))
    }
}
