//! Agent versions and memory blocks ([`agentrt_runtime::store::AgentStore`]).

use std::time::UNIX_EPOCH;

use agentrt_runtime::agents::{AgentSource, AgentSpec, AgentVersion, Memory};
use agentrt_runtime::store::Store;

fn version(id: &str, version: u64, prompt: &str) -> AgentVersion {
    AgentVersion {
        id: id.to_owned(),
        version,
        source: AgentSource::Api,
        spec: AgentSpec {
            system_prompt: prompt.to_owned(),
            ..AgentSpec::default()
        },
        created_at: UNIX_EPOCH,
    }
}

/// Versions are added one at a time, never replaced; the latest is the
/// highest; a listing pages by id with each agent's latest.
pub async fn agent_versions_are_immutable_and_listed_by_id(store: &dyn Store) {
    let agents = store.agents();
    assert!(agents.get_agent("a", None).await.unwrap().is_none());
    assert!(!agents.put_agent(&version("a", 2, "skip")).await.unwrap());
    assert!(agents.put_agent(&version("a", 1, "one")).await.unwrap());
    assert!(!agents.put_agent(&version("a", 1, "again")).await.unwrap());
    assert!(agents.put_agent(&version("a", 2, "two")).await.unwrap());
    // An id extending another is its own agent.
    assert!(agents.put_agent(&version("a1", 1, "other")).await.unwrap());
    assert!(agents.put_agent(&version("b", 1, "bee")).await.unwrap());
    let latest = agents.get_agent("a", None).await.unwrap().unwrap();
    assert_eq!(
        (latest.version, latest.spec.system_prompt.as_str()),
        (2, "two")
    );
    let first = agents.get_agent("a", Some(1)).await.unwrap().unwrap();
    assert_eq!(first.spec.system_prompt, "one");
    assert!(agents.get_agent("a", Some(3)).await.unwrap().is_none());
    let page: Vec<_> = agents
        .list_agents(None, 2)
        .await
        .unwrap()
        .into_iter()
        .map(|a| (a.id, a.version))
        .collect();
    assert_eq!(page, [("a".to_owned(), 2), ("a1".to_owned(), 1)]);
    let rest: Vec<_> = agents
        .list_agents(Some("a1"), 10)
        .await
        .unwrap()
        .into_iter()
        .map(|a| a.id)
        .collect();
    assert_eq!(rest, ["b"]);
}

/// Memory is per owner and agent, replaced by compare-and-swap on its
/// version, and deleted per agent or for every agent of an owner.
pub async fn memory_is_per_owner_and_agent_and_swapped_by_version(store: &dyn Store) {
    let agents = store.agents();
    let empty = agents.get_memory("alice", "a").await.unwrap();
    assert_eq!(empty, Memory::default());
    let one = Memory {
        version: 1,
        blocks: [("fact".to_owned(), "tea".to_owned())].into(),
    };
    assert!(agents.put_memory("alice", "a", &one, 0).await.unwrap());
    // A writer that read version 0 lost.
    assert!(!agents.put_memory("alice", "a", &one, 0).await.unwrap());
    let two = Memory {
        version: 2,
        blocks: [("fact".to_owned(), "coffee".to_owned())].into(),
    };
    assert!(!agents.put_memory("alice", "a", &two, 5).await.unwrap());
    assert!(agents.put_memory("alice", "a", &two, 1).await.unwrap());
    assert_eq!(agents.get_memory("alice", "a").await.unwrap(), two);
    // Another owner, another agent, an owner extending another's name.
    assert_eq!(
        agents.get_memory("bob", "a").await.unwrap(),
        Memory::default()
    );
    assert_eq!(
        agents.get_memory("alice", "b").await.unwrap(),
        Memory::default()
    );
    assert!(agents.put_memory("alice", "b", &one, 0).await.unwrap());
    assert!(agents.put_memory("alice2", "a", &one, 0).await.unwrap());
    assert!(agents.put_memory("bob", "a", &one, 0).await.unwrap());
    assert_eq!(agents.delete_memory("alice", Some("b")).await.unwrap(), 1);
    assert_eq!(
        agents.get_memory("alice", "b").await.unwrap(),
        Memory::default()
    );
    assert!(agents.put_memory("alice", "b", &one, 0).await.unwrap());
    assert_eq!(agents.delete_memory("alice", None).await.unwrap(), 2);
    assert_eq!(
        agents.get_memory("alice", "a").await.unwrap(),
        Memory::default()
    );
    assert_eq!(agents.get_memory("alice2", "a").await.unwrap(), one);
    assert_eq!(agents.get_memory("bob", "a").await.unwrap(), one);
    // Every owner's memory of one agent.
    assert!(agents.put_memory("bob", "a1", &one, 0).await.unwrap());
    assert_eq!(agents.delete_agent_memory("a").await.unwrap(), 2);
    assert_eq!(
        agents.get_memory("bob", "a").await.unwrap(),
        Memory::default()
    );
    assert_eq!(agents.get_memory("bob", "a1").await.unwrap(), one);
}
