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

DRAIN_SECONDS = 1.0
"""How long the pipes are read after the group is killed (what it printed before)."""


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
