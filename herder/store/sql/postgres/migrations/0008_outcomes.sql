-- herder schema v8 (PostgreSQL): what issue 14's outcome table spends and records on the
-- job. transient_attempts: its own budget for rate limits and overloaded APIs;
-- escalations: weight moves (an OOM escalates once); actionable / human_action: the last
-- decision's flags. Columns with a constant default are added without a table rewrite.
ALTER TABLE herder_jobs
    ADD COLUMN transient_attempts int NOT NULL DEFAULT 0,
    ADD COLUMN escalations int NOT NULL DEFAULT 0,
    ADD COLUMN actionable boolean NOT NULL DEFAULT false,
    ADD COLUMN human_action boolean NOT NULL DEFAULT false,
    -- A job type's silence_timeout: no new log output for that long, the attempt is stuck.
    ADD COLUMN silence_timeout_seconds double precision;
