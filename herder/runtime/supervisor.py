"""An attempt's supervisor: the small process between an agent and its job that outlives
the agent and keeps what the agent would otherwise lose, the job's ending.

`python -I supervisor.py STATUS FD` (herder.runtime.executor.SUPERVISOR) is started by the
agent as the leader of the attempt's own session (in its cgroup, with the job's umask). It
turns dumpable off, reads the job's launch (argv, environment, run_as user) as JSON from
descriptor FD until end of file, starts the job as its child, answers on the same socket
with `ok PID` or `error TEXT` (so a missing program fails the launch as before), waits on it
and writes its exit status, peak RSS (the job's own, as the kernel counts it) and end time
to STATUS (a temporary file renamed over it, so a reader sees all or nothing), then exits.
A new agent of the host reads that file for an attempt that ended while no agent was up
(herder.runtime.attempt_files.read_status).

A separate interpreter, not a fork of the agent: a fork of a threaded process that goes on
running Python may deadlock, and would carry the agent's memory (its token) along. `-I` and
an empty environment: under run_as it runs as root, so nothing of the job's (PYTHONPATH,
LD_PRELOAD, its working folder) may reach its interpreter; the job's environment comes
through the socket and is the job's alone. It carries no attempt marker (it is no job
process: a kill by marker leaves it to exit with its job). Only standard modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

PR_SET_DUMPABLE = 4


def not_dumpable() -> None:
    """The launch it reads holds the job's environment (an account's key, maybe)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def write_status(path: str, status: dict[str, Any]) -> None:
    """All or nothing: a temporary file, flushed, renamed over `path`."""
    temporary = f"{path}.tmp"
    handle = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(handle, json.dumps(status, sort_keys=True).encode())
        os.fsync(handle)
    finally:
        os.close(handle)
    os.replace(temporary, path)


def status_of(wait_status: int, max_rss_kb: int, pid: int) -> dict[str, Any]:
    signalled = os.WIFSIGNALED(wait_status)
    return {"pid": pid,
            "exit_code": None if signalled else os.WEXITSTATUS(wait_status),
            "signal": os.WTERMSIG(wait_status) if signalled else None,
            "peak_rss": max_rss_kb * 1024, "ended_at": time.time()}


def main(argv: list[str]) -> int:
    not_dumpable()
    status_path, descriptor = argv[0], int(argv[1])
    # The group's SIGTERM (a timeout, a cancel) is the job's to act on; this process stays
    # to record how it ended. A handler, not SIG_IGN: an exec resets it for the job.
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda *_: None)
    channel = socket.socket(fileno=descriptor)
    data = b""
    while chunk := channel.recv(65536):
        data += chunk
    launch = json.loads(data)
    switch: dict[str, Any] = {}
    if launch.get("user") is not None:
        switch = {"user": launch["user"], "group": launch["group"],
                  "extra_groups": launch["groups"]}
    try:
        job = subprocess.Popen(launch["argv"], env=launch["env"], close_fds=True, **switch)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        channel.sendall(f"error {exc}".encode())
        channel.close()
        write_status(status_path, {"launch_error": str(exc), "ended_at": time.time()})
        return 127
    with contextlib.suppress(OSError):  # the agent died meanwhile: the end is recorded
        channel.sendall(f"ok {job.pid}".encode())
    channel.close()
    del launch, data
    _, wait_status, usage = os.wait4(job.pid, 0)
    write_status(status_path, status_of(wait_status, usage.ru_maxrss, job.pid))
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
