-- herder schema v7 (PostgreSQL): a job remembers the last host that failed to start it (placed
-- but never picked up, lost before its start, launch failure, refused, short of RAM), so
-- placement passes that host over while another one fits. Set by attempt_finish; NULL on
-- every existing job. A nullable column without a default is added without a table rewrite.
ALTER TABLE herder_jobs ADD COLUMN avoid_host text;
