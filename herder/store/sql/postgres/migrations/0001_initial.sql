-- herder schema v1 (PostgreSQL). Applied by `herder migrate` and on start.
CREATE TABLE herder_jobs (
    id                   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_type             text NOT NULL,
    command              jsonb NOT NULL,
    shell                boolean NOT NULL DEFAULT false,
    payload              jsonb NOT NULL DEFAULT '{}',
    priority             integer NOT NULL DEFAULT 100,
    weight               text NOT NULL,
    dedup_key            text,
    dedup_released       boolean NOT NULL DEFAULT false,
    affinity             text,
    available_at         timestamptz NOT NULL,
    max_attempts         integer NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds      double precision,
    env                  jsonb NOT NULL DEFAULT '{}',
    workdir              text,
    backoff_base_seconds double precision NOT NULL DEFAULT 10,
    backoff_max_seconds  double precision NOT NULL DEFAULT 600,
    status               text NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'claimed', 'running', 'done', 'failed', 'cancelled')),
    attempt              integer NOT NULL DEFAULT 0,
    failures             integer NOT NULL DEFAULT 0,
    lost                 integer NOT NULL DEFAULT 0,
    host                 text,
    exit_code            integer,
    failure_reason       text,
    cancel_requested     boolean NOT NULL DEFAULT false,
    created_at           timestamptz NOT NULL,
    claimed_at           timestamptz,
    started_at           timestamptz,
    finished_at          timestamptz,
    updated_at           timestamptz NOT NULL
);

-- The claim scans this index in priority order; it holds only queued rows.
CREATE INDEX herder_jobs_queued ON herder_jobs (priority, id) WHERE status = 'queued';
-- The dedup guard: one live (or done, unless released by a forced rerun) job per key.
CREATE UNIQUE INDEX herder_jobs_dedup ON herder_jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND NOT dedup_released
      AND status IN ('queued', 'claimed', 'running', 'done');
-- No index on status alone: every status change would add an entry to it. Listing by status
-- walks the primary key backwards; the active statuses have partial indexes of their own.

CREATE TABLE herder_attempts (
    job_id       bigint NOT NULL,
    attempt      integer NOT NULL,
    host         text NOT NULL,
    worker       text NOT NULL,
    pid          integer,
    log_path     text,
    claimed_at   timestamptz NOT NULL,
    started_at   timestamptz,
    heartbeat_at timestamptz NOT NULL,
    ended_at     timestamptz,
    exit_code    integer,
    outcome      text,
    PRIMARY KEY (job_id, attempt)
);
-- Only the primary key: heartbeats and the final update of an attempt stay HOT (no index
-- entries); live attempts are found through the jobs' partial indexes.

CREATE TABLE herder_events (
    id          bigint GENERATED ALWAYS AS IDENTITY,
    job_id      bigint NOT NULL,
    at          timestamptz NOT NULL,
    kind        text NOT NULL,
    from_status text,
    to_status   text,
    attempt     integer,
    detail      jsonb NOT NULL DEFAULT '{}',
    -- One index serves both uniqueness and a job's history in order.
    PRIMARY KEY (job_id, id)
);
