-- herder schema v6 (PostgreSQL): API tokens with scopes. Every caller of the HTTP API holds one;
-- only its SHA-256 is stored. Agent tokens are bound to one host; the hosts' own token hashes
-- (v2) move here and stay valid.
CREATE TABLE herder_tokens (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name            text NOT NULL,
    scope           text NOT NULL CHECK (scope IN ('admin', 'submit', 'read', 'agent')),
    token_hash      text NOT NULL UNIQUE,
    host            text,
    job_types       jsonb,
    priority_floor  integer,
    created_at      timestamptz NOT NULL,
    revoked_at      timestamptz,
    CHECK ((scope = 'agent') = (host IS NOT NULL))
);
CREATE INDEX herder_tokens_host ON herder_tokens (host) WHERE revoked_at IS NULL;

INSERT INTO herder_tokens (name, scope, token_hash, host, created_at)
SELECT 'host:' || label, 'agent', token_hash, label, updated_at
FROM herder_hosts WHERE token_hash IS NOT NULL;
UPDATE herder_hosts SET token_hash = NULL WHERE token_hash IS NOT NULL;
