-- herder schema v7 (SQLite): a job remembers the last host that failed to start it (placed
-- but never picked up, lost before its start, launch failure, refused, short of RAM), so
-- placement passes that host over while another one fits. Set by attempt_finish; NULL on
-- every existing job (nothing to carry over). The view gains the column for job_list_due.
ALTER TABLE herder_jobs ADD COLUMN avoid_host TEXT;

DROP VIEW herder_job_records;
CREATE VIEW herder_job_records AS
SELECT j.id, s.job_type, s.command, s.shell, s.payload, j.priority, j.weight, j.dedup_key,
       j.dedup_released, j.affinity, j.available_at, s.max_attempts, s.timeout_seconds, s.env,
       s.workdir, s.backoff_base_seconds, s.backoff_max_seconds, j.status, j.attempt,
       j.failures, j.lost, j.host, j.exit_code, j.failure_reason, j.cancel_requested,
       s.created_at, j.claimed_at, j.started_at, j.finished_at, j.updated_at, j.ram_gb,
       j.spawn_failures, j.worker, j.pid, j.log_path, j.heartbeat_at, j.avoid_host
FROM herder_jobs j JOIN herder_job_specs s ON s.id = j.id;
