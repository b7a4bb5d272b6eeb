-- herder schema v4 (PostgreSQL): an attempt's end is an event.
-- An attempt ended by writing two rows, its history row and its 'finished' event, which
-- held the same facts. The 'finished' event now carries the ended attempt's columns, and
-- herder_attempts is a view of those events: a finish writes one row per job fewer, and
-- the history keeps the event stream's ids and order.
ALTER TABLE herder_events
    ADD COLUMN host text,
    ADD COLUMN worker text,
    ADD COLUMN pid integer,
    ADD COLUMN log_path text,
    ADD COLUMN claimed_at timestamptz,
    ADD COLUMN started_at timestamptz,
    ADD COLUMN heartbeat_at timestamptz,
    ADD COLUMN exit_code integer,
    ADD COLUMN outcome text;

UPDATE herder_events e
SET host = a.host, worker = a.worker, pid = a.pid, log_path = a.log_path,
    claimed_at = a.claimed_at, started_at = a.started_at, heartbeat_at = a.heartbeat_at,
    exit_code = a.exit_code, outcome = a.outcome
FROM herder_attempts a
WHERE e.kind = 'finished' AND a.job_id = e.job_id AND a.attempt = e.attempt;

-- Attempts that ended without a 'finished' event (v3 closed stray unended attempts as lost)
-- get one now, at their end.
INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, detail, host,
                           worker, pid, log_path, claimed_at, started_at, heartbeat_at,
                           exit_code, outcome)
SELECT a.job_id, coalesce(a.ended_at, a.heartbeat_at), 'finished', NULL, NULL, a.attempt,
       jsonb_build_object('outcome', a.outcome, 'exit_code', a.exit_code), a.host, a.worker,
       a.pid, a.log_path, a.claimed_at, a.started_at, a.heartbeat_at, a.exit_code, a.outcome
FROM herder_attempts a
WHERE NOT EXISTS (SELECT 1 FROM herder_events e
                  WHERE e.job_id = a.job_id AND e.attempt = a.attempt AND e.kind = 'finished')
ORDER BY coalesce(a.ended_at, a.heartbeat_at), a.job_id, a.attempt;

DROP TABLE herder_attempts;

CREATE VIEW herder_attempts AS
SELECT job_id, attempt, coalesce(host, '') AS host, coalesce(worker, '') AS worker, pid,
       log_path, coalesce(claimed_at, at) AS claimed_at, started_at,
       coalesce(heartbeat_at, claimed_at, at) AS heartbeat_at, at AS ended_at, exit_code,
       outcome
FROM herder_events
WHERE kind = 'finished';
