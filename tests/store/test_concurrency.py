"""Several OS processes on one store: every job is claimed once, a dedup key makes one job.

Workers are `spawn`ed processes that each open their own store from its URL. They meet at a
barrier before the first write, so the race starts together; nothing sleeps.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import traceback
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from herder.core.model import AttemptResult, Decision, JobSpec, JobStatus, Outcome
from herder.store import open_store
from herder.store.sqlite import parse_sqlite_url

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
JOBS = 2_000
CLAIMERS = 4
SUBMITTERS = 8
SUBMITS_EACH = 20
BARRIER_TIMEOUT = 60.0
RESULT_TIMEOUT = 120.0

pytestmark = pytest.mark.timeout(180)


# -- worker processes (module level, so `spawn` can import them) ---------------------------


def _claim_worker(url: str, name: str, limit: int, barrier: Any, out: Any) -> None:
    """Claim batches of `limit` until none is left, finishing each with OK."""
    try:
        with open_store(url, migrate=False) as store:
            barrier.wait(BARRIER_TIMEOUT)
            claimed: list[tuple[int, int]] = []
            tick = 0
            while True:
                tick += 1
                now = T0 + timedelta(seconds=tick)
                jobs = store.job_claim("h1", name, limit, now)
                if not jobs:
                    break
                claimed.extend((job.id, job.attempt) for job in jobs)
                applied = store.attempt_finish(
                    [AttemptResult(job.token, Outcome.OK, 0, Decision(JobStatus.DONE))
                     for job in jobs],
                    now,
                )
                if len(applied) != len(jobs):  # someone else re-claimed one of ours
                    lost = sorted({str(j.token) for j in jobs} - {str(t) for t, _ in applied})
                    raise AssertionError(f"{name}: finishes fenced out for {lost}")
        out.put(("ok", name, claimed))
    except BaseException:
        barrier.abort()
        out.put(("error", name, traceback.format_exc()))


def _submit_worker(url: str, name: str, key: str, barrier: Any, out: Any) -> None:
    """Submit the same dedup key SUBMITS_EACH times, one transaction each."""
    try:
        with open_store(url, migrate=False) as store:
            barrier.wait(BARRIER_TIMEOUT)
            results = []
            for i in range(SUBMITS_EACH):
                spec = JobSpec(command=("echo", name, str(i)), dedup_key=key)
                [result] = store.job_insert([spec], T0 + timedelta(seconds=i))
                results.append((result.job_id, result.created))
        out.put(("ok", name, results))
    except BaseException:
        barrier.abort()
        out.put(("error", name, traceback.format_exc()))


def _run_workers(target: Any, count: int, args_for: Any) -> dict[str, Any]:
    """Start `count` spawned workers behind one barrier; their results by worker name."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(count)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=target, args=(*args_for(f"w{i}"), barrier, out), daemon=True)
        for i in range(count)
    ]
    for proc in procs:
        proc.start()
    try:
        replies = [out.get(timeout=RESULT_TIMEOUT) for _ in procs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    errors = [f"{name}:\n{detail}" for kind, name, detail in replies if kind == "error"]
    assert not errors, "\n".join(errors)
    assert all(proc.exitcode == 0 for proc in procs), [proc.exitcode for proc in procs]
    return {name: detail for _, name, detail in replies}


def _rows(url: str, query: str) -> list[tuple[Any, ...]]:
    """Read rows straight from the database, bypassing the store under test."""
    if url.startswith("sqlite:"):
        path, _ = parse_sqlite_url(url)
        with sqlite3.connect(path) as conn:
            return [tuple(row) for row in conn.execute(query).fetchall()]
    with psycopg.connect(url) as conn:
        return [tuple(row) for row in conn.execute(query).fetchall()]


# -- tests ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("limit", [1, 10])
def test_concurrent_claimers_claim_every_job_exactly_once(store_url, limit):
    with open_store(store_url) as store:
        specs = [JobSpec(command=("true",), priority=i % 7) for i in range(JOBS)]
        ids = [r.job_id for r in store.job_insert(specs, T0)]
    assert len(set(ids)) == JOBS

    claimed_by = _run_workers(
        _claim_worker, CLAIMERS, lambda name: (store_url, name, limit)
    )

    claimed = [job_id for pairs in claimed_by.values() for job_id, _ in pairs]
    duplicates = [job_id for job_id, n in Counter(claimed).items() if n > 1]
    assert duplicates == [], f"claimed more than once: {duplicates[:20]}"
    assert sorted(claimed) == sorted(ids)
    assert all(attempt == 1 for pairs in claimed_by.values() for _, attempt in pairs)
    if store_url.startswith("postgres"):
        # SKIP LOCKED shares the work out; SQLite's busy handler makes no fairness promise
        # (one process can win every lock), so there only exactly-once is checked.
        workers_with_work = [name for name, pairs in claimed_by.items() if pairs]
        assert len(workers_with_work) >= 2, "the claimers never actually ran side by side"

    statuses = _rows(store_url, "SELECT status, attempt, count(*) FROM herder_jobs "
                                "GROUP BY status, attempt")
    assert statuses == [("done", 1, JOBS)]
    per_job = _rows(store_url, "SELECT job_id, count(*), min(outcome), max(outcome) "
                               "FROM herder_attempts GROUP BY job_id")
    assert len(per_job) == JOBS
    assert {(n, lo, hi) for _, n, lo, hi in per_job} == {(1, "ok", "ok")}
    events = _rows(store_url, "SELECT kind, count(*) FROM herder_events GROUP BY kind "
                              "ORDER BY kind")
    assert events == [("claimed", JOBS), ("finished", JOBS), ("submitted", JOBS)]


@pytest.mark.slow
def test_concurrent_submits_of_one_dedup_key_make_one_job(store_url):
    key = "same-key"
    results = _run_workers(_submit_worker, SUBMITTERS, lambda name: (store_url, name, key))

    returned = [pair for pairs in results.values() for pair in pairs]
    assert len(returned) == SUBMITTERS * SUBMITS_EACH
    returned_ids = {job_id for job_id, _ in returned}
    assert len(returned_ids) == 1, f"callers saw different jobs: {sorted(returned_ids)}"
    assert [created for _, created in returned].count(True) == 1

    [job_id] = returned_ids
    rows = _rows(store_url, "SELECT id, dedup_key, status FROM herder_jobs")
    assert rows == [(job_id, key, "queued")]
    assert _rows(store_url, "SELECT count(*) FROM herder_events") == [(1,)]


def _fresh_opener(path: str, barrier: Any, out: Any) -> None:
    """Open a store on a file nobody has set up yet, write to it and refresh statistics."""
    try:
        barrier.wait(BARRIER_TIMEOUT)
        with open_store(f"sqlite:///{path}") as store:
            store.job_insert([JobSpec(command=("true",))], T0)
            store.statistics_refresh()
        out.put("ok")
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def test_sqlite_processes_opening_a_fresh_file_together_all_get_in(tmp_path):
    """`herder up` and `herder submit` started together in a new directory open the same new
    file at once. Switching it to WAL, migrating it and refreshing its statistics must wait
    for the other processes, not fail with "database is locked" (which took down `herder up`
    in about one round in eight)."""
    context = multiprocessing.get_context("fork")  # 120 processes: spawn would take minutes
    for round_ in range(30):
        path = tmp_path / f"fresh-{round_}.db"
        barrier, out = context.Barrier(4), context.Queue()
        procs = [context.Process(target=_fresh_opener, args=(str(path), barrier, out))
                 for _ in range(4)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=RESULT_TIMEOUT) for _ in procs]
        for proc in procs:
            proc.join(RESULT_TIMEOUT)
        assert results == ["ok"] * 4, f"round {round_}: {results}"
        with open_store(f"sqlite:///{path}", migrate=False) as store:
            assert len(store.job_list()) == 4


def test_sqlite_new_files_get_small_pages_and_old_files_keep_theirs(tmp_path):
    """A new file gets PAGE_SIZE pages (less to fsync per commit); a file made with SQLite's
    default 4 KiB pages, already in WAL mode, keeps them and works as before."""
    import sqlite3

    from herder.store.sqlite import PAGE_SIZE

    def page_size(path):
        conn = sqlite3.connect(path)
        try:
            return conn.execute("PRAGMA page_size").fetchone()[0]
        finally:
            conn.close()

    fresh = tmp_path / "fresh.db"
    with open_store(f"sqlite:///{fresh}") as store:
        store.job_insert([JobSpec(command=("true",))], T0)
    assert PAGE_SIZE != 4096 and page_size(fresh) == PAGE_SIZE

    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("PRAGMA page_size = 4096")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE other (x INTEGER)")
    conn.close()
    with open_store(f"sqlite:///{old}") as store:
        store.job_insert([JobSpec(command=("true",))], T0)
        [job] = store.job_claim("h1", "w1", 1, T0)
        assert job.attempt == 1
    assert page_size(old) == 4096
