"""An agent's guardian: what it watches and what it tells the server.

The guardian (`herder.runtime.agent.start_guardian`) is a process in a session of its own,
reading a pipe from its agent. Two things end an attempt through it:

* The agent dies (the pipe closes): the guardian kills the agent's jobs, then reports the
  agent gone, so the server declares its attempts lost and keeps work off the host at once
  instead of after the lease. Best effort: a few seconds of retries, then the lease still
  applies. The token is sent, never logged.
* The agent is frozen (SIGSTOP, a debugger, a stuck runner thread) while its jobs run on:
  it cannot fence itself, so the guardian does. After every change the agent writes each
  running attempt's backstop deadline (monotonic seconds, a clock the two processes share);
  an attempt whose deadline passes without renewal is killed, half a fence margin before
  the server may declare it lost and run it elsewhere.
"""

from __future__ import annotations

import logging
import math
import os
import select
import time
from collections.abc import Callable, Mapping

import httpx

from herder.backoff import Backoff

log = logging.getLogger("herder.guardian")

REPORT_BUDGET_SECONDS = 5.0
"""How long the guardian keeps trying; a supervisor restarting the agent must not wait."""


def encode_deadlines(deadlines: Mapping[str, float]) -> bytes:
    """One line: `marker=deadline` for each running attempt (markers hold no space or =)."""
    return (" ".join(f"{marker}={deadline:.3f}"
                     for marker, deadline in sorted(deadlines.items())) + "\n").encode()


def decode_deadlines(line: bytes) -> dict[str, float]:
    """The attempts of one line; a malformed entry is skipped, never guessed."""
    deadlines: dict[str, float] = {}
    for entry in line.decode(errors="replace").split():
        marker, _, value = entry.rpartition("=")
        try:
            deadline = float(value)
        except ValueError:
            continue
        if marker and math.isfinite(deadline):
            deadlines[marker] = deadline
    return deadlines


def due(deadlines: Mapping[str, float], now: float) -> list[str]:
    return sorted(marker for marker, deadline in deadlines.items() if deadline <= now)


def watch(read_end: int, kill: Callable[[list[str]], None],
          clock: Callable[[], float] = time.monotonic) -> None:
    """Read deadline lines until the agent's end of the pipe closes; kill the attempts
    whose deadline passes in between (each once, until the agent names it again)."""
    deadlines: dict[str, float] = {}
    pending = b""
    while True:
        soonest = min(deadlines.values(), default=math.inf)
        timeout = None if soonest == math.inf else max(0.0, soonest - clock())
        readable, _, _ = select.select([read_end], [], [], timeout)
        if not readable:
            overdue = due(deadlines, clock())
            if overdue:
                kill(overdue)
                for marker in overdue:
                    deadlines.pop(marker, None)
            continue
        chunk = os.read(read_end, 65536)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines:
            deadlines = decode_deadlines(lines[-1])


def report_gone(
    server: str,
    token: str,
    label: str,
    worker: str,
    ca: str | None = None,
    budget_seconds: float = REPORT_BUDGET_SECONDS,
    backoff: Backoff | None = None,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """POST /api/v1/agent/{label}/gone for the dead `worker`; True once the server took it.

    Network errors and 5xx are retried with jittered backoff within the budget; any other
    answer is final (a 4xx cannot improve by asking again)."""
    from herder.runtime.agent_client import ServerClient  # the agent's own client

    backoff = backoff or Backoff(base=0.2, cap=1.0)
    deadline = time.monotonic() + budget_seconds
    client = ServerClient(server, token, label, verify=ca or True, timeout=2.0,
                          transport=transport)
    try:
        while True:
            reply = client.request("POST", client.agent_path("/gone"),
                                   params={"worker": worker})
            if reply.status is not None and reply.status < 500:
                if reply.status == 200:
                    log.warning("guardian: reported agent %s gone (%s)", worker, reply.body)
                    return True
                log.error("guardian: the server refused the report that agent %s is "
                          "gone: HTTP %d", worker, reply.status)
                return False
            # A network error's text could name the URL; its type says enough.
            problem = (f"HTTP {reply.status}" if reply.status is not None
                       else type(reply.error).__name__)
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                log.error("guardian: could not tell the server agent %s is gone (%s); its "
                          "attempts are lost after the lease instead", worker, problem)
                return False
            sleep(delay)
    finally:
        client.close()
