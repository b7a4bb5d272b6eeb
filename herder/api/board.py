"""Wakes long-polling agents when the scheduler places work on their host.

Each host has a version number; a poller remembers the version it saw before querying and
waits until it changes, so an assignment committed between the query and the wait is never
missed. Only the waiters of the hosts that got work are woken. Notifications may come from
any thread (the scheduler runs in one).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict


class AssignmentBoard:
    def __init__(self) -> None:
        self._versions: dict[str, int] = defaultdict(int)
        self._waiters: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def version(self, host: str) -> int:
        return self._versions[host]

    def notify(self, hosts: set[str] | None = None) -> None:
        """Thread-safe: bump the hosts' versions (every host when None) and wake waiters."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop is shutting down
            loop.call_soon_threadsafe(self._bump, hosts)

    def _bump(self, hosts: set[str] | None) -> None:
        for host in (hosts if hosts is not None else set(self._waiters) | set(self._versions)):
            self._versions[host] += 1
            for event in self._waiters.get(host, ()):
                event.set()

    async def wait(self, host: str, seen: int, timeout: float) -> bool:
        """Wait until the host's version moves past `seen`; False on timeout."""
        if self._versions[host] != seen:
            return True
        event = asyncio.Event()
        self._waiters[host].add(event)
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except TimeoutError:
            pass
        finally:
            waiters = self._waiters.get(host)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[host]
        return self._versions[host] != seen
