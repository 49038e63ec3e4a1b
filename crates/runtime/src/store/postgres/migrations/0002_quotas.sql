-- agentrt schema version 2: quotas per owner (the [quotas] table).
--
-- `user_bytes` counts the user messages' bytes stored in the session (the
-- `stored_bytes` quota sums it over the owner's sessions; it goes with the
-- session when that is deleted). Sessions stored before this migration
-- count from here on. `turn_minutes` counts the turns an owner began in a
-- minute of the database's clock (the `turns_per_minute` quota); each
-- begin removes the owner's older minutes, so it holds at most one row per
-- owner that ever began a turn under that quota.

ALTER TABLE sessions ADD COLUMN user_bytes bigint NOT NULL DEFAULT 0;

CREATE TABLE turn_minutes (
    owner  text COLLATE "C" NOT NULL,
    minute timestamptz NOT NULL,
    turns  bigint NOT NULL,
    PRIMARY KEY (owner, minute)
);
