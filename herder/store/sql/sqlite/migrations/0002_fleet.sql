-- herder schema v2 (SQLite): hosts, RAM reservations, alerts; jobs remember the RAM
-- budget they were placed with, so capacity can be re-checked in SQL.
ALTER TABLE herder_jobs ADD COLUMN ram_gb REAL NOT NULL DEFAULT 0;
ALTER TABLE herder_jobs ADD COLUMN spawn_failures INTEGER NOT NULL DEFAULT 0;
CREATE INDEX herder_jobs_host_active ON herder_jobs (host) WHERE status IN ('claimed', 'running');

CREATE TABLE herder_hosts (
    label              TEXT PRIMARY KEY,
    ram_total_gb       REAL NOT NULL CHECK (ram_total_gb >= 0),
    ram_reserved_gb    REAL NOT NULL DEFAULT 0 CHECK (ram_reserved_gb >= 0),
    cpus               INTEGER NOT NULL DEFAULT 1 CHECK (cpus >= 1),
    enabled            INTEGER NOT NULL DEFAULT 1,
    transport          TEXT NOT NULL DEFAULT 'agent' CHECK (transport IN ('local', 'agent', 'ssh')),
    ssh_target         TEXT,
    prime_max_workers  INTEGER NOT NULL DEFAULT 1 CHECK (prime_max_workers >= 0),
    prime_max_weight   TEXT,
    night_max_workers  INTEGER NOT NULL DEFAULT 1 CHECK (night_max_workers >= 0),
    night_max_weight   TEXT,
    allowed_job_types  TEXT,
    allowed_weights    TEXT,
    priority_floor     INTEGER,
    labels             TEXT NOT NULL DEFAULT '[]',
    token_hash         TEXT,
    last_heartbeat     REAL,
    agent_info         TEXT NOT NULL DEFAULT '{}',
    created_at         REAL NOT NULL,
    updated_at         REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE herder_reservations (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT NOT NULL CHECK (kind IN ('subagent', 'ci')),
    owner       TEXT NOT NULL,
    host        TEXT NOT NULL,
    weight      TEXT NOT NULL,
    ram_gb      REAL NOT NULL,
    status      TEXT NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'done', 'failed', 'cancelled', 'released', 'expired')),
    detail      TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    ended_at    REAL
);
CREATE INDEX herder_reservations_active ON herder_reservations (host) WHERE status = 'active';
CREATE UNIQUE INDEX herder_reservations_ci ON herder_reservations (owner)
    WHERE kind = 'ci' AND status = 'active';

CREATE TABLE herder_alerts (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    key        TEXT NOT NULL,
    message    TEXT NOT NULL,
    opened_at  REAL NOT NULL,
    cleared_at REAL
);
CREATE UNIQUE INDEX herder_alerts_open ON herder_alerts (key) WHERE cleared_at IS NULL;
