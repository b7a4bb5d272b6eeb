"""Process trees: identify an attempt's processes and stop all of them.

Each attempt runs in its own session and process group, and every process in it inherits
`HERDER_ATTEMPT_TOKEN` in its environment. Killing the group catches ordinary children; the
environment marker also catches descendants that left the group (setsid, double fork), and
lets a restarted runner find survivors of a runner that was killed with -9. (A descendant
that also clears its environment is caught only by the attempt's cgroup, where there is
one: herder.runtime.memory.)

Processes are listed and inspected through psutil. Two reads stay by hand, where psutil does
not serve: a process's start time in clock ticks (the kernel's exact value, which worker ids
and markers carry; psutil's `create_time` is a float derived from it) and the marker scan of
every process's environment (psutil parses each into a dict, three times slower, and the
scan runs on every poll of an attempt whose group is gone).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

import psutil

TOKEN_VARIABLE = "HERDER_ATTEMPT_TOKEN"


def process_start_time(pid: int) -> int | None:
    """Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat).

    Together with the pid it names a process uniquely, so a recycled pid is not mistaken
    for the runner that once had it.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses; split after the last ')'.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def is_zombie(pid: int) -> bool:
    """True for a zombie and for a process that is gone."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def process_alive(pid: int, start_time: int | None = None) -> bool:
    """True if pid runs (not a zombie) and, when given, started at start_time."""
    if pid <= 0:
        return False
    actual = process_start_time(pid)
    if actual is None or is_zombie(pid):
        return False
    return start_time is None or actual == start_time


def processes_with_token(token: str) -> list[int]:
    """Pids whose environment carries HERDER_ATTEMPT_TOKEN=token (excluding this process)."""
    return token_markers().get(token, [])


def signal_tree(pgid: int | None, token: str | None, sig: int) -> int:
    """Send sig to the process group and to every process carrying the token.

    Returns how many targets were signalled; zero means nothing of the attempt is left.
    """
    hits = 0
    if pgid is not None and pgid > 0:
        try:
            os.killpg(pgid, sig)
            hits += 1
        except (ProcessLookupError, PermissionError):
            pass
    if token is not None:
        for pid in processes_with_token(token):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                hits += 1
    return hits


def tree_alive(pgid: int | None, token: str | None) -> bool:
    """True while any member of the group or any token-carrying process remains."""
    if pgid is not None and pgid > 0:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            pass
        except PermissionError:
            return True
        else:
            if _group_has_live_member(pgid):
                return True
    return bool(token and processes_with_token(token))


def _group_has_live_member(pgid: int) -> bool:
    """killpg(0) succeeds while zombies remain; look for a member that is not a zombie."""
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and not is_zombie(pid):
                return True
        except OSError:
            continue
    return False


def kill_tree(
    pgid: int | None, token: str | None, grace: float, reap: Iterable[int] = ()
) -> bool:
    """SIGTERM the attempt's processes, SIGKILL after `grace`; True when none are left.

    Used where blocking is acceptable (recovery at start, shutdown). `reap` names children of
    this process to wait for, so they do not linger as zombies.
    """
    signal_tree(pgid, token, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(reap)
        if not tree_alive(pgid, token):
            return True
        time.sleep(0.02)
    signal_tree(pgid, token, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _reap(reap)
        if not tree_alive(pgid, token):
            return True
        time.sleep(0.02)
    return not tree_alive(pgid, token)


def _reap(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, os.WNOHANG)


def _other_pids() -> list[int]:
    own = os.getpid()
    return [pid for pid in psutil.pids() if pid != own]


def process_log(pid: int) -> str:
    """The attempt log (`HERDER_LOG`) in a job process's environment; "" when unknown."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            environ = handle.read()
    except OSError:
        return ""
    for item in environ.split(b"\0"):
        if item.startswith(b"HERDER_LOG="):
            return item[len(b"HERDER_LOG="):].decode(errors="replace")
    return ""


def token_markers() -> dict[str, list[int]]:
    """Every live process carrying an attempt marker, grouped by marker."""
    prefix = f"{TOKEN_VARIABLE}=".encode()
    found: dict[str, list[int]] = {}
    for pid in _other_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix):
                if not is_zombie(pid):
                    marker = item[len(prefix):].decode(errors="replace")
                    found.setdefault(marker, []).append(pid)
                break
    return found
