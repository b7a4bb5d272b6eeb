"""Migrations: from blank, from each older schema, and a newer schema refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from support.store import (
    at,
    finish,
    migrate_up_to,
    raw_execute,
    spec,
    submit,
)

from herder.core.model import (
    Attempt,
    AttemptToken,
    HostRecord,
    JobStatus,
    Outcome,
)
from herder.store import Store, open_store
from herder.store.base import load_migrations

# -- schema ---------------------------------------------------------------------------------


def test_migrate_from_blank_is_idempotent(blank_store_url):
    with open_store(blank_store_url, migrate=False) as store:
        versions = [version for version, _, _ in load_migrations(store.dialect)]
        assert versions[:2] == [1, 2]
        assert store.schema_version() == 0
        assert store.migrate() == versions
        assert store.schema_version() == versions[-1]
        assert store.migrate() == []
        assert store.schema_version() == versions[-1]
        submit(store)
    with open_store(blank_store_url) as again:  # a second opener migrates nothing
        assert again.schema_version() == versions[-1]
        assert again.migrate() == []
        assert len(again.job_list()) == 1, "re-migrating must keep the data"


def test_migrated_store_reports_the_latest_version(store):
    latest = max(version for version, _, _ in load_migrations(store.dialect))
    assert latest >= 2
    assert store.schema_version() == latest
    assert store.migrate() == []


def test_opening_a_current_sqlite_database_does_not_wait_for_a_writer(sqlite_url):
    # Every command opens (and migrates) the store: with the schema current that is two
    # reads, so `should-dispatch` answers while `herder up` holds the write lock.
    import sqlite3

    from herder.store.sqlite import sqlite_store

    writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        store = sqlite_store(sqlite_url, busy_timeout=0.2)
        try:
            assert store.migrate() == []
            assert store.job_dedup_holder("free") is None
        finally:
            store.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()


_OLD_ATTEMPT_ROW = (
    "INSERT INTO herder_attempts (job_id, attempt, host, worker, pid, log_path, claimed_at, "
    "started_at, heartbeat_at, ended_at, exit_code, outcome) "
    "VALUES (%s, 1, 'h1', 'w1', %s, %s, %s, %s, %s, %s, %s, %s)")
"""An attempt history row as schema v1-v3 stored it (a table then)."""


def _old_submit(store: Store, url: str, t: Callable[[float], Any], count: int) -> list[int]:
    """Submit `count` jobs as herder did up to schema v4 (one job row holding the spec, and
    its 'submitted' event): the store's own insert writes the current schema."""
    row = ("INSERT INTO herder_jobs (job_type, command, payload, weight, available_at, "
           "max_attempts, env, created_at, updated_at) "
           "VALUES ('adhoc', %s, '{}', 'light', %s, 3, '{}', %s, %s)")
    raw_execute(store, url, [(row, (json.dumps(["true", str(n)]), t(0), t(0), t(0)))
                              for n in range(count)])
    raw_execute(store, url, [
        ("INSERT INTO herder_events (job_id, at, kind, to_status, detail) "
         "SELECT id, created_at, 'submitted', 'queued', '{}' FROM herder_jobs", ())])
    return list(range(1, count + 1))  # a blank database numbers its first jobs from 1


def test_migration_3_moves_live_attempts_onto_their_job_rows(blank_store_url, monkeypatch):
    """A v2 database (live attempt rows in herder_attempts) keeps its live attempts."""
    with open_store(blank_store_url, migrate=False) as store:
        t = migrate_up_to(store, monkeypatch, 2)
        running, queued, done = _old_submit(store, blank_store_url, t, 3)
        attempt = _OLD_ATTEMPT_ROW
        raw_execute(store, blank_store_url, [
            ("UPDATE herder_jobs SET status = 'running', attempt = 1, host = 'h1', "
             "claimed_at = %s, started_at = %s WHERE id = %s", (t(1), t(2), running)),
            (attempt, (running, 42, "/logs/1.log", t(1), t(2), t(5), None, None, None)),
            # a stray unended attempt of a job that has moved on: closed as lost
            ("UPDATE herder_jobs SET attempt = 1 WHERE id = %s", (queued,)),
            (attempt, (queued, None, None, t(1), None, t(3), None, None, None)),
            ("UPDATE herder_jobs SET status = 'done', attempt = 1, host = 'h1', "
             "claimed_at = %s, finished_at = %s WHERE id = %s", (t(1), t(4), done)),
            (attempt, (done, 7, None, t(1), t(2), t(3), t(4), 0, "ok")),
        ])
        monkeypatch.undo()
        assert store.migrate() == [v for v, _, _ in load_migrations(store.dialect) if v > 2]

        live = store.attempt_list_live()
        assert [(la.attempt.job_id, la.attempt.worker, la.attempt.pid, la.attempt.log_path,
                 la.attempt.heartbeat_at, la.job_status) for la in live] == [
            (running, "w1", 42, "/logs/1.log", at(5), JobStatus.RUNNING)]
        [stray] = store.attempt_list(queued)
        assert (stray.ended_at, stray.outcome) == (at(3), Outcome.LOST)
        [ended] = store.attempt_list(done)
        assert (ended.pid, ended.ended_at, ended.exit_code) == (7, at(4), 0)
        # the moved attempt still heartbeats and finishes under its fencing token
        token = AttemptToken(running, 1)
        assert store.attempt_heartbeat("h1", [token], at(6)).live == frozenset({token})
        assert finish(store, token, Outcome.OK, at(7), exit_code=0) == [(token, JobStatus.DONE)]
        [history] = store.attempt_list(running)
        assert (history.worker, history.pid, history.heartbeat_at, history.ended_at) == (
            "w1", 42, at(6), at(7))


def test_migration_4_keeps_every_ended_attempt_as_its_finished_event(blank_store_url,
                                                                    monkeypatch):
    """A v3 database (a history row and a 'finished' event per ended attempt) keeps its
    history: each history row lands on its event, and a history row that never had an
    event (v3 closed stray attempts as lost) gets one at its end."""
    with open_store(blank_store_url, migrate=False) as store:
        t = migrate_up_to(store, monkeypatch, 3)
        done, stray = _old_submit(store, blank_store_url, t, 2)
        attempt = _OLD_ATTEMPT_ROW
        raw_execute(store, blank_store_url, [
            ("UPDATE herder_jobs SET status = 'done', attempt = 1, host = 'h1', "
             "claimed_at = %s, finished_at = %s WHERE id = %s", (t(1), t(4), done)),
            (attempt, (done, 7, "/logs/7.log", t(1), t(2), t(3), t(4), 0, "ok")),
            ("INSERT INTO herder_events (job_id, at, kind, from_status, to_status, attempt, "
             "detail) VALUES (%s, %s, 'finished', 'running', 'done', 1, "
             "'{\"outcome\": \"ok\", \"exit_code\": 0}')", (done, t(4))),
            ("UPDATE herder_jobs SET attempt = 1 WHERE id = %s", (stray,)),
            (attempt, (stray, None, None, t(1), None, t(3), t(3), None, "lost")),
        ])
        monkeypatch.undo()
        assert store.migrate() == [v for v, _, _ in load_migrations(store.dialect) if v > 3]

        [ended] = store.attempt_list(done)
        assert ended == Attempt(done, 1, "h1", "w1", 7, "/logs/7.log", at(1), at(2), at(3),
                                at(4), 0, Outcome.OK)
        assert [(e.kind, e.at, e.detail) for e in store.event_list(done)][1:] == [
            ("finished", at(4), {"outcome": "ok", "exit_code": 0})]
        [lost] = store.attempt_list(stray)
        assert (lost.worker, lost.ended_at, lost.exit_code, lost.outcome) == (
            "w1", at(3), None, Outcome.LOST)
        assert [(e.kind, e.attempt, e.at) for e in store.event_list(stray)][1:] == [
            ("finished", 1, at(3))]
        # the next attempt's end joins the same history
        store.job_retry(done, at(5))
        [job] = store.job_claim("h2", "w2", 1, at(6))
        assert finish(store, job.token, Outcome.OK, at(7), exit_code=0) == [
            (job.token, JobStatus.DONE)]
        assert [(a.attempt, a.host, a.ended_at) for a in store.attempt_list(done)] == [
            (1, "h1", at(4)), (2, "h2", at(7))]


def test_sqlite_migration_5_splits_each_job_into_its_state_and_its_spec(tmp_path,
                                                                       monkeypatch):
    """A v4 SQLite database (one wide job row) keeps every job whole when its spec moves to
    herder_job_specs, and job ids go on from the old counter, gaps included."""
    sqlite_url = f"sqlite:///{tmp_path / 'v4.db'}"
    with open_store(sqlite_url, migrate=False) as store:
        t = migrate_up_to(store, monkeypatch, 4)
        running, done, queued = _old_submit(store, sqlite_url, t, 3)
        raw_execute(store, sqlite_url, [
            ("UPDATE herder_jobs SET status = 'running', attempt = 1, host = 'h1', "
             "worker = 'w1', pid = 42, log_path = '/logs/1.log', claimed_at = %s, "
             "started_at = %s, heartbeat_at = %s, ram_gb = 2.5, payload = '{\"issue\": 7}', "
             "env = '{\"A\": \"1\"}', workdir = '/src', timeout_seconds = 60, "
             "dedup_key = 'issue-7' WHERE id = %s", (t(1), t(2), t(3), running)),
            ("UPDATE herder_jobs SET status = 'done', attempt = 1, host = 'h1', exit_code = 0, "
             "claimed_at = %s, finished_at = %s, priority = 5 WHERE id = %s",
             (t(1), t(4), done)),
            # jobs 4-10 existed once: a new job must not take one of their ids
            ("UPDATE sqlite_sequence SET seq = 10 WHERE name = 'herder_jobs'", ()),
        ])
        monkeypatch.undo()
        assert store.migrate()[0] == 5

        job = store.job_get(running)
        assert job is not None
        assert (job.status, job.command, job.payload, job.env, job.workdir,
                job.timeout_seconds, job.dedup_key, job.ram_gb, job.created_at) == (
            JobStatus.RUNNING, ("true", "0"), {"issue": 7}, {"A": "1"}, "/src", 60.0,
            "issue-7", 2.5, at(0))
        [live] = store.attempt_list_live()
        assert (live.attempt.pid, live.attempt.log_path, live.attempt.heartbeat_at,
                live.max_attempts) == (42, "/logs/1.log", at(3), 3)
        old_done = store.job_get(done)
        assert old_done is not None
        assert (old_done.status, old_done.priority, old_done.exit_code, old_done.finished_at,
                old_done.command) == (JobStatus.DONE, 5, 0, at(4), ("true", "1"))
        assert submit(store, spec(), now=at(5)) == [11]
        # the dedup index came back: the running job's key still holds
        [again] = store.job_insert([spec(dedup_key="issue-7")], at(5))
        assert (again.job_id, again.created) == (running, False)
        # the moved jobs go on through claim and finish under their fencing tokens
        claimed, new = store.job_claim("h2", "w2", 5, at(6))
        assert (claimed.id, claimed.command, claimed.max_attempts) == (queued, ("true", "2"), 3)
        assert (new.id, new.command) == (11, ("true",))
        assert finish(store, claimed.token, Outcome.OK, at(7), exit_code=0) == [
            (claimed.token, JobStatus.DONE)]
        token = AttemptToken(running, 1)
        assert finish(store, token, Outcome.OK, at(8), exit_code=0) == [
            (token, JobStatus.DONE)]
        assert [j.id for j in store.job_list()] == [11, queued, done, running]


def _insert_without_silence_timeout(store: Store, monkeypatch) -> None:
    """Submit as herder did before schema v8 (no silence_timeout_seconds column)."""
    queries = store.driver.queries
    for name in ("job_insert", "job_spec_insert"):
        if name in queries:
            old = (queries[name].replace(",\n        silence_timeout_seconds)", ")")
                   .replace(", silence_timeout_seconds)", ")")
                   .replace(", %(silence_timeout_seconds)s)", ")")
                   .replace(", :silence_timeout_seconds)", ")"))
            assert "silence_timeout_seconds" not in old, old
            monkeypatch.setitem(queries, name, old)


def test_migration_7_gives_jobs_a_host_to_avoid_and_keeps_them(blank_store_url, monkeypatch):
    """A v5 database keeps its queued and placed jobs; they start with no host to avoid, and
    an attempt that ends before it started makes its host the one to avoid, while an
    attempt that ran does not."""
    with open_store(blank_store_url, migrate=False) as store:
        migrate_up_to(store, monkeypatch, 5)
        _insert_without_silence_timeout(store, monkeypatch)
        for label in ("h1", "h2"):
            assert store.host_insert(HostRecord(label, ram_total_gb=16, prime_max_workers=4,
                                                night_max_workers=4), at(0))
        placed, started, queued = submit(store, spec(), spec(), spec(), now=at(0))
        assert {t.job_id for t in store.job_assign("h1", [(placed, 0.0), (started, 0.0)],
                                                   4, 12.8, at(1))} == {placed, started}
        assert store.attempt_start(AttemptToken(started, 1), 42, "/logs/1.log", at(2))
        monkeypatch.undo()
        assert store.migrate() == [v for v, _, _ in load_migrations(store.dialect) if v > 5]

        assert [(d.id, d.avoid_host) for d in store.job_list_due(at(3), 10)] == [
            (queued, None)]
        assert finish(store, AttemptToken(placed, 1), Outcome.REFUSED, at(3))[0][1] is (
            JobStatus.QUEUED)
        assert finish(store, AttemptToken(started, 1), Outcome.LOST, at(3))[0][1] is (
            JobStatus.QUEUED)
        due = {d.id: d.avoid_host for d in store.job_list_due(at(100), 10)}
        assert due == {placed: "h1", started: None, queued: None}
        # the next unstarted end on another host replaces it
        assert [t.job_id for t in store.job_assign("h2", [(placed, 0.0)], 4, 12.8,
                                                   at(101))] == [placed]
        finish(store, AttemptToken(placed, 2), Outcome.LAUNCH_FAILED, at(102))
        due = {d.id: d.avoid_host for d in store.job_list_due(at(1000), 10)}
        assert due[placed] == "h2"


def test_a_schema_newer_than_the_code_stops_migrate_and_changes_nothing(blank_store_url):
    from herder.core.errors import StoreUnavailable

    with open_store(blank_store_url) as store:
        latest = store.schema_version()
        t = (lambda s: s) if store.dialect == "sqlite" else at
        raw_execute(store, blank_store_url, [
            ("INSERT INTO herder_schema (version, name, applied_at) VALUES (%s, 'next', %s)",
             (latest + 1, t(0)))])
        with pytest.raises(StoreUnavailable, match=f"schema v{latest + 1}, newer than"):
            store.migrate()
        assert store.schema_version() == latest + 1
    with pytest.raises(StoreUnavailable, match="upgrade herder"):
        open_store(blank_store_url)
