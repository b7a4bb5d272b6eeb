-- herder schema v16 (SQLite): an account's quota as its probe last reported it (issue 24):
-- the share used (0-100) and when it resets; NULL: unknown (accounts are ranked by it, and
-- one nearly spent is passed over).
ALTER TABLE herder_accounts ADD COLUMN usage_percent REAL;
ALTER TABLE herder_accounts ADD COLUMN usage_resets_at REAL;
