"""Processes a test starts, and the job processes it finds in /proc.

Every process a test starts runs in a process group of its own with its stderr in a file,
so a test can kill exactly what it started and show what each one said. Job processes live
in sessions of their own, so they are found instead by their attempt marker
(`HERDER_ATTEMPT_TOKEN=<job>.<attempt>@<worker>`) in /proc, wherever they were reparented.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from herder.runtime.process import TOKEN_VARIABLE, process_alive, process_start_time
from support.waits import wait_for

# -- processes seen in /proc ---------------------------------------------------------------------


class Proc(msgspec.Struct, frozen=True):
    """A process seen in /proc: pid plus kernel start time, so a reused pid is not it.
    `token` is its attempt marker ("" for a process that is not a job)."""

    pid: int
    start: int
    token: str
    argv: tuple[str, ...]

    def alive(self) -> bool:
        return process_alive(self.pid, self.start)

    @property
    def job(self) -> int:
        return int(self.token.partition("@")[0].partition(".")[0])

    @property
    def attempt(self) -> int:
        return int(self.token.partition("@")[0].partition(".")[2])

    @property
    def worker(self) -> str:
        return self.token.partition("@")[2]


def process_argv(pid: int) -> tuple[str, ...]:
    """The command line of pid, () if it is gone."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            data = handle.read()
    except OSError:
        return ()
    return tuple(part.decode(errors="replace") for part in data.split(b"\0") if part)


def process_environment(pid: int) -> dict[str, str]:
    """The environment pid started with, {} if it is gone or not ours to read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            data = handle.read()
    except OSError:
        return {}
    environment: dict[str, str] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep:
            environment[name.decode(errors="replace")] = value.decode(errors="replace")
    return environment


def _stat_after_name(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from field 3 (state) on, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split()


def process_parent(pid: int) -> int | None:
    """The parent of pid (field 4 of /proc/PID/stat), None if it is gone."""
    fields = _stat_after_name(pid)
    return None if fields is None else int(fields[1])


def process_group(pid: int) -> int | None:
    """The process group of pid (field 5 of /proc/PID/stat), None if it is gone."""
    fields = _stat_after_name(pid)
    return None if fields is None else int(fields[2])


def process_ids() -> Iterator[int]:
    own = os.getpid()
    return (int(entry) for entry in os.listdir("/proc") if entry.isdigit() and int(entry) != own)


def descendants(pid: int) -> list[int]:
    """Every live process below pid in the parent tree."""
    children: dict[int, list[int]] = {}
    for child in process_ids():
        parent = process_parent(child)
        if parent is not None:
            children.setdefault(parent, []).append(child)
    found: list[int] = []
    pending = [pid]
    while pending:
        below = children.get(pending.pop(), [])
        found += below
        pending += below
    return found


def children_like(parent: int) -> list[Proc]:
    """Live children of `parent` with its own command line and no attempt marker (a fork
    of it, such as an agent's guardian, rather than a job)."""
    argv = process_argv(parent)
    found: list[Proc] = []
    for pid in process_ids():
        start = process_start_time(pid)
        if (process_parent(pid) == parent and start is not None
                and process_argv(pid) == argv and TOKEN_VARIABLE not in process_environment(pid)):
            found.append(Proc(pid, start, "", argv))
    return found


def marked_processes(select: Callable[[str], bool] = lambda token: True,
                     log_under: Path | None = None) -> list[Proc]:
    """Live (non-zombie) job processes whose attempt marker satisfies `select` and, with
    `log_under`, whose job log is below that folder."""
    found: list[Proc] = []
    for pid in process_ids():
        environment = process_environment(pid)
        token = environment.get(TOKEN_VARIABLE)
        if token is None or not select(token):
            continue
        if log_under is not None and not environment.get("HERDER_LOG", "").startswith(
                str(log_under)):
            continue
        start = process_start_time(pid)
        if start is not None and process_alive(pid, start):
            found.append(Proc(pid, start, token, process_argv(pid)))
    return found


def kill_processes(procs: Iterable[Proc]) -> None:
    """SIGKILL each of `procs` that is still the process it was."""
    for proc in procs:
        if proc.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc.pid, signal.SIGKILL)


def kill_leftovers(find: Callable[[], list[Proc]], rounds: int = 5) -> None:
    """Kill what `find` returns until it returns nothing (a job may fork while it dies)."""
    for _ in range(rounds):
        left = find()
        if not left:
            return
        kill_processes(left)
        with contextlib.suppress(AssertionError):
            wait_for(lambda procs=left: not any(p.alive() for p in procs), 5,
                     "leftover job processes to die")


def kill_group(process: subprocess.Popen[Any], sig: int = signal.SIGKILL) -> None:
    """Signal the process group of a subprocess started in a session of its own; after a
    SIGKILL, reap it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    if sig == signal.SIGKILL:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)


# -- processes a test started ------------------------------------------------------------------


@dataclass
class Started:
    name: str
    process: subprocess.Popen[Any]
    stderr: Path


class StartedProcesses:
    """The processes one test started, each in its own group with its stderr in a file."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._started: list[Started] = []

    def __iter__(self) -> Iterator[Started]:
        return iter(list(self._started))

    def start(self, name: str, argv: Sequence[str], cwd: Path, env: Mapping[str, str],
              stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        stderr = self.folder / f"{len(self._started):02d}-{name}.stderr"
        with open(stderr, "wb") as err:
            process = subprocess.Popen(list(argv), cwd=cwd, env=dict(env),
                                       stdin=subprocess.DEVNULL, stdout=stdout, stderr=err,
                                       start_new_session=True)
        self.add(name, process, stderr)
        return process

    def add(self, name: str, process: subprocess.Popen[Any], stderr: Path) -> None:
        """One the test started itself (in its own session), so it is shown and killed too."""
        self._started.append(Started(name, process, stderr))

    def stderr_of(self, process: subprocess.Popen[Any]) -> str:
        for started in self._started:
            if started.process is process:
                return started.stderr.read_text(errors="replace")
        raise KeyError(process.pid)

    def tails(self, lines: int) -> list[str]:
        """The last `lines` of each stderr, under a header with the file and exit status."""
        shown: list[str] = []
        for started in self._started:
            with contextlib.suppress(OSError):
                tail = started.stderr.read_text(errors="replace").splitlines()[-lines:]
                shown.append(f"--- {started.stderr.name} (exit {started.process.poll()}) ---")
                shown.extend(tail)
        return shown

    def close(self) -> None:
        """Kill every group (a stopped one is continued first, or it would not die)."""
        for started in self._started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(started.process.pid, signal.SIGCONT)
            kill_group(started.process)


# -- a daemon that outlives the check which left it -------------------------------------------


class EscapingDaemon:
    """A command that starts a daemon in a session of its own (out of the group a timeout
    kills) holding the caller's stdout and stderr, then exits: a bounded subprocess must
    still return at its timeout."""

    def __init__(self, folder: Path) -> None:
        self.pid_file = folder / "daemon.pid"
        self.argv = ("/bin/sh", "-c",
                     'setsid sh -c \'echo $$ > "$1"; exec sleep 120\' daemon "$1" & exit 0',
                     "check", str(self.pid_file))

    def pid(self) -> int | None:
        text = self.pid_file.read_text().strip() if self.pid_file.exists() else ""
        return int(text) if text else None

    def assert_alive(self) -> None:
        """The caller returned while the daemon still held its pipes."""
        daemon = wait_for(self.pid, 30, "the daemon's pid")
        assert Path(f"/proc/{daemon}").exists()


@contextlib.contextmanager
def escaping_daemon(folder: Path) -> Iterator[EscapingDaemon]:
    """An `EscapingDaemon`, killed when the block ends."""
    daemon = EscapingDaemon(folder)
    try:
        yield daemon
    finally:
        pid = daemon.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
