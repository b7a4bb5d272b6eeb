-- herder schema v20 (PostgreSQL): the machines `herder up` runs on (issue 26), so the
-- fleet view, `herder hosts`, `/queue`, `/metrics` and `herder why` show them like hosts.
-- A runner writes its row from its loop (when its slots change, else every few seconds) and deletes it on a clean exit;
-- a row whose `last_turn_at` is old is a runner that died. Never read by placement:
-- `herder up` keeps claiming (job_claim), and only `herder_hosts` rows are placed on.
CREATE TABLE herder_runners (
    label             text PRIMARY KEY,
    worker            text NOT NULL,
    concurrency       integer NOT NULL,
    running           integer NOT NULL,
    cpus              integer NOT NULL,
    ram_total_gb      double precision NOT NULL,
    ram_booked_gb     double precision NOT NULL,
    ram_available_gb  double precision,
    started_at        timestamptz NOT NULL,
    last_turn_at      timestamptz NOT NULL
);
