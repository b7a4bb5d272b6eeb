"""The generated Job reader and the column decoders it calls (pure code: no store)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from herder.model import Job, JobStatus
from herder.store.base import (
    CLAIM_GIVEN,
    CLAIM_RETURNS,
    _OpenJob,
    claim_given,
    job_reader,
    object_from_json,
)
from herder.store.sqlite import _time as sqlite_time

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOB = Job(
    id=7, job_type="agent", command=("run", "x"), shell=False, payload={"n": 1}, priority=5,
    weight="small", dedup_key="k", affinity=None, available_at=T0, max_attempts=3,
    timeout_seconds=60.0, env={"A": "b"}, workdir=None, backoff_base_seconds=10.0,
    backoff_max_seconds=600.0, status=JobStatus.CLAIMED, attempt=2, failures=1, lost=0,
    host="h1", exit_code=3, failure_reason="exit_nonzero", cancel_requested=False,
    created_at=T0, claimed_at=T0, started_at=None, finished_at=None, updated_at=T0,
    ram_gb=4.0, spawn_failures=0)


def test_reader_builds_the_same_job_as_the_constructor():
    values = dataclasses.astuple(JOB)
    names = [field.name for field in dataclasses.fields(Job)]
    assert job_reader(names)(values) == JOB


def test_a_read_job_is_a_frozen_job_like_any_other():
    values = dataclasses.astuple(JOB)
    job = job_reader([field.name for field in dataclasses.fields(Job)])(values)
    assert type(job) is Job and job == JOB and repr(job) == repr(JOB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.status = JobStatus.DONE  # type: ignore[misc]
    assert dataclasses.replace(job, attempt=3).attempt == 3
    # The reader's open twin must keep Job's slot layout, or its class switch would fail.
    assert _OpenJob.__slots__ == Job.__slots__


def test_reader_converts_and_decodes_in_that_order():
    decode = {"command": lambda text: text.split(" "), "status": str.lower}
    row = {**dataclasses.asdict(JOB), "command": "run x", "status": "CLAIMED", "shell": 0}
    job = job_reader(list(row), decode)(list(row.values()))
    assert job.command == ("run", "x") and job.status is JobStatus.CLAIMED
    assert job.shell is False


def test_claim_reader_takes_what_the_claim_wrote_from_given():
    row = dataclasses.asdict(JOB)
    read = job_reader(CLAIM_RETURNS, None, CLAIM_GIVEN)
    assert read([row[name] for name in CLAIM_RETURNS], claim_given("h1", T0)) == JOB


def test_reader_fills_defaults_of_older_rows_and_names_a_missing_column():
    row = dataclasses.asdict(JOB)
    del row["ram_gb"], row["spawn_failures"]
    job = job_reader(list(row))(list(row.values()))
    assert job.ram_gb == 0.0 and job.spawn_failures == 0
    del row["weight"]
    with pytest.raises(KeyError, match="weight"):
        job_reader(list(row))


def test_json_columns_decode_to_fresh_objects():
    first, second = object_from_json("{}"), object_from_json("{}")
    assert first == {} and first is not second  # a caller may keep and change its own
    assert object_from_json('{"a": [1]}') == {"a": [1]}
    assert object_from_json(b"{}") == {} and object_from_json(b'{"b": 2}') == {"b": 2}
    assert object_from_json(None) is None


def test_sqlite_time_reuses_only_the_same_instant():
    stamps = [1_700_000_000.5, 1_700_000_000.5, 1_700_000_123.25, 1_700_000_000.5, None]
    converted = [sqlite_time(stamp) for stamp in stamps]
    expected = [None if s is None else datetime.fromtimestamp(s, UTC) for s in stamps]
    assert converted == expected
    assert converted[0] is converted[1]  # the repeated instant was converted once


def test_tokens_and_results_build_like_the_dataclasses_they_are():
    from herder.model import AttemptResult, AttemptToken, Decision, Outcome, _slot_init

    token = AttemptToken(7, 2)
    assert token == AttemptToken(job_id=7, attempt=2) and hash(token) == hash(AttemptToken(7, 2))
    assert (token.job_id, token.attempt, str(token)) == (7, 2, "7.2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.attempt = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        AttemptToken(7)  # type: ignore[call-arg]
    result = AttemptResult(token, Outcome.OK, 0, Decision(JobStatus.DONE))
    assert result == AttemptResult(decision=Decision(JobStatus.DONE), exit_code=0,
                                   outcome=Outcome.OK, token=token)
    assert dataclasses.replace(result, exit_code=1).exit_code == 1

    @dataclasses.dataclass(frozen=True, slots=True)
    class WithDefault:
        x: int = 0

    with pytest.raises(TypeError, match="without defaults"):
        _slot_init(WithDefault)


def test_sqlite_claim_pairs_spec_rows_by_id_when_they_come_out_of_order():
    from herder.errors import StoreUnavailable
    from herder.store.sqlite import _pair_specs

    specs = [(3, "c"), (1, "a"), (2, "b")]
    assert _pair_specs([1, 2, 3], specs) == [(1, "a"), (2, "b"), (3, "c")]
    with pytest.raises(StoreUnavailable, match=r"claimed jobs \[4\] have no spec row"):
        _pair_specs([1, 4], specs)


def test_sqlite_claim_reader_knows_the_spec_query_columns(tmp_path):
    """The claim's reader is built before its spec query first runs, from a list of that
    query's columns: the list must follow the query."""
    import sqlite3
    from contextlib import closing

    from herder.store import open_store
    from herder.store.sqlite import _CLAIM_SPEC_COLUMNS, Q

    path = tmp_path / "h.db"
    open_store(f"sqlite:///{path}").close()
    with closing(sqlite3.connect(path)) as conn:
        cursor = conn.execute(Q["job_claim_specs"], {"job_ids": "[]"})
        assert tuple(column[0] for column in cursor.description) == _CLAIM_SPEC_COLUMNS
