-- herder schema v6 (SQLite): API tokens with scopes. Every caller of the HTTP API holds one;
-- only its SHA-256 is stored. Agent tokens are bound to one host; the hosts' own token hashes
-- (v2) move here and stay valid.
CREATE TABLE herder_tokens (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    name            TEXT NOT NULL,
    scope           TEXT NOT NULL CHECK (scope IN ('admin', 'submit', 'read', 'agent')),
    token_hash      TEXT NOT NULL UNIQUE,
    host            TEXT,
    job_types       TEXT,
    priority_floor  INTEGER,
    created_at      REAL NOT NULL,
    revoked_at      REAL,
    CHECK ((scope = 'agent') = (host IS NOT NULL))
);
CREATE INDEX herder_tokens_host ON herder_tokens (host) WHERE revoked_at IS NULL;

INSERT INTO herder_tokens (name, scope, token_hash, host, created_at)
SELECT 'host:' || label, 'agent', token_hash, label, updated_at
FROM herder_hosts WHERE token_hash IS NOT NULL;
UPDATE herder_hosts SET token_hash = NULL WHERE token_hash IS NOT NULL;
