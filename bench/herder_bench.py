"""herder's own throughput and latency, in the same rows/table as the shared peer benchmarks.

Groups (rows appended with the shared `common.record`, so `summarize.py` prints them):

herder-pg / herder-sqlite  (through `herder.store.open_store(url)`, the real store code)
  enqueue single (1 job/call)       job_insert([spec]) in a loop for ENQ_SECONDS.
  enqueue batch (1000 jobs/call)    job_insert(1000 specs) in a loop for ENQ_SECONDS.
  claim-finish B=b c=c              N no-op jobs preloaded (batch job_insert, not timed; on
                                    PostgreSQL VACUUM ANALYZE + CHECKPOINT afterwards), then c
                                    processes each loop job_claim(limit=b) + one attempt_finish
                                    of those b jobs (outcome ok -> done) for RAW_SECONDS, like
                                    pgbench -T. ops/s = finished jobs / slowest process's time.
                                    Verified: jobs done in DB == jobs counted, none still
                                    claimed, no job with more than one attempt, queue not dry.
  latency submit->start ...         `herder up` running idle; one job at a time is submitted
                                    (job_insert) and its process appends $EPOCHREALTIME to a
                                    file; latency = that stamp - the time before job_insert.
                                    p50_ms / p99_ms are extra fields; ops/s = 1000 / p50_ms.
herder-raw-pg / herder-raw-sqlite  (bare Python loops over a minimal table, the same database)
  claim-finish B=b c=c              the shared sql/claim10_2tx.sql shape with LIMIT b
                                    (psycopg, prepared, autocommit: 2 commits per b jobs) /
                                    SQLite BEGIN IMMEDIATE; UPDATE ... RETURNING; COMMIT; then
                                    the finish UPDATE in its own BEGIN IMMEDIATE ... COMMIT.
  enqueue ...                       single autocommit INSERT; INSERT + pg_notify in one
                                    transaction (what herder's submit does); 1000-row batch.

SQLite variants carry `sync=full` (herder's default) or `sync=normal` (`?synchronous=normal`).

Env knobs: REPS (3), RAW_SECONDS (5), ENQ_SECONDS (5), CLAIM_CLIENTS (1,4,8),
BATCHES (1,10,100), HERDER_PARTS or PARTS (enqueue claim raw latency), BACKENDS (pg sqlite),
SQLITE_SYNCS (full,normal), PGPORT (5432 standalone), HERDER_BENCH_PG_URL (overrides the
postgresql://postgres@127.0.0.1:$PGPORT/herder_bench default), SQLITE_DIR
(/tmp/herder-bench), LATENCY_SAMPLES (200), LATENCY_CONCURRENCY (2), HERDER_UP (command
prefix for the runner, default `<python> -c "from herder.cli import main; main()"`),
WITH_START=1 (also call attempt_start per job in the claim loop), HERDER_SQLITE_ANALYZE=1
(run ANALYZE on herder's SQLite file after the preload; herder never does), PAYLOAD_BYTES
(0: each job's payload is `{}`; N: a prompt of N bytes of text, in herder's and the raw
tables alike, as an agent job carries; the variants say `payload=NB`), RESULTS (jsonl
path; default bench/results/herder-<stamp>.jsonl standalone), SHARED_BENCH (the shared
bench folder).
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import random
import shlex
import signal
import sqlite3
import statistics
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shared_dir() -> str:
    if os.environ.get("SHARED_BENCH"):
        return os.path.abspath(os.environ["SHARED_BENCH"])
    if os.path.exists(os.path.join(os.getcwd(), "common.py")):
        return os.getcwd()  # run_all.sh cd's into the shared folder before the extras
    return os.path.abspath(os.path.join(REPO, "..", "shared", "bench"))


SHARED = _shared_dir()
if not os.path.exists(os.path.join(SHARED, "common.py")):
    raise SystemExit(f"cannot find the shared bench folder (common.py) at {SHARED}; "
                     "set SHARED_BENCH")
# Standalone: results go to this repo (the shared folder is read-only), PG to port 5432.
os.environ.setdefault(
    "RESULTS", os.path.join(REPO, "bench", "results",
                            f"herder-{time.strftime('%Y%m%d-%H%M%S')}.jsonl"))
os.environ.setdefault("PGPORT", "5432")
sys.path.insert(0, SHARED)
sys.path.insert(0, REPO)

import common  # type: ignore[import-not-found,unused-ignore]  # noqa: E402
import psycopg  # noqa: E402

from herder.core.model import (  # noqa: E402
    AttemptResult,
    Decision,
    JobSpec,
    JobStatus,
    Outcome,
)
from herder.store import Store, open_store  # noqa: E402

REPS = common.REPS
RAW_SECONDS = float(os.environ.get("RAW_SECONDS", "5"))
ENQ_SECONDS = float(os.environ.get("ENQ_SECONDS", "5"))
ENQ_BATCH = 1000
CLAIM_CLIENTS = [int(x) for x in os.environ.get("CLAIM_CLIENTS", "1,4,8").split(",") if x]
BATCHES = [int(x) for x in os.environ.get("BATCHES", "1,10,100").split(",") if x]
ALL_PARTS = ("enqueue", "claim", "raw", "latency")
PARTS = (os.environ.get("HERDER_PARTS") or os.environ.get("PARTS") or " ".join(ALL_PARTS)
         ).replace(",", " ").split()
BACKENDS = os.environ.get("BACKENDS", "pg sqlite").replace(",", " ").split()
SQLITE_SYNCS = os.environ.get("SQLITE_SYNCS", "full,normal").replace(",", " ").split()
PGPORT = int(os.environ["PGPORT"])
PG_DB = "herder_bench"
PG_URL = os.environ.get("HERDER_BENCH_PG_URL",
                        f"postgresql://{common.PGUSER}@{common.PGHOST}:{PGPORT}/{PG_DB}")
SQLITE_DIR = os.environ.get("SQLITE_DIR", "/tmp/herder-bench")
LATENCY_SAMPLES = int(os.environ.get("LATENCY_SAMPLES", "200"))
LATENCY_CONCURRENCY = int(os.environ.get("LATENCY_CONCURRENCY", "2"))
WITH_START = os.environ.get("WITH_START", "0") == "1"
HERDER_SQLITE_ANALYZE = os.environ.get("HERDER_SQLITE_ANALYZE", "0") == "1"
# First-run preload per implementation and batch size for a 5 s run (scaled by RAW_SECONDS);
# later runs of the same group and batch use max(this, 2.5 x the best rate seen x RAW_SECONDS),
# and a run that went dry is redone once with 3x its preload. The raw tables load fast
# (server-side / executemany), so they get generous first guesses.
PRELOAD_GUESS = {
    "herder": {1: 20_000, 10: 60_000, 100: 120_000},
    "raw": {1: 150_000, 10: 400_000, 100: 800_000},
}
PRELOAD_CHUNK = 5000
HERDER_SCHEMA = ("herder",)  # the claim loops that run on herder's own tables

PAYLOAD_BYTES = int(os.environ.get("PAYLOAD_BYTES", "0"))


def prompt_text(size: int) -> str:
    """`size` bytes of word-like text: compresses about as a prompt does, unlike "x" * n."""
    rng = random.Random(7)
    words = ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9)))
             for _ in range(500)]
    text = ""
    while len(text) < size:
        text += rng.choice(words) + " "
    return text[:size]


PAYLOAD = {"prompt": prompt_text(PAYLOAD_BYTES)} if PAYLOAD_BYTES else {}
RAW_PAYLOAD = json.dumps(PAYLOAD or {"task": "noop"})
NOOP = JobSpec(command=("true",), job_type="noop", payload=PAYLOAD)
OK = Decision(JobStatus.DONE)
HOST = "bench-host"


def now() -> datetime:
    return datetime.now(UTC)


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- PostgreSQL helpers ----------------------------------------------------------------------


def pg_admin_url(db: str = "postgres") -> str:
    base, _, _ = PG_URL.rpartition("/")
    return f"{base}/{db}"


def pg_exec(*statements: str, db_url: str = PG_URL) -> list[tuple[Any, ...]]:
    """Run statements in autocommit; returns the last one's rows (if any)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows: list[tuple[Any, ...]] = []
        for stmt in statements:
            cur = conn.execute(stmt.encode())
            rows = cur.fetchall() if cur.description else []
        return rows


def pg_fresh_database() -> None:
    """Drop and recreate the dedicated bench database, so its schema is the current one."""
    say(f"  (re)creating database {PG_DB} on port {PGPORT}")
    pg_exec(f"DROP DATABASE IF EXISTS {PG_DB} WITH (FORCE)", f"CREATE DATABASE {PG_DB}",
            db_url=pg_admin_url())


def pg_wait_autovacuum() -> None:
    common.wait_until(lambda: int(pg_exec(common.AUTOVACUUM_BUSY_SQL)[0][0]))


def pg_wal_lsn() -> str:
    return str(pg_exec("SELECT pg_current_wal_lsn()::text")[0][0])


def pg_wal_bytes_since(lsn: str) -> int:
    return int(pg_exec(f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{lsn}')")[0][0])


def pg_xact_commit() -> int:
    time.sleep(0.6)  # backends flush their stats at most once a second / on exit
    return int(pg_exec("SELECT pg_stat_clear_snapshot()",
                       f"SELECT xact_commit FROM pg_stat_database WHERE datname = '{PG_DB}'"
                       )[0][0])


HERDER_TABLES = "herder_jobs, herder_events"  # herder_attempts is a view of events

RAW_PG_SCHEMA = """
DROP TABLE IF EXISTS raw_jobs;
CREATE TABLE raw_jobs (
    id          bigserial PRIMARY KEY,
    queue       text        NOT NULL DEFAULT 'default',
    status      text        NOT NULL DEFAULT 'queued',
    priority    int         NOT NULL DEFAULT 0,
    payload     jsonb       NOT NULL DEFAULT '{}',
    attempts    int         NOT NULL DEFAULT 0,
    created_at  timestamptz NOT NULL DEFAULT now(),
    started_at  timestamptz,
    finished_at timestamptz
);
CREATE INDEX raw_jobs_queued_idx ON raw_jobs (status, priority, id) WHERE status = 'queued'
"""
# sql/claim10_2tx.sql with LIMIT %(b)s; finish in a second autocommit statement.
RAW_PG_CLAIM = """
WITH c AS (SELECT id FROM raw_jobs WHERE status = 'queued'
            ORDER BY priority, id FOR UPDATE SKIP LOCKED LIMIT %(b)s),
     u AS (UPDATE raw_jobs j SET status = 'running', started_at = now(),
                  attempts = j.attempts + 1
             FROM c WHERE j.id = c.id RETURNING j.id)
SELECT array_agg(id) AS ids FROM u"""
RAW_PG_FINISH = (
    "UPDATE raw_jobs SET status = 'done', finished_at = now() WHERE id = ANY (%(ids)s::bigint[])"
)
RAW_PG_INSERT = f"INSERT INTO raw_jobs (priority, payload) VALUES (%s, '{RAW_PAYLOAD}')"


def raw_pg_preload(n: int) -> None:
    pg_exec(
        "TRUNCATE raw_jobs RESTART IDENTITY",
        "DROP INDEX IF EXISTS raw_jobs_queued_idx",
        "INSERT INTO raw_jobs (priority, payload) SELECT (g % 10), "
        f"'{RAW_PAYLOAD}'::jsonb FROM generate_series(1, {n}) g",
        "CREATE INDEX raw_jobs_queued_idx ON raw_jobs (status, priority, id) "
        "WHERE status = 'queued'",
        "VACUUM ANALYZE raw_jobs",
        "CHECKPOINT",
    )


# -- SQLite helpers ----------------------------------------------------------------------------


def sqlite_path(name: str) -> str:
    return os.path.join(SQLITE_DIR, name)


def sqlite_url(path: str, sync: str) -> str:
    url = f"sqlite:///{path}"  # path is absolute, so this is sqlite:////abs/path
    return url if sync == "full" else f"{url}?synchronous={sync}"


def sqlite_remove(path: str) -> None:
    os.makedirs(SQLITE_DIR, exist_ok=True)
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


def sqlite_connect(path: str, sync: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync.upper()}")
    return conn


def sqlite_query(path: str, sql: str) -> tuple[Any, ...]:
    conn = sqlite_connect(path, "normal")
    try:
        return tuple(conn.execute(sql).fetchone())
    finally:
        conn.close()


def sqlite_settle(path: str, analyze: bool) -> None:
    conn = sqlite_connect(path, "normal")
    try:
        if analyze:
            conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


RAW_SQLITE_SCHEMA = """
CREATE TABLE raw_jobs (
    id          INTEGER PRIMARY KEY,
    queue       TEXT    NOT NULL DEFAULT 'default',
    status      TEXT    NOT NULL DEFAULT 'queued',
    priority    INTEGER NOT NULL DEFAULT 0,
    payload     TEXT    NOT NULL DEFAULT '{}',
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  REAL    NOT NULL,
    started_at  REAL,
    finished_at REAL
);
CREATE INDEX raw_jobs_queued_idx ON raw_jobs (status, priority, id) WHERE status = 'queued';
"""
RAW_SQLITE_CLAIM = (
    "UPDATE raw_jobs SET status = 'running', started_at = ?, attempts = attempts + 1 "
    "WHERE id IN (SELECT id FROM raw_jobs WHERE status = 'queued' "
    "             ORDER BY priority, id LIMIT ?) RETURNING id"
)
RAW_SQLITE_INSERT = "INSERT INTO raw_jobs (priority, payload, created_at) VALUES (?, ?, ?)"


def raw_sqlite_fresh(path: str, preload: int) -> None:
    sqlite_remove(path)
    conn = sqlite_connect(path, "normal")
    try:
        conn.executescript(RAW_SQLITE_SCHEMA)
        stamp = time.time()
        conn.execute("BEGIN")
        conn.executemany(RAW_SQLITE_INSERT,
                         ((i % 10, RAW_PAYLOAD, stamp) for i in range(preload)))
        conn.execute("COMMIT")
    finally:
        conn.close()
    sqlite_settle(path, analyze=True)  # as the shared bench_sqlite.py does


# -- herder store setup ------------------------------------------------------------------------


def herder_preload(url: str, n: int) -> None:
    with open_store(url) as store:
        for start in range(0, n, PRELOAD_CHUNK):
            store.job_insert([NOOP] * min(PRELOAD_CHUNK, n - start), now())


def herder_pg_reset(preload: int) -> None:
    pg_exec(f"TRUNCATE {HERDER_TABLES} RESTART IDENTITY")
    if preload:
        herder_preload(PG_URL, preload)
        pg_exec(f"VACUUM ANALYZE {HERDER_TABLES}")
    pg_exec("CHECKPOINT")


def herder_sqlite_fresh(path: str, preload: int) -> None:
    sqlite_remove(path)
    herder_preload(sqlite_url(path, "normal"), preload)  # also migrates
    # herder itself never runs ANALYZE, so by default neither do we (measure it as shipped)
    sqlite_settle(path, analyze=HERDER_SQLITE_ANALYZE)


# -- the claim loops (run in forked child processes) -------------------------------------------


@dataclass
class LoopResult:
    jobs: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    dry: bool = False
    rounds: int = 0
    claim_s: float = 0.0
    finish_s: float = 0.0
    error: str = ""

    def add_round(self, claim_s: float, finish_s: float, jobs: int) -> None:
        """One claim -> finish round of a loop: its two timings and the jobs it finished."""
        self.claim_s += claim_s
        self.finish_s += finish_s
        self.rounds += 1
        self.jobs += jobs


class ClaimLoop:
    """Set up in the child (connect), then run() one timed loop."""

    def run(self, batch: int, deadline: float, res: LoopResult) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class HerderLoop(ClaimLoop):
    def __init__(self, url: str, worker: str) -> None:
        self.store: Store = open_store(url, migrate=False)
        self.worker = worker

    def run(self, batch: int, deadline: float, res: LoopResult) -> None:
        store, worker = self.store, self.worker
        pid = os.getpid()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            jobs = store.job_claim(HOST, worker, batch, now())
            t1 = time.perf_counter()
            if not jobs:
                res.dry = True
                break
            if WITH_START:
                for job in jobs:
                    store.attempt_start(job.token, pid, None, now())
            t2 = time.perf_counter()
            applied = store.attempt_finish(
                [AttemptResult(job.token, Outcome.OK, 0, OK) for job in jobs], now())
            res.add_round(t1 - t0, time.perf_counter() - t2, len(applied))

    def close(self) -> None:
        self.store.close()


class RawPgLoop(ClaimLoop):
    def __init__(self) -> None:
        self.conn = psycopg.connect(PG_URL, autocommit=True, prepare_threshold=0)

    def run(self, batch: int, deadline: float, res: LoopResult) -> None:
        conn = self.conn
        params = {"b": batch}
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            row = conn.execute(RAW_PG_CLAIM, params, prepare=True).fetchone()
            t1 = time.perf_counter()
            ids = row[0] if row else None
            if not ids:
                res.dry = True
                break
            conn.execute(RAW_PG_FINISH, {"ids": ids}, prepare=True)
            res.add_round(t1 - t0, time.perf_counter() - t1, len(ids))

    def close(self) -> None:
        self.conn.close()


class RawSqliteLoop(ClaimLoop):
    def __init__(self, path: str, sync: str) -> None:
        self.conn = sqlite_connect(path, sync)

    def run(self, batch: int, deadline: float, res: LoopResult) -> None:
        conn = self.conn
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            ids = [r[0] for r in conn.execute(RAW_SQLITE_CLAIM, (time.time(), batch))]
            conn.execute("COMMIT")
            t1 = time.perf_counter()
            if not ids:
                res.dry = True
                break
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(
                "UPDATE raw_jobs SET status = 'done', finished_at = ? "
                f"WHERE id IN ({','.join('?' * len(ids))})", (time.time(), *ids))
            conn.execute("COMMIT")
            res.add_round(t1 - t0, time.perf_counter() - t1, len(ids))

    def close(self) -> None:
        self.conn.close()


@dataclass(frozen=True)
class ClaimConfig:
    """One cell of the claim matrix."""

    group: str  # herder-pg, herder-raw-sqlite, ...
    impl: str  # herder, raw-pg, raw-sqlite
    backend: str  # pg, sqlite
    sync: str  # SQLite synchronous setting ("-" on PostgreSQL)
    batch: int
    clients: int

    @property
    def variant(self) -> str:
        name = f"claim-finish B={self.batch} c={self.clients}"
        if self.backend == "sqlite":
            name += f" sync={self.sync}"
        if self.impl in HERDER_SCHEMA and self.backend == "sqlite" and HERDER_SQLITE_ANALYZE:
            name += " analyzed"
        if WITH_START and self.impl == "herder":
            name += " +start"
        if PAYLOAD_BYTES:
            name += f" payload={PAYLOAD_BYTES}B"
        return name


def make_loop(cfg: ClaimConfig, target: str, worker: str) -> ClaimLoop:
    if cfg.impl == "herder":
        return HerderLoop(target, worker)
    if cfg.impl == "raw-pg":
        return RawPgLoop()
    return RawSqliteLoop(target, cfg.sync)


@dataclass(frozen=True)
class ChildArgs:
    cfg: ClaimConfig
    target: str
    index: int
    ready: MpEvent
    go: MpEvent
    out: Any  # multiprocessing Queue


def claim_child(args: ChildArgs) -> None:
    res = LoopResult()
    try:
        loop = make_loop(args.cfg, args.target, f"w{args.index}")
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        args.ready.set()
        args.out.put(res)
        return
    args.ready.set()
    args.go.wait()
    c0 = time.process_time()
    t0 = time.perf_counter()
    try:
        loop.run(args.cfg.batch, t0 + RAW_SECONDS, res)
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.seconds = time.perf_counter() - t0
    res.cpu_s = time.process_time() - c0
    loop.close()
    args.out.put(res)


def run_claimers(cfg: ClaimConfig, target: str
                 ) -> tuple[list[LoopResult], dict[str, Any], int | None]:
    """Fork the claimers, start them together; (results, cpu stats + WAL bytes, xact delta)."""
    pg = cfg.backend == "pg"
    ctx = mp.get_context("fork")
    go = ctx.Event()
    out = ctx.Queue()
    readies = [ctx.Event() for _ in range(cfg.clients)]
    procs = [ctx.Process(target=claim_child,
                         args=(ChildArgs(cfg, target, i, readies[i], go, out),))
             for i in range(cfg.clients)]
    for p in procs:
        p.start()
    for ev in readies:
        ev.wait(60)
    if pg:
        pg_wait_autovacuum()
    x0 = pg_xact_commit() if pg else None
    lsn = pg_wal_lsn() if pg else ""
    c0 = common.cpu_snapshot()
    go.set()
    results = [out.get(timeout=RAW_SECONDS + 300) for _ in procs]
    cpu: dict[str, Any] = common.cpu_stats(c0, common.cpu_snapshot())
    if pg:
        cpu["wal_bytes"] = pg_wal_bytes_since(lsn)
    for p in procs:
        p.join()
    xacts = pg_xact_commit() - x0 if x0 is not None else None
    return results, cpu, xacts


def summarize_loops(results: list[LoopResult]) -> dict[str, Any]:
    rounds = sum(r.rounds for r in results) or 1
    return {
        "per_process": [r.jobs for r in results],
        "client_cpu_s": round(sum(r.cpu_s for r in results), 4),
        "claim_ms": round(1000 * sum(r.claim_s for r in results) / rounds, 3),
        "finish_ms": round(1000 * sum(r.finish_s for r in results) / rounds, 3),
        "dry": any(r.dry for r in results),
    }


class Preloads:
    """Preload sizes that grow with the rates seen, so a fast config does not run dry."""

    def __init__(self) -> None:
        self.best: dict[tuple[str, int], float] = {}

    def size(self, key: str, impl: str, batch: int) -> int:
        guesses = PRELOAD_GUESS["herder" if impl in HERDER_SCHEMA else "raw"]
        guess = guesses.get(batch, max(guesses.values())) * RAW_SECONDS / 5
        seen = self.best.get((key, batch), 0.0) * 2.5 * RAW_SECONDS
        return int(math.ceil(max(guess, seen) / 1000) * 1000)

    def saw(self, key: str, batch: int, rate: float) -> None:
        self.best[(key, batch)] = max(self.best.get((key, batch), 0.0), rate)


PRELOADS = Preloads()


def claim_run(cfg: ClaimConfig, rep: int) -> None:
    """One timed claim->finish run (retried once with a bigger preload if it ran dry)."""
    key = f"{cfg.group}/{cfg.sync}"
    retried = False
    preload = PRELOADS.size(key, cfg.impl, cfg.batch)
    while True:
        db_path = ""  # the SQLite file, for the checks
        if cfg.impl in HERDER_SCHEMA and cfg.backend == "pg":
            herder_pg_reset(preload)
            target = PG_URL
        elif cfg.impl in HERDER_SCHEMA:
            db_path = sqlite_path("herder-claim.db")
            herder_sqlite_fresh(db_path, preload)
            target = sqlite_url(db_path, cfg.sync)
        elif cfg.impl == "raw-pg":
            raw_pg_preload(preload)
            target = PG_URL
        else:
            target = db_path = sqlite_path("raw-claim.db")
            raw_sqlite_fresh(db_path, preload)
        load_before = round(os.getloadavg()[0], 2)  # other work on the box (noise hint)
        results, cpu, xacts = run_claimers(cfg, target)
        n = sum(r.jobs for r in results)
        secs = max(r.seconds for r in results)
        PRELOADS.saw(key, cfg.batch, n / secs if secs else 0.0)
        info = summarize_loops(results)
        errors = [r.error for r in results if r.error]
        if info["dry"] and not retried and not errors:
            say(f"  {cfg.group} {cfg.variant}: queue of {preload} ran dry; retrying with more")
            retried = True
            preload = max(3 * preload, PRELOADS.size(key, cfg.impl, cfg.batch))
            continue
        break
    check = verify_claim(cfg.impl in HERDER_SCHEMA, cfg.backend, db_path)
    valid = (not info["dry"] and not errors and check["jobs_done_in_db"] == n
             and check["in_flight"] == 0 and check["max_attempt"] <= 1
             and check["multi_attempt_jobs"] == 0 and check["queued_left"] > 0)
    extra: dict[str, Any] = {**cpu, **info, **check, "preload": preload, "valid": valid,
                             "batch": cfg.batch, "clients": cfg.clients,
                             "loadavg_1m_before": load_before}
    if cfg.impl in HERDER_SCHEMA and cfg.backend == "sqlite":
        extra["analyzed"] = HERDER_SQLITE_ANALYZE
    if retried:
        extra["retried"] = True
    if errors:
        extra["errors"] = errors[:3]
        say(f"  errors: {errors[:3]}")
    if xacts is not None and n:
        extra["xacts_per_job"] = round(xacts / n, 3)
    if "wal_bytes" in extra and n:
        extra["wal_bytes_per_job"] = round(extra["wal_bytes"] / n)
    common.record(cfg.group, cfg.variant, rep, n, secs, **extra)


def verify_claim(herder_schema: bool, backend: str, db_path: str) -> dict[str, int]:
    if herder_schema:
        jobs_sql = ("SELECT count(*) FILTER (WHERE status = 'done'), "
                    "count(*) FILTER (WHERE status = 'queued'), "
                    "count(*) FILTER (WHERE status IN ('claimed', 'running')), "
                    "coalesce(max(attempt), 0) FROM herder_jobs")
        multi_sql = ("SELECT count(*) FROM (SELECT job_id FROM herder_attempts "
                     "GROUP BY job_id HAVING count(*) > 1) m")
    else:
        jobs_sql = ("SELECT count(*) FILTER (WHERE status = 'done'), "
                    "count(*) FILTER (WHERE status = 'queued'), "
                    "count(*) FILTER (WHERE status = 'running'), "
                    "coalesce(max(attempts), 0) FROM raw_jobs")
        multi_sql = "SELECT 0"
    if backend == "pg":
        done, queued, flight, max_att = pg_exec(jobs_sql)[0]
        multi = pg_exec(multi_sql)[0][0]
    else:
        done, queued, flight, max_att = sqlite_query(db_path, jobs_sql)
        multi = sqlite_query(db_path, multi_sql)[0]
    return {"jobs_done_in_db": int(done), "queued_left": int(queued), "in_flight": int(flight),
            "max_attempt": int(max_att), "multi_attempt_jobs": int(multi)}


# -- enqueue -----------------------------------------------------------------------------------


def timed_loop(step: Callable[[], int], seconds: float) -> tuple[int, float, float]:
    """Call step() (-> jobs it did) until `seconds` passed: (jobs, wall s, CPU s)."""
    n = 0
    c0 = time.process_time()
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:
        n += step()
    return n, time.perf_counter() - t0, time.process_time() - c0


@contextmanager
def measured(pg: bool) -> Iterator[dict[str, Any]]:
    """Machine CPU and (PG) committed transactions around a block; fills the dict after."""
    extra: dict[str, Any] = {"loadavg_1m_before": round(os.getloadavg()[0], 2)}
    if pg:
        pg_wait_autovacuum()
    x0 = pg_xact_commit() if pg else None
    lsn = pg_wal_lsn() if pg else ""
    c0 = common.cpu_snapshot()
    yield extra
    extra.update(common.cpu_stats(c0, common.cpu_snapshot()))
    if pg:
        extra["wal_bytes"] = pg_wal_bytes_since(lsn)
    if x0 is not None:
        extra["xacts"] = pg_xact_commit() - x0


def enqueue_herder(backend: str, sync: str, batch: int, rep: int) -> None:
    group = f"herder-{backend}"
    variant = ("enqueue single (1 job/call)" if batch == 1
               else f"enqueue batch ({batch} jobs/call)")
    if backend == "pg":
        herder_pg_reset(0)
        url = PG_URL
    else:
        variant += f" sync={sync}"
        path = sqlite_path("herder-enqueue.db")
        herder_sqlite_fresh(path, 0)
        url = sqlite_url(path, sync)
    specs = [NOOP] * batch
    store = open_store(url, migrate=False)
    try:
        def step() -> int:
            return len(store.job_insert(specs, now()))

        with measured(backend == "pg") as extra:
            n, secs, cpu_s = timed_loop(step, ENQ_SECONDS)
            store.close()  # the backend flushes its transaction stats on disconnect
    finally:
        store.close()
    rows = (pg_exec("SELECT count(*) FROM herder_jobs")[0][0] if backend == "pg"
            else sqlite_query(path, "SELECT count(*) FROM herder_jobs")[0])
    xacts = extra.pop("xacts", None)
    if xacts is not None:
        extra["xacts_per_job"] = round(xacts / max(n, 1), 3)
        extra["wal_bytes_per_job"] = round(extra["wal_bytes"] / max(n, 1))
    common.record(group, variant, rep, n, secs, **extra, client_cpu_s=round(cpu_s, 4),
                  rows_in_db=int(rows), valid=int(rows) == n)


def enqueue_raw_pg(mode: str, rep: int) -> None:
    pg_exec("TRUNCATE raw_jobs RESTART IDENTITY", "CHECKPOINT")
    conn = psycopg.connect(PG_URL, autocommit=True, prepare_threshold=0)
    counter = [0]

    def single() -> int:
        counter[0] += 1
        conn.execute(RAW_PG_INSERT, (counter[0] % 10,), prepare=True)
        return 1

    def notify() -> int:
        counter[0] += 1
        with conn.transaction():
            conn.execute(RAW_PG_INSERT, (counter[0] % 10,), prepare=True)
            conn.execute("SELECT pg_notify('herder_bench', 'job')", prepare=True)
        return 1

    rows_param = [(i % 10,) for i in range(ENQ_BATCH)]

    def batch() -> int:
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(RAW_PG_INSERT, rows_param)
        return ENQ_BATCH

    step, variant = {
        "single": (single, "enqueue single (autocommit INSERT)"),
        "notify": (notify, "enqueue single (BEGIN; INSERT; pg_notify; COMMIT)"),
        "batch": (batch, f"enqueue batch ({ENQ_BATCH} rows/tx, executemany)"),
    }[mode]
    try:
        with measured(True) as extra:
            n, secs, cpu_s = timed_loop(step, ENQ_SECONDS)
            conn.close()  # the backend flushes its transaction stats on disconnect
    finally:
        conn.close()
    rows = int(pg_exec("SELECT count(*) FROM raw_jobs")[0][0])
    xacts = extra.pop("xacts")
    common.record("herder-raw-pg", variant, rep, n, secs, **extra,
                  xacts_per_job=round(xacts / max(n, 1), 3),
                  wal_bytes_per_job=round(extra["wal_bytes"] / max(n, 1)),
                  client_cpu_s=round(cpu_s, 4),
                  rows_in_db=rows, valid=rows == n)


def enqueue_raw_sqlite(sync: str, rep: int) -> None:
    path = sqlite_path("raw-enqueue.db")
    raw_sqlite_fresh(path, 0)
    conn = sqlite_connect(path, sync)
    counter = [0]

    def single() -> int:
        counter[0] += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(RAW_SQLITE_INSERT, (counter[0] % 10, RAW_PAYLOAD, time.time()))
        conn.execute("COMMIT")
        return 1

    try:
        with measured(False) as extra:
            n, secs, cpu_s = timed_loop(single, ENQ_SECONDS)
    finally:
        conn.close()
    rows = int(sqlite_query(path, "SELECT count(*) FROM raw_jobs")[0])
    common.record("herder-raw-sqlite", f"enqueue single (1 INSERT/tx) sync={sync}", rep, n,
                  secs, **extra, client_cpu_s=round(cpu_s, 4), rows_in_db=rows,
                  valid=rows == n)


# -- latency with `herder up` ------------------------------------------------------------------


def herder_up_cmd() -> list[str]:
    if os.environ.get("HERDER_UP"):
        return shlex.split(os.environ["HERDER_UP"])
    return [sys.executable, "-c", "from herder.cli import main; main()"]


def herder_up_available() -> str | None:
    """None if `herder up` looks runnable, else why not."""
    try:
        probe = subprocess.run([*herder_up_cmd(), "up", "--help"], check=False,
                               capture_output=True, text=True, timeout=60, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    if probe.returncode != 0:
        tail = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or ["(no output)"]
        return f"`herder up --help` exited {probe.returncode}: {tail[0]}"
    return None


def read_stamps(path: str) -> list[tuple[str, float]]:
    if not os.path.exists(path):
        return []
    out: list[tuple[str, float]] = []
    with open(path) as fh:
        for line in fh:
            parts = line.split()
            if parts:
                try:
                    out.append((parts[0] if len(parts) > 1 else "",
                                float(parts[-1].replace(",", "."))))
                except ValueError:
                    continue
    return out


def wait_for_line(path: str, count: int, timeout: float) -> tuple[str, float] | None:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        stamps = read_stamps(path)
        if len(stamps) >= count:
            return stamps[count - 1]
        time.sleep(0.0005)
    return None


def wait_terminal(store: Store, job_id: int, timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        job = store.job_get(job_id)
        if job is not None and job.status.terminal:
            return True
        time.sleep(0.002)
    return False


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        say(f"  herder up (pid {proc.pid}) did not stop on SIGTERM; killing it")
        proc.kill()
        proc.wait(10)


def latency_run(backend: str, rep: int) -> bool:
    """One latency run; False if `herder up` did not work (the caller stops trying)."""
    group = f"herder-{backend}"
    stamp_file = sqlite_path(f"latency-{backend}.stamps")
    os.makedirs(SQLITE_DIR, exist_ok=True)
    if os.path.exists(stamp_file):
        os.remove(stamp_file)
    if backend == "pg":
        herder_pg_reset(0)
        url = PG_URL
    else:
        path = sqlite_path("herder-latency.db")
        herder_sqlite_fresh(path, 0)
        url = sqlite_url(path, "full")
    script = f'echo "$HERDER_JOB_ID $EPOCHREALTIME" >> {shlex.quote(stamp_file)}'
    spec = JobSpec(command=("/bin/bash", "-c", script), job_type="latency", max_attempts=1)
    log_path = sqlite_path(f"herder-up-{backend}.log")
    # --db is an option of the `herder` group (also read from HERDER_DB)
    cmd = [*herder_up_cmd(), "--db", url, "up", "--concurrency", str(LATENCY_CONCURRENCY)]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=SQLITE_DIR,
                                env={**os.environ, "HERDER_DB": url}, start_new_session=True)
    store = open_store(url, migrate=False)
    try:
        store.job_insert([spec], now())  # warm-up: proves the runner is up and running jobs
        if wait_for_line(stamp_file, 1, 60) is None:
            with open(log_path, errors="replace") as fh:
                tail = fh.read()[-2000:]
            say(f"  SKIP latency ({backend}): `herder up` ran no job within 60 s "
                f"(exit code {proc.poll()}); log tail:\n{tail}")
            return False
        time.sleep(0.5)
        lat_ms: list[float] = []
        missed = 0
        t_run = time.perf_counter()
        for i in range(LATENCY_SAMPLES):
            t_submit = time.time()
            job_id = store.job_insert([spec], now())[0].job_id
            line = wait_for_line(stamp_file, i + 2, 10)
            if line is None or (line[0] and line[0] != str(job_id)):
                missed += 1
                if missed >= 5:
                    say(f"  latency ({backend}): 5 jobs did not start within 10 s; giving up")
                    break
                continue
            lat_ms.append((line[1] - t_submit) * 1000)
            wait_terminal(store, job_id, 10)
            # the runner is idle again; a random pause so submits do not lock onto a poll tick
            time.sleep(0.02 + (i * 0.618 % 1) * 0.08)
        secs = time.perf_counter() - t_run
    finally:
        store.close()
        stop_process(proc)
    if not lat_ms:
        return False
    lat_ms.sort()
    p50 = statistics.median(lat_ms)
    p99 = lat_ms[min(len(lat_ms) - 1, math.ceil(0.99 * len(lat_ms)) - 1)]
    common.record(
        group, f"latency submit->start, idle `herder up` c={LATENCY_CONCURRENCY} "
        "(ops/s = 1000/p50)", rep, len(lat_ms), secs, ops_per_s=1000 / p50,
        p50_ms=round(p50, 2), p99_ms=round(p99, 2), min_ms=round(lat_ms[0], 2),
        max_ms=round(lat_ms[-1], 2), missed=missed, valid=missed == 0,
        **({} if backend == "pg" else {"sync": "full"}))
    return True


# -- main --------------------------------------------------------------------------------------


def main() -> None:
    unknown = [p for p in PARTS if p not in ALL_PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; use {ALL_PARTS}")
    say(f"  herder bench: parts={PARTS} backends={BACKENDS} reps={REPS} "
        f"raw_seconds={RAW_SECONDS} clients={CLAIM_CLIENTS} batches={BATCHES} "
        f"pg={PG_URL} results -> {common.RESULTS}")
    if "pg" in BACKENDS:
        pg_fresh_database()
        open_store(PG_URL).close()  # migrate
        pg_exec(RAW_PG_SCHEMA)
    os.makedirs(SQLITE_DIR, exist_ok=True)

    if "enqueue" in PARTS:
        for backend in BACKENDS:
            syncs = ["-"] if backend == "pg" else SQLITE_SYNCS
            for sync in syncs:
                for batch in (1, ENQ_BATCH):
                    for rep in range(1, REPS + 1):
                        enqueue_herder(backend, sync, batch, rep)
    if "raw" in PARTS:
        if "pg" in BACKENDS:
            for mode in ("single", "notify", "batch"):
                for rep in range(1, REPS + 1):
                    enqueue_raw_pg(mode, rep)
        if "sqlite" in BACKENDS:
            for sync in SQLITE_SYNCS:
                for rep in range(1, REPS + 1):
                    enqueue_raw_sqlite(sync, rep)
    # claim matrix: herder and raw interleaved per (batch, clients) and per repetition
    # (herder, raw, herder, raw, ...), so both see the same box even while its load moves
    for backend in BACKENDS:
        syncs = ["-"] if backend == "pg" else SQLITE_SYNCS
        impls = [(f"herder-{backend}", "herder")] if "claim" in PARTS else []
        if "raw" in PARTS:
            impls.append((f"herder-raw-{backend}", f"raw-{backend}"))
        for batch in BATCHES:
            for clients in CLAIM_CLIENTS:
                for sync in syncs:
                    for rep in range(1, REPS + 1):
                        for group, impl in impls:
                            claim_run(ClaimConfig(group, impl, backend, sync, batch, clients),
                                      rep)
    if "latency" in PARTS:
        why = herder_up_available()
        if why is not None:
            say(f"  SKIP latency: `herder up` is not available yet ({why})")
        else:
            for backend in BACKENDS:
                for rep in range(1, REPS + 1):
                    if not latency_run(backend, rep):
                        break
    say(f"  herder bench done; rows in {common.RESULTS}")


if __name__ == "__main__":
    main()
