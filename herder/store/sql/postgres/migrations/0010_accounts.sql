-- herder schema v10 (PostgreSQL): accounts, the credential identities a host runs jobs
-- under (issue 15), with their health; env holds what an account gives a job and may hold
-- secrets, so no query but the one that binds an attempt reads it. herder_jobs.account is
-- the account the live attempt runs under: an account's sessions are its live attempts.
CREATE TABLE herder_accounts (
    host             text NOT NULL,
    name             text NOT NULL,
    env              jsonb NOT NULL DEFAULT '{}',
    max_sessions     integer NOT NULL DEFAULT 1 CHECK (max_sessions >= 1),
    job_types        jsonb,
    probe            jsonb,
    source           text NOT NULL DEFAULT 'config' CHECK (source IN ('config', 'cli')),
    depleted_until   timestamptz,
    auth_revoked_at  timestamptz,
    dead_token       boolean,
    probed_at        timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (host, name)
);
ALTER TABLE herder_jobs ADD COLUMN account text;
CREATE INDEX herder_jobs_account ON herder_jobs (host, account)
    WHERE account IS NOT NULL AND status IN ('claimed', 'running');
