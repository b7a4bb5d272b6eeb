"""Finishing: fencing by attempt token, batches and groups, the policy's decisions."""

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
