-- agentrt schema version 5: what a session may spend and what it spent.
--
-- `budget`: the session's limits, set at CreateSession / UpdateSession
-- ({"max_tokens", "max_cost_nano_usd"}, each absent or null for no limit).
-- `spent`: its ended turns' usage and cost summed ({"usage": {input_tokens,
-- output_tokens, reasoning_tokens, cached_input_tokens}, "cost_nano_usd"}),
-- added in the transaction that stores a turn's end. Sessions that exist
-- before this migration start with no budget and nothing spent.

ALTER TABLE sessions
    ADD COLUMN budget jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN spent  jsonb NOT NULL DEFAULT '{}';
