-- herder schema v20 (SQLite): the machines `herder up` runs on (issue 26), so the fleet
-- view, `herder hosts`, `/queue`, `/metrics` and `herder why` show them like hosts. A
-- runner writes its row from its loop (when its slots change, else every few seconds) and deletes it on a clean exit; a
-- row whose `last_turn_at` is old is a runner that died. Never read by placement: `herder
-- up` keeps claiming (job_claim), and only `herder_hosts` rows are placed on.
CREATE TABLE herder_runners (
    label             TEXT PRIMARY KEY,
    worker            TEXT NOT NULL,
    concurrency       INTEGER NOT NULL,
    running           INTEGER NOT NULL,
    cpus              INTEGER NOT NULL,
    ram_total_gb      REAL NOT NULL,
    ram_booked_gb     REAL NOT NULL,
    ram_available_gb  REAL,
    started_at        REAL NOT NULL,
    last_turn_at      REAL NOT NULL
);
