"""Cancel and retry."""

from __future__ import annotations

from support.store import (
    at,
    claim_one,
    decision_for,
    finish,
    get,
    snapshot,
    spec,
    submit,
)

from herder.core.model import (
    AttemptResult,
    JobStatus,
    Outcome,
)

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
