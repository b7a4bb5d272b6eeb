-- herder schema v19 (PostgreSQL): fleet settings an operator changes at run time (issue
-- 24), read by every replica and the scheduler: `[fleet] emergency_max_workers` set or
-- lifted with `herder fleet cap`. A row overrides herder.toml; value NULL is "lifted".
CREATE TABLE herder_fleet_settings (
    name        text PRIMARY KEY,
    value       bigint,
    updated_at  timestamptz NOT NULL,
    updated_by  text NOT NULL
);
-- `/queue` and `/metrics` count each host's spawn failures of the last hour, and the
-- breakers read the recent outcomes: ended attempts are the 'finished' events.
CREATE INDEX herder_events_finished ON herder_events (at) WHERE kind = 'finished';
