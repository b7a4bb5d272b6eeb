"""A runner's guardian: a watchdog process that outlives a dead or frozen runner.

Job processes run in sessions of their own, so neither `kill -9` nor SIGSTOP of the runner
reaches them; left alone they would run on while the store or server, after the lease, runs
the job elsewhere. Every runner process (`herder up`, `herder server` with local hosts,
`herder agent`, `herder run-attempt`) forks a guardian before its threads start
(`start_guardian`). It sits in its own session reading a pipe from the runner:

* The runner dies (the pipe closes): the guardian kills every process carrying one of the
  runner's attempt markers (SIGTERM, then SIGKILL after the grace), then runs its `report`
  (an agent tells the server it is gone, so its jobs are rerun at once instead of after
  the lease; best effort, a few seconds of retries; the token is sent, never logged).
* An agent's guardian first waits `[runtime] adopt_grace` for the host's next agent: once
  that one has adopted the attempts (or killed and reported what it could not adopt) it
  writes the handover file named after the dead worker (`handover_path`), and the guardian
  stands down, killing nothing. Without it by then, the guardian does as above, first
  writing `lost_path` so a late next agent does not adopt what it killed. Deadlines still
  hold while it waits: an attempt whose lease backstop passes is killed.
* The runner is frozen (SIGSTOP, a debugger, a stuck thread) while its jobs run on: it
  cannot fence itself, so the guardian does. After every change each runner writes its
  attempts' backstop deadlines (monotonic seconds, a clock the two processes share); an
  attempt whose deadline passes without renewal is killed, half a fence margin before the
  lease ends and the job may run elsewhere.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from herder.core.backoff import Backoff
from herder.core.model import WorkerId
from herder.runtime.cgroup import cgroup_name, kill_leftovers, runner_prefix
from herder.runtime.process import kill_tree, process_start_time, token_markers, tree_alive

if TYPE_CHECKING:
    import httpx

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
          clock: Callable[[], float] = time.monotonic) -> dict[str, float]:
    """Read deadline lines until the agent's end of the pipe closes; kill the attempts
    whose deadline passes in between (each once, until the agent names it again). The
    deadlines last known, of the attempts not killed."""
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
            return deadlines
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if lines:
            deadlines = decode_deadlines(lines[-1])


class GuardianLink:
    """The runner process's end of the pipe; the runners of one process (a server's local
    hosts) share it, each publishing its own attempts, and the guardian gets the union."""

    def __init__(self, write_end: int) -> None:
        self.write_end = write_end
        self._lock = threading.Lock()
        self._by_runner: dict[str, dict[str, float]] = {}
        self._sent: bytes | None = None

    def publish(self, runner: str, deadlines: Mapping[str, float]) -> None:
        with self._lock:
            self._by_runner[runner] = dict(deadlines)
            line = encode_deadlines({marker: deadline
                                     for runner_deadlines in self._by_runner.values()
                                     for marker, deadline in runner_deadlines.items()})
            if line == self._sent:
                return
            try:
                os.write(self.write_end, line)
                self._sent = line
            except OSError as exc:  # full (a guardian not reading) or gone: the lease holds
                log.warning("cannot tell the guardian the attempts' deadlines: %s", exc)


def handover_path(folder: Path, worker: WorkerId) -> Path:
    """The file a next agent writes once it has taken over `worker`'s attempts."""
    return folder / f"{worker.pid}-{worker.start_time}"


def lost_path(folder: Path, worker: WorkerId) -> Path:
    """The file a guardian writes when it stops waiting and kills `worker`'s attempts."""
    return folder / f"{worker.pid}-{worker.start_time}.lost"


def touch(path: Path) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.touch()
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)


def await_successor(deadlines: dict[str, float], handed: Path, grace: float,
                    kill: Callable[[list[str]], None], left: Callable[[], bool],
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait up to `grace` for `handed` to appear (True: a next agent has the attempts);
    meanwhile attempts whose deadline passes are killed. False once `grace` ran out; True
    at once when nothing of the dead runner is `left`."""
    end = clock() + grace
    while True:
        if handed.exists() or not left():
            return True
        now = clock()
        if now >= end:
            return False
        overdue = due(deadlines, now)
        if overdue:
            kill(overdue)
            for marker in overdue:
                deadlines.pop(marker, None)
        sleep(min(0.05, max(0.0, end - now)))


def start_guardian(grace: float, report: Callable[[], object] | None = None,
                   adopt_grace: float = 0.0, handover: Path | None = None) -> GuardianLink:
    """Fork this process's guardian; call it before any thread starts.

    On the runner's death it kills the attempts of every runner of this process (markers
    end in this process's pid and start time, whatever the host label), SIGTERM then
    SIGKILL after `grace`, well inside the lease; then it calls `report`. With `handover`
    (an agent's folder for handover files) and `adopt_grace`, it first waits that long for
    a next agent to adopt them, and stands down when one does."""
    read_end, write_end = os.pipe()
    parent = os.getpid()
    started = process_start_time(parent) or 0
    suffix = f"/{parent}/{started}"
    prefix = runner_prefix(parent, started)
    child = os.fork()
    if child:
        os.close(read_end)
        # The runner writes deadlines as it goes: a guardian that stopped reading must not
        # block it (an update it misses only makes it act on an older, earlier deadline).
        os.set_blocking(write_end, False)
        return GuardianLink(write_end)
    try:
        os.close(write_end)
        os.setsid()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        # Not the runner's stdin or stdout: an ssh session (`run-attempt`) ends when they
        # close. Its stderr stays, for the lines below.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        close_sockets(keep={0, 1, 2, read_end})
        deadlines = watch(read_end, lambda markers: kill_frozen(markers, prefix))
        # Its own markers, and those of attempts it adopted (they keep their first agent's).
        known = set(deadlines)

        def mine(marker: str) -> bool:
            return marker.endswith(suffix) or marker in known

        if handover is not None and stands_down(handover, WorkerId("", parent, started),
                                                adopt_grace, deadlines, prefix, mine):
            os._exit(0)
        for marker in token_markers():
            if mine(marker):
                kill_tree(None, marker, grace)
        kill_leftovers(prefix)  # what left the session and cleared its environment
        # A clean exit (an agent that drained and said it stopped) is reported the same
        # way: by then it has no live attempts and the host is marked stopped already.
        if report is not None:
            report()
    finally:
        os._exit(0)


def close_sockets(keep: set[int]) -> None:
    """Close the sockets the guardian inherited (the agent's connection to its server, for
    one). Held open here, a dead agent's connection would not close with it: the server
    would never see its long poll end, and would bind the placements it hands out meanwhile
    to an agent that is gone. The guardian opens its own connection to report. Without
    /proc they stay open (a guardian holding them beats no guardian at all)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError as exc:
        log.warning("guardian: cannot list its descriptors (%s): the runner's sockets stay "
                    "open in it", exc.strerror)
        return
    for name in names:
        fd = int(name)
        if fd in keep:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:  # the listing's own descriptor, closed by now
            continue


def stands_down(folder: Path, worker: WorkerId, adopt_grace: float,
                deadlines: dict[str, float], prefix: str, mine: Callable[[str], bool]
                ) -> bool:
    """A dead agent's guardian: True when a next agent took its attempts over within
    `adopt_grace`; else it notes they are lost (a late agent must not adopt them)."""
    handed = handover_path(folder, worker)

    def kill(markers: list[str]) -> None:
        # A lease nearly out: what is left of the agent is lost, not for a next agent to
        # adopt (it would find the killed attempts ended, and report them failed).
        touch(lost_path(folder, worker))
        kill_frozen(markers, prefix)

    def left() -> bool:
        return any(mine(marker) for marker in token_markers())

    if not left():  # a clean stop (drained), or nothing was running
        return False
    if adopt_grace > 0:
        log.warning("guardian: waiting up to %gs for the next agent to adopt this agent's "
                    "attempts", adopt_grace)
        if await_successor(deadlines, handed, adopt_grace, kill, left):
            if handed.exists():
                log.warning("guardian: the next agent adopted this agent's attempts")
                handed.unlink(missing_ok=True)  # read by no one else
                return True
            return False  # nothing left (killed, or ended and reported by a next agent)
    touch(lost_path(folder, worker))
    return False


def kill_frozen(markers: list[str], prefix: str | None = None) -> None:
    """The runner let these run past their backstop without renewing them: it is frozen
    (or its loop is stuck), and the job may soon run elsewhere."""
    for marker in markers:
        if tree_alive(None, marker) and kill_tree(None, marker, 0.0):
            log.error("guardian: attempt %s outlived its lease unrenewed (is the runner "
                      "frozen?): killed it", marker.partition("@")[0])
        job, _, attempt = marker.partition("@")[0].partition(".")
        if prefix is not None and job.isdigit() and attempt.isdigit():
            kill_leftovers(prefix, cgroup_name(prefix, int(job), int(attempt)))


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
    allow_plaintext: bool = False,
) -> bool:
    """POST /api/v1/agent/{label}/gone for the dead `worker`; True once the server took it.

    Network errors and 5xx are retried with jittered backoff within the budget; any other
    answer is final (a 4xx cannot improve by asking again)."""
    from herder.runtime.agent_client import ServerClient  # the agent's own client

    backoff = backoff or Backoff(base=0.2, cap=1.0)
    deadline = time.monotonic() + budget_seconds
    client = ServerClient(server, token, label, verify=ca or True, timeout=2.0,
                          transport=transport, allow_plaintext=allow_plaintext)
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
