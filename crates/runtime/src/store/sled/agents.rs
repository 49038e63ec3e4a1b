//! The `agents` tree: agent versions and memory blocks (see
//! `store/agents.rs`).
//!
//! Keys: `a` id `\0` version (8 bytes, big-endian) → [`AgentVersion`], so an
//! id's versions are in order and its latest is the last under its prefix
//! (ids never hold NUL); `m` owner's length (4 bytes, big-endian) owner agent
//! → [`Memory`], so one owner's records share a prefix whatever the owner's
//! bytes. Every write is compare-and-swap, then flushed.

use async_trait::async_trait;

use super::{AGENTS, SledStore, backend, blocking, decode};
use crate::agents::{AgentVersion, Memory};
use crate::store::record::encode;
use crate::store::{AgentStore, StoreError};

fn agent_prefix(id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(id.len() + 2);
    key.push(b'a');
    key.extend_from_slice(id.as_bytes());
    key.push(0);
    key
}

fn agent_key(id: &str, version: u64) -> Vec<u8> {
    let mut key = agent_prefix(id);
    key.extend_from_slice(&version.to_be_bytes());
    key
}

fn owner_prefix(owner: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(owner.len() + 5);
    key.push(b'm');
    key.extend_from_slice(&u32::try_from(owner.len()).unwrap_or(u32::MAX).to_be_bytes());
    key.extend_from_slice(owner.as_bytes());
    key
}

fn memory_key(owner: &str, agent: &str) -> Vec<u8> {
    let mut key = owner_prefix(owner);
    key.extend_from_slice(agent.as_bytes());
    key
}

impl SledStore {
    /// The latest version stored of `id` (0: none).
    fn latest_agent(&self, id: &str) -> Result<Option<AgentVersion>, StoreError> {
        let prefix = agent_prefix(id);
        match self.agents.scan_prefix(&prefix).next_back() {
            None => Ok(None),
            Some(Err(e)) => Err(backend("scan", e)),
            Some(Ok((key, value))) => decode(AGENTS, &key, &value).map(Some),
        }
    }
}

#[async_trait]
impl AgentStore for SledStore {
    async fn put_agent(&self, agent: &AgentVersion) -> Result<bool, StoreError> {
        self.disk.admit()?;
        let started = std::time::Instant::now();
        let latest = self.latest_agent(&agent.id)?.map_or(0, |a| a.version);
        if agent.version != latest + 1 {
            return Ok(false);
        }
        let value = encode(agent)?;
        let swapped = self
            .agents
            .compare_and_swap(
                agent_key(&agent.id, agent.version),
                None::<&[u8]>,
                Some(value),
            )
            .map_err(|e| backend("write", e))?;
        if swapped.is_err() {
            return Ok(false);
        }
        self.durable_write(started).await?;
        Ok(true)
    }

    async fn get_agent(
        &self,
        id: &str,
        version: Option<u64>,
    ) -> Result<Option<AgentVersion>, StoreError> {
        match version {
            None => self.latest_agent(id),
            Some(v) => {
                let key = agent_key(id, v);
                match self.agents.get(&key).map_err(|e| backend("read", e))? {
                    Some(value) => decode(AGENTS, &key, &value).map(Some),
                    None => Ok(None),
                }
            }
        }
    }

    async fn list_agents(
        &self,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<AgentVersion>, StoreError> {
        let tree = self.agents.clone();
        let after = after.map(str::to_owned);
        blocking(move || {
            // Ids in order: after each id's last version, skip to the next.
            let mut out = Vec::new();
            let mut from = match &after {
                // The first key past every version of `after`.
                Some(a) => {
                    let mut k = agent_prefix(a);
                    k.extend_from_slice(&[0xff; 9]);
                    k
                }
                None => vec![b'a'],
            };
            while out.len() < limit {
                let Some(entry) = tree.range(from.clone()..vec![b'b']).next() else {
                    break;
                };
                let (key, _) = entry.map_err(|e| backend("scan", e))?;
                let Some(nul) = key.iter().position(|&b| b == 0) else {
                    return Err(StoreError::Corrupt {
                        key: format!("{AGENTS}/{}", key.escape_ascii()),
                        reason: "an agent key without its version".to_owned(),
                    });
                };
                let prefix = key[..=nul].to_vec();
                if let Some(last) = tree.scan_prefix(&prefix).next_back() {
                    let (k, v) = last.map_err(|e| backend("scan", e))?;
                    out.push(decode(AGENTS, &k, &v)?);
                }
                from = prefix;
                from.extend_from_slice(&[0xff; 9]);
            }
            Ok(out)
        })
        .await
    }

    async fn get_memory(&self, owner: &str, agent: &str) -> Result<Memory, StoreError> {
        let key = memory_key(owner, agent);
        match self.agents.get(&key).map_err(|e| backend("read", e))? {
            Some(value) => decode(AGENTS, &key, &value),
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
        self.disk.admit()?;
        let started = std::time::Instant::now();
        let key = memory_key(owner, agent);
        let current = self.agents.get(&key).map_err(|e| backend("read", e))?;
        let version = match &current {
            Some(value) => decode::<Memory>(AGENTS, &key, value)?.version,
            None => 0,
        };
        if version != expected {
            return Ok(false);
        }
        let swapped = self
            .agents
            .compare_and_swap(&key, current, Some(encode(memory)?))
            .map_err(|e| backend("write", e))?;
        if swapped.is_err() {
            return Ok(false);
        }
        self.durable_write(started).await?;
        Ok(true)
    }

    async fn delete_memory(&self, owner: &str, agent: Option<&str>) -> Result<u64, StoreError> {
        let started = std::time::Instant::now();
        let prefix = match agent {
            Some(agent) => memory_key(owner, agent),
            None => owner_prefix(owner),
        };
        let tree = self.agents.clone();
        let exact = agent.is_some();
        let removed = blocking(move || {
            let mut removed = 0u64;
            for entry in tree.scan_prefix(&prefix).keys() {
                let key = entry.map_err(|e| backend("scan", e))?;
                // An exact key only: another agent's id may extend this one.
                if exact && key.as_ref() != prefix.as_slice() {
                    continue;
                }
                tree.remove(&key).map_err(|e| backend("delete", e))?;
                removed += 1;
            }
            Ok(removed)
        })
        .await?;
        self.durable_write(started).await?;
        Ok(removed)
    }

    async fn delete_agent_memory(&self, agent: &str) -> Result<u64, StoreError> {
        let started = std::time::Instant::now();
        let tree = self.agents.clone();
        let agent = agent.as_bytes().to_vec();
        let removed = blocking(move || {
            let mut removed = 0u64;
            for entry in tree.scan_prefix(b"m").keys() {
                let key = entry.map_err(|e| backend("scan", e))?;
                // `m`, the owner's length (4 bytes), the owner, the agent.
                let owner_len = key
                    .get(1..5)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .map_or(usize::MAX, |b| u32::from_be_bytes(b) as usize);
                if key.get(5usize.saturating_add(owner_len)..) == Some(agent.as_slice()) {
                    tree.remove(&key).map_err(|e| backend("delete", e))?;
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await?;
        self.durable_write(started).await?;
        Ok(removed)
    }
}
