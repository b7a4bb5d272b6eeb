"""The documented Python API, `herder.client.Client`, on both backends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.cli import store_state

from herder.client import Client, Submitted
from herder.core.errors import InputError, NotFound
from herder.core.model import Job, JobStatus
from herder.core.settings.loading import Config
from herder.core.settings.sections import RuntimeSection, Settings
from herder.runtime.runner import Runner
from herder.runtime.runner_options import RunnerOptions
from herder.store import open_store


@pytest.fixture
def client(store_url, tmp_path, monkeypatch) -> Iterator[Client]:
    monkeypatch.delenv("HERDER_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    with Client(store_url, Config(Settings(), None)) as opened:
        yield opened


def run_jobs(url: str, log_dir: Path) -> threading.Thread:
    """`herder up --exit-when-idle` in a thread, on its own store connection."""
    options = RunnerOptions(host="api-test", log_dir=log_dir, runtime=RuntimeSection(
        concurrency=2, heartbeat_interval=0.2, attempt_lease=10.0, kill_grace=1.0,
        poll_interval=0.05), exit_when_idle=True)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            with open_store(url) as store:
                Runner(store, options).run(install_signals=False)
        except BaseException as exc:  # pragma: no cover - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=target, name="herder-runner", daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def test_submit_get_and_list(client, tmp_path):
    first = client.submit(command=["echo", "one"], priority=7, weight="heavy",
                          payload={"n": 1}, env={"A": "b"}, timeout_seconds=30)
    assert first == Submitted(first.job_id, True, JobStatus.QUEUED)
    second = client.submit(command=["true"], dedup_key="api-2", affinity="box",
                           max_attempts=5, workdir=str(tmp_path))
    job = client.get(first.job_id)
    assert isinstance(job, Job)
    assert (job.command, job.priority, job.weight, job.payload, job.env["A"],
            job.timeout_seconds) == (("echo", "one"), 7, "heavy", {"n": 1}, "b", 30.0)
    assert job.workdir == str(tmp_path.resolve())
    other = client.get(second.job_id)
    assert (other.dedup_key, other.affinity, other.max_attempts) == ("api-2", "box", 5)
    assert [j.id for j in client.list()] == [second.job_id, first.job_id]
    assert [j.id for j in client.list(limit=1)] == [second.job_id]
    assert client.list([JobStatus.DONE]) == []


def test_submit_rejects_bad_input_by_field_and_stores_nothing(client, store_url):
    client.submit(command=["true"])
    before = store_state(store_url)
    for kwargs, field in [
        ({"job_type": "nope"}, "job_type"),
        ({"command": ["true"], "weight": "colossal"}, "weight"),
        ({"command": ["no-such-program-for-herder-tests"]}, "command"),
        ({"command": ["true"], "max_attempts": 0}, "max_attempts"),
        ({"command": ["true"], "payload": {"x": float("nan")}}, "payload"),
        ({"command": ["true"], "priority": 2**40}, "priority"),
        ({}, "command"),
    ]:
        with pytest.raises(InputError) as raised:
            client.submit(**kwargs)
        assert raised.value.field == field, kwargs
    assert store_state(store_url) == before


def test_dedup_hit_returns_the_holder_with_created_false(client):
    first = client.submit(command=["true"], dedup_key="ci-123")
    again = client.submit(command=["echo", "other"], dedup_key="ci-123")
    assert first.created is True
    assert again == Submitted(first.job_id, False, JobStatus.QUEUED)
    assert len(client.list()) == 1
    assert client.should_dispatch("ci-123") == (first.job_id, JobStatus.QUEUED)
    assert client.should_dispatch("ci-124") is None


def test_cancel_and_retry(client):
    job_id = client.submit(command=["true"], dedup_key="k").job_id
    assert client.retry(job_id) is False, "a queued job cannot be retried"
    assert client.cancel(job_id) is JobStatus.CANCELLED
    assert client.get(job_id).status is JobStatus.CANCELLED
    assert client.cancel(job_id) is JobStatus.CANCELLED, "cancelling again reports the status"
    assert client.should_dispatch("k") is None
    assert client.retry(job_id) is True
    job = client.get(job_id)
    assert (job.status, job.failures) == (JobStatus.QUEUED, 0)
    assert client.should_dispatch("k") == (job_id, JobStatus.QUEUED)


def test_unknown_job_raises_not_found(client):
    for call in (client.get, client.cancel, client.retry, client.wait):
        with pytest.raises(NotFound, match="no job 4242"):
            call(4242)


def test_wait_returns_when_a_runner_finishes_the_jobs(client, store_url, tmp_path):
    good = client.submit(command=["sh", "-c", "echo out-$HERDER_JOB_ID"]).job_id
    bad = client.submit(command=["sh", "-c", "exit 3"], max_attempts=1).job_id
    runner = run_jobs(store_url, tmp_path / "logs")
    done = client.wait(good, timeout=30)
    failed = client.wait(bad, timeout=30)
    runner.join(timeout=30)
    assert not runner.is_alive(), "the runner should exit once idle"
    assert runner.errors == []
    assert (done.status, done.exit_code, done.attempt, done.host) == (
        JobStatus.DONE, 0, 1, "api-test")
    assert (failed.status, failed.exit_code, failed.failure_reason, failed.failures) == (
        JobStatus.FAILED, 3, "implementation_error", 1)
    (attempt,) = client.attempts(good)
    assert attempt.log_path is not None
    assert f"out-{good}" in Path(attempt.log_path).read_text()
    kinds = [event.to_status for event in client.events(good) if event.to_status]
    assert kinds[-1] is JobStatus.DONE


def test_wait_returns_once_the_job_is_cancelled(client):
    job_id = client.submit(command=["true"]).job_id
    result: list[Job] = []
    waiter = threading.Thread(target=lambda: result.append(client.wait(job_id, timeout=30)),
                              daemon=True)
    waiter.start()
    assert client.cancel(job_id) is JobStatus.CANCELLED
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert result[0].status is JobStatus.CANCELLED


def test_wait_times_out_when_nothing_runs_the_job(client):
    job_id = client.submit(command=["true"]).job_id
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"job {job_id} is still queued"):
        client.wait(job_id, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 10
    assert client.get(job_id).status is JobStatus.QUEUED


def test_client_reads_db_from_config_and_env(tmp_path, monkeypatch, sqlite_url):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HERDER_DB", raising=False)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "herder.toml").write_text('[herder]\ndb = "sqlite:///q.db"\n')
    with Client(config=tmp_path / "proj" / "herder.toml") as from_config:
        assert from_config.store.url == f"sqlite:///{(tmp_path / 'proj' / 'q.db').resolve()}"
    monkeypatch.setenv("HERDER_DB", sqlite_url)
    with Client(config=tmp_path / "proj" / "herder.toml") as from_env:
        assert from_env.store.url == sqlite_url


@pytest.mark.parametrize("field", ["command", "env", "workdir", "dedup_key", "affinity"])
def test_submit_refuses_nul_characters_in_any_text(client, store_url, field):
    values = {"command": ["tr\x00ue"], "env": {"A": "b\x00"}, "workdir": "/tmp\x00",
              "dedup_key": "k\x00", "affinity": "h\x00"}
    kwargs = {"command": ["true"], field: values[field]}
    with pytest.raises(InputError) as raised:
        client.submit(**kwargs)
    assert raised.value.field == field
    assert client.list() == []


def test_submit_names_an_unknown_field_and_an_impossible_delay(client):
    with pytest.raises(TypeError, match="priorty"):
        client.submit(command=["true"], priorty=3)
    for delay in (float("nan"), -1.0, 10.0**12):
        with pytest.raises(InputError) as raised:
            client.submit(command=["true"], delay_seconds=delay)
        assert raised.value.field == "delay"
    assert client.list() == []
