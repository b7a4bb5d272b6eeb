-- The event rows of the set-based writes, written once for both dialects. Each block is
-- the INSERT of one kind of event, reading the rows the write changed from a relation
-- of the block's name (`submitted`, `claimed`, ...). A dialect's statement includes it
-- with a line `{{ events.<kind> }}`: PostgreSQL's after the data-modifying CTE of that
-- name (one statement, one round trip), SQLite's after a CTE over the changed ids that the
-- write returned (SQLite has no data-modifying CTEs; same transaction). Parameters are
-- `:name`, as in sql/queries.sql; CASTs give PostgreSQL the types a bare NULL lacks.

-- name: submitted
INSERT INTO herder_events (job_id, at, kind, to_status)
SELECT id, :now, 'submitted', 'queued' FROM submitted

-- name: dedup_released
INSERT INTO herder_events (job_id, at, kind, detail)
SELECT id, :now, 'dedup_released', :detail FROM dedup_released

-- name: claimed
INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, detail)
SELECT id, :now, 'claimed', 'queued', 'claimed', attempt, :detail FROM claimed

-- name: finished
-- Each carries its ended attempt (herder_attempts is their view), from the live columns
-- the job row still holds. The status the job left is read from started_at (only a
-- started attempt has one), so no read before the update is needed.
INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, detail,
                           host, worker, pid, log_path, claimed_at, started_at,
                           heartbeat_at, exit_code, outcome, peak_rss_bytes,
                           memory_budget_bytes, memory_enforcement)
SELECT id, :now, 'finished', CASE WHEN started_at IS NULL THEN 'claimed' ELSE 'running' END,
       status, attempt, :detail, host, worker, pid, log_path, claimed_at, started_at,
       heartbeat_at, CAST(:exit_code AS INTEGER), CAST(:outcome AS TEXT),
       CAST(:peak_rss_bytes AS BIGINT), CAST(:memory_budget_bytes AS BIGINT),
       CAST(:memory_enforcement AS TEXT)
FROM finished
