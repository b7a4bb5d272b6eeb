"""What the store tests share: the test clock, submitting, claiming and finishing through
the public API, and writing rows as an older herder did (for the migration tests)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from herder.core.model import (
    AttemptResult,
    AttemptToken,
    Decision,
    Event,
    Job,
    JobSpec,
    JobStatus,
    Outcome,
)
from herder.core.scheduling.policy import RetryState, decide
from herder.store import Store
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



def raw_execute(store: Store, url: str, statements: list[tuple[str, tuple]]) -> None:
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



def migrate_up_to(store: Store, monkeypatch, version: int) -> Callable[[float], Any]:
    """Migrate a blank store to `version` only; returns how raw SQL writes `at(seconds)`.
    `monkeypatch.undo()` lets the next `migrate()` apply the rest."""
    from herder.store import base

    everything = load_migrations(store.dialect)
    monkeypatch.setattr(base, "load_migrations",
                        lambda dialect: [m for m in everything if m[0] <= version])
    assert store.migrate() == list(range(1, version + 1))
    return (lambda s: at(s).timestamp()) if store.dialect == "sqlite" else at



def age_presences(store: Store, url: str, seconds: float) -> None:
    """Make every `herder up` presence `seconds` older by the database's clock (which
    stamps them): a runner that has been silent that long."""
    older = ("last_turn_at - %s" if store.dialect == "sqlite"
             else "last_turn_at - make_interval(secs => %s)")
    raw_execute(store, url, [(f"UPDATE herder_runners SET last_turn_at = {older}",
                              (seconds,))])
