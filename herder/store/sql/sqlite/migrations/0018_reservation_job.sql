-- herder schema v18 (SQLite): the job a subagent reservation was booked for (`herder reserve
-- --job`, $HERDER_JOB_ID inside a job), so a job holds no more slots on a host than
-- [fleet] max_subagents_for_weight gives its weight (NULL: booked for no job, or before v18).
ALTER TABLE herder_reservations ADD COLUMN job_id INTEGER;
CREATE INDEX herder_reservations_job ON herder_reservations (job_id, host)
    WHERE job_id IS NOT NULL AND status = 'active';
