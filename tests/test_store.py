"""The Store contract, run against every backend through the parametrized `store` fixture.

Time is an argument of every store method: tests pass an explicit clock and never sleep.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from herder.errors import InputError
from herder.model import (
    Attempt,
    AttemptResult,
    AttemptToken,
    Decision,
    Event,
    HostRecord,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
    Reservation,
    ReservationKind,
    ReservationStatus,
    Scope,
    Transport,
)
from herder.scheduling.policy import RetryState, decide
from herder.store import Store, open_store
from herder.store.base import load_migrations

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """The test clock: `seconds` after T0."""
    return T0 + timedelta(seconds=seconds)


def spec(**fields) -> JobSpec:
    fields.setdefault("command", ("true",))
    return JobSpec(**fields)


def submit(store: Store, *specs: JobSpec, now: datetime = T0) -> list[int]:
    """Insert specs that must all be created; their ids in order."""
    results = store.job_insert(specs or [spec()], now)
    assert all(r.created for r in results), results
    return [r.job_id for r in results]


def claim_one(store: Store, now: datetime = T0, host: str = "h1", worker: str = "w1") -> Job:
    jobs = store.job_claim(host, worker, 1, now)
    assert len(jobs) == 1, jobs
    return jobs[0]


def decision_for(store: Store, job_id: int, outcome: Outcome, now: datetime) -> Decision:
    """What the policy decides for the job's current counters."""
    job = store.job_get(job_id)
    assert job is not None
    state = RetryState(
        job.failures, job.lost, job.max_attempts, job.backoff_base_seconds,
        job.backoff_max_seconds,
    )
    return decide(outcome, state, now)


def finish(
    store: Store,
    token: AttemptToken,
    outcome: Outcome,
    now: datetime,
    exit_code: int | None = None,
) -> list[tuple[AttemptToken, JobStatus]]:
    decision = decision_for(store, token.job_id, outcome, now)
    return store.attempt_finish([AttemptResult(token, outcome, exit_code, decision)], now)


def get(store: Store, job_id: int) -> Job:
    job = store.job_get(job_id)
    assert job is not None
    return job


def snapshot(store: Store, job_id: int) -> tuple[Job, list, list[Event]]:
    return get(store, job_id), store.attempt_list(job_id), store.event_list(job_id)


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


# -- insert ---------------------------------------------------------------------------------


def test_insert_returns_ids_in_order(store):
    results = store.job_insert([spec(command=(f"job{i}",)) for i in range(5)], T0)
    ids = [r.job_id for r in results]
    assert ids == sorted(ids) and len(set(ids)) == 5
    assert all(r.created and r.status is JobStatus.QUEUED for r in results)
    assert [get(store, i).command for i in ids] == [(f"job{i}",) for i in range(5)]
    more = submit(store, spec())
    assert more[0] > ids[-1]


def test_insert_round_trips_every_field(store):
    submitted = spec(
        command=("echo", "hi there"), job_type="build", shell=True,
        payload={"a": [1, 2], "b": {"c": None}}, priority=7, weight="heavy",
        dedup_key="k1", affinity="h1", available_at=at(5), max_attempts=4,
        timeout_seconds=12.5, env={"X": "1"}, workdir="/tmp/w",
        backoff_base_seconds=2.0, backoff_max_seconds=30.0,
    )
    [job_id] = submit(store, submitted)
    job = get(store, job_id)
    for name in JobSpec.__slots__:
        assert getattr(job, name) == getattr(submitted, name), name
    assert job.status is JobStatus.QUEUED
    assert (job.attempt, job.failures, job.lost) == (0, 0, 0)
    assert job.host is None and job.exit_code is None and job.failure_reason is None
    assert job.cancel_requested is False
    assert job.created_at == T0 and job.updated_at == T0
    assert job.claimed_at is None and job.started_at is None and job.finished_at is None
    assert store.job_get(job_id + 1000) is None


def test_insert_without_available_at_is_due_at_submit_time(store):
    [job_id] = submit(store, spec(), now=at(3))
    assert get(store, job_id).available_at == at(3)
    assert store.job_claim("h1", "w1", 1, at(2.999)) == []
    assert claim_one(store, at(3)).id == job_id


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


# -- fencing --------------------------------------------------------------------------------


@pytest.mark.parametrize("first_end", [Outcome.LOST, Outcome.FAILED])
def test_stale_attempt_token_is_fenced_out(store, first_end):
    [job_id] = submit(store, spec(backoff_base_seconds=0))
    first = claim_one(store, T0)
    assert store.attempt_start(first.token, 100, "/a1", at(1))
    assert finish(store, first.token, first_end, at(2), exit_code=1) == [
        (first.token, JobStatus.QUEUED)]

    # between the attempts: the old token already is dead
    assert store.attempt_heartbeat("h1", [first.token], at(2)).live == frozenset()

    second = claim_one(store, at(3), host="h2")
    assert second.id == job_id and second.attempt == 2
    assert store.attempt_start(second.token, 200, "/a2", at(4))
    before = snapshot(store, job_id)

    late = at(10)
    assert store.attempt_heartbeat("h1", [first.token], late).live == frozenset()
    assert store.attempt_start(first.token, 101, "/late", late) is False
    ok = Decision(JobStatus.DONE)
    assert store.attempt_finish([AttemptResult(first.token, Outcome.OK, 0, ok)], late) == []
    assert snapshot(store, job_id) == before

    # the live token still works after the stale writes bounced
    assert store.attempt_heartbeat("h2", [second.token], late).live == {second.token}
    assert store.attempt_finish([AttemptResult(second.token, Outcome.OK, 0, ok)], late) == [
        (second.token, JobStatus.DONE)]
    done = get(store, job_id)
    assert done.status is JobStatus.DONE and done.attempt == 2 and done.exit_code == 0
    a1, a2 = store.attempt_list(job_id)
    assert a1.outcome is first_end and a1.ended_at == at(2) and a1.pid == 100
    assert a2.outcome is Outcome.OK and a2.ended_at == late and a2.pid == 200


def test_finish_is_applied_once(store):
    [job_id] = submit(store)
    job = claim_one(store)
    assert finish(store, job.token, Outcome.OK, at(1), exit_code=0) == [
        (job.token, JobStatus.DONE)]
    before = snapshot(store, job_id)
    assert finish(store, job.token, Outcome.FAILED, at(2), exit_code=3) == []
    assert snapshot(store, job_id) == before


def test_finish_applies_a_batch_and_skips_stale_entries(store):
    a_id, b_id = submit(store, spec(), spec())
    a, b = store.job_claim("h1", "w1", 2, T0)
    stale = AttemptToken(a_id, 7)
    ok = Decision(JobStatus.DONE)
    applied = store.attempt_finish(
        [AttemptResult(a.token, Outcome.OK, 0, ok),
         AttemptResult(stale, Outcome.OK, 0, ok),
         AttemptResult(b.token, Outcome.FAILED, 2,
                       Decision(JobStatus.FAILED, failure_reason="exit_nonzero",
                                spend_failure=True))],
        at(1),
    )
    assert sorted(applied, key=lambda x: x[0].job_id) == [
        (a.token, JobStatus.DONE), (b.token, JobStatus.FAILED)]
    assert get(store, a_id).status is JobStatus.DONE
    failed = get(store, b_id)
    assert failed.status is JobStatus.FAILED and failed.exit_code == 2 and failed.failures == 1


def test_finish_with_a_stale_token_after_an_applied_group_writes_each_event_once(store):
    """SQLite finishes ending groups without RETURNING and redoes the whole call when a
    token turns out stale: the groups before it must not be applied (or logged) twice."""
    ids = submit(store, spec(), spec(), spec())
    a, b, c = store.job_claim("h1", "w1", 3, T0)
    failed = Decision(JobStatus.FAILED, failure_reason="exit_nonzero")
    applied = store.attempt_finish(
        [AttemptResult(a.token, Outcome.OK, 0, Decision(JobStatus.DONE)),
         AttemptResult(b.token, Outcome.OK, 0, Decision(JobStatus.DONE)),
         AttemptResult(c.token, Outcome.FAILED, 4, failed),
         AttemptResult(AttemptToken(a.id, a.attempt + 1), Outcome.FAILED, 4, failed)],
        at(1))
    assert sorted(applied, key=lambda pair: pair[0].job_id) == [
        (a.token, JobStatus.DONE), (b.token, JobStatus.DONE), (c.token, JobStatus.FAILED)]
    assert [get(store, job_id).status for job_id in ids] == [
        JobStatus.DONE, JobStatus.DONE, JobStatus.FAILED]
    for job_id in ids:
        kinds = [event.kind for event in store.event_list(job_id)]
        assert kinds == ["submitted", "claimed", "finished"]
        assert len(store.attempt_list(job_id)) == 1


def test_finish_applies_the_live_result_whatever_the_batch_order(store):
    [job_id] = submit(store)
    job = claim_one(store)
    ok = Decision(JobStatus.DONE)
    applied = store.attempt_finish(
        [AttemptResult(job.token, Outcome.OK, 0, ok),
         AttemptResult(AttemptToken(job_id, job.attempt + 1), Outcome.FAILED, 1, ok),
         AttemptResult(AttemptToken(job_id, job.attempt - 1), Outcome.FAILED, 1, ok)],
        at(1))
    assert applied == [(job.token, JobStatus.DONE)]
    assert get(store, job_id).exit_code == 0


def test_finish_with_a_token_twice_applies_its_first_result(store):
    [job_id] = submit(store)
    job = claim_one(store)
    applied = store.attempt_finish(
        [AttemptResult(job.token, Outcome.FAILED, 5,
                       Decision(JobStatus.FAILED, failure_reason="exit_nonzero")),
         AttemptResult(job.token, Outcome.OK, 0, Decision(JobStatus.DONE))], at(1))
    assert applied == [(job.token, JobStatus.FAILED)]
    assert get(store, job_id).exit_code == 5
    assert [a.outcome for a in store.attempt_list(job_id)] == [Outcome.FAILED]


def test_finish_applies_mixed_results_in_one_call(store):
    ids = submit(store, *(spec(max_attempts=2, backoff_base_seconds=0.0) for _ in range(4)))
    jobs = store.job_claim("h1", "w1", 4, T0)
    retry = Decision(JobStatus.QUEUED, failure_reason="exit_nonzero", spend_failure=True,
                     available_at=at(5))
    outcomes = [(Outcome.OK, 0, Decision(JobStatus.DONE)), (Outcome.FAILED, 1, retry),
                (Outcome.FAILED, 2, retry), (Outcome.OK, 0, Decision(JobStatus.DONE))]
    applied = store.attempt_finish(
        [AttemptResult(job.token, *o) for job, o in zip(jobs, outcomes, strict=True)], at(1))
    assert sorted(applied, key=lambda pair: pair[0].job_id) == [
        (job.token, o[2].status) for job, o in zip(jobs, outcomes, strict=True)]
    after = [get(store, job_id) for job_id in ids]
    assert [j.exit_code for j in after] == [0, 1, 2, 0]
    assert [j.failures for j in after] == [0, 1, 1, 0]
    assert after[1].available_at == at(5) and after[1].finished_at is None
    for job_id, (outcome, code, _) in zip(ids, outcomes, strict=True):
        [attempt] = store.attempt_list(job_id)
        assert (attempt.outcome, attempt.exit_code, attempt.ended_at) == (outcome, code, at(1))
        finished = [e for e in store.event_list(job_id) if e.kind == "finished"]
        assert [e.detail for e in finished] == [{"outcome": outcome.value, "exit_code": code}]


# -- finish with policy decisions -----------------------------------------------------------


def test_failure_requeues_with_backoff_then_fails_at_max_attempts(store):
    [job_id] = submit(store, spec(max_attempts=2, backoff_base_seconds=10))
    first = claim_one(store, T0)
    assert store.attempt_start(first.token, 1, None, at(1))
    assert finish(store, first.token, Outcome.FAILED, at(2), exit_code=3) == [
        (first.token, JobStatus.QUEUED)]
    job = get(store, job_id)
    assert job.status is JobStatus.QUEUED
    assert job.failures == 1 and job.lost == 0 and job.exit_code == 3
    assert job.available_at == at(12), "backoff base 10 s after the first failure"
    assert job.finished_at is None
    [attempt] = store.attempt_list(job_id)
    assert attempt.outcome is Outcome.FAILED and attempt.exit_code == 3
    assert attempt.ended_at == at(2)

    assert store.job_claim("h1", "w1", 1, at(11.9)) == []
    second = claim_one(store, at(12))
    assert second.attempt == 2
    assert finish(store, second.token, Outcome.FAILED, at(13), exit_code=4) == [
        (second.token, JobStatus.FAILED)]
    job = get(store, job_id)
    assert job.status is JobStatus.FAILED and job.failures == 2
    assert job.failure_reason == "implementation_error" and job.exit_code == 4
    assert job.finished_at == at(13)
    assert store.job_claim("h1", "w1", 1, at(10_000)) == []


def test_timeout_fails_with_its_reason(store):
    [job_id] = submit(store, spec(max_attempts=1))
    job = claim_one(store)
    finish(store, job.token, Outcome.TIMEOUT, at(1))
    failed = get(store, job_id)
    assert failed.status is JobStatus.FAILED and failed.failure_reason == "timeout"


def test_lost_requeues_at_once_and_counts_lost_not_failures(store):
    [job_id] = submit(store, spec(max_attempts=1))
    first = claim_one(store, T0)
    assert finish(store, first.token, Outcome.LOST, at(5)) == [(first.token, JobStatus.QUEUED)]
    job = get(store, job_id)
    assert job.status is JobStatus.QUEUED and job.lost == 1 and job.failures == 0
    assert job.available_at == at(5)
    assert claim_one(store, at(5)).attempt == 2


def test_ok_finishes_done(store):
    [job_id] = submit(store)
    job = claim_one(store)
    assert store.attempt_start(job.token, 5, None, at(1))
    assert finish(store, job.token, Outcome.OK, at(2), exit_code=0) == [
        (job.token, JobStatus.DONE)]
    done = get(store, job_id)
    assert done.status is JobStatus.DONE and done.exit_code == 0
    assert done.finished_at == at(2) and done.failure_reason is None
    assert store.job_counts() == {}


# -- cancel and retry -----------------------------------------------------------------------


def test_cancel_queued_job_cancels_it(store):
    [job_id] = submit(store)
    assert store.job_cancel(job_id, at(1)) is JobStatus.CANCELLED
    job = get(store, job_id)
    assert job.status is JobStatus.CANCELLED and job.failure_reason == "cancelled"
    assert job.finished_at == at(1) and job.cancel_requested is False
    assert store.job_claim("h1", "w1", 1, at(2)) == []
    event = store.event_list(job_id)[-1]
    assert (event.kind, event.from_status, event.to_status) == (
        "cancelled", JobStatus.QUEUED, JobStatus.CANCELLED)
    assert store.job_cancel(job_id, at(3)) is None, "not active any more"
    assert store.job_cancel(job_id + 100, at(3)) is None


def test_cancel_running_requests_stop_and_requeue_becomes_cancelled(store):
    [job_id] = submit(store, spec(backoff_base_seconds=0))
    job = claim_one(store)
    assert store.attempt_start(job.token, 1, None, at(1))
    assert store.job_cancel(job_id, at(2)) is JobStatus.RUNNING
    running = get(store, job_id)
    assert running.status is JobStatus.RUNNING and running.cancel_requested is True
    event = store.event_list(job_id)[-1]
    assert (event.kind, event.from_status, event.to_status, event.attempt) == (
        "cancel_requested", JobStatus.RUNNING, JobStatus.RUNNING, 1)
    assert store.attempt_heartbeat("h1", [job.token], at(3)).cancel == {job.token}

    decision = decision_for(store, job_id, Outcome.FAILED, at(4))
    assert decision.status is JobStatus.QUEUED, "precondition: the policy would retry"
    applied = store.attempt_finish([AttemptResult(job.token, Outcome.FAILED, 143, decision)],
                                   at(4))
    assert applied == [(job.token, JobStatus.CANCELLED)]
    cancelled = get(store, job_id)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.failure_reason == "cancelled"
    assert cancelled.cancel_requested is False and cancelled.finished_at == at(4)
    assert store.job_claim("h1", "w1", 1, at(100)) == []
    event = store.event_list(job_id)[-1]
    assert (event.from_status, event.to_status) == (JobStatus.RUNNING, JobStatus.CANCELLED)


def test_cancel_requested_job_that_succeeds_is_done(store):
    [job_id] = submit(store)
    job = claim_one(store)
    assert store.job_cancel(job_id, at(1)) is JobStatus.CLAIMED
    assert finish(store, job.token, Outcome.OK, at(2), exit_code=0) == [
        (job.token, JobStatus.DONE)]
    assert get(store, job_id).cancel_requested is False


def test_retry_failed_job_requeues_with_fresh_budget(store):
    [job_id] = submit(store, spec(max_attempts=1))
    first = claim_one(store)
    finish(store, first.token, Outcome.FAILED, at(1), exit_code=1)
    assert get(store, job_id).status is JobStatus.FAILED

    assert store.job_retry(job_id, at(50)) is True
    job = get(store, job_id)
    assert job.status is JobStatus.QUEUED and job.failures == 0 and job.lost == 0
    assert job.failure_reason is None and job.finished_at is None
    assert job.available_at == at(50)
    event = store.event_list(job_id)[-1]
    assert (event.kind, event.from_status, event.to_status) == (
        "retried", JobStatus.FAILED, JobStatus.QUEUED)

    second = claim_one(store, at(50))
    assert second.attempt == 2, "attempt numbers are never reused"
    assert [a.attempt for a in store.attempt_list(job_id)] == [1, 2]
    assert store.job_retry(job_id, at(51)) is False, "a claimed job is not retried"
    assert store.job_retry(job_id + 100, at(51)) is False


def test_retry_queued_job_is_refused(store):
    [job_id] = submit(store)
    before = snapshot(store, job_id)
    assert store.job_retry(job_id, at(1)) is False
    assert snapshot(store, job_id) == before


# -- dedup ----------------------------------------------------------------------------------


def test_same_dedup_key_twice_gives_one_job(store):
    first = store.job_insert([spec(dedup_key="k")], T0)
    second = store.job_insert([spec(dedup_key="k", command=("other",))], at(1))
    assert first[0].created is True
    assert second[0].created is False and second[0].job_id == first[0].job_id
    assert second[0].status is JobStatus.QUEUED
    assert len(store.job_list()) == 1
    assert [e.kind for e in store.event_list(first[0].job_id)] == ["submitted"]


def test_same_dedup_key_twice_in_one_batch(store):
    a, b, c = store.job_insert([spec(dedup_key="k"), spec(dedup_key="k"), spec()], T0)
    assert a.created and not b.created and b.job_id == a.job_id
    assert c.created and c.job_id != a.job_id
    assert len(store.job_list()) == 2


def test_dedup_holder_reports_the_holder(store):
    assert store.job_dedup_holder("k") is None
    [job_id] = submit(store, spec(dedup_key="k"))
    assert store.job_dedup_holder("k") == (job_id, JobStatus.QUEUED)
    claim_one(store)
    assert store.job_dedup_holder("k") == (job_id, JobStatus.CLAIMED)
    assert store.job_dedup_holder("other") is None


@pytest.mark.parametrize("end", ["failed", "cancelled"])
def test_dedup_key_is_free_after_holder_fails_or_is_cancelled(store, end):
    [old] = submit(store, spec(dedup_key="k", max_attempts=1))
    if end == "failed":
        finish(store, claim_one(store).token, Outcome.FAILED, at(1), exit_code=1)
    else:
        store.job_cancel(old, at(1))
    assert get(store, old).status is JobStatus(end)
    assert store.job_dedup_holder("k") is None
    [new] = submit(store, spec(dedup_key="k"), now=at(2))
    assert new != old
    assert store.job_dedup_holder("k") == (new, JobStatus.QUEUED)


def test_done_holds_dedup_key_unless_forced(store):
    [old] = submit(store, spec(dedup_key="k"))
    finish(store, claim_one(store).token, Outcome.OK, at(1), exit_code=0)
    [again] = store.job_insert([spec(dedup_key="k")], at(2))
    assert (again.job_id, again.created, again.status) == (old, False, JobStatus.DONE)
    assert store.job_dedup_holder("k") == (old, JobStatus.DONE)

    [forced] = store.job_insert([spec(dedup_key="k")], at(3), force=True)
    assert forced.created is True and forced.job_id != old
    assert store.job_dedup_holder("k") == (forced.job_id, JobStatus.QUEUED)
    assert get(store, old).status is JobStatus.DONE
    released = store.event_list(old)[-1]
    assert released.kind == "dedup_released" and released.at == at(3)


def test_force_never_releases_an_active_holder(store):
    [holder] = submit(store, spec(dedup_key="k"))
    [forced] = store.job_insert([spec(dedup_key="k")], at(1), force=True)
    assert (forced.job_id, forced.created) == (holder, False)
    assert len(store.job_list()) == 1
    assert [e.kind for e in store.event_list(holder)] == ["submitted"]


def test_retry_of_failed_job_whose_key_is_held_elsewhere_is_refused(store):
    [old] = submit(store, spec(dedup_key="k", max_attempts=1))
    finish(store, claim_one(store).token, Outcome.FAILED, at(1), exit_code=1)
    [new] = submit(store, spec(dedup_key="k"), now=at(2))
    before = snapshot(store, old)
    with pytest.raises(InputError) as raised:
        store.job_retry(old, at(3))
    assert raised.value.field == "dedup_key"
    assert snapshot(store, old) == before
    assert store.job_dedup_holder("k") == (new, JobStatus.QUEUED)


def test_retry_of_released_done_job_takes_the_key_back_or_is_refused(store):
    """A done job whose key a forced rerun took must not become a second holder."""
    [old] = submit(store, spec(dedup_key="k"))
    finish(store, claim_one(store).token, Outcome.OK, at(1), exit_code=0)
    [forced] = store.job_insert([spec(dedup_key="k")], at(2), force=True)
    assert forced.created
    rerun = forced.job_id
    with pytest.raises(InputError):
        store.job_retry(old, at(3))
    assert get(store, old).status is JobStatus.DONE
    assert store.job_counts() == {JobStatus.QUEUED: 1}

    store.job_cancel(rerun, at(4))
    assert store.job_retry(old, at(5)) is True
    assert store.job_dedup_holder("k") == (old, JobStatus.QUEUED)
    [dup] = store.job_insert([spec(dedup_key="k")], at(6))
    assert (dup.job_id, dup.created) == (old, False)


# -- listing --------------------------------------------------------------------------------


def _mixed_statuses(store: Store) -> dict[JobStatus, list[int]]:
    """Three queued, one claimed, one running, one done, one cancelled job."""
    ids = submit(store, *(spec(priority=i) for i in range(7)))
    claimed, running, done = (claim_one(store) for _ in range(3))
    assert store.attempt_start(running.token, 1, None, at(1))
    finish(store, done.token, Outcome.OK, at(1), exit_code=0)
    store.job_cancel(ids[3], at(1))
    return {
        JobStatus.CLAIMED: [claimed.id],
        JobStatus.RUNNING: [running.id],
        JobStatus.DONE: [done.id],
        JobStatus.CANCELLED: [ids[3]],
        JobStatus.QUEUED: ids[4:],
    }


def test_job_counts_counts_active_jobs_only(store):
    assert store.job_counts() == {}
    _mixed_statuses(store)
    assert store.job_counts() == {
        JobStatus.QUEUED: 3, JobStatus.CLAIMED: 1, JobStatus.RUNNING: 1}


def test_job_list_filters_by_status_and_limits(store):
    by_status = _mixed_statuses(store)
    everything = store.job_list()
    assert [j.id for j in everything] == sorted(
        (i for ids in by_status.values() for i in ids), reverse=True)
    for status, ids in by_status.items():
        listed = store.job_list([status])
        assert [j.id for j in listed] == sorted(ids, reverse=True), status
        assert all(j.status is status for j in listed)
    active = store.job_list([JobStatus.QUEUED, JobStatus.RUNNING])
    assert {j.id for j in active} == set(by_status[JobStatus.QUEUED] + by_status[JobStatus.RUNNING])
    assert [j.id for j in store.job_list(limit=2)] == [j.id for j in everything[:2]]
    assert [j.id for j in store.job_list([JobStatus.QUEUED], limit=1)] == [
        max(by_status[JobStatus.QUEUED])]
    assert store.job_list([JobStatus.FAILED]) == []
    assert store.job_list([]) == []


def test_job_list_page_filters_and_pages_by_id_newest_first(store):
    by_status = _mixed_statuses(store)
    for status, ids in by_status.items():
        assert [job.id for job in store.job_list_page(status=status)] == sorted(ids, reverse=True)
    keyed = submit(store, spec(job_type="review", dedup_key="repo#7"))
    everything = [job.id for job in store.job_list(None, 100)]
    pages: list[int] = []
    before = None
    while True:  # pages of 3 walk every job once, newest first
        page = store.job_list_page(before=before, limit=3)
        pages += [job.id for job in page]
        if len(page) < 3:
            break
        before = page[-1].id
    assert pages == everything
    queued = by_status[JobStatus.QUEUED]
    assert [job.id for job in store.job_list_page(status=JobStatus.QUEUED,
                                                  before=max(queued))] == sorted(queued)[:-1][::-1]
    assert [job.id for job in store.job_list_page(job_type="review")] == keyed
    assert [job.id for job in store.job_list_page(dedup_key="repo#7")] == keyed
    assert [job.id for job in store.job_list_page(host="h1")] == sorted(
        by_status[JobStatus.CLAIMED] + by_status[JobStatus.RUNNING] + by_status[JobStatus.DONE],
        reverse=True)
    assert store.job_list_page(host="nowhere") == []
    assert store.job_list_page(status=JobStatus.FAILED, job_type="review") == []


def test_the_latest_event_id_moves_with_every_change(store):
    assert store.event_latest_id() == 0
    [job_id] = submit(store)
    first = store.event_latest_id()
    assert first > 0
    store.job_cancel(job_id, at(1))
    assert store.event_latest_id() > first


# -- events ---------------------------------------------------------------------------------


def test_events_replay_to_the_current_status(store):
    [job_id] = submit(store, spec(max_attempts=3, backoff_base_seconds=0, dedup_key="k"))
    clock = iter(range(1, 100))

    def tick() -> datetime:
        return at(next(clock))

    job = claim_one(store, tick())
    assert store.attempt_start(job.token, 1, None, tick())
    finish(store, job.token, Outcome.FAILED, tick(), exit_code=1)          # -> queued
    job = claim_one(store, tick())
    finish(store, job.token, Outcome.LOST, tick())                         # -> queued
    job = claim_one(store, tick())
    assert store.attempt_start(job.token, 2, None, tick())
    store.job_cancel(job_id, tick())                                       # cancel requested
    finish(store, job.token, Outcome.FAILED, tick(), exit_code=143)        # -> cancelled
    assert store.job_retry(job_id, tick())                                 # -> queued
    job = claim_one(store, tick())
    assert store.attempt_start(job.token, 3, None, tick())
    finish(store, job.token, Outcome.OK, tick(), exit_code=0)              # -> done
    store.job_insert([spec(dedup_key="k")], tick(), force=True)            # releases the key

    events = store.event_list(job_id)
    assert [e.kind for e in events] == [
        "submitted", "claimed", "started", "finished", "claimed", "finished", "claimed",
        "started", "cancel_requested", "finished", "retried", "claimed", "started",
        "finished", "dedup_released",
    ]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert all(e.job_id == job_id for e in events)

    status: JobStatus | None = None
    for event in events:
        if event.kind == "dedup_released":
            assert event.from_status is None and event.to_status is None
            continue
        assert event.to_status is not None, event
        assert event.from_status == status, event
        status = event.to_status
    assert status is get(store, job_id).status is JobStatus.DONE

    claims = [e.attempt for e in events if e.kind == "claimed"]
    assert claims == [1, 2, 3, 4]
    finished = [e for e in events if e.kind == "finished"]
    assert [e.detail["outcome"] for e in finished] == ["failed", "lost", "failed", "ok"]
    assert [e.detail["exit_code"] for e in finished] == [1, None, 143, 0]


def write_every_kind_of_event(store: Store) -> list[int]:
    """Submit, force a rerun, claim as a batch, start, finish with mixed results, requeue,
    cancel and retry: every event the set-based and the single writes make."""
    done_key, failed, lost = submit(store, spec(dedup_key="k"), spec(max_attempts=1),
                                    spec(max_attempts=3, backoff_base_seconds=0))
    first = {job.id: job for job in store.job_claim("h1", "w1", 3, at(1))}
    assert store.attempt_start(first[failed].token, 41, "/logs/41", at(2))
    store.attempt_finish([
        AttemptResult(first[done_key].token, Outcome.OK, 0,
                      decision_for(store, done_key, Outcome.OK, at(3))),
        AttemptResult(first[failed].token, Outcome.FAILED, 3,
                      decision_for(store, failed, Outcome.FAILED, at(3)),
                      report=json.dumps({"source": "exit code", "turns": 7})),
        AttemptResult(first[lost].token, Outcome.LOST, None,
                      decision_for(store, lost, Outcome.LOST, at(3)))], at(3))
    [again] = store.job_claim("h2", "w2", 3, at(4))
    assert again.id == lost
    store.job_cancel(lost, at(5))
    finish(store, again.token, Outcome.FAILED, at(6), exit_code=143)
    assert store.job_retry(failed, at(7)) and store.job_retry(lost, at(7))
    [rerun] = store.job_insert([spec(dedup_key="k")], at(8), force=True)
    assert rerun.created
    return [done_key, failed, lost, rerun.job_id]


@pytest.mark.postgres
def test_both_backends_write_the_same_event_rows(sqlite_url, postgres_url):
    """Events are written by the same SQL (sql/events.sql) on both dialects: the same
    writes leave the same event rows and the same attempt history."""

    def history(url: str) -> list[tuple[Any, ...]]:
        with open_store(url) as store:
            return [(job_id,
                     [(e.at, e.kind, e.from_status, e.to_status, e.attempt, e.detail)
                      for e in store.event_list(job_id)],
                     store.attempt_list(job_id))
                    for job_id in write_every_kind_of_event(store)]

    on_sqlite, on_postgres = history(sqlite_url), history(postgres_url)
    assert on_sqlite == on_postgres
    kinds = {event[1] for _, events, _ in on_sqlite for event in events}
    assert kinds == {"submitted", "dedup_released", "claimed", "started", "finished",
                     "cancel_requested", "retried"}
    [(_, events, attempts)] = [row for row in on_sqlite if row[0] == 2]
    assert events[-2][1:] == ("finished", JobStatus.RUNNING, JobStatus.FAILED, 1, {
        "source": "exit code", "turns": 7, "outcome": "failed", "exit_code": 3})
    assert (attempts[0].pid, attempts[0].log_path, attempts[0].exit_code) == (41, "/logs/41", 3)


# -- waking ---------------------------------------------------------------------------------


def test_waker_wakes_on_submit(store):
    waker = store.listen()
    try:
        assert waker.wait(0.0) is False
        with open_store(store.url) as other:
            submit(other)
        assert waker.wait(30.0) is True
    finally:
        waker.close()


def test_statistics_refresh_runs_when_many_rows_changed(store):
    now = datetime(2026, 6, 1, tzinfo=UTC)
    store.job_insert([JobSpec(command=("true",)) for _ in range(1500)], now)
    if store.dialect == "sqlite":
        assert store.statistics_refresh() is True  # PRAGMA optimize decides by itself
        return
    # PostgreSQL's activity counters reach pg_stat a moment after the writes.
    deadline = time.monotonic() + 15
    while not store.statistics_refresh():
        assert time.monotonic() < deadline, "1,500 inserts never made the statistics stale"
        time.sleep(0.1)
    assert store.statistics_refresh() is False, "right after ANALYZE nothing is stale"


def _raw_execute(store: Store, url: str, statements: list[tuple[str, tuple]]) -> None:
    """Write rows the way an older herder did, below the store's API."""
    if store.dialect == "sqlite":
        import sqlite3

        from herder.store.sqlite import parse_sqlite_url
        conn = sqlite3.connect(parse_sqlite_url(url)[0])
        with conn:
            for text, params in statements:
                conn.execute(text.replace("%s", "?"), params)
        conn.close()
        return
    import psycopg
    with psycopg.connect(url, autocommit=True) as pg:
        for text, params in statements:
            pg.execute(text, params)


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
    _raw_execute(store, url, [(row, (json.dumps(["true", str(n)]), t(0), t(0), t(0)))
                              for n in range(count)])
    _raw_execute(store, url, [
        ("INSERT INTO herder_events (job_id, at, kind, to_status, detail) "
         "SELECT id, created_at, 'submitted', 'queued', '{}' FROM herder_jobs", ())])
    return list(range(1, count + 1))  # a blank database numbers its first jobs from 1


def _migrate_up_to(store: Store, monkeypatch, version: int) -> Callable[[float], Any]:
    """Migrate a blank store to `version` only; returns how raw SQL writes `at(seconds)`.
    `monkeypatch.undo()` lets the next `migrate()` apply the rest."""
    from herder.store import base

    everything = load_migrations(store.dialect)
    monkeypatch.setattr(base, "load_migrations",
                        lambda dialect: [m for m in everything if m[0] <= version])
    assert store.migrate() == list(range(1, version + 1))
    return (lambda s: at(s).timestamp()) if store.dialect == "sqlite" else at


def test_migration_3_moves_live_attempts_onto_their_job_rows(blank_store_url, monkeypatch):
    """A v2 database (live attempt rows in herder_attempts) keeps its live attempts."""
    with open_store(blank_store_url, migrate=False) as store:
        t = _migrate_up_to(store, monkeypatch, 2)
        running, queued, done = _old_submit(store, blank_store_url, t, 3)
        attempt = _OLD_ATTEMPT_ROW
        _raw_execute(store, blank_store_url, [
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
        t = _migrate_up_to(store, monkeypatch, 3)
        done, stray = _old_submit(store, blank_store_url, t, 2)
        attempt = _OLD_ATTEMPT_ROW
        _raw_execute(store, blank_store_url, [
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
        t = _migrate_up_to(store, monkeypatch, 4)
        running, done, queued = _old_submit(store, sqlite_url, t, 3)
        _raw_execute(store, sqlite_url, [
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
        _migrate_up_to(store, monkeypatch, 5)
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
    from herder.errors import StoreUnavailable

    with open_store(blank_store_url) as store:
        latest = store.schema_version()
        t = (lambda s: s) if store.dialect == "sqlite" else at
        _raw_execute(store, blank_store_url, [
            ("INSERT INTO herder_schema (version, name, applied_at) VALUES (%s, 'next', %s)",
             (latest + 1, t(0)))])
        with pytest.raises(StoreUnavailable, match=f"schema v{latest + 1}, newer than"):
            store.migrate()
        assert store.schema_version() == latest + 1
    with pytest.raises(StoreUnavailable, match="upgrade herder"):
        open_store(blank_store_url)


@pytest.mark.postgres
def test_postgres_finish_of_several_groups_is_all_or_nothing(postgres_url, monkeypatch):
    """Several groups are one transaction on PostgreSQL too (SQLite's BEGIN IMMEDIATE): a
    failure in the second group leaves the first group's jobs running, not half done."""
    from herder.store import postgres

    with open_store(postgres_url) as store:
        submit(store, spec(), spec())
        first, second = store.job_claim("h1", "w1", 2, T0)
        real = postgres._adapt
        calls: list[int] = []

        def fail_second(params):
            if params and "next_status" in params:  # a finish group's parameters
                calls.append(1)
                if len(calls) == 2:
                    raise RuntimeError("crash between groups")
            return real(params)

        monkeypatch.setattr(postgres, "_adapt", fail_second)
        with pytest.raises(RuntimeError, match="between groups"):
            store.attempt_finish(
                [AttemptResult(first.token, Outcome.OK, 0, Decision(JobStatus.DONE)),
                 AttemptResult(second.token, Outcome.FAILED, 1,
                               Decision(JobStatus.FAILED, failure_reason="exit_nonzero"))],
                at(1))
        assert len(calls) == 2
        assert [get(store, job.id).status for job in (first, second)] == [JobStatus.CLAIMED] * 2
        assert store.attempt_list(first.id)[0].ended_at is None
        monkeypatch.undo()
        assert len(store.attempt_finish(
            [AttemptResult(first.token, Outcome.OK, 0, Decision(JobStatus.DONE))], at(2))) == 1


def test_host_agent_gone_marks_only_the_dead_workers_agent_stopped(store):
    """The guardian's report stops the host only while its dead worker is the last one
    heard from: a new agent that heartbeated meanwhile is left alone."""
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    store.host_heartbeat("h1", at(1), {"worker": "h1/10/1", "gate": {"weights": None}})
    assert not store.host_agent_gone("h1", "h1/99/1")
    assert not store.host_agent_gone("nowhere", "h1/10/1")
    assert store.host_agent_gone("h1", "h1/10/1")
    host = store.host_get("h1")
    assert host is not None and host.last_heartbeat == at(1)
    assert dict(host.agent_info) == {"worker": "h1/10/1", "gate": {"weights": None},
                                     "stopped": True, "gone": "h1/10/1"}
    store.host_heartbeat("h1", at(2), {"worker": "h1/11/1"})
    assert not store.host_agent_gone("h1", "h1/10/1")
    host = store.host_get("h1")
    assert host is not None and dict(host.agent_info) == {"worker": "h1/11/1"}
    # a clean stop stays a clean stop
    store.host_heartbeat("h1", at(3), {"worker": "h1/11/1", "stopped": True})
    assert not store.host_agent_gone("h1", "h1/11/1")
    store.host_heartbeat("h1", at(4), {"worker": "h1/12/1", "stopped": False})
    assert store.host_agent_gone("h1", "h1/12/1")


# -- fleet: hosts ---------------------------------------------------------------------------


FULL_HOST = HostRecord(
    "h2", ram_total_gb=64.0, ram_reserved_gb=4.0, cpus=16, enabled=False,
    transport=Transport.SSH, ssh_target="ops@h2", prime_max_workers=3, prime_max_weight="medium",
    night_max_workers=6, night_max_weight="heavy", allowed_job_types=frozenset({"ci", "agent"}),
    allowed_weights=frozenset({"light"}), priority_floor=50, labels=frozenset({"gpu", "ssd"}))


def test_host_insert_round_trips_every_field_and_refuses_a_second_insert(store):
    assert store.host_insert(FULL_HOST, at(0))
    assert not store.host_insert(HostRecord("h2", ram_total_gb=1.0), at(1))
    assert store.host_get("h2") == FULL_HOST
    assert store.host_get("nowhere") is None


def test_host_update_replaces_the_configuration_of_a_known_host_only(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    changed = HostRecord("h1", ram_total_gb=32, cpus=8, labels=frozenset({"big"}),
                         allowed_job_types=frozenset())
    assert store.host_update(changed, at(1))
    assert store.host_get("h1") == changed
    assert not store.host_update(HostRecord("nowhere", ram_total_gb=1), at(1))


def test_host_list_is_ordered_by_label_and_shows_a_live_token(store):
    for label in ("b", "a", "c"):
        store.host_insert(HostRecord(label, ram_total_gb=8), at(0))
    token_id = store.token_insert("agent-a", Scope.AGENT, "hash-a", at(0), host="a")
    assert [(h.label, h.has_token) for h in store.host_list()] == [
        ("a", True), ("b", False), ("c", False)]
    assert store.token_revoke(token_id, at(1))
    assert not any(h.has_token for h in store.host_list())


def test_host_heartbeat_stores_the_agents_report(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    assert store.host_heartbeat("h1", at(5), {"worker": "h1/10/1", "ram_free_gb": 7.5})
    host = store.host_get("h1")
    assert host is not None and host.last_heartbeat == at(5)
    assert dict(host.agent_info) == {"worker": "h1/10/1", "ram_free_gb": 7.5}
    assert not store.host_heartbeat("nowhere", at(5), {})


def test_host_remove_refuses_while_the_host_has_live_jobs(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    [job_id] = submit(store)
    [token] = store.job_assign("h1", [(job_id, 2.0)], 2, 16.0, at(1))
    assert not store.host_remove("h1")
    store.attempt_finish([AttemptResult(token, Outcome.OK, 0, Decision(JobStatus.DONE))], at(2))
    assert store.host_remove("h1")
    assert store.host_get("h1") is None
    assert not store.host_remove("h1")


def test_job_assign_books_within_workers_and_ram_and_says_where(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    ids = submit(store, spec(), spec(), spec(), spec())
    # 3 + 3 fit 6.5; the 4 GB job does not, the next 0.5 GB one does; then no worker is left.
    placed = store.job_assign("h1", [(ids[0], 3.0), (ids[1], 3.0), (ids[2], 4.0),
                                     (ids[3], 0.5)], 3, 6.5, at(1))
    assert placed == [AttemptToken(ids[0], 1), AttemptToken(ids[1], 1), AttemptToken(ids[3], 1)]
    assert store.job_assign("h1", [(ids[2], 0.0)], 3, 100.0, at(1)) == []
    assert store.job_assign("nowhere", [(ids[2], 0.0)], 3, 100.0, at(1)) == []
    assert store.job_assign("h1", [(ids[0], 0.0)], 9, 100.0, at(1)) == []  # not queued
    usage = store.host_usage(at(1))["h1"]
    assert (usage.workers, usage.jobs_gb, usage.reserved_gb) == (3, 6.5, 0.0)
    job = get(store, ids[0])
    assert (job.status, job.host, job.ram_gb, job.attempt) == (JobStatus.CLAIMED, "h1", 3.0, 1)
    placed_event = store.event_list(ids[0])[-1]
    assert (placed_event.kind, placed_event.from_status, placed_event.to_status,
            placed_event.attempt) == ("placed", JobStatus.QUEUED, JobStatus.CLAIMED, 1)
    assert dict(placed_event.detail) == {"host": "h1", "ram_gb": 3.0}


def test_an_assigned_attempt_goes_to_one_runner(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    ids = submit(store, spec(priority=5), spec(priority=1))
    tokens = store.job_assign("h1", [(ids[0], 1.0), (ids[1], 1.0)], 2, 16.0, at(1))
    assert [job.id for job in store.attempt_list_assigned("h1", 10)] == [ids[1], ids[0]]
    assert store.attempt_set_worker(tokens[0], "w1", at(2))
    assert store.attempt_set_worker(tokens[0], "w1", at(3))  # the same runner again
    assert not store.attempt_set_worker(tokens[0], "w2", at(3))
    assert not store.attempt_set_worker(AttemptToken(ids[1], 9), "w1", at(3))
    assert [job.id for job in store.attempt_list_assigned("h1", 10)] == [ids[1]]
    assert store.attempt_list_assigned("other", 10) == []


def test_job_list_due_lists_queued_jobs_in_claim_order(store):
    ids = submit(store, spec(priority=5, job_type="ci", weight="heavy", affinity="h1"),
                 spec(priority=1), spec(available_at=at(60)))
    due = store.job_list_due(at(1), 10)
    assert [job.id for job in due] == [ids[1], ids[0]]
    assert (due[1].priority, due[1].job_type, due[1].weight, due[1].affinity,
            due[1].created_at, due[1].available_at) == (5, "ci", "heavy", "h1", T0, T0)
    assert [job.id for job in store.job_list_due(at(60), 1)] == [ids[1]]


# -- fleet: reservations --------------------------------------------------------------------


def reserve(store: Store, kind: ReservationKind = ReservationKind.SUBAGENT, owner: str = "o1",
            count: int = 1, ram_gb: float = 2.0, bookable_gb: float | None = None,
            host: str = "h1", expires: float = 600, now: float = 1) -> list[Reservation]:
    return store.reservation_create(kind, owner, host, "light", ram_gb, count, at(expires),
                                    bookable_gb, at(now))


def test_reservation_create_books_only_what_fits(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    assert reserve(store, host="nowhere") == []
    made = reserve(store, count=5, ram_gb=3.0, bookable_gb=10.0)
    assert len(made) == 3  # 3 x 3 GB fit 10 GB, a fourth does not
    first = made[0]
    assert (first.kind, first.owner, first.host, first.weight, first.ram_gb, first.status,
            first.created_at, first.expires_at, first.ended_at) == (
        ReservationKind.SUBAGENT, "o1", "h1", "light", 3.0, ReservationStatus.ACTIVE, at(1),
        at(600), None)
    assert reserve(store, count=2, ram_gb=3.0, bookable_gb=10.0) == []
    assert len(reserve(store, count=2, ram_gb=3.0)) == 2  # unbounded
    assert store.host_usage(at(2))["h1"].reserved_gb == 15.0


def test_a_ci_reservation_is_one_per_owner_until_released(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [slot] = reserve(store, ReservationKind.CI, owner="pr-1")
    assert reserve(store, ReservationKind.CI, owner="pr-1", now=2) == [slot]
    released = store.reservation_release_ci("pr-1", at(3))
    assert released is not None and released.id == slot.id
    assert (released.status, released.ended_at) == (ReservationStatus.RELEASED, at(3))
    assert store.reservation_release_ci("pr-1", at(4)) is None
    [again] = reserve(store, ReservationKind.CI, owner="pr-1", now=5)
    assert again.id != slot.id


def test_reservation_end_ends_an_active_reservation_once(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [booked] = reserve(store)
    ended = store.reservation_end(booked.id, ReservationStatus.DONE, at(5))
    assert ended is not None
    assert (ended.id, ended.status, ended.ended_at) == (booked.id, ReservationStatus.DONE, at(5))
    assert store.reservation_end(booked.id, ReservationStatus.FAILED, at(6)) is None
    assert store.reservation_get(booked.id) == ended
    assert store.reservation_get(booked.id + 1000) is None


def test_reservation_list_shows_active_reservations_by_host(store):
    for label in ("h1", "h2"):
        store.host_insert(HostRecord(label, ram_total_gb=16), at(0))
    [one] = reserve(store, host="h1")
    [two] = reserve(store, host="h2")
    [three] = reserve(store, host="h1")
    store.reservation_end(three.id, ReservationStatus.CANCELLED, at(2))
    assert [r.id for r in store.reservation_list()] == [one.id, two.id]
    assert [r.id for r in store.reservation_list("h2")] == [two.id]


def test_reservation_expire_ends_what_is_past_its_time(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [short] = reserve(store, expires=10)
    [long] = reserve(store, expires=100)
    assert store.host_usage(at(10))["h1"].reserved_gb == 2.0  # no longer counted once due
    assert store.reservation_expire(at(10)) == 1
    assert store.reservation_expire(at(10)) == 0
    expired = store.reservation_get(short.id)
    assert expired is not None
    assert (expired.status, expired.ended_at) == (ReservationStatus.EXPIRED, at(10))
    assert [r.id for r in store.reservation_list()] == [long.id]


# -- alerts ---------------------------------------------------------------------------------


def test_an_open_alert_dedups_by_key_until_cleared(store):
    assert store.alert_open("disk", "disk full on h1", at(0))
    assert not store.alert_open("disk", "disk full again", at(1))
    assert store.alert_open("lost", "h2 lost", at(2))
    assert [(a.key, a.message, a.opened_at, a.cleared_at) for a in store.alert_list()] == [
        ("lost", "h2 lost", at(2), None), ("disk", "disk full on h1", at(0), None)]
    assert store.alert_clear("disk", at(3))
    assert not store.alert_clear("disk", at(4))
    assert not store.alert_clear("never", at(4))
    assert [a.key for a in store.alert_list()] == ["lost"]
    assert store.alert_open("disk", "disk full once more", at(5))


def test_alert_list_shows_cleared_alerts_on_request_newest_first(store):
    for second, key in enumerate(("a", "b", "c")):
        store.alert_open(key, key, at(second))
    store.alert_clear("b", at(9))
    everything = store.alert_list(open_only=False)
    assert [(a.key, a.cleared_at) for a in everything] == [("c", None), ("b", at(9)),
                                                            ("a", None)]
    assert [a.key for a in store.alert_list(open_only=False, limit=2)] == ["c", "b"]
    assert [a.key for a in store.alert_list(limit=1)] == ["c"]


# -- the driver protocol --------------------------------------------------------------------


def test_shared_queries_take_each_dialects_placeholders():
    from herder.store.driver import load_queries, postgres_placeholders

    assert postgres_placeholders("SELECT :a::text, x FROM t WHERE y = :b_c AND z LIKE 'q%'") == (
        "SELECT %(a)s::text, x FROM t WHERE y = %(b_c)s AND z LIKE 'q%%'")
    sqlite, postgres = load_queries("sqlite"), load_queries("postgres")
    shared = {"host_insert", "reservation_insert", "alert_open", "job_retry", "event_insert"}
    assert shared <= sqlite.keys() & postgres.keys()
    assert ":label" in sqlite["host_get"] and "%(label)s" in postgres["host_get"]
    # What must differ keeps one version per dialect, under one name.
    for name in ("job_claim", "attempt_finish", "host_lock", "reservation_end"):
        assert sqlite[name] != postgres[name]
    # The event rows of the set-based writes are one INSERT for both (sql/events.sql):
    # inside PostgreSQL's statement, in SQLite's `_events` statement after it.
    for write, kind in (("job_insert", "submitted"), ("job_dedup_release", "dedup_released"),
                        ("job_claim", "claimed"), ("attempt_finish", "finished")):
        insert = f"SELECT id, :now, '{kind}'"
        assert insert in sqlite[f"{write}_events"] and f"FROM {kind}" in sqlite[f"{write}_events"]
        assert postgres_placeholders(insert) in postgres[write]


def test_a_stored_job_whose_spec_row_is_missing_is_reported_as_damage(tmp_path):
    """SQLite keeps a job's spec in its own table; a claim that finds no spec row says so."""
    import sqlite3
    from contextlib import closing

    from herder.errors import StoreUnavailable

    path = tmp_path / "h.db"
    with open_store(f"sqlite:///{path}") as store:
        [job_id] = submit(store)
        with closing(sqlite3.connect(path)) as conn, conn:
            conn.execute("DELETE FROM herder_job_specs WHERE id = ?", (job_id,))
        with pytest.raises(StoreUnavailable, match=rf"claimed jobs \[{job_id}\] have no spec row"):
            store.job_claim("h1", "w1", 1, T0)
