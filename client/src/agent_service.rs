//! `AgentService`: agent profiles (creating and updating them is for admin
//! principals) and the caller's memory blocks.

use crate::{Client, Error, proto};

impl Client {
    /// Creates agent `agent_id` (its version 1; admin principals only).
    pub async fn create_agent(
        &self,
        agent_id: &str,
        spec: proto::AgentSpec,
    ) -> Result<proto::Agent, Error> {
        let req = proto::CreateAgentRequest {
            agent_id: agent_id.to_owned(),
            spec: Some(spec),
        };
        let mut stub = self.agents.clone();
        let r = self
            .call(None, req, |r| async move { stub.create_agent(r).await })
            .await?;
        r.agent
            .ok_or_else(|| Error::Protocol("CreateAgentResponse without an agent".into()))
    }

    /// Replaces agent `agent_id`'s spec: its next version (admin principals
    /// only). `expected_version` (when set) must be its latest.
    pub async fn update_agent(
        &self,
        agent_id: &str,
        spec: proto::AgentSpec,
        expected_version: Option<u64>,
    ) -> Result<proto::Agent, Error> {
        let req = proto::UpdateAgentRequest {
            agent_id: agent_id.to_owned(),
            spec: Some(spec),
            expected_version: expected_version.unwrap_or(0),
        };
        let mut stub = self.agents.clone();
        let r = self
            .call(None, req, |r| async move { stub.update_agent(r).await })
            .await?;
        r.agent
            .ok_or_else(|| Error::Protocol("UpdateAgentResponse without an agent".into()))
    }

    /// Version `version` of agent `agent_id` (the latest when `None`).
    pub async fn agent(&self, agent_id: &str, version: Option<u64>) -> Result<proto::Agent, Error> {
        let req = proto::GetAgentRequest {
            agent_id: agent_id.to_owned(),
            version: version.unwrap_or(0),
        };
        let mut stub = self.agents.clone();
        let r = self
            .call(None, req, |r| async move { stub.get_agent(r).await })
            .await?;
        r.agent
            .ok_or_else(|| Error::Protocol("GetAgentResponse without an agent".into()))
    }

    /// Every agent's latest version, following the pages.
    pub async fn agents(&self) -> Result<Vec<proto::Agent>, Error> {
        let mut all = Vec::new();
        let mut page_token = String::new();
        loop {
            let req = proto::ListAgentsRequest {
                page_size: 500,
                page_token: std::mem::take(&mut page_token),
            };
            let mut stub = self.agents.clone();
            let page = self
                .call(None, req, |r| async move { stub.list_agents(r).await })
                .await?;
            all.extend(page.agents);
            if page.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = page.next_page_token;
        }
    }

    /// The caller's memory blocks for `agent_id` (or `user_id`'s: admin
    /// principals only).
    pub async fn memory(
        &self,
        agent_id: &str,
        user_id: Option<&str>,
    ) -> Result<proto::GetMemoryResponse, Error> {
        let req = proto::GetMemoryRequest {
            agent_id: agent_id.to_owned(),
            user_id: user_id.unwrap_or_default().to_owned(),
        };
        let mut stub = self.agents.clone();
        self.call(None, req, |r| async move { stub.get_memory(r).await })
            .await
    }

    /// Sets memory block `block` of the caller's memory for `agent_id` to
    /// `text`.
    pub async fn set_memory(
        &self,
        agent_id: &str,
        block: &str,
        text: &str,
    ) -> Result<proto::UpdateMemoryResponse, Error> {
        self.update_memory(proto::UpdateMemoryRequest {
            agent_id: agent_id.to_owned(),
            edits: vec![proto::MemoryEdit {
                block: block.to_owned(),
                change: Some(proto::memory_edit::Change::Set(text.to_owned())),
            }],
            ..Default::default()
        })
        .await
    }

    /// Applies a memory update as given.
    pub async fn update_memory(
        &self,
        req: proto::UpdateMemoryRequest,
    ) -> Result<proto::UpdateMemoryResponse, Error> {
        let mut stub = self.agents.clone();
        self.call(None, req, |r| async move { stub.update_memory(r).await })
            .await
    }
}
