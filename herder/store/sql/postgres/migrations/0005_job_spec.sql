-- herder schema v5 (PostgreSQL): nothing to do. On SQLite v5 splits a job into its state row
-- and its spec row; PostgreSQL keeps one row (TOAST already keeps large values out of line).
-- The version exists here too, so both backends carry the same schema version numbers.
SELECT 1;
