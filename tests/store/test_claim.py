"""Claiming and the live attempt: claim, start, heartbeat, the live list."""

from __future__ import annotations

import pytest
from support.store import (
    T0,
    at,
    claim_one,
    finish,
    get,
    snapshot,
    spec,
    submit,
)

from herder.core.model import (
    AttemptResult,
    AttemptToken,
    Decision,
    JobStatus,
    Outcome,
)
from herder.store import open_store

# -- claim ----------------------------------------------------------------------------------


def test_claim_takes_lowest_priority_first_then_enqueue_order(store):
    priorities = [50, 10, 100, 10, 50, 10]
    ids = submit(store, *(spec(priority=p) for p in priorities))
    expected = [i for _, i in sorted(zip(priorities, ids, strict=True))]
    one_by_one = [claim_one(store).id for _ in ids]
    assert one_by_one == expected
    assert store.job_claim("h1", "w1", 1, T0) == []


def test_claim_batch_is_ordered_and_limited(store):
    priorities = [50, 10, 100, 10, 50, 10]
    ids = submit(store, *(spec(priority=p) for p in priorities))
    expected = [i for _, i in sorted(zip(priorities, ids, strict=True))]
    first = store.job_claim("h1", "w1", 4, T0)
    assert [j.id for j in first] == expected[:4]
    rest = store.job_claim("h1", "w1", 10, T0)
    assert [j.id for j in rest] == expected[4:]


def test_claim_returns_every_field_as_stored(store):
    """The claim reads back only what it did not write and fills in the rest: every field,
    on a second attempt of a job that uses all of them, must equal a fresh read."""
    [job_id] = submit(store, spec(
        command=("agent", "--issue", "{n}"), payload={"n": 7, "deep": {"a": [1, 2]}},
        env={"MODE": "x"}, workdir="/tmp", priority=3, weight="heavy", dedup_key="issue-7",
        affinity="h1", timeout_seconds=90.5, max_attempts=3, backoff_base_seconds=0.0))
    first = claim_one(store, at(1))
    assert store.attempt_start(first.token, 4242, "/tmp/log", at(2))
    assert store.attempt_finish([AttemptResult(
        first.token, Outcome.FAILED, 3,
        Decision(JobStatus.QUEUED, failure_reason="exit_nonzero", spend_failure=True,
                 available_at=at(3)))], at(3))
    [second] = store.job_claim("h1", "w2", 5, at(4))
    assert second.attempt == 2 and second.exit_code == 3 and second.failures == 1
    assert second.failure_reason == "exit_nonzero" and second.started_at is None
    assert second == get(store, job_id)


def test_claimed_jobs_that_share_stored_values_keep_their_own_objects(store):
    """A statement's times are decoded once per distinct value, its JSON once per row: two
    jobs submitted together share their stamps, never their payload or env."""
    submit(store, spec(payload={"n": 1}, env={"A": "b"}), spec(payload={"n": 1}, env={"A": "b"}))
    first, second = store.job_claim("h1", "w1", 2, at(1))
    assert first.created_at == second.created_at == T0 and first.claimed_at == at(1)
    assert first.payload == second.payload and first.payload is not second.payload
    assert first.env == second.env and first.env is not second.env
    first.payload["n"] = 2
    assert second.payload == {"n": 1}


def test_future_available_at_is_not_claimed_until_due(store):
    [later] = submit(store, spec(available_at=at(60), priority=1))
    [now_job] = submit(store, spec(priority=100))
    assert [j.id for j in store.job_claim("h1", "w1", 10, T0)] == [now_job]
    assert store.job_claim("h1", "w1", 10, at(59.5)) == []
    assert get(store, later).status is JobStatus.QUEUED
    assert [j.id for j in store.job_claim("h1", "w1", 10, at(60))] == [later]


def test_affinity_restricts_claim_to_that_host(store):
    [pinned] = submit(store, spec(affinity="h2", priority=1))
    [free] = submit(store, spec(priority=2))
    assert [j.id for j in store.job_claim("h1", "w1", 10, T0)] == [free]
    assert store.job_claim("h1", "w1", 10, T0) == []
    claimed = store.job_claim("h2", "w9", 10, T0)
    assert [j.id for j in claimed] == [pinned]
    assert claimed[0].host == "h2"


def test_claim_creates_attempt_and_event(store):
    [job_id] = submit(store)
    job = claim_one(store, at(1), host="h1", worker="w7")
    assert job.id == job_id
    assert job.status is JobStatus.CLAIMED and job.attempt == 1
    assert job.host == "h1" and job.claimed_at == at(1) and job.updated_at == at(1)
    assert job == get(store, job_id), "the claim returns the row as stored"

    [attempt] = store.attempt_list(job_id)
    assert attempt.token == AttemptToken(job_id, 1)
    assert (attempt.host, attempt.worker) == ("h1", "w7")
    assert attempt.claimed_at == at(1) and attempt.heartbeat_at == at(1)
    assert attempt.pid is None and attempt.started_at is None
    assert attempt.ended_at is None and attempt.outcome is None and attempt.exit_code is None

    submitted, claimed = store.event_list(job_id)
    assert (submitted.kind, submitted.from_status, submitted.to_status) == (
        "submitted", None, JobStatus.QUEUED)
    assert (claimed.kind, claimed.from_status, claimed.to_status, claimed.attempt) == (
        "claimed", JobStatus.QUEUED, JobStatus.CLAIMED, 1)
    assert claimed.at == at(1)
    assert claimed.detail == {"host": "h1", "worker": "w7"}


def test_attempt_start_moves_claimed_to_running_once(store):
    [job_id] = submit(store)
    job = claim_one(store)
    assert store.attempt_start(job.token, 4242, "/logs/1.log", at(2)) is True
    running = get(store, job_id)
    assert running.status is JobStatus.RUNNING and running.started_at == at(2)
    [attempt] = store.attempt_list(job_id)
    assert (attempt.pid, attempt.log_path) == (4242, "/logs/1.log")
    assert attempt.started_at == at(2) and attempt.heartbeat_at == at(2)
    started = store.event_list(job_id)[-1]
    assert (started.kind, started.from_status, started.to_status, started.attempt) == (
        "started", JobStatus.CLAIMED, JobStatus.RUNNING, 1)
    assert started.detail == {"pid": 4242, "log_path": "/logs/1.log"}

    before = snapshot(store, job_id)
    assert store.attempt_start(job.token, 999, None, at(3)) is False
    assert snapshot(store, job_id) == before


def test_heartbeat_reports_live_and_cancel_sets(store):
    a_id, b_id = submit(store, spec(), spec())
    a, b = store.job_claim("h1", "w1", 2, T0)
    assert store.attempt_start(a.token, 1, None, at(1))
    assert store.job_cancel(b_id, at(2)) is JobStatus.CLAIMED
    stranger = AttemptToken(a_id + b_id + 100, 1)
    wrong_attempt = AttemptToken(a_id, 2)

    reply = store.attempt_heartbeat("h1", [a.token, b.token, stranger, wrong_attempt], at(5))
    assert reply.live == {a.token, b.token}
    assert reply.cancel == {b.token}
    assert [x.heartbeat_at for x in store.attempt_list(a_id)] == [at(5)]
    assert [x.heartbeat_at for x in store.attempt_list(b_id)] == [at(5)]

    empty = store.attempt_heartbeat("h1", [], at(6))
    assert empty.live == frozenset() and empty.cancel == frozenset()


def test_heartbeat_renews_only_the_hosts_own_attempts(store):
    """Issue 23: host h2's token sent h1's attempt with its heartbeat and renewed it."""
    a_id, b_id = submit(store, spec(affinity="h1"), spec(affinity="h2"))
    a = claim_one(store, T0, host="h1")
    b = claim_one(store, T0, host="h2")
    before = snapshot(store, a_id)
    reply = store.attempt_heartbeat("h2", [a.token, b.token], at(5))
    assert reply.live == {b.token}
    assert snapshot(store, a_id) == before
    assert [x.heartbeat_at for x in store.attempt_list(a_id)] == [T0]
    assert [x.heartbeat_at for x in store.attempt_list(b_id)] == [at(5)]


def test_attempt_list_live_lists_unended_attempts(store):
    _, _, c_id = submit(store, spec(), spec(affinity="h2"), spec())
    a = claim_one(store, host="h1")
    b = claim_one(store, host="h2")
    assert {x.attempt.token for x in store.attempt_list_live()} == {a.token, b.token}
    [live_b] = store.attempt_list_live("h2")
    assert live_b.attempt.token == b.token and live_b.job_status is JobStatus.CLAIMED
    assert live_b.max_attempts == 3 and (live_b.failures, live_b.lost) == (0, 0)
    finish(store, a.token, Outcome.OK, at(1))
    assert {x.attempt.token for x in store.attempt_list_live()} == {b.token}
    assert c_id not in {x.attempt.job_id for x in store.attempt_list_live()}


def test_a_stored_job_whose_spec_row_is_missing_is_reported_as_damage(tmp_path):
    """SQLite keeps a job's spec in its own table; a claim that finds no spec row says so."""
    import sqlite3
    from contextlib import closing

    from herder.core.errors import StoreUnavailable

    path = tmp_path / "h.db"
    with open_store(f"sqlite:///{path}") as store:
        [job_id] = submit(store)
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM herder_job_specs WHERE id = ?", (job_id,))
        with pytest.raises(StoreUnavailable, match=rf"claimed jobs \[{job_id}\] have no spec row"):
            store.job_claim("h1", "w1", 1, T0)
