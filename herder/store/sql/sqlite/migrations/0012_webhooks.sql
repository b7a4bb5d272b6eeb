-- herder schema v12 (SQLite): forge webhook deliveries seen (issue 16), so a replayed or
-- redelivered delivery enqueues nothing twice. A row is written in the transaction that
-- inserts its jobs (a crash loses both, so the forge's redelivery still enqueues); the
-- maintenance sweep forgets rows older than hooks.retention.
CREATE TABLE herder_deliveries (
    source       TEXT NOT NULL,
    delivery_id  TEXT NOT NULL,
    event        TEXT NOT NULL,
    received_at  REAL NOT NULL,
    job_ids      TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (source, delivery_id)
) WITHOUT ROWID;
CREATE INDEX herder_deliveries_received ON herder_deliveries (received_at);
