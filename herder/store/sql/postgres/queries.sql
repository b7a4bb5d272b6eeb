-- Named queries (PostgreSQL), with `:name` parameters as everywhere (the driver turns them
-- into psycopg's `%(name)s`). Each `-- name:` block is one statement; the store method of
-- the same name runs it. Every state change is guarded on (id, attempt, status) and writes
-- its event rows in the same statement (the set-based ones from sql/events.sql).

-- name: job_insert
WITH submitted AS (
    INSERT INTO herder_jobs (
        job_type, command, shell, payload, priority, weight, dedup_key, affinity,
        available_at, max_attempts, timeout_seconds, env, workdir,
        backoff_base_seconds, backoff_max_seconds, created_at, updated_at,
        silence_timeout_seconds)
    VALUES (
        :job_type, :command, :shell, :payload, :priority, :weight,
        :dedup_key, :affinity, :available_at, :max_attempts, :timeout_seconds,
        :env, :workdir, :backoff_base_seconds, :backoff_max_seconds,
        :now, :now, :silence_timeout_seconds)
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND NOT dedup_released
        AND status IN ('queued', 'claimed', 'running', 'done')
    DO NOTHING
    RETURNING id
), ev AS (
    {{ events.submitted }}
)
SELECT id, pg_notify('herder', 'job') AS woke FROM submitted;

-- name: job_dedup_holder
SELECT id, status FROM herder_jobs
WHERE dedup_key = :dedup_key AND NOT dedup_released
  AND status IN ('queued', 'claimed', 'running', 'done')
ORDER BY id DESC LIMIT 1;

-- name: job_dedup_release
WITH dedup_released AS (
    UPDATE herder_jobs SET dedup_released = true, updated_at = :now
    WHERE dedup_key = :dedup_key AND status = 'done' AND NOT dedup_released
    RETURNING id
), ev AS (
    {{ events.dedup_released }}
)
SELECT id FROM dedup_released;

-- name: job_list
SELECT * FROM herder_jobs
WHERE (:statuses::jsonb IS NULL
       OR status IN (SELECT jsonb_array_elements_text(:statuses::jsonb)))
ORDER BY id DESC LIMIT :limit;

-- name: job_claim
-- The store inlines LIMIT as a literal (one prepared statement per batch size): with a
-- parameter there, a cached generic plan assumes a large limit and sorts the whole queue.
WITH picked AS (
    SELECT id FROM herder_jobs
    WHERE status = 'queued' AND available_at <= :now
      AND (affinity IS NULL OR affinity = :host)
      -- the job types whose preflight failed here (mostly none), as one JSON array: an
      -- array parameter would keep the plan from being cached (see attempt_finish)
      AND NOT (:blocked::jsonb ? job_type)
    ORDER BY priority, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE herder_jobs j
    SET status = 'claimed', attempt = j.attempt + 1, host = :host, worker = :worker,
        pid = NULL, log_path = NULL, claimed_at = :now, started_at = NULL,
        heartbeat_at = :now, updated_at = :now
    FROM picked WHERE j.id = picked.id
    -- The columns of a Job, no more, and none of those set here (the store fills them in
    -- from what it wrote: claimed_jobs).
    RETURNING j.id, j.job_type, j.command, j.shell, j.payload, j.priority, j.weight,
              j.dedup_key, j.affinity, j.available_at, j.max_attempts, j.timeout_seconds,
              j.env, j.workdir, j.backoff_base_seconds, j.backoff_max_seconds, j.attempt,
              j.failures, j.lost, j.exit_code, j.failure_reason, j.cancel_requested,
              j.created_at, j.finished_at, j.ram_gb, j.spawn_failures, j.transient_attempts,
              j.escalations, j.actionable, j.human_action, j.silence_timeout_seconds
), ev AS (
    {{ events.claimed }}
)
SELECT * FROM claimed ORDER BY priority, id;

-- name: attempt_heartbeat
-- heartbeat_at is in no index, so this is a HOT update of the job row. Only attempts on
-- :host: a host's token renews nothing of another host. IS NOT DISTINCT FROM (the same
-- test for a host that is never null) is no index condition, so the rows are still found
-- by their key, not through the host's active jobs.
UPDATE herder_jobs j SET heartbeat_at = :now
FROM unnest(:job_ids::bigint[], :attempts::int[]) AS t(job_id, attempt)
WHERE j.id = t.job_id AND j.attempt = t.attempt AND j.status IN ('claimed', 'running')
  AND j.host IS NOT DISTINCT FROM :host::text
RETURNING j.id AS job_id, j.attempt, j.cancel_requested;

-- name: attempt_finish
-- One statement per group of results that share an outcome, exit code and decision (a
-- batch is usually one group), those passed once. The guard on (id, attempt, status) is
-- re-checked by PostgreSQL if a concurrent update got there first.
-- The 'finished' events (sql/events.sql) read the updated rows. A requeue wakes idle
-- runners.
-- The group's tokens come as one JSON object {"job_id": attempt}, and each job row looks
-- its attempt up by key (a binary search in jsonb). There is no join to plan: joined with
-- the batch, statistics taken while no job was active (the usual case) chose a nested loop
-- that re-read the whole batch for every job row. The primary key finds the rows.
WITH finished AS (
    UPDATE herder_jobs SET
        status = CASE WHEN cancel_requested AND :next_status::text = 'queued'
                      THEN 'cancelled' ELSE :next_status::text END,
        exit_code = :exit_code::int,
        failure_reason = CASE WHEN cancel_requested AND :next_status::text = 'queued'
                              THEN 'cancelled' ELSE :failure_reason::text END,
        failures = failures + :spend_failure::int,
        lost = lost + :spend_lost::int,
        spawn_failures = spawn_failures + :spend_spawn_failure::int,
        transient_attempts = transient_attempts + :spend_transient::int,
        escalations = escalations + (:weight::text IS NOT NULL)::int,
        weight = COALESCE(:weight::text, weight),
        actionable = :actionable::int::boolean,
        human_action = :human_action::int::boolean,
        available_at = COALESCE(:available_at::timestamptz, available_at),
        finished_at = CASE WHEN :next_status::text = 'queued' AND NOT cancel_requested
                           THEN NULL ELSE :now END,
        avoid_host = CASE WHEN :avoid_host::int = 1 OR started_at IS NULL THEN host
                          ELSE avoid_host END,
        cancel_requested = false,
        updated_at = :now
    WHERE id = ANY(:job_ids::bigint[])
      AND attempt = (:tokens::jsonb ->> id::text)::int
      AND status IN ('claimed', 'running')
    RETURNING id, attempt, status, host, worker, pid, log_path, claimed_at, started_at,
              heartbeat_at
), ev AS (
    {{ events.finished }}
)
SELECT id, attempt, status,
       CASE WHEN status = 'queued' THEN pg_notify('herder', 'job') END AS woke
FROM finished;

-- name: job_cancel_requested
SELECT id AS job_id, attempt FROM herder_jobs
WHERE id = ANY(:job_ids::bigint[]) AND cancel_requested;

-- Fleet: hosts ------------------------------------------------------------------------------
-- name: host_preflight_record
-- An ssh host's preflight, run over ssh by the server: the job types that fail there, kept
-- in agent_info as an agent reports them (`preflight_failed`), its heartbeat untouched.
UPDATE herder_hosts
SET agent_info = agent_info || jsonb_build_object('preflight_failed',
                                                  :preflight_failed::jsonb)
WHERE label = :label RETURNING label;

-- name: host_heartbeat_push
-- A push host's heartbeat (`herder heartbeat`): it says only that the host is up, so the
-- preflight the server ran over ssh stands.
UPDATE herder_hosts
SET last_heartbeat = :now,
    agent_info = jsonb_build_object('via', :via::text, 'preflight_failed',
                                    agent_info -> 'preflight_failed')
WHERE label = :label RETURNING label;

-- name: host_agent_gone
-- The host's agent died (its guardian said so): not live until an agent heartbeats again.
-- Only while the dead worker is the last one heard from, so a new agent is left alone, and
-- not after a clean stop (the agent said so itself).
UPDATE herder_hosts
SET agent_info = agent_info || jsonb_build_object('stopped', true, 'gone', :worker::text)
WHERE label = :label AND agent_info ->> 'worker' = :worker
  AND agent_info -> 'stopped' IS DISTINCT FROM 'true'::jsonb
RETURNING label;

-- name: host_lock
SELECT label FROM herder_hosts WHERE label = :label FOR UPDATE;

-- Fleet: placement -------------------------------------------------------------------------
-- name: attempt_take
-- An agent takes a placement on its host. Only the host's live agent: the worker its last
-- heartbeat came from, not stopped or reported gone. A dead agent's long poll the server
-- still holds (its connection not seen closed yet) takes nothing, so a placement made as
-- the host's agent is replaced waits for the new one instead of being bound to the dead.
-- FOR SHARE: a new agent's heartbeat (which rewrites the host row) waits for this take to
-- commit, or this take sees the new worker, so the heartbeat's list of the host's attempts
-- always shows a placement the old worker took.
UPDATE herder_jobs SET heartbeat_at = :now, worker = :worker
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
  AND host = :host AND (worker = '' OR worker = :worker)
  AND EXISTS (SELECT 1 FROM herder_hosts h
              WHERE h.label = :host AND h.agent_info ->> 'worker' = :worker::text
                AND h.agent_info -> 'stopped' IS DISTINCT FROM 'true'::jsonb
              FOR SHARE)
RETURNING id AS job_id;

-- name: attempt_list_assigned
SELECT * FROM herder_jobs
WHERE host = :host AND status = 'claimed' AND worker = ''
ORDER BY priority, id
LIMIT :limit;

-- Fleet: reservations ----------------------------------------------------------------------
-- name: reservation_end
UPDATE herder_reservations SET status = :status, ended_at = :now,
    detail = detail || :detail
WHERE id = :id AND status = 'active'
  AND (:by::bigint IS NULL OR created_by = :by::bigint)
RETURNING *;

-- Fleet: alerts ----------------------------------------------------------------------------

-- Tokens ------------------------------------------------------------------------------------
-- Maintenance --------------------------------------------------------------------------------
-- name: statistics_stale
-- Autovacuum analyzes too, but only after a naptime; until then a burst of submits into a
-- young table leaves the planner sorting every queued row on each claim.
SELECT n_mod_since_analyze > greatest(1000, 0.1 * n_live_tup) AS stale
FROM pg_stat_user_tables
WHERE relid = 'herder_jobs'::regclass;

-- name: statistics_refresh
ANALYZE herder_jobs;

-- name: schema_table_exists
SELECT to_regclass('herder_schema') IS NOT NULL AS present;

-- name: session_limits
-- herder's limits on its own session, each only where nothing else set it: the URL's or
-- PGOPTIONS' options, a service file, ALTER ROLE/DATABASE ... SET and postgresql.conf win.
SELECT set_config(l.name, l.value, false)
FROM (VALUES ('statement_timeout', :statement_timeout::text),
             ('idle_in_transaction_session_timeout',
              :idle_in_transaction_session_timeout::text)) AS l (name, value)
JOIN pg_settings s ON s.name = l.name
WHERE s.source = 'default';

-- Migrations ---------------------------------------------------------------------------------
-- name: schema_table_create
CREATE TABLE IF NOT EXISTS herder_schema (
    version integer PRIMARY KEY, name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now());

-- name: migration_unlimited
-- A migration may rewrite a large table, and a second server waits for the first one's
-- lock: neither is a runaway statement.
SET LOCAL statement_timeout = 0;

-- name: migration_lock
-- One migrator at a time, until its transaction ends.
SELECT pg_advisory_xact_lock(:lock);

-- Leadership and wake-ups --------------------------------------------------------------------
-- name: leader_lease
-- The leader's session advisory lock: held while its connection lives.
SELECT pg_try_advisory_lock(:lock) AS held;

-- name: leader_lease_check
SELECT 1 AS held;

-- name: notify
SELECT pg_notify(:channel, :topic);


-- name: runner_publish
-- `herder up`'s presence, from its loop: one row per machine label. `last_turn_at` is the
-- database's clock (now()), not the runner's: a runner whose clock is off neither
-- shows down nor makes the others' rows look old.
INSERT INTO herder_runners (label, worker, concurrency, running, cpus, ram_total_gb,
                            ram_booked_gb, ram_available_gb, started_at, last_turn_at)
VALUES (:label, :worker, :concurrency, :running, :cpus, :ram_total_gb, :ram_booked_gb,
        :ram_available_gb, :started_at, now())
ON CONFLICT (label) DO UPDATE SET worker = excluded.worker,
    concurrency = excluded.concurrency, running = excluded.running, cpus = excluded.cpus,
    ram_total_gb = excluded.ram_total_gb, ram_booked_gb = excluded.ram_booked_gb,
    ram_available_gb = excluded.ram_available_gb, started_at = excluded.started_at,
    last_turn_at = excluded.last_turn_at
RETURNING label;

-- name: runner_list
-- With the database's clock, so a reader judges the rows' age by the clock that wrote them.
SELECT *, now() AS database_now FROM herder_runners ORDER BY label;

-- name: runner_prune
-- Presences not written for :idle_seconds by the database's clock: machines that stopped
-- running `herder up`.
DELETE FROM herder_runners
WHERE last_turn_at < now() - make_interval(secs => :idle_seconds) RETURNING label;
