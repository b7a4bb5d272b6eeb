-- herder schema v10 (SQLite): accounts, the credential identities a host runs jobs under
-- (issue 15), with their health; env holds what an account gives a job and may hold
-- secrets, so no query but the one that binds an attempt reads it. herder_jobs.account is
-- the account the live attempt runs under: an account's sessions are its live attempts.
CREATE TABLE herder_accounts (
    host             TEXT NOT NULL,
    name             TEXT NOT NULL,
    env              TEXT NOT NULL DEFAULT '{}',
    max_sessions     INTEGER NOT NULL DEFAULT 1 CHECK (max_sessions >= 1),
    job_types        TEXT,
    probe            TEXT,
    source           TEXT NOT NULL DEFAULT 'config' CHECK (source IN ('config', 'cli')),
    depleted_until   REAL,
    auth_revoked_at  REAL,
    dead_token       INTEGER,
    probed_at        REAL,
    created_at       REAL NOT NULL,
    updated_at       REAL NOT NULL,
    PRIMARY KEY (host, name)
) WITHOUT ROWID;
ALTER TABLE herder_jobs ADD COLUMN account TEXT;
CREATE INDEX herder_jobs_account ON herder_jobs (host, account)
    WHERE account IS NOT NULL AND status IN ('claimed', 'running');
