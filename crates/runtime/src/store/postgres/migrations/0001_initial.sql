-- agentrt schema version 1: sessions with their lease, messages, turns.
--
-- Ids compare with COLLATE "C" (byte order, which for UTF-8 is code-point
-- order): the listing's tie-break on id must be the order Rust's `str`
-- comparison gives, whatever the database's default collation is.
-- Times the runtime sets are bigint nanoseconds since the Unix epoch
-- (timestamptz keeps only microseconds, and a stored time must read back
-- exactly); the lease expiry is a timestamptz on the database's clock.

CREATE TABLE sessions (
    id                text COLLATE "C" PRIMARY KEY,
    owner             text COLLATE "C" NOT NULL,
    agent_id          text NOT NULL,
    project_id        text NOT NULL,
    title             text NOT NULL,
    model             text NOT NULL,
    system_prompt     text NOT NULL,
    metadata          jsonb NOT NULL,
    created_at_ns     bigint NOT NULL,
    last_active_ns    bigint NOT NULL,
    archived          boolean NOT NULL,
    last_turn         jsonb,
    message_count     bigint NOT NULL,
    next_seq          bigint NOT NULL,
    compacted_through bigint NOT NULL,
    summary_seq       bigint NOT NULL,
    incarnation       text NOT NULL,
    -- The live turn's lease: all four set, or all four NULL.
    lease_replica     text,
    lease_address     text,
    lease_turn        text,
    lease_expires     timestamptz,
    CONSTRAINT sessions_lease_whole CHECK (
        (lease_turn IS NULL) = (lease_replica IS NULL)
        AND (lease_turn IS NULL) = (lease_address IS NULL)
        AND (lease_turn IS NULL) = (lease_expires IS NULL)
    )
);

-- ListSessions: an owner's sessions, newest activity first, ties by id.
CREATE INDEX sessions_by_activity ON sessions (owner, last_active_ns DESC, id DESC);

-- The sweeper: leases by expiry, only sessions with a live turn.
CREATE INDEX sessions_lease_expiry ON sessions (lease_expires) WHERE lease_turn IS NOT NULL;

-- History: one row per message; `record` is the message as the sled store
-- encodes it (a version byte, then serde_json), so content of any kind
-- (NUL characters, image bytes) round-trips.
CREATE TABLE messages (
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    seq        bigint NOT NULL,
    turn_id    text NOT NULL,
    record     bytea NOT NULL,
    PRIMARY KEY (session_id, seq)
);

CREATE TABLE turns (
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    turn_id    text NOT NULL,
    request_id text,
    status     text NOT NULL,
    record     bytea NOT NULL,
    PRIMARY KEY (session_id, turn_id)
);

-- A Chat's idempotency key starts at most one turn per session.
CREATE UNIQUE INDEX turns_by_request ON turns (session_id, request_id) WHERE request_id IS NOT NULL;

-- Start-up recovery: the turns still running.
CREATE INDEX turns_running ON turns (session_id, turn_id) WHERE status = 'running';
