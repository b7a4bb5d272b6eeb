"""Helpers for the runtime integration tests (tests/test_runner.py, tests/test_crash.py).

A `Harness` owns one test's herder: a herder.toml with small timings in tmp_path, a client on
the test's database, `herder` CLI subprocesses (`up` runs in its own process group), and a
unique host label. The host label is part of every attempt marker
(`HERDER_ATTEMPT_TOKEN=<job>.<attempt>@<host>/<pid>/<start>`), so scanning /proc for it finds
exactly this test's job processes, wherever they have been reparented; `close()` kills them
all, and every `up` group, so nothing leaks into other tests.

Synchronisation is always on an observed event (a store row, a file, a process) with a
deadline; `wait_for` fails with a message saying what did not happen and the state around it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from herder.client import Client
from herder.model import Attempt, Event, Job, JobStatus
from herder.runtime.process import TOKEN_VARIABLE, process_alive, process_start_time
from herder.store import Store

T = TypeVar("T")

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


# -- waiting ------------------------------------------------------------------------------------


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    detail: Callable[[], object] | None = None,
    interval: float = 0.02,
) -> T:
    """Poll `predicate` until it returns something truthy; fail clearly after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}"
            if detail is not None:
                message += f"\n--- state ---\n{detail()}"
            raise AssertionError(message)
        time.sleep(interval)


# -- processes ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    """A process seen in /proc: pid plus kernel start time, so a reused pid is not it."""

    pid: int
    start: int
    token: str
    argv: tuple[str, ...]

    def alive(self) -> bool:
        return process_alive(self.pid, self.start)


def _environ_token(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    prefix = f"{TOKEN_VARIABLE}=".encode()
    for item in data.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix):].decode(errors="replace")
    return None


def _argv(pid: int) -> tuple[str, ...]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            data = handle.read()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in data.split(b"\0") if part)


def marked_processes(select: Callable[[str], bool]) -> list[Proc]:
    """Live (non-zombie) processes whose attempt marker satisfies `select`."""
    own = os.getpid()
    found: list[Proc] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        pid = int(entry)
        token = _environ_token(pid)
        if token is None or not select(token):
            continue
        start = process_start_time(pid)
        if start is not None and process_alive(pid, start):
            found.append(Proc(pid, start, token, _argv(pid)))
    return found


def _stat_after_name(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (state) on, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def process_group(pid: int) -> int | None:
    """The process group of pid (field 5 of /proc/PID/stat), None if it is gone."""
    fields = _stat_after_name(pid)
    return None if fields is None else int(fields[2])


def descendants(pid: int) -> list[int]:
    """Every live process below pid in the parent tree (field 4 of /proc/PID/stat)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        fields = _stat_after_name(int(entry)) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    pending = [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


def kill_all(procs: Iterable[Proc]) -> None:
    for proc in procs:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL a subprocess started with start_new_session=True, with its whole group."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


# -- the harness --------------------------------------------------------------------------------


def write_config(
    directory: Path,
    runtime: dict[str, str] | None = None,
    defaults: dict[str, str] | None = None,
    extra: str = "",
) -> Path:
    """A herder.toml with test timings; values are TOML literals (strings quoted)."""
    runtime_values = {**DEFAULT_RUNTIME, **(runtime or {})}
    default_values = {**DEFAULT_DEFAULTS, **(defaults or {})}
    lines = ["[herder]", 'log_dir = "logs"', "", "[runtime]"]
    lines += [f"{key} = {value}" for key, value in runtime_values.items()]
    lines += ["", "[defaults]"]
    lines += [f"{key} = {value}" for key, value in default_values.items()]
    path = directory / "herder.toml"
    path.write_text("\n".join(lines) + "\n\n" + extra)
    return path


def cli_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("HERDER_DB", "HERDER_CONFIG", TOKEN_VARIABLE)}
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Harness:
    def __init__(
        self,
        directory: Path,
        db_url: str,
        runtime: dict[str, str] | None = None,
        defaults: dict[str, str] | None = None,
        extra_config: str = "",
    ) -> None:
        self.dir = directory
        self.db = db_url
        # Every host label of this test starts with it (see `up`), so markers find them all.
        self.host = f"t{secrets.token_hex(5)}"
        self.config = write_config(directory, runtime, defaults, extra_config)
        self.log_dir = directory / "logs"
        self.client = Client(db_url, str(self.config))
        self.procs: list[subprocess.Popen[Any]] = []
        self._stderr: list[Path] = []

    @property
    def store(self) -> Store:
        return self.client.store

    # -- cli --------------------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "herder.cli", "--db", self.db, "--config",
                str(self.config), *args]

    def cli(self, *args: str, timeout: float = 60, check: bool = True
            ) -> subprocess.CompletedProcess[str]:
        try:
            result = subprocess.run(self.argv(*args), cwd=self.dir, env=cli_environment(),
                                    capture_output=True, text=True, timeout=timeout,
                                    check=False)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"herder {' '.join(args)} did not exit within {timeout:.0f}s\n"
                f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}\n"
                f"--- state ---\n{self.describe()}") from None
        if check and result.returncode != 0:
            raise AssertionError(f"herder {' '.join(args)} exited {result.returncode}\n"
                                 f"stdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def spawn(self, *args: str, stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        """A `herder` subprocess in its own process group; stderr goes to a file."""
        err_path = self.dir / f"herder-{len(self._stderr)}-{args[0]}.stderr"
        self._stderr.append(err_path)
        with open(err_path, "wb") as err:
            process = subprocess.Popen(self.argv(*args), cwd=self.dir, env=cli_environment(),
                                       stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                       start_new_session=True)
        self.procs.append(process)
        return process

    def up(self, *args: str, host: str | None = None) -> subprocess.Popen[Any]:
        """`herder up` as this test's host (or another label starting with it)."""
        assert host is None or host.startswith(self.host)
        return self.spawn("up", "--host", host or self.host, *args)

    def wait_exit(self, process: subprocess.Popen[Any], timeout: float, what: str) -> int:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{what} did not exit within {timeout:.0f}s\n"
                                 f"--- state ---\n{self.describe()}") from None

    def stderr_of(self, process: subprocess.Popen[Any]) -> str:
        return self._stderr[self.procs.index(process)].read_text(errors="replace")

    def wait_ready(self, process: subprocess.Popen[Any], timeout: float = 20) -> None:
        """Until `herder up` logs that its loop is up (its first rescue pass is done)."""
        wait_for(lambda: " up: concurrency " in self.stderr_of(process)
                 or process.poll() is not None, timeout, "herder up to be ready", self.describe)
        assert process.poll() is None, f"herder up exited {process.returncode}\n{self.describe()}"

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, command: Sequence[str], **options: Any) -> int:
        options.setdefault("workdir", str(self.dir))
        return self.client.submit(command=list(command), **options).job_id

    def job(self, job_id: int) -> Job:
        return self.client.get(job_id)

    def attempts(self, job_id: int) -> list[Attempt]:
        return self.store.attempt_list(job_id)

    def events(self, job_id: int) -> list[Event]:
        return self.store.event_list(job_id)

    def wait_status(self, job_id: int, statuses: JobStatus | Iterable[JobStatus],
                    timeout: float = 30) -> Job:
        wanted = {statuses} if isinstance(statuses, JobStatus) else set(statuses)

        def reached() -> Job | None:
            job = self.job(job_id)
            return job if job.status in wanted else None

        return wait_for(reached, timeout,
                        f"job {job_id} to be {'/'.join(sorted(wanted))}", self.describe)

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

    def describe(self) -> str:
        """Jobs, attempts, live job processes and the tail of each herder stderr."""
        lines: list[str] = []
        with contextlib.suppress(Exception):
            for job in self.client.list(limit=50):
                lines.append(f"job {job.id}: {job.status} attempt={job.attempt} "
                             f"failures={job.failures} lost={job.lost} exit={job.exit_code} "
                             f"reason={job.failure_reason}")
                for a in self.attempts(job.id):
                    lines.append(f"    #{a.attempt} worker={a.worker} pid={a.pid} "
                                 f"outcome={a.outcome} exit={a.exit_code}")
        with contextlib.suppress(Exception):
            for proc in self.marked():
                lines.append(f"process {proc.pid} {proc.token} {' '.join(proc.argv)}")
        for path in self._stderr:
            with contextlib.suppress(OSError):
                tail = path.read_text(errors="replace").splitlines()[-40:]
                lines.append(f"--- {path.name} ---")
                lines.extend(tail)
        return "\n".join(lines)

    def close(self) -> None:
        for process in self.procs:
            kill_group(process)
        # Job processes live in sessions of their own: find them by their marker.
        for _ in range(3):
            left = self.marked()
            if not left:
                break
            kill_all(left)
            with contextlib.suppress(AssertionError):
                wait_for(lambda procs=left: not any(p.alive() for p in procs), 5,
                         "leftovers to die")
        self.client.close()


def shell(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


@pytest.fixture
def harness(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    """One test's `Harness` (see above), closed at teardown."""
    h = Harness(tmp_path, store_url)
    try:
        yield h
    finally:
        h.close()
