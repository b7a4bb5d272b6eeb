-- Named queries (SQLite). Each `-- name:` block is one statement; the store method of the
-- same name runs it (a method may run several inside one BEGIN IMMEDIATE transaction).
-- Every state change is guarded on (id, attempt, status); the set-based writes are each
-- followed by their `_events` statement (the event rows from sql/events.sql) in the same
-- transaction.

-- name: job_insert
-- The job's state row; job_spec_insert then writes what was submitted under the same id.
INSERT INTO herder_jobs (priority, weight, dedup_key, affinity, available_at, updated_at)
VALUES (:priority, :weight, :dedup_key, :affinity, :available_at, :now)
ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND dedup_released = 0
    AND status IN ('queued', 'claimed', 'running', 'done')
DO NOTHING
RETURNING id;

-- name: job_spec_insert
INSERT INTO herder_job_specs (
    id, job_type, command, shell, payload, max_attempts, timeout_seconds, env, workdir,
    backoff_base_seconds, backoff_max_seconds, created_at, silence_timeout_seconds)
VALUES (
    :job_id, :job_type, :command, :shell, :payload, :max_attempts, :timeout_seconds, :env,
    :workdir, :backoff_base_seconds, :backoff_max_seconds, :now, :silence_timeout_seconds);

-- name: job_dedup_holder
SELECT id, status FROM herder_jobs
WHERE dedup_key = :dedup_key AND dedup_released = 0
  AND status IN ('queued', 'claimed', 'running', 'done')
ORDER BY id DESC LIMIT 1;

-- name: job_dedup_release
UPDATE herder_jobs SET dedup_released = 1, updated_at = :now
WHERE dedup_key = :dedup_key AND status = 'done' AND dedup_released = 0
RETURNING id;

-- name: job_dedup_release_events
-- :job_ids is a JSON array of the jobs job_dedup_release changed.
WITH dedup_released(id) AS (SELECT value FROM json_each(:job_ids))
{{ events.dedup_released }};

-- name: job_insert_events
-- :job_ids is a JSON array of the jobs job_insert created.
WITH submitted(id) AS (SELECT value FROM json_each(:job_ids))
{{ events.submitted }};

-- name: job_list
SELECT * FROM herder_job_records
WHERE (:statuses IS NULL OR status IN (SELECT value FROM json_each(:statuses)))
ORDER BY id DESC LIMIT :limit;

-- name: job_claim
-- INDEXED BY: without statistics SQLite may prefer another index and sort every queued row
-- on each claim; the partial index gives the order for free.
UPDATE herder_jobs
SET status = 'claimed', attempt = attempt + 1, host = :host, worker = :worker, pid = NULL,
    log_path = NULL, claimed_at = :now, started_at = NULL, heartbeat_at = :now,
    updated_at = :now
WHERE id IN (
    SELECT id FROM herder_jobs INDEXED BY herder_jobs_queued
    WHERE status = 'queued' AND available_at <= :now
      AND (affinity IS NULL OR affinity = :host)
      -- :blocked: the job types whose preflight failed here (a JSON array, mostly empty)
      AND (:blocked = '[]' OR NOT EXISTS (
          SELECT 1 FROM herder_job_specs s WHERE s.id = herder_jobs.id
            AND s.job_type IN (SELECT value FROM json_each(:blocked))))
    ORDER BY priority, id
    LIMIT :limit)
-- The job's state, but for the columns set here (the store fills those in from what it
-- wrote: claimed_jobs); job_claim_specs reads the spec after COMMIT (it never
-- changes, so it needs no lock).
RETURNING id, priority, weight, dedup_key, affinity, available_at, attempt, failures, lost,
    exit_code, failure_reason, cancel_requested, finished_at, ram_gb, spawn_failures,
    transient_attempts, escalations, actionable, human_action;

-- name: job_claim_specs
-- :job_ids is a JSON array of the claimed jobs' ids; the store pairs the rows by id.
SELECT s.id, s.job_type, s.command, s.shell, s.payload, s.max_attempts, s.timeout_seconds,
       s.env, s.workdir, s.backoff_base_seconds, s.backoff_max_seconds, s.created_at,
       s.silence_timeout_seconds
FROM json_each(:job_ids) AS t JOIN herder_job_specs s ON s.id = t.value;

-- name: job_claim_events
-- :tokens holds the claimed jobs as one JSON object {"job_id": attempt}.
WITH claimed(id, attempt) AS (SELECT CAST(key AS INTEGER), value FROM json_each(:tokens))
{{ events.claimed }};

-- name: attempt_heartbeat
-- :job_ids and :attempts are JSON arrays of the tokens' halves, in the same order; each
-- job row is found by its rowid. json_each has an `id` column too, hence the table's name.
-- Only attempts on :host: a host's token renews nothing of another host. The unary + keeps
-- that check off the host index, so each row is still found by its rowid.
UPDATE herder_jobs SET heartbeat_at = :now
FROM json_each(:attempts) AS t
WHERE herder_jobs.id = :job_ids ->> t.key AND herder_jobs.attempt = t.value
  AND herder_jobs.status IN ('claimed', 'running') AND +herder_jobs.host = :host
RETURNING herder_jobs.id AS job_id, herder_jobs.attempt, herder_jobs.cancel_requested;

-- name: attempt_finish
-- Set-based: one statement per group of results that share an outcome, exit code and
-- decision (a batch is usually one group), those passed as parameters and the group's
-- tokens as one JSON object {"job_id": attempt}: json_each gives key and value without
-- parsing each element again, and the job rows are found by rowid.
UPDATE herder_jobs SET
    status = CASE WHEN cancel_requested AND :next_status = 'queued'
                  THEN 'cancelled' ELSE :next_status END,
    exit_code = :exit_code,
    failure_reason = CASE WHEN cancel_requested AND :next_status = 'queued'
                          THEN 'cancelled' ELSE :failure_reason END,
    failures = failures + :spend_failure,
    lost = lost + :spend_lost,
    spawn_failures = spawn_failures + :spend_spawn_failure,
    transient_attempts = transient_attempts + :spend_transient,
    escalations = escalations + (:weight IS NOT NULL),
    weight = COALESCE(:weight, weight),
    actionable = :actionable,
    human_action = :human_action,
    available_at = COALESCE(:available_at, available_at),
    finished_at = CASE WHEN :next_status = 'queued' AND NOT cancel_requested
                       THEN NULL ELSE :now END,
    avoid_host = CASE WHEN :avoid_host OR started_at IS NULL THEN host ELSE avoid_host END,
    cancel_requested = 0,
    updated_at = :now
FROM json_each(:tokens) AS t
WHERE herder_jobs.id = t.key AND herder_jobs.attempt = t.value
  AND herder_jobs.status IN ('claimed', 'running')
RETURNING id, attempt, status;

-- name: attempt_finish_events
-- :applied is a JSON array of the job ids attempt_finish changed; the events read them
-- back in the same transaction.
WITH finished AS (
    SELECT j.id, j.status, j.attempt, j.host, j.worker, j.pid, j.log_path, j.claimed_at,
           j.started_at, j.heartbeat_at
    FROM json_each(:applied) AS t JOIN herder_jobs j ON j.id = t.value)
{{ events.finished }};

-- name: job_cancel_requested
SELECT id AS job_id, attempt FROM herder_jobs
WHERE id IN (SELECT value FROM json_each(:job_ids)) AND cancel_requested = 1;

-- Fleet: hosts ------------------------------------------------------------------------------
-- name: host_preflight_record
-- An ssh host's preflight, run over ssh by the server: the job types that fail there, kept
-- in agent_info as an agent reports them (`preflight_failed`), its heartbeat untouched.
UPDATE herder_hosts SET agent_info = json_set(agent_info, '$.preflight_failed',
                                              json(:preflight_failed))
WHERE label = :label RETURNING label;

-- name: host_heartbeat_push
-- A push host's heartbeat (`herder heartbeat`): it says only that the host is up, so the
-- preflight the server ran over ssh stands.
UPDATE herder_hosts
SET last_heartbeat = :now,
    agent_info = json_object('via', :via, 'preflight_failed',
                             json(json_extract(agent_info, '$.preflight_failed')))
WHERE label = :label RETURNING label;

-- name: host_agent_gone
-- The host's agent died (its guardian said so): not live until an agent heartbeats again.
-- Only while the dead worker is the last one heard from, so a new agent is left alone, and
-- not after a clean stop (the agent said so itself).
UPDATE herder_hosts SET agent_info = json_set(agent_info, '$.stopped', json('true'),
                                              '$.gone', :worker)
WHERE label = :label AND json_extract(agent_info, '$.worker') = :worker
  AND NOT coalesce(json_extract(agent_info, '$.stopped'), 0)
RETURNING label;

-- name: host_lock
SELECT label FROM herder_hosts WHERE label = :label;

-- Fleet: placement -------------------------------------------------------------------------
-- name: attempt_take
-- An agent takes a placement on its host. Only the host's live agent: the worker its last
-- heartbeat came from, not stopped or reported gone. A dead agent's long poll the server
-- still holds (its connection not seen closed yet) takes nothing, so a placement made as
-- the host's agent is replaced waits for the new one instead of being bound to the dead.
UPDATE herder_jobs SET heartbeat_at = :now, worker = :worker
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
  AND host = :host AND (worker = '' OR worker = :worker)
  AND EXISTS (SELECT 1 FROM herder_hosts h
              WHERE h.label = :host AND json_extract(h.agent_info, '$.worker') = :worker
                AND NOT coalesce(json_extract(h.agent_info, '$.stopped'), 0))
RETURNING id AS job_id;

-- name: attempt_list_assigned
SELECT * FROM herder_job_records
-- The IN repeats herder_jobs_host_active's predicate so the planner can use that index
-- (it does not infer it from status = 'claimed'); else every poll scans all jobs ever run.
WHERE host = :host AND status IN ('claimed', 'running') AND status = 'claimed' AND worker = ''
ORDER BY priority, id
LIMIT :limit;

-- Fleet: reservations ----------------------------------------------------------------------
-- name: reservation_end
UPDATE herder_reservations SET status = :status, ended_at = :now,
    detail = json_patch(detail, :detail)
WHERE id = :id AND status = 'active'
  AND (CAST(:by AS INTEGER) IS NULL OR created_by = CAST(:by AS INTEGER))
RETURNING *;

-- Fleet: alerts ----------------------------------------------------------------------------

-- Tokens ------------------------------------------------------------------------------------

-- name: schema_table_exists
SELECT count(*) AS present FROM sqlite_master WHERE type = 'table' AND name = 'herder_schema';

-- name: statistics_stale
-- SQLite's own advice is `PRAGMA optimize` now and then: it analyzes only what needs it.
SELECT 1 AS stale;

-- name: statistics_refresh
-- It may write, so the driver runs it in `BEGIN IMMEDIATE` like every write: in autocommit
-- it would start as a reader and fail at once ("database is locked", no busy wait)
-- whenever another process committed in between.
PRAGMA optimize;

-- Migrations ---------------------------------------------------------------------------------
-- name: schema_table_create
CREATE TABLE IF NOT EXISTS herder_schema (
    version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);


-- name: runner_publish
-- `herder up`'s presence, from its loop: one row per machine label. `last_turn_at` is the
-- database's clock (epoch seconds, as every time here), not the runner's: a runner whose clock is off neither
-- shows down nor makes the others' rows look old.
INSERT INTO herder_runners (label, worker, concurrency, running, cpus, ram_total_gb,
                            ram_booked_gb, ram_available_gb, started_at, last_turn_at)
VALUES (:label, :worker, :concurrency, :running, :cpus, :ram_total_gb, :ram_booked_gb,
        :ram_available_gb, :started_at, (julianday('now') - 2440587.5) * 86400.0)
ON CONFLICT (label) DO UPDATE SET worker = excluded.worker,
    concurrency = excluded.concurrency, running = excluded.running, cpus = excluded.cpus,
    ram_total_gb = excluded.ram_total_gb, ram_booked_gb = excluded.ram_booked_gb,
    ram_available_gb = excluded.ram_available_gb, started_at = excluded.started_at,
    last_turn_at = excluded.last_turn_at
RETURNING label;

-- name: runner_list
-- With the database's clock, so a reader judges the rows' age by the clock that wrote them.
SELECT *, (julianday('now') - 2440587.5) * 86400.0 AS database_now FROM herder_runners ORDER BY label;

-- name: runner_prune
-- Presences not written for :idle_seconds by the database's clock: machines that stopped
-- running `herder up`.
DELETE FROM herder_runners
WHERE last_turn_at < (julianday('now') - 2440587.5) * 86400.0 - :idle_seconds RETURNING label;
