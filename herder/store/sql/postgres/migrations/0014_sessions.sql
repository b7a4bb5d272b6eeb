-- herder schema v14 (PostgreSQL): dashboard sessions live in the database, so a server
-- restart keeps them and every replica behind a balancer knows them. A session's id is
-- stored as its SHA-256 only: reading the table does not give a usable cookie.
CREATE TABLE herder_sessions (
    id_hash     text PRIMARY KEY,
    token_key   text NOT NULL,
    csrf        text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX herder_sessions_expires ON herder_sessions (expires_at);
