-- Named queries both dialects share, written with `:name` parameters (as every query is;
-- the PostgreSQL driver turns them into `%(name)s`). Each `-- name:` block is one
-- statement; the store method of the same name runs it. A query that must differ between
-- the dialects lives in sql/<dialect>/queries.sql instead, under the same name.
-- `{{ job_records }}` is each job with its spec (SQLite's view, PostgreSQL's table).

-- name: job_counts
SELECT status, count(*) AS count FROM herder_jobs
WHERE status IN ('queued', 'claimed', 'running')
GROUP BY status;

-- name: event_insert
INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, detail)
VALUES (:job_id, :now, :kind, :from_status, :to_status, :attempt, :detail);

-- name: attempt_start
UPDATE herder_jobs SET status = 'running', pid = :pid, log_path = :log_path,
    started_at = :now, heartbeat_at = :now, updated_at = :now
WHERE id = :job_id AND attempt = :attempt AND status = 'claimed'
RETURNING id;

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
    cancel_requested = FALSE, dedup_released = FALSE, updated_at = :now
WHERE id = :job_id AND status IN ('done', 'failed', 'cancelled')
RETURNING id, attempt;

-- name: attempt_list
-- Ended attempts from the history, then the live one from its job row.
SELECT job_id, attempt, host, worker, pid, log_path, claimed_at, started_at, heartbeat_at,
       ended_at, exit_code, outcome, peak_rss_bytes, memory_budget_bytes, memory_enforcement
FROM herder_attempts WHERE job_id = :job_id
UNION ALL
SELECT id, attempt, host, coalesce(worker, ''), pid, log_path, claimed_at, started_at,
       coalesce(heartbeat_at, claimed_at), NULL, NULL, NULL, NULL, NULL, NULL
FROM herder_jobs WHERE id = :job_id AND status IN ('claimed', 'running')
ORDER BY attempt;

-- name: event_latest_id
-- The newest event's id: the dashboard's live view asks it each second to see whether
-- anything changed (the primary key's last entry, whatever the table's size).
SELECT max(id) AS id FROM herder_events;

-- name: event_list
SELECT id, job_id, at, kind, from_status, to_status, attempt, detail
FROM herder_events WHERE job_id = :job_id ORDER BY id;

-- name: host_insert
INSERT INTO herder_hosts (
    label, ram_total_gb, ram_reserved_gb, cpus, enabled, transport, ssh_target,
    prime_max_workers, prime_max_weight, night_max_workers, night_max_weight,
    allowed_job_types, allowed_weights, priority_floor, labels, created_at, updated_at)
VALUES (
    :label, :ram_total_gb, :ram_reserved_gb, :cpus, :enabled, :transport,
    :ssh_target, :prime_max_workers, :prime_max_weight, :night_max_workers,
    :night_max_weight, :allowed_job_types, :allowed_weights, :priority_floor,
    :labels, :now, :now)
ON CONFLICT (label) DO NOTHING
RETURNING label;

-- name: host_update
UPDATE herder_hosts SET
    ram_total_gb = :ram_total_gb, ram_reserved_gb = :ram_reserved_gb, cpus = :cpus,
    enabled = :enabled, transport = :transport, ssh_target = :ssh_target,
    prime_max_workers = :prime_max_workers, prime_max_weight = :prime_max_weight,
    night_max_workers = :night_max_workers, night_max_weight = :night_max_weight,
    allowed_job_types = :allowed_job_types, allowed_weights = :allowed_weights,
    priority_floor = :priority_floor, labels = :labels, updated_at = :now
WHERE label = :label
RETURNING label;

-- name: host_get
SELECT h.*, EXISTS (SELECT 1 FROM herder_tokens t
                    WHERE t.host = h.label AND t.revoked_at IS NULL) AS has_token
FROM herder_hosts h WHERE label = :label;

-- name: host_list
SELECT h.*, EXISTS (SELECT 1 FROM herder_tokens t
                    WHERE t.host = h.label AND t.revoked_at IS NULL) AS has_token
FROM herder_hosts h ORDER BY label;

-- name: runner_remove
-- A clean exit: only the runner's own row (a newer runner of the label may have taken it).
DELETE FROM herder_runners WHERE label = :label AND worker = :worker RETURNING label;

-- name: host_remove
DELETE FROM herder_hosts
WHERE label = :label
  AND NOT EXISTS (SELECT 1 FROM herder_jobs j
                  WHERE j.host = herder_hosts.label AND j.status IN ('claimed', 'running'))
RETURNING label;

-- name: host_heartbeat
UPDATE herder_hosts SET last_heartbeat = :now, agent_info = :agent_info
WHERE label = :label RETURNING label;

-- name: host_usage
SELECT h.label,
       coalesce(j.workers, 0) AS workers, coalesce(j.jobs_gb, 0) AS jobs_gb,
       coalesce(r.reserved_gb, 0) AS reserved_gb
FROM herder_hosts h
LEFT JOIN (SELECT host, count(*) AS workers, sum(ram_gb) AS jobs_gb FROM herder_jobs
           WHERE host IS NOT NULL AND status IN ('claimed', 'running')
           GROUP BY host) j ON j.host = h.label
LEFT JOIN (SELECT host, sum(ram_gb) AS reserved_gb FROM herder_reservations
           WHERE status = 'active' AND expires_at > :now GROUP BY host) r
       ON r.host = h.label;

-- name: host_booked
SELECT (SELECT count(*) FROM herder_jobs
        WHERE host = :label AND status IN ('claimed', 'running')) AS workers,
       (SELECT coalesce(sum(ram_gb), 0) FROM herder_jobs
        WHERE host = :label AND status IN ('claimed', 'running'))
     + (SELECT coalesce(sum(ram_gb), 0) FROM herder_reservations
        WHERE host = :label AND status = 'active' AND expires_at > :now) AS booked_gb;

-- name: job_assign
UPDATE herder_jobs
SET status = 'claimed', attempt = attempt + 1, host = :host, ram_gb = :ram_gb,
    worker = '', pid = NULL, log_path = NULL, claimed_at = :now, started_at = NULL,
    heartbeat_at = :now, updated_at = :now
WHERE id = :job_id AND status = 'queued'
RETURNING id, attempt;

-- name: attempt_set_worker
-- Hands a placement to a runner. The lease restarts here: the runner counts its own from
-- before it asked, so its fence always comes before the server's rescue.
UPDATE herder_jobs SET heartbeat_at = :now, worker = :worker
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
  AND (worker = '' OR worker = :worker)
RETURNING id AS job_id;

-- name: attempt_adopt
-- A new agent of the host takes over an attempt its dead predecessor (:previous) started:
-- only while it is live there and still that worker's, so a guardian's late report of the
-- old worker finds nothing of it. The lease restarts here, as for a placement.
UPDATE herder_jobs SET heartbeat_at = :now, worker = :worker
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
  AND host = :host AND worker IN (:previous, :worker)
RETURNING id AS job_id;

-- name: reservation_insert
INSERT INTO herder_reservations (kind, owner, host, weight, ram_gb, detail, created_at,
                                 expires_at, created_by, job_id)
VALUES (:kind, :owner, :host, :weight, :ram_gb, :detail, :now,
        :expires_at, :created_by, :job_id)
ON CONFLICT (owner) WHERE kind = 'ci' AND status = 'active' DO NOTHING
RETURNING *;

-- name: reservation_active_ci
SELECT * FROM herder_reservations WHERE kind = 'ci' AND owner = :owner AND status = 'active';

-- name: reservation_release_ci
-- :by set: only a slot that token made (a non-admin token releases only its own).
UPDATE herder_reservations SET status = 'released', ended_at = :now
WHERE kind = 'ci' AND owner = :owner AND status = 'active'
  AND (CAST(:by AS BIGINT) IS NULL OR created_by = CAST(:by AS BIGINT))
RETURNING *;

-- name: reservation_count_by
-- The active reservations and slots a token holds (its cap, `server.token_max_reservations`).
SELECT count(*) AS held FROM herder_reservations
WHERE created_by = :created_by AND status = 'active';

-- name: reservation_count_for_job
-- The live subagent slots a job holds on a host (its cap, `fleet.max_subagents_for_weight`).
SELECT count(*) AS held FROM herder_reservations
WHERE job_id = :job_id AND host = :host AND kind = 'subagent' AND status = 'active'
  AND expires_at > :now;

-- name: reservation_get
SELECT * FROM herder_reservations WHERE id = :id;

-- name: reservation_list
SELECT * FROM herder_reservations
WHERE status = 'active' AND (CAST(:host AS TEXT) IS NULL OR host = CAST(:host AS TEXT))
ORDER BY id;

-- name: reservation_expire
UPDATE herder_reservations SET status = 'expired', ended_at = :now
WHERE status = 'active' AND expires_at <= :now
RETURNING id;

-- name: token_insert
INSERT INTO herder_tokens (name, scope, token_hash, host, job_types, priority_floor,
                           allow_adhoc, created_at)
VALUES (:name, :scope, :token_hash, :host, :job_types, :priority_floor, :allow_adhoc, :now)
RETURNING id;

-- name: token_get
SELECT * FROM herder_tokens WHERE token_hash = :token_hash;

-- name: token_list
SELECT * FROM herder_tokens ORDER BY id;

-- name: token_revoke
UPDATE herder_tokens SET revoked_at = :now
WHERE id = :id AND revoked_at IS NULL
RETURNING id;

-- name: token_revoke_host
UPDATE herder_tokens SET revoked_at = :now
WHERE host = :host AND revoked_at IS NULL
RETURNING id;

-- name: alert_open
INSERT INTO herder_alerts (key, message, opened_at) VALUES (:key, :message, :now)
ON CONFLICT (key) WHERE cleared_at IS NULL DO NOTHING
RETURNING id;

-- name: alert_clear
UPDATE herder_alerts SET cleared_at = :now
WHERE key = :key AND cleared_at IS NULL
RETURNING id;

-- name: alert_list
SELECT * FROM herder_alerts
WHERE (NOT :open_only OR cleared_at IS NULL)
ORDER BY id DESC LIMIT :limit;

-- name: alert_list_since
SELECT * FROM herder_alerts
WHERE cleared_at IS NULL OR cleared_at >= :since OR opened_at >= :since
ORDER BY id;

-- name: alert_mark_sent
UPDATE herder_alerts SET sent_at = :now, sent_count = sent_count + 1
WHERE id = :id AND sent_at IS NULL
RETURNING id;

-- name: alert_mark_resolved_sent
UPDATE herder_alerts SET resolved_sent_at = :now, sent_count = sent_count + 1
WHERE id = :id AND resolved_sent_at IS NULL AND cleared_at IS NOT NULL
RETURNING id;

-- name: schema_version
SELECT max(version) AS version FROM herder_schema;

-- name: schema_version_record
INSERT INTO herder_schema (version, name, applied_at) VALUES (:version, :name, :now);

-- name: account_upsert
INSERT INTO herder_accounts (host, name, env, max_sessions, job_types, probe, source,
                             created_at, updated_at)
VALUES (:host, :name, :env, :max_sessions, :job_types, :probe, :source, :now, :now)
ON CONFLICT (host, name) DO UPDATE SET
    env = excluded.env, max_sessions = excluded.max_sessions,
    job_types = excluded.job_types, probe = excluded.probe, source = excluded.source,
    updated_at = excluded.updated_at
RETURNING name;

-- name: account_delete
DELETE FROM herder_accounts WHERE host = :host AND name = :name RETURNING name;

-- name: account_list
-- Never the env: its values may be secrets (only account_env reads them, to bind).
SELECT a.host, a.name, a.max_sessions, a.job_types, a.probe, a.source, a.depleted_until,
       a.auth_revoked_at, a.dead_token, a.probed_at, a.usage_percent, a.usage_resets_at,
       (SELECT count(*) FROM herder_jobs j
        WHERE j.host = a.host AND j.account = a.name
          AND j.status IN ('claimed', 'running')) AS sessions
FROM herder_accounts a
WHERE a.host = coalesce(:host, a.host)
ORDER BY a.host, a.name;

-- name: account_env
SELECT env FROM herder_accounts WHERE host = :host AND name = :name;

-- name: account_mark_depleted
UPDATE herder_accounts SET depleted_until = :until, updated_at = :now
WHERE host = :host AND name = :name RETURNING name;

-- name: account_mark_revoked
UPDATE herder_accounts SET auth_revoked_at = :now, updated_at = :now
WHERE host = :host AND name = :name RETURNING name;

-- name: account_clear
-- A successful run: the quota and the login work again (a dead token waits for a probe).
UPDATE herder_accounts SET depleted_until = NULL, auth_revoked_at = NULL, updated_at = :now
WHERE host = :host AND name = :name
  AND (depleted_until IS NOT NULL OR auth_revoked_at IS NOT NULL)
RETURNING name;

-- name: account_record_probe
UPDATE herder_accounts SET dead_token = :dead_token, usage_percent = :usage_percent,
    usage_resets_at = :usage_resets_at, probed_at = :now, updated_at = :now
WHERE host = :host AND name = :name RETURNING name;

-- name: attempt_bind_account
-- The live attempt runs under the account, while the account has a free session.
UPDATE herder_jobs SET account = :account
WHERE id = :job_id AND attempt = :attempt AND status IN ('claimed', 'running')
  AND (SELECT count(*) FROM herder_jobs j
       WHERE j.host = :host AND j.account = :account
         AND j.status IN ('claimed', 'running')) < :max_sessions
RETURNING id;

-- name: attempt_get_account
SELECT host, account FROM herder_jobs WHERE id = :job_id AND attempt = :attempt;

-- name: job_clear_account
UPDATE herder_jobs SET account = NULL
WHERE id = :job_id AND account IS NOT NULL AND status NOT IN ('claimed', 'running')
RETURNING id;

-- name: delivery_record
-- A webhook delivery, unless its (source, id) was seen: no row back means a replay.
INSERT INTO herder_deliveries (source, delivery_id, event, received_at)
VALUES (:source, :delivery_id, :event, :now)
ON CONFLICT (source, delivery_id) DO NOTHING
RETURNING source;

-- name: delivery_set_jobs
UPDATE herder_deliveries SET job_ids = :job_ids
WHERE source = :source AND delivery_id = :delivery_id;

-- name: delivery_get
SELECT * FROM herder_deliveries WHERE source = :source AND delivery_id = :delivery_id;

-- name: delivery_expire
DELETE FROM herder_deliveries WHERE received_at < :before RETURNING source;

-- name: session_open
INSERT INTO herder_sessions (id_hash, token_key, csrf, expires_at)
VALUES (:id_hash, :token_key, :csrf, :expires_at);

-- name: session_get
SELECT token_key, csrf FROM herder_sessions WHERE id_hash = :id_hash AND expires_at > :now;

-- name: session_close
DELETE FROM herder_sessions WHERE id_hash = :id_hash RETURNING id_hash;

-- name: session_expire
DELETE FROM herder_sessions WHERE expires_at <= :now RETURNING id_hash;

-- name: job_status_counts
-- Every status, ended ones too (`/queue`, `/metrics`): one pass, no rows read back.
SELECT status, count(*) AS count FROM herder_jobs GROUP BY status;

-- name: job_queue_depth
-- Queued jobs by weight and priority (the partial queued index holds them all).
SELECT weight, priority, count(*) AS count FROM herder_jobs
WHERE status = 'queued'
GROUP BY weight, priority;

-- name: job_failure_counts
SELECT coalesce(failure_reason, 'unknown') AS reason, actionable, count(*) AS count
FROM herder_jobs WHERE status = 'failed'
GROUP BY coalesce(failure_reason, 'unknown'), actionable;

-- name: attempt_outcome_counts
-- Attempts that ended since `since`, by host and outcome (`/queue` and `/metrics` count the
-- spawn failures of each host from it); the ended_at index keeps it to the window.
SELECT host, outcome, count(*) AS count FROM herder_attempts
WHERE ended_at >= :since AND outcome IS NOT NULL AND host <> ''
GROUP BY host, outcome;

-- name: fleet_setting_get
SELECT name, value, updated_at, updated_by FROM herder_fleet_settings WHERE name = :name;

-- name: fleet_setting_put
INSERT INTO herder_fleet_settings (name, value, updated_at, updated_by)
VALUES (:name, :value, :now, :by)
ON CONFLICT (name) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at,
                                 updated_by = excluded.updated_by
RETURNING name;

-- name: fleet_setting_delete
DELETE FROM herder_fleet_settings WHERE name = :name RETURNING name;

-- name: alert_record
-- An alert that is over when it is learnt of (an agent's trouble its own URLs already sent):
-- one closed row, so no delivery pass can see it open and send it again.
INSERT INTO herder_alerts (key, message, opened_at, cleared_at)
VALUES (:key, :message, :now, :now)
RETURNING id;

-- name: job_get
SELECT * FROM {{ job_records }} WHERE id = :job_id;

-- name: job_list_page
-- The dashboard's jobs view: one page, newest first, before a cursor id (keyset paging:
-- the cost is the page, not the table). A filter left NULL matches every job.
SELECT * FROM {{ job_records }}
WHERE (CAST(:status AS TEXT) IS NULL OR status = CAST(:status AS TEXT))
  AND (CAST(:job_type AS TEXT) IS NULL OR job_type = CAST(:job_type AS TEXT))
  AND (CAST(:host AS TEXT) IS NULL OR host = CAST(:host AS TEXT))
  AND (CAST(:dedup_key AS TEXT) IS NULL OR dedup_key = CAST(:dedup_key AS TEXT))
  AND (CAST(:before AS BIGINT) IS NULL OR id < CAST(:before AS BIGINT))
ORDER BY id DESC LIMIT :limit;

-- name: attempt_list_live
SELECT id AS job_id, attempt, host, coalesce(worker, '') AS worker, pid, log_path,
       claimed_at, started_at, coalesce(heartbeat_at, claimed_at) AS heartbeat_at,
       CAST(NULL AS TIMESTAMPTZ) AS ended_at, CAST(NULL AS INTEGER) AS exit_code,
       CAST(NULL AS TEXT) AS outcome, status AS job_status, failures, lost, max_attempts,
       backoff_base_seconds, backoff_max_seconds
FROM {{ job_records }}
WHERE status IN ('claimed', 'running') AND host IS NOT NULL
  AND (CAST(:host AS TEXT) IS NULL OR host = CAST(:host AS TEXT));

-- name: job_list_due
SELECT id, priority, weight, job_type, affinity, created_at, available_at, avoid_host
FROM {{ job_records }}
WHERE status = 'queued' AND available_at <= :now
ORDER BY priority, id
LIMIT :limit;

-- name: attempt_list_recent_outcomes
-- For the circuit breakers: each host and job type's newest ended attempts since `since`,
-- at most `per_group` of them (newest first).
SELECT host, job_type, outcome, ended_at FROM (
    SELECT a.host, j.job_type, a.outcome, a.ended_at,
           row_number() OVER (PARTITION BY a.host, j.job_type
                              ORDER BY a.ended_at DESC, a.job_id DESC) AS n
    FROM herder_attempts a JOIN {{ job_records }} j ON j.id = a.job_id
    WHERE a.ended_at >= :since AND a.outcome IS NOT NULL AND a.host <> ''
) recent
WHERE n <= :per_group
ORDER BY host, job_type, ended_at DESC;

-- name: job_list_running_types
-- For the circuit breakers: each host and job type's newest live attempt (a trial job).
SELECT host, job_type, max(claimed_at) AS claimed_at FROM {{ job_records }}
WHERE status IN ('claimed', 'running') AND host IS NOT NULL
GROUP BY host, job_type;
