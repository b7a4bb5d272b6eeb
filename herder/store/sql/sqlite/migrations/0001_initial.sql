-- herder schema v1 (SQLite). Times are unix epoch seconds (REAL); JSON is TEXT.
CREATE TABLE herder_jobs (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    job_type             TEXT NOT NULL,
    command              TEXT NOT NULL,
    shell                INTEGER NOT NULL DEFAULT 0,
    payload              TEXT NOT NULL DEFAULT '{}',
    priority             INTEGER NOT NULL DEFAULT 100,
    weight               TEXT NOT NULL,
    dedup_key            TEXT,
    dedup_released       INTEGER NOT NULL DEFAULT 0,
    affinity             TEXT,
    available_at         REAL NOT NULL,
    max_attempts         INTEGER NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds      REAL,
    env                  TEXT NOT NULL DEFAULT '{}',
    workdir              TEXT,
    backoff_base_seconds REAL NOT NULL DEFAULT 10,
    backoff_max_seconds  REAL NOT NULL DEFAULT 600,
    status               TEXT NOT NULL DEFAULT 'queued'
        CHECK (status IN ('queued', 'claimed', 'running', 'done', 'failed', 'cancelled')),
    attempt              INTEGER NOT NULL DEFAULT 0,
    failures             INTEGER NOT NULL DEFAULT 0,
    lost                 INTEGER NOT NULL DEFAULT 0,
    host                 TEXT,
    exit_code            INTEGER,
    failure_reason       TEXT,
    cancel_requested     INTEGER NOT NULL DEFAULT 0,
    created_at           REAL NOT NULL,
    claimed_at           REAL,
    started_at           REAL,
    finished_at          REAL,
    updated_at           REAL NOT NULL
);

CREATE INDEX herder_jobs_queued ON herder_jobs (priority, id) WHERE status = 'queued';
CREATE UNIQUE INDEX herder_jobs_dedup ON herder_jobs (dedup_key)
    WHERE dedup_key IS NOT NULL AND dedup_released = 0
      AND status IN ('queued', 'claimed', 'running', 'done');

CREATE TABLE herder_attempts (
    job_id       INTEGER NOT NULL,
    attempt      INTEGER NOT NULL,
    host         TEXT NOT NULL,
    worker       TEXT NOT NULL,
    pid          INTEGER,
    log_path     TEXT,
    claimed_at   REAL NOT NULL,
    started_at   REAL,
    heartbeat_at REAL NOT NULL,
    ended_at     REAL,
    exit_code    INTEGER,
    outcome      TEXT,
    PRIMARY KEY (job_id, attempt)
) WITHOUT ROWID;

CREATE TABLE herder_events (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL,
    at          REAL NOT NULL,
    kind        TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT,
    attempt     INTEGER,
    detail      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX herder_events_job ON herder_events (job_id, id);
