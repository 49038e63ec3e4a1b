-- agentrt schema version 6: the sessions' inboxes (ON_BUSY_ENQUEUE).
--
-- One row per queued message: its id (UUIDv7, so byte order is arrival
-- order) and its record (the request, as admission takes it). A row leaves
-- only in the transaction that begins its turn (which fails when the row is
-- gone, so a message never runs twice), in the one that reports it failed
-- in history, by a stop that clears the inbox, or with its session.

CREATE TABLE inbox (
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    id         text COLLATE "C" NOT NULL,
    record     bytea NOT NULL,
    PRIMARY KEY (session_id, id)
);
