-- herder schema v3 (PostgreSQL): the live attempt lives on its job row.
-- Claim, start, heartbeat and finish then write one job row (plus the event) instead of a
-- job row and an attempt row, and no hot statement joins herder_attempts, so no cached plan
-- can turn into a scan of the attempt history. herder_attempts keeps ended attempts only,
-- each written once when its attempt ends.
ALTER TABLE herder_jobs
    ADD COLUMN worker text,
    ADD COLUMN pid integer,
    ADD COLUMN log_path text,
    ADD COLUMN heartbeat_at timestamptz;

UPDATE herder_jobs j
SET worker = a.worker, pid = a.pid, log_path = a.log_path, heartbeat_at = a.heartbeat_at
FROM herder_attempts a
WHERE a.job_id = j.id AND a.attempt = j.attempt AND a.ended_at IS NULL
  AND j.status IN ('claimed', 'running');

DELETE FROM herder_attempts a USING herder_jobs j
WHERE a.ended_at IS NULL AND a.job_id = j.id AND a.attempt = j.attempt
  AND j.status IN ('claimed', 'running');

-- An unended attempt whose job moved on cannot be live any more: close it as lost.
UPDATE herder_attempts SET ended_at = heartbeat_at, outcome = 'lost' WHERE ended_at IS NULL;

-- `host IS NOT NULL` keeps this index out of reach of the finish and heartbeat guards
-- (`status IN ('claimed', 'running')` without a host): with the old predicate the planner
-- could drive those batch updates from this index and rescan the batch per active job.
DROP INDEX herder_jobs_host_active;
CREATE INDEX herder_jobs_host_active ON herder_jobs (host)
    WHERE host IS NOT NULL AND status IN ('claimed', 'running');
