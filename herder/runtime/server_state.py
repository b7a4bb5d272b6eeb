"""What the parts of `herder server` (leader, local hosts, relay, agent service, read
models) share while it runs, and the one way each of their loops runs a cycle."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from herder.core.backoff import Backoff
from herder.runtime.loop_health import Loop, LoopRegistry
from herder.store import Waker, as_unavailable

log = logging.getLogger("herder.coordinator")
AssignmentListener = Callable[[set[str]], None]
"""Told the hosts that just got work (from the scheduler's thread): the HTTP API wakes the
long-polls of those hosts' agents, the ssh launcher its loop."""


@dataclass(eq=False)
class ServerState:
    """The server's shared, changing facts: one object, so a part never holds a stale copy
    (a test swaps `loops`; the leader's flag is read by the relay and the read models)."""

    loops: LoopRegistry = field(default_factory=LoopRegistry)
    stop: threading.Event = field(default_factory=threading.Event)
    """Set once: every loop ends."""
    is_leader: bool = False
    fatal: str | None = None
    """Set when a thread that must live ended: /healthz fails and the process ends."""
    listeners: list[AssignmentListener] = field(default_factory=list)

    def assigned(self, hosts: set[str]) -> None:
        for listener in list(self.listeners):
            listener(hosts)


def utcnow() -> datetime:
    return datetime.now(UTC)


def close_quietly(waker: Waker) -> None:
    with contextlib.suppress(Exception):
        waker.close()


def run_cycle(loop: Loop, backoff: Backoff, what: str,
              cycle: Callable[[], object]) -> float | None:
    """One cycle of a long-running loop: None when it succeeded, else the backoff delay to
    wait before the next try (the failure recorded in the loop's health and logged)."""
    try:
        cycle()
    except Exception as exc:
        loop.failed(exc)
        delay = backoff.next()
        log_failure(what, exc, delay)
        return delay
    loop.succeeded()
    backoff.reset()
    return None


def log_failure(what: str, error: Exception, delay: float) -> None:
    """One line for a database outage (expected, retried); a traceback for anything else."""
    retry = f"; retrying in {delay:.1f}s" if delay else "; retrying"
    unavailable = as_unavailable(error)
    if unavailable is not None:
        log.error("%s failed: %s%s", what, unavailable, retry)
    else:
        log.exception("%s failed%s", what, retry)
