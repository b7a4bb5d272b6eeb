-- herder schema v12 (PostgreSQL): forge webhook deliveries seen (issue 16), so a replayed
-- or redelivered delivery enqueues nothing twice. A row is written in the transaction that
-- inserts its jobs (a crash loses both, so the forge's redelivery still enqueues); the
-- maintenance sweep forgets rows older than hooks.retention.
CREATE TABLE herder_deliveries (
    source       text NOT NULL,
    delivery_id  text NOT NULL,
    event        text NOT NULL,
    received_at  timestamptz NOT NULL,
    job_ids      jsonb NOT NULL DEFAULT '[]',
    PRIMARY KEY (source, delivery_id)
);
CREATE INDEX herder_deliveries_received ON herder_deliveries (received_at);
