"""Listing jobs: counts, lists, pages, the latest event id."""

from __future__ import annotations

from support.store import (
    at,
    claim_one,
    finish,
    spec,
    submit,
)

from herder.core.model import (
    JobStatus,
    Outcome,
)
from herder.store import Store

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
