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

-- The paused turns (waiting for their callers with no process running
-- them), looked through by every replica every few seconds for those past
-- their bound.
CREATE INDEX turns_paused ON turns (session_id, turn_id) WHERE status = 'paused';
