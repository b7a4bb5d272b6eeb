-- herder schema v9 (PostgreSQL): an attempt's memory. Its 'finished' event (herder_attempts
-- is their view) records the process tree's peak RSS, the weight's budget it ran under, and
-- how that was enforced (cgroup-v2, cgroup-v1, watchdog, off). NULL: an attempt from
-- before, or one that never ran (lost, refused), or reported by an agent older than these
-- columns.
ALTER TABLE herder_events
    ADD COLUMN peak_rss_bytes bigint,
    ADD COLUMN memory_budget_bytes bigint,
    ADD COLUMN memory_enforcement text;

-- Columns are appended to the view's end, so it is replaced in place.
CREATE OR REPLACE VIEW herder_attempts AS
SELECT job_id, attempt, coalesce(host, '') AS host, coalesce(worker, '') AS worker, pid,
       log_path, coalesce(claimed_at, at) AS claimed_at, started_at,
       coalesce(heartbeat_at, claimed_at, at) AS heartbeat_at, at AS ended_at, exit_code,
       outcome, peak_rss_bytes, memory_budget_bytes, memory_enforcement
FROM herder_events
WHERE kind = 'finished';
