"""A short check's output within its time (a dispatch check, a preflight, an account probe).

Each runs in a session of its own, so its whole group is killed at the timeout. A descendant
that left the group (setsid, a daemon such as an ssh control master or an update notifier)
and kept one of the pipes open would hold `communicate()` until it exits, however long: the
caller (a server thread, `herder up`'s preflight, the probe loop) would hang past the
timeout. So the pipes are drained only briefly after the kill, then closed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import NamedTuple

DRAIN_SECONDS = 1.0
"""How long the pipes are read after the group is killed (what it printed before)."""


class Ended(NamedTuple):
    """How a short process ended: its exit status (negative: the signal) and its output."""

    returncode: int
    stdout: bytes
    stderr: bytes


def run_within(argv: Sequence[str], timeout: float, env: Mapping[str, str], umask: int,
               cwd: str | None = None, stdout: bool = True, stderr: bool = True
               ) -> Ended | None:
    """Run `argv` in a session of its own, with no stdin, and what it said within `timeout`
    (`stdout`/`stderr` False: that stream is discarded); None when it gave no answer in
    time (its group is killed). OSError when it cannot start."""
    process = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE if stdout else subprocess.DEVNULL,
                               stderr=subprocess.PIPE if stderr else subprocess.DEVNULL,
                               env=dict(env), cwd=cwd, start_new_session=True, umask=umask)
    output = output_within(process, timeout)
    if output is None:
        return None
    return Ended(process.returncode, *output)


def output_within(process: subprocess.Popen[bytes], timeout: float
                  ) -> tuple[bytes, bytes] | None:
    """(stdout, stderr) once `process` ended and its pipes closed within `timeout`; else
    None, with its group killed, the process reaped and its pipes closed."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    else:
        return stdout or b"", stderr or b""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        process.communicate(timeout=DRAIN_SECONDS)
    except subprocess.TimeoutExpired:  # a descendant outside the group holds a pipe
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
        process.wait()
    return None
