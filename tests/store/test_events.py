"""Events: replayed to the current status, and the same rows on both backends."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from support.store import (
    at,
    claim_one,
    decision_for,
    finish,
    get,
    spec,
    submit,
)

from herder.core.model import (
    AttemptResult,
    JobStatus,
    Outcome,
)
from herder.store import Store, open_store

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
