-- herder schema v8 (SQLite): what issue 14's outcome table spends and records on the job.
-- transient_attempts: its own budget for rate limits and overloaded APIs; escalations:
-- weight moves (an OOM escalates once); actionable / human_action: the last decision's
-- flags, for `herder jobs --actionable` and alerts. Every existing job starts at zero.
ALTER TABLE herder_jobs ADD COLUMN transient_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE herder_jobs ADD COLUMN escalations INTEGER NOT NULL DEFAULT 0;
ALTER TABLE herder_jobs ADD COLUMN actionable INTEGER NOT NULL DEFAULT 0;
ALTER TABLE herder_jobs ADD COLUMN human_action INTEGER NOT NULL DEFAULT 0;
-- A job type's silence_timeout: no new log output for that long and the attempt is stuck.
ALTER TABLE herder_job_specs ADD COLUMN silence_timeout_seconds REAL;

DROP VIEW herder_job_records;
CREATE VIEW herder_job_records AS
SELECT j.id, s.job_type, s.command, s.shell, s.payload, j.priority, j.weight, j.dedup_key,
       j.dedup_released, j.affinity, j.available_at, s.max_attempts, s.timeout_seconds, s.env,
       s.workdir, s.backoff_base_seconds, s.backoff_max_seconds, j.status, j.attempt,
       j.failures, j.lost, j.host, j.exit_code, j.failure_reason, j.cancel_requested,
       s.created_at, j.claimed_at, j.started_at, j.finished_at, j.updated_at, j.ram_gb,
       j.spawn_failures, j.worker, j.pid, j.log_path, j.heartbeat_at, j.avoid_host,
       j.transient_attempts, j.escalations, j.actionable, j.human_action,
       s.silence_timeout_seconds
FROM herder_jobs j JOIN herder_job_specs s ON s.id = j.id;
