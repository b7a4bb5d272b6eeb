"""Submitting: job_insert and the dedup keys it honours (or, forced, releases)."""

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

from herder.core.errors import InputError
from herder.core.model import (
    JobSpec,
    JobStatus,
    Outcome,
)

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
