-- herder schema v13 (PostgreSQL): alert delivery (issue 16). The store is the record of
-- what was handed to the delivery queue, so a restarted or new leader sends nothing twice:
-- sent_at when the opening was sent, resolved_sent_at when the clearing was.
ALTER TABLE herder_alerts ADD COLUMN sent_at timestamptz;
ALTER TABLE herder_alerts ADD COLUMN resolved_sent_at timestamptz;
ALTER TABLE herder_alerts ADD COLUMN sent_count integer NOT NULL DEFAULT 0;
CREATE INDEX herder_alerts_key ON herder_alerts (key, id);
