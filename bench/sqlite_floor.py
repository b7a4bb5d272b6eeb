"""The SQLite floor of what the issue requires, with no herder code: stdlib sqlite3 only.

Compares, back to back on one file layout, the bare raw loop (the same table and statements
as herder_bench.py's herder-raw-sqlite rows) with the same loop plus only the writes the
issue asks for: an event row per transition (with a per-job index, which any event history
needs) and a history row per attempt, in the same transactions. WAL, synchronous=FULL.

usage: python bench/sqlite_floor.py          (B=100 and 10, 3 rounds each, 4 s per loop)
env:   BATCHES (100,10), ROUNDS (3), SECONDS (4), FLOOR_DIR (/tmp/herder-floor)
"""

from __future__ import annotations

import os
import sqlite3
import time

DIR = os.environ.get("FLOOR_DIR", "/tmp/herder-floor")
PATH = os.path.join(DIR, "floor.db")
SECONDS = float(os.environ.get("SECONDS", "4"))
ROUNDS = int(os.environ.get("ROUNDS", "3"))
BATCHES = [int(b) for b in os.environ.get("BATCHES", "100,10").split(",") if b]
PRELOAD = 300_000

SCHEMA = """
CREATE TABLE raw_jobs (
    id INTEGER PRIMARY KEY, queue TEXT NOT NULL DEFAULT 'default',
    status TEXT NOT NULL DEFAULT 'queued', priority INTEGER NOT NULL DEFAULT 0,
    payload TEXT NOT NULL DEFAULT '{}', attempts INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL, started_at REAL, finished_at REAL);
CREATE INDEX raw_jobs_queued_idx ON raw_jobs (status, priority, id) WHERE status = 'queued';
CREATE TABLE floor_events (
    id INTEGER PRIMARY KEY, job_id INTEGER NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,
    attempt INTEGER);
CREATE INDEX floor_events_job ON floor_events (job_id, id);
CREATE TABLE floor_attempts (
    job_id INTEGER NOT NULL, attempt INTEGER NOT NULL, host TEXT NOT NULL,
    started_at REAL NOT NULL, ended_at REAL NOT NULL, exit_code INTEGER,
    outcome TEXT NOT NULL, PRIMARY KEY (job_id, attempt)) WITHOUT ROWID;
"""
CLAIM = ("UPDATE raw_jobs SET status = 'running', started_at = ?, attempts = attempts + 1 "
         "WHERE id IN (SELECT id FROM raw_jobs WHERE status = 'queued' "
         "ORDER BY priority, id LIMIT ?) RETURNING id, attempts")
EVENT = "INSERT INTO floor_events (job_id, at, kind, attempt) VALUES (?, ?, ?, ?)"
HISTORY = "INSERT INTO floor_attempts VALUES (?, ?, 'host', ?, ?, 0, 'ok')"


def fresh(with_writes: bool) -> sqlite3.Connection:
    os.makedirs(DIR, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(PATH + suffix):
            os.remove(PATH + suffix)
    conn = sqlite3.connect(PATH, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(SCHEMA)
    stamp = time.time()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO raw_jobs (priority, payload, created_at) VALUES (?, ?, ?)",
                     ((i % 10, '{"task": "noop"}', stamp) for i in range(PRELOAD)))
    if with_writes:  # every job has its `submitted` event, as in herder
        conn.execute("INSERT INTO floor_events (job_id, at, kind) "
                     "SELECT id, created_at, 'submitted' FROM raw_jobs")
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return conn


def loop(batch: int, with_writes: bool) -> float:
    """Jobs per second of claim -> finish, two commits per batch."""
    conn = fresh(with_writes)
    jobs = 0
    deadline = time.perf_counter() + SECONDS
    while time.perf_counter() < deadline:
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        rows = conn.execute(CLAIM, (now, batch)).fetchall()
        if with_writes:
            conn.executemany(EVENT, [(job, now, "claimed", attempt) for job, attempt in rows])
        conn.execute("COMMIT")
        now = time.time()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(f"UPDATE raw_jobs SET status = 'done', finished_at = ? "
                     f"WHERE id IN ({','.join('?' * len(rows))})",
                     (now, *(job for job, _ in rows)))
        if with_writes:
            conn.executemany(HISTORY, [(job, attempt, now, now) for job, attempt in rows])
            conn.executemany(EVENT, [(job, now, "finished", attempt) for job, attempt in rows])
        conn.execute("COMMIT")
        jobs += len(rows)
    conn.close()
    return jobs / SECONDS


def main() -> None:
    print("| batch | round | raw jobs/s | raw + required writes jobs/s | ratio |")
    print("|---|---|---|---|---|")
    for batch in BATCHES:
        for round_ in range(1, ROUNDS + 1):
            raw, floor = loop(batch, False), loop(batch, True)
            print(f"| {batch} | {round_} | {raw:,.0f} | {floor:,.0f} | {floor / raw:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
