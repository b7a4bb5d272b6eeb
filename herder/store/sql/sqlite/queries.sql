-- Named queries (SQLite). Each `-- name:` block is one statement; the store method of the
-- same name runs it (a method may run several inside one BEGIN IMMEDIATE transaction).
-- Every state change is guarded on (id, attempt, status).

-- name: job_insert
INSERT INTO herder_jobs (
    job_type, command, shell, payload, priority, weight, dedup_key, affinity,
    available_at, max_attempts, timeout_seconds, env, workdir,
    backoff_base_seconds, backoff_max_seconds, created_at, updated_at)
VALUES (
    :job_type, :command, :shell, :payload, :priority, :weight, :dedup_key, :affinity,
    :available_at, :max_attempts, :timeout_seconds, :env, :workdir,
    :backoff_base_seconds, :backoff_max_seconds, :now, :now)
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND dedup_released = 0
    AND status IN ('queued', 'claimed', 'running', 'done')
DO NOTHING
RETURNING id;

-- name: job_dedup_holder
SELECT id, status FROM herder_jobs
WHERE dedup_key = :dedup_key AND dedup_released = 0
  AND status IN ('queued', 'claimed', 'running', 'done')
ORDER BY id DESC LIMIT 1;

-- name: job_dedup_release
UPDATE herder_jobs SET dedup_released = 1, updated_at = :now
WHERE dedup_key = :dedup_key AND status = 'done' AND dedup_released = 0
RETURNING id;

-- name: job_get
SELECT * FROM herder_jobs WHERE id = :job_id;

-- name: job_list
SELECT * FROM herder_jobs
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
ORDER BY id DESC LIMIT :limit;

-- name: job_counts
SELECT status, count(*) FROM herder_jobs
WHERE status IN ('queued', 'claimed', 'running')
GROUP BY status;

-- name: job_claim
UPDATE herder_jobs
SET status = 'claimed', attempt = attempt + 1, host = :host,
    claimed_at = :now, started_at = NULL, updated_at = :now
WHERE id IN (
    SELECT id FROM herder_jobs
    WHERE status = 'queued' AND available_at <= :now
      AND (affinity IS NULL OR affinity = :host)
    ORDER BY priority, id
    LIMIT :limit)
RETURNING *;

-- name: attempt_insert
INSERT INTO herder_attempts (job_id, attempt, host, worker, claimed_at, heartbeat_at)
VALUES (:job_id, :attempt, :host, :worker, :now, :now);

-- name: event_insert
INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, detail)
VALUES (:job_id, :now, :kind, :from_status, :to_status, :attempt, :detail);

-- name: attempt_start
UPDATE herder_jobs SET status = 'running', started_at = :now, updated_at = :now
WHERE id = :job_id AND attempt = :attempt AND status = 'claimed'
RETURNING id;

-- name: attempt_start_record
UPDATE herder_attempts SET pid = :pid, log_path = :log_path, started_at = :now,
    heartbeat_at = :now
WHERE job_id = :job_id AND attempt = :attempt;

-- name: attempt_heartbeat
UPDATE herder_attempts SET heartbeat_at = :now
WHERE job_id = :job_id AND attempt = :attempt AND ended_at IS NULL
  AND EXISTS (SELECT 1 FROM herder_jobs j
              WHERE j.id = :job_id AND j.attempt = :attempt
                AND j.status IN ('claimed', 'running'))
RETURNING job_id, attempt,
    (SELECT cancel_requested FROM herder_jobs WHERE id = :job_id);

-- name: attempt_finish
UPDATE herder_jobs SET
    status = CASE WHEN cancel_requested AND :next_status = 'queued'
                  THEN 'cancelled' ELSE :next_status END,
    exit_code = :exit_code,
    failure_reason = CASE WHEN cancel_requested AND :next_status = 'queued'
                          THEN 'cancelled' ELSE :failure_reason END,
    failures = failures + :spend_failure,
    lost = lost + :spend_lost,
    spawn_failures = spawn_failures + :spend_spawn_failure,
    available_at = COALESCE(:available_at, available_at),
    finished_at = CASE WHEN :next_status = 'queued' AND NOT cancel_requested
                       THEN NULL ELSE :now END,
    cancel_requested = 0,
    updated_at = :now
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
RETURNING id, attempt, status;

-- name: attempt_finish_status
SELECT status FROM herder_jobs WHERE id = :job_id;

-- name: attempt_finish_record
UPDATE herder_attempts SET ended_at = :now, exit_code = :exit_code, outcome = :outcome
WHERE job_id = :job_id AND attempt = :attempt;

-- name: job_cancel
UPDATE herder_jobs SET
    status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
    cancel_requested = (status <> 'queued'),
    failure_reason = CASE WHEN status = 'queued' THEN 'cancelled' ELSE failure_reason END,
    finished_at = CASE WHEN status = 'queued' THEN :now ELSE finished_at END,
    updated_at = :now
WHERE id = :job_id AND status IN ('queued', 'claimed', 'running')
RETURNING id, status, attempt, cancel_requested;

-- name: job_retry
UPDATE herder_jobs SET status = 'queued', failures = 0, lost = 0,
    available_at = :now, failure_reason = NULL, finished_at = NULL,
    cancel_requested = 0, dedup_released = 0, updated_at = :now
WHERE id = :job_id AND status IN ('done', 'failed', 'cancelled')
RETURNING id, attempt;

-- name: job_cancel_requested
SELECT id, attempt FROM herder_jobs
WHERE id IN (SELECT value FROM json_each(:job_ids)) AND cancel_requested = 1;

-- name: attempt_list
SELECT * FROM herder_attempts WHERE job_id = :job_id ORDER BY attempt;

-- name: attempt_list_live
SELECT a.*, j.status AS job_status, j.failures, j.lost, j.max_attempts,
       j.backoff_base_seconds, j.backoff_max_seconds
FROM herder_attempts a JOIN herder_jobs j ON j.id = a.job_id AND j.attempt = a.attempt
WHERE a.ended_at IS NULL AND j.status IN ('claimed', 'running')
  AND (:host IS NULL OR a.host = :host);

-- name: event_list
SELECT * FROM herder_events WHERE job_id = :job_id ORDER BY id;
