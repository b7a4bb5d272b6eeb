-- herder schema v14 (SQLite): dashboard sessions live in the database, so a server restart
-- keeps them and every replica behind a balancer knows them. A session's id is stored as
-- its SHA-256 only: reading the table does not give a usable cookie.
CREATE TABLE herder_sessions (
    id_hash     TEXT PRIMARY KEY,
    token_key   TEXT NOT NULL,
    csrf        TEXT NOT NULL,
    expires_at  REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX herder_sessions_expires ON herder_sessions (expires_at);
