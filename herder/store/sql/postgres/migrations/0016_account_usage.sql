-- herder schema v16 (PostgreSQL): an account's quota as its probe last reported it (issue
-- 24): the share used (0-100) and when it resets; NULL: unknown (accounts are ranked by it,
-- and one nearly spent is passed over).
ALTER TABLE herder_accounts ADD COLUMN usage_percent double precision
    CHECK (usage_percent BETWEEN 0 AND 100);
ALTER TABLE herder_accounts ADD COLUMN usage_resets_at timestamptz;
