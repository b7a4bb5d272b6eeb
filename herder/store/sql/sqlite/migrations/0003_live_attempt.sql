-- herder schema v3 (SQLite): the live attempt lives on its job row.
-- Claim, start, heartbeat and finish then write one job row (plus the event) instead of a
-- job row and an attempt row; herder_attempts keeps ended attempts only, each written once
-- when its attempt ends.
ALTER TABLE herder_jobs ADD COLUMN worker TEXT;
ALTER TABLE herder_jobs ADD COLUMN pid INTEGER;
ALTER TABLE herder_jobs ADD COLUMN log_path TEXT;
ALTER TABLE herder_jobs ADD COLUMN heartbeat_at REAL;

UPDATE herder_jobs
SET (worker, pid, log_path, heartbeat_at) = (
    SELECT a.worker, a.pid, a.log_path, a.heartbeat_at FROM herder_attempts a
    WHERE a.job_id = herder_jobs.id AND a.attempt = herder_jobs.attempt)
WHERE status IN ('claimed', 'running');

DELETE FROM herder_attempts
WHERE ended_at IS NULL AND EXISTS (
    SELECT 1 FROM herder_jobs j
    WHERE j.id = herder_attempts.job_id AND j.attempt = herder_attempts.attempt
      AND j.status IN ('claimed', 'running'));

-- An unended attempt whose job moved on cannot be live any more: close it as lost.
UPDATE herder_attempts SET ended_at = heartbeat_at, outcome = 'lost' WHERE ended_at IS NULL;

-- The same index as on PostgreSQL, where `host IS NOT NULL` keeps the batch finish and
-- heartbeat guards from being planned through it.
DROP INDEX herder_jobs_host_active;
CREATE INDEX herder_jobs_host_active ON herder_jobs (host)
    WHERE host IS NOT NULL AND status IN ('claimed', 'running');
