"""The local harness: one test's `herder up` on this machine (tests/test_runner.py,
tests/test_crash.py and others).

A `Harness` owns one test's herder: a herder.toml with small timings in tmp_path, a client on
the test's database, `herder` CLI subprocesses (`up` runs in its own process group), and a
unique host label. The host label is part of every attempt marker
(`HERDER_ATTEMPT_TOKEN=<job>.<attempt>@<host>/<pid>/<start>`), so scanning /proc for it finds
exactly this test's job processes, wherever they have been reparented; `close()` kills them
all, and every `up` group, so nothing leaks into other tests.
"""

from __future__ import annotations

import contextlib
import secrets
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from herder.client import Client
from herder.core.model import Event
from herder.store import Store
from support.config import write_config
from support.harness import HarnessBase
from support.processes import (
    Proc,
    marked_processes,
)
from support.waits import wait_for

# TOML literals (strings quoted), as a test's `runtime=` and `defaults=` overrides are given.
DEFAULT_RUNTIME = {
    "heartbeat_interval": '"0.2s"',
    "attempt_lease": '"2s"',
    "kill_grace": '"1s"',
    "poll_interval": '"0.2s"',
    "max_lost": "5",
}
DEFAULT_DEFAULTS = {
    "max_attempts": "3",
    "backoff_base": '"0s"',
    "backoff_max": '"1s"',
}


def shell(script: str) -> list[str]:
    """argv of a job that runs `script` in /bin/sh."""
    return ["/bin/sh", "-c", script]


class Harness(HarnessBase):
    def __init__(
        self,
        directory: Path,
        db_url: str,
        runtime: dict[str, str] | None = None,
        defaults: dict[str, str] | None = None,
        extra_config: str = "",
    ) -> None:
        self.dir = directory
        # Every host label of this test starts with it (see `up`), so markers find them all.
        self.host = f"t{secrets.token_hex(5)}"
        config = write_config(directory / "herder.toml", {
            "herder": {"log_dir": '"logs"'},
            "runtime": {**DEFAULT_RUNTIME, **(runtime or {})},
            "defaults": {**DEFAULT_DEFAULTS, **(defaults or {})},
        }, extra_config)
        super().__init__(directory, db_url, config)
        self.log_dir = directory / "logs"
        self.client = Client(db_url, str(config))

    @property
    def store(self) -> Store:
        return self.client.store

    def spawn(self, *args: str, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        """A `herder` subprocess in its own process group; stderr goes to a file."""
        return self.start(f"herder-{args[0]}", *args, stdout=stdout)

    def up(self, *args: str, host: str | None = None) -> subprocess.Popen[Any]:
        """`herder up` as this test's host (or another label starting with it)."""
        assert host is None or host.startswith(self.host)
        return self.spawn("up", "--host", host or self.host, *args)

    def wait_ready(self, process: subprocess.Popen[Any], timeout: float = 20) -> None:
        """Until `herder up` logs that its loop is up (its first rescue pass is done)."""
        wait_for(lambda: " up: concurrency " in self.stderr_of(process)
                 or process.poll() is not None, timeout, "herder up to be ready", self.describe)
        assert process.poll() is None, f"herder up exited {process.returncode}\n{self.describe()}"

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, command: Sequence[str], **options: Any) -> int:
        options.setdefault("workdir", str(self.dir))
        return self.client.submit(command=list(command), **options).job_id

    def events(self, job_id: int) -> list[Event]:
        return self.store.event_list(job_id)

    # -- processes --------------------------------------------------------------------------

    def marked(self, job_id: int | None = None, attempt: int | None = None) -> list[Proc]:
        """This test's job processes, optionally of one job / attempt."""
        def select(token: str) -> bool:
            head, sep, worker = token.partition("@")
            if not sep or not worker.split("/", 1)[0].startswith(self.host):
                return False
            job, _, number = head.partition(".")
            return ((job_id is None or job == str(job_id))
                    and (attempt is None or number == str(attempt)))

        return marked_processes(select)

    def job_processes(self) -> list[Proc]:
        return self.marked()

    def close(self) -> None:
        super().close()
        self.client.close()


@contextlib.contextmanager
def open_harness(directory: Path, db_url: str) -> Iterator[Harness]:
    """A `Harness` on `db_url`, closed when the block ends."""
    h = Harness(directory, db_url)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def harness(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    """One test's `Harness` (see above), once per backend."""
    with open_harness(tmp_path, store_url) as h:
        yield h
