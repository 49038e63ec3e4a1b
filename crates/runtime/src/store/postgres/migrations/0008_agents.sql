-- agentrt schema version 8: agent profiles (every version, immutable) and
-- memory blocks per owner and agent; how each session uses its agent.
--
-- `record` is the value as the sled store encodes it (a version byte, then
-- serde_json). A version is added by INSERT only, so two replicas racing
-- for the same version cannot both win; memory is replaced by
-- compare-and-swap on its version.

CREATE TABLE agents (
    id      text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    record  bytea NOT NULL,
    PRIMARY KEY (id, version)
);

CREATE TABLE agent_memory (
    owner   text COLLATE "C" NOT NULL,
    agent   text COLLATE "C" NOT NULL,
    version bigint NOT NULL,
    record  bytea NOT NULL,
    PRIMARY KEY (owner, agent)
);

-- The session's agent version (0: the latest), its parent session, the
-- memory snapshot of its prompt (see agents::AgentBinding).
ALTER TABLE sessions ADD COLUMN agent jsonb NOT NULL DEFAULT '{}';
CREATE INDEX sessions_by_parent ON sessions ((agent->>'parent_session_id'))
    WHERE agent->>'parent_session_id' <> '';
