-- agentrt schema version 3: what every replica shares besides sessions.
--
-- `replicas`: one row per replica process, written by its heartbeat (every
-- second) and removed when it stops cleanly; a row whose heartbeat is older
-- than a few lease times belongs to a replica that died and is removed by
-- the next heartbeat of any replica. Operator calls that act cluster-wide
-- (ResetRunners, InvalidateRunners) reach the replicas listed here.
--
-- `settings`: operator settings every replica applies (today the default
-- model set by SetDefaultModel), one row per name, its value as JSON and a
-- version that grows with every change; replicas poll it with their
-- heartbeat and apply a newer version.

CREATE TABLE replicas (
    id           text COLLATE "C" PRIMARY KEY,
    address      text NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL
);

CREATE TABLE settings (
    name       text COLLATE "C" PRIMARY KEY,
    value      jsonb NOT NULL,
    version    bigint NOT NULL,
    updated_at timestamptz NOT NULL
);
