-- agentrt schema version 7: what each owner's turns spent per UTC day (the
-- daily_tokens and daily_cost quotas).
--
-- One row per owner and day (days since the epoch, UTC): input plus output
-- tokens and cost in nano-USD of the owner's turns that ended that day,
-- added in the transaction that stores each turn's end. Rows stay when
-- sessions are deleted: what was spent was spent.

CREATE TABLE daily_spent (
    owner  text COLLATE "C" NOT NULL,
    day    bigint NOT NULL,
    tokens bigint NOT NULL DEFAULT 0,
    cost   bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, day)
);

-- A paused turn's bound (its pause's `until`, nanoseconds since the epoch;
-- NULL unless paused): every replica looks every few seconds for the paused
-- turns past it, the longest expired first.
ALTER TABLE turns ADD COLUMN pause_until bigint;
CREATE INDEX turns_paused ON turns (pause_until) WHERE status = 'paused';
