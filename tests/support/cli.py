"""The real `herder` command, run as a subprocess (`python -m herder.cli`), and the store
it leaves behind.

Its environment is `clean_environment()`, so nothing from the developer's shell leaks in.
Store state is read and changed only through the public Store API.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from herder.core.model import AttemptResult, Job, JobStatus, Outcome
from herder.core.scheduling.policy import RetryState, decide
from herder.store import open_store
from support.environment import clean_environment

CLI_TIMEOUT = 60.0
UNREACHABLE_DB = "postgresql://postgres@127.0.0.1:1/nope"


def herder_argv(*args: str, db: str | None = None, config: Path | None = None) -> list[str]:
    """argv of `herder [--db DB] [--config CONFIG] ARGS...` in this interpreter."""
    argv = [sys.executable, "-m", "herder.cli"]
    if db is not None:
        argv += ["--db", db]
    if config is not None:
        argv += ["--config", str(config)]
    return [*argv, *args]


def run_herder(
    *args: str,
    cwd: Path,
    db: str | None = None,
    config: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = CLI_TIMEOUT,
    check: bool = False,
    detail: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`herder [--db DB] [--config CONFIG] ARGS...` in `cwd`; output captured as text.
    With `check`, a non-zero exit fails the test; a timeout always does, with `detail()`."""
    try:
        result = subprocess.run(
            herder_argv(*args, db=db, config=config), cwd=cwd, env=clean_environment(env),
            capture_output=True, text=True, timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        state = "" if detail is None else f"\n--- state ---\n{detail()}"
        raise AssertionError(
            f"herder {' '.join(args)} did not exit within {timeout:.0f}s\n"
            f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}{state}") from None
    if check and result.returncode != 0:
        raise AssertionError(f"herder {' '.join(args)} exited {result.returncode}\n"
                             f"stdout: {result.stdout}\nstderr: {result.stderr}")
    return result


def run_many(
    calls: Sequence[Sequence[str]], cwd: Path, db: str | None = None,
    config: Path | None = None, env: Mapping[str, str] | None = None, workers: int = 4,
) -> list[subprocess.CompletedProcess[str]]:
    """Several independent `herder` invocations at once (they must not depend on each other);
    results in the order of `calls`."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(run_herder, *args, cwd=cwd, db=db, config=config, env=env)
                   for args in calls]
        return [future.result() for future in futures]


def ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Assert the command exited 0; show its output when it did not."""
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result


def submitted_id(result: subprocess.CompletedProcess[str]) -> int:
    """The id a successful `submit` printed: stdout must be exactly one integer line."""
    ok(result)
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].strip().isdigit(), result.stdout
    return int(lines[0])


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """A usage error: exit 2, nothing on stdout, exactly one `herder: error:` line on stderr."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "", result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("herder: error: "), lines[0]
    assert "Traceback" not in result.stderr
    return lines[0]


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


class StoreState(msgspec.Struct, frozen=True):
    """Everything a bad submit could have changed: each job's row and its event ids."""

    jobs: tuple[tuple[int, str, int, bool], ...]
    events: tuple[tuple[int, int], ...]


def store_state(url: str) -> StoreState:
    with open_store(url) as store:
        jobs = store.job_list(None, 100_000)
        # Ids just past the last job too, so an event for a half-made job would show.
        last = max((job.id for job in jobs), default=0)
        ids = sorted({job.id for job in jobs} | set(range(1, last + 4)))
        events = tuple((job_id, event.id) for job_id in ids for event in store.event_list(job_id))
        return StoreState(
            tuple(sorted((j.id, str(j.status), j.attempt, j.cancel_requested) for j in jobs)),
            events,
        )


def get_job(url: str, job_id: int) -> Job:
    with open_store(url) as store:
        job = store.job_get(job_id)
    assert job is not None, job_id
    return job


def end_job(url: str, job_id: int, outcome: Outcome, exit_code: int | None = None) -> JobStatus:
    """Claim the one due queued job (which must be `job_id`), start it and end its attempt
    with `outcome`, as a runner would; returns the job's new status."""
    now = datetime.now(UTC) + timedelta(seconds=1)
    with open_store(url) as store:
        claimed = store.job_claim("test-host", "test-worker", 100, now)
        assert [job.id for job in claimed] == [job_id], [job.id for job in claimed]
        job = claimed[0]
        assert store.attempt_start(job.token, os.getpid(), None, now)
        state = RetryState(job.failures, job.lost, job.max_attempts, job.backoff_base_seconds,
                           job.backoff_max_seconds)
        decision = decide(outcome, state, now)
        applied = store.attempt_finish([AttemptResult(job.token, outcome, exit_code, decision)],
                                       now)
    assert len(applied) == 1, applied
    return applied[0][1]
