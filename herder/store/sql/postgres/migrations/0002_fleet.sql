-- herder schema v2 (PostgreSQL): hosts, RAM reservations, alerts; jobs remember the RAM
-- budget they were placed with, so capacity can be re-checked in SQL.
ALTER TABLE herder_jobs ADD COLUMN ram_gb double precision NOT NULL DEFAULT 0;
ALTER TABLE herder_jobs ADD COLUMN spawn_failures integer NOT NULL DEFAULT 0;
CREATE INDEX herder_jobs_host_active ON herder_jobs (host) WHERE status IN ('claimed', 'running');

CREATE TABLE herder_hosts (
    label              text PRIMARY KEY,
    ram_total_gb       double precision NOT NULL CHECK (ram_total_gb >= 0),
    ram_reserved_gb    double precision NOT NULL DEFAULT 0 CHECK (ram_reserved_gb >= 0),
    cpus               integer NOT NULL DEFAULT 1 CHECK (cpus >= 1),
    enabled            boolean NOT NULL DEFAULT true,
    transport          text NOT NULL DEFAULT 'agent' CHECK (transport IN ('local', 'agent', 'ssh')),
    ssh_target         text,
    prime_max_workers  integer NOT NULL DEFAULT 1 CHECK (prime_max_workers >= 0),
    prime_max_weight   text,
    night_max_workers  integer NOT NULL DEFAULT 1 CHECK (night_max_workers >= 0),
    night_max_weight   text,
    allowed_job_types  jsonb,
    allowed_weights    jsonb,
    priority_floor     integer,
    labels             jsonb NOT NULL DEFAULT '[]',
    token_hash         text,
    last_heartbeat     timestamptz,
    agent_info         jsonb NOT NULL DEFAULT '{}',
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL
);

CREATE TABLE herder_reservations (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('subagent', 'ci')),
    owner       text NOT NULL,
    host        text NOT NULL,
    weight      text NOT NULL,
    ram_gb      double precision NOT NULL,
    status      text NOT NULL DEFAULT 'active'
        CHECK (status IN ('active', 'done', 'failed', 'cancelled', 'released', 'expired')),
    detail      jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL,
    expires_at  timestamptz NOT NULL,
    ended_at    timestamptz
);
CREATE INDEX herder_reservations_active ON herder_reservations (host) WHERE status = 'active';
-- A CI run holds at most one live slot, so claim is idempotent.
CREATE UNIQUE INDEX herder_reservations_ci ON herder_reservations (owner)
    WHERE kind = 'ci' AND status = 'active';

CREATE TABLE herder_alerts (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key        text NOT NULL,
    message    text NOT NULL,
    opened_at  timestamptz NOT NULL,
    cleared_at timestamptz
);
-- One open alert per key: raised once, deduplicated until it clears.
CREATE UNIQUE INDEX herder_alerts_open ON herder_alerts (key) WHERE cleared_at IS NULL;
