-- agentrt schema version 4: a session's turns listed newest first.
--
-- Turn ids are UUIDv7 strings (time-ordered), so byte order of the id is
-- admission order; ListTurns pages through a session's turns by id in byte
-- order (COLLATE "C", whatever the database's default collation), which
-- this index serves without a sort.

CREATE INDEX turns_newest ON turns (session_id, turn_id COLLATE "C");
