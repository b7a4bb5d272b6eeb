"""Reading a Job from a row, and the column decoders it relies on (pure code: no store)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from herder.core.model import AttemptResult, AttemptToken, Decision, Job, JobStatus, Outcome
from herder.store.rows import claimed_jobs, job_from_row, object_from_json

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = Job(
    id=7, job_type="agent", command=("run", "x"), shell=False, payload={"n": 1}, priority=5,
    weight="small", dedup_key="k", affinity=None, available_at=T0, max_attempts=3,
    timeout_seconds=60.0, env={"A": "b"}, workdir=None, backoff_base_seconds=10.0,
    backoff_max_seconds=600.0, status=JobStatus.CLAIMED, attempt=2, failures=1, lost=0,
    host="h1", exit_code=3, failure_reason="exit_nonzero", cancel_requested=False,
    created_at=T0 - timedelta(seconds=9), claimed_at=T0 + timedelta(seconds=1), started_at=None,
    finished_at=None, updated_at=T0 + timedelta(seconds=2),
    ram_gb=4.0, spawn_failures=0)


def test_a_row_builds_the_same_job_as_the_constructor():
    assert job_from_row(msgspec.structs.asdict(JOB)) == JOB


def test_a_row_in_stored_forms_becomes_python_values():
    """SQLite stores flags as integers and a command as a JSON list."""
    row = {**msgspec.structs.asdict(JOB), "command": ["run", "x"], "status": "claimed", "shell": 0,
           "cancel_requested": 0, "worker": "w1", "dedup_released": 0}
    job = job_from_row(row)
    assert job == JOB and job.status is JobStatus.CLAIMED and job.shell is False


def test_an_older_row_gets_the_defaults_and_a_missing_column_is_named():
    row = msgspec.structs.asdict(JOB)
    del row["ram_gb"], row["spawn_failures"]
    job = job_from_row(row)
    assert job.ram_gb == 0.0 and job.spawn_failures == 0
    del row["weight"]
    with pytest.raises(KeyError, match="weight"):
        job_from_row(row)


def test_json_columns_decode_to_fresh_objects():
    first, second = object_from_json("{}"), object_from_json("{}")
    assert first == {} and first is not second  # a caller may keep and change its own
    assert object_from_json('{"a": [1]}') == {"a": [1]}
    assert object_from_json(b"{}") == {} and object_from_json(b'{"b": 2}') == {"b": 2}
    assert object_from_json(None) is None


def test_tokens_and_results_build_like_the_frozen_values_they_are():
    token = AttemptToken(7, 2)
    assert token == AttemptToken(job_id=7, attempt=2) and hash(token) == hash(AttemptToken(7, 2))
    assert (token.job_id, token.attempt, str(token)) == (7, 2, "7.2")
    with pytest.raises(AttributeError):
        token.attempt = 3  # type: ignore[misc]
    result = AttemptResult(token, Outcome.OK, 0, Decision(JobStatus.DONE))
    assert result == AttemptResult(decision=Decision(JobStatus.DONE), exit_code=0,
                                   outcome=Outcome.OK, token=token)
    assert msgspec.structs.replace(result, exit_code=1).exit_code == 1


def test_a_claims_columns_build_its_jobs_in_order_with_what_the_claim_wrote():
    """A claim hands back each column as one list, in stored forms, without the columns it
    set (status, host, its times): those come from what it wrote."""
    written = ("status", "host", "claimed_at", "started_at", "updated_at")
    second = msgspec.structs.replace(JOB, id=8, command=("other",), shell=True, actionable=True)
    columns = {name: [getattr(job, name) for job in (JOB, second)]
               for name in (field.name for field in msgspec.structs.fields(Job))
               if name not in written}
    columns["command"] = [list(JOB.command), ["other"]]
    columns["shell"], columns["actionable"] = [0, 1], [0, 1]
    now = T0 + timedelta(seconds=30)

    jobs = claimed_jobs(columns, "h9", now)

    assert jobs == [msgspec.structs.replace(job, status=JobStatus.CLAIMED, host="h9",
                                        claimed_at=now, started_at=None, updated_at=now)
                    for job in (JOB, second)]
    assert jobs[1].shell is True and jobs[0].actionable is False
