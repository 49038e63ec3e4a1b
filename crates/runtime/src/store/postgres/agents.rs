//! The `agents` and `agent_memory` tables (migration 8; see
//! `store/agents.rs`).

use async_trait::async_trait;

use super::PostgresStore;
use super::codec;
use crate::agents::{AgentVersion, Memory};
use crate::store::record::{decode, encode};
use crate::store::{AgentStore, StoreError};

fn corrupt(table: &str, key: &str, reason: String) -> StoreError {
    StoreError::Corrupt {
        key: format!("{table}/{}", key.escape_debug()),
        reason,
    }
}

fn big(v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Backend("a version beyond i64".to_owned()))
}

#[async_trait]
impl AgentStore for PostgresStore {
    async fn put_agent(&self, agent: &AgentVersion) -> Result<bool, StoreError> {
        codec::check_text("an agent", [agent.id.as_str()])?;
        let record = encode(agent)?;
        let version = big(agent.version)?;
        // The next version only: the previous one must exist (or none, for
        // version 1), and the primary key refuses a second writer.
        let sql = "INSERT INTO agents (id, version, record) \
                   SELECT $1::text, $2::bigint, $3::bytea \
                   WHERE COALESCE((SELECT max(version) FROM agents WHERE id = $1::text), 0) \
                       = $2::bigint - 1 \
                   ON CONFLICT DO NOTHING";
        let client = self.client().await?;
        let n = codec::execute(&client, sql, &[&agent.id, &version, &record]).await?;
        Ok(n == 1)
    }

    async fn get_agent(
        &self,
        id: &str,
        version: Option<u64>,
    ) -> Result<Option<AgentVersion>, StoreError> {
        let client = self.client().await?;
        let row = match version {
            Some(v) => {
                let sql = "SELECT record FROM agents WHERE id = $1 AND version = $2";
                codec::row(&client, sql, &[&id, &big(v)?]).await?
            }
            None => {
                let sql = "SELECT record FROM agents WHERE id = $1 ORDER BY version DESC LIMIT 1";
                codec::row(&client, sql, &[&id]).await?
            }
        };
        row.map(|row| decode(row.get::<_, &[u8]>(0)).map_err(|e| corrupt("agents", id, e)))
            .transpose()
    }

    async fn list_agents(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AgentVersion>, StoreError> {
        let sql = "SELECT DISTINCT ON (id) id, record FROM agents \
                   WHERE ($1::text IS NULL OR id > $1) ORDER BY id, version DESC LIMIT $2";
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let rows = codec::rows(&client, sql, &[&after, &limit]).await?;
        rows.iter()
            .map(|row| {
                decode(row.get::<_, &[u8]>(1))
                    .map_err(|e| corrupt("agents", row.get::<_, &str>(0), e))
            })
            .collect()
    }

    async fn get_memory(&self, owner: &str, agent: &str) -> Result<Memory, StoreError> {
        let sql = "SELECT record FROM agent_memory WHERE owner = $1 AND agent = $2";
        let client = self.client().await?;
        match codec::row(&client, sql, &[&owner, &agent]).await? {
            Some(row) => {
                decode(row.get::<_, &[u8]>(0)).map_err(|e| corrupt("agent_memory", agent, e))
            }
            None => Ok(Memory::default()),
        }
    }

    async fn put_memory(
        &self,
        owner: &str,
        agent: &str,
        memory: &Memory,
        expected: u64,
    ) -> Result<bool, StoreError> {
        codec::check_text("memory", [owner, agent])?;
        codec::check_text(
            "memory blocks",
            memory
                .blocks
                .iter()
                .flat_map(|(k, v)| [k.as_str(), v.as_str()]),
        )?;
        let record = encode(memory)?;
        let (version, expected) = (big(memory.version)?, big(expected)?);
        let client = self.client().await?;
        let n = if expected == 0 {
            let sql = "INSERT INTO agent_memory (owner, agent, version, record) \
                       VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
            codec::execute(&client, sql, &[&owner, &agent, &version, &record]).await?
        } else {
            let sql = "UPDATE agent_memory SET version = $3, record = $4 \
                       WHERE owner = $1 AND agent = $2 AND version = $5";
            codec::execute(
                &client,
                sql,
                &[&owner, &agent, &version, &record, &expected],
            )
            .await?
        };
        Ok(n == 1)
    }

    async fn delete_memory(&self, owner: &str, agent: Option<&str>) -> Result<u64, StoreError> {
        let sql = "DELETE FROM agent_memory WHERE owner = $1 AND ($2::text IS NULL OR agent = $2)";
        let client = self.client().await?;
        codec::execute(&client, sql, &[&owner, &agent]).await
    }

    async fn delete_agent_memory(&self, agent: &str) -> Result<u64, StoreError> {
        let sql = "DELETE FROM agent_memory WHERE agent = $1";
        let client = self.client().await?;
        codec::execute(&client, sql, &[&agent]).await
    }
}
