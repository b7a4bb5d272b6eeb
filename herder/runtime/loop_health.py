"""Loop heartbeats: every long-running loop of a process records its last successful cycle,
so `/healthz` can tell a working server from one whose scheduler thread died or is stuck
while the HTTP side keeps answering (a half-dead server that still says "leader").

Times are monotonic seconds: wall-clock steps must not make a loop look stale or fresh.
The assessment (`assess`) is pure; `LoopRegistry` only keeps the states under a lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import msgspec
from msgspec.structs import replace

STALE_FACTOR = 10  # cycles a loop may miss before it counts as stale
STALE_FLOOR_SECONDS = 30.0  # never stale sooner: one slow store call must not flap /healthz


def stale_after(interval: float, floor: float = STALE_FLOOR_SECONDS) -> float:
    """Seconds without a successful cycle after which a loop of this interval is stale."""
    return max(STALE_FACTOR * interval, floor)


class LoopState(msgspec.Struct, frozen=True):
    name: str
    interval: float
    stale_after: float
    started: float  # monotonic; a loop that never succeeded is judged from here
    last_success: float | None = None
    failures: int = 0  # consecutive failed cycles
    last_error: str | None = None  # the exception's type only: messages may hold hosts, URLs
    ended: bool = False  # the loop's thread is gone (not on purpose)
    generation: int = 0  # which registration of the name this is (a loop registered again)


class LoopReport(msgspec.Struct, frozen=True):
    name: str
    ok: bool
    age_seconds: float  # since the last successful cycle (or the start, before the first)
    stale_after_seconds: float
    failures: int
    last_error: str | None
    ended: bool

    def view(self) -> dict[str, object]:
        return {
            "ok": self.ok, "age_seconds": round(self.age_seconds, 3),
            "stale_after_seconds": self.stale_after_seconds, "failures": self.failures,
            "last_error": self.last_error, "ended": self.ended,
        }


def assess(state: LoopState, now: float) -> LoopReport:
    """Whether a loop is working at monotonic time `now`."""
    since = state.last_success if state.last_success is not None else state.started
    age = max(0.0, now - since)
    return LoopReport(state.name, not state.ended and age <= state.stale_after, age,
                      state.stale_after, state.failures, state.last_error, state.ended)


class Loop:
    """The handle a loop's thread reports through. It speaks for its own registration only:
    a thread still ending while its name is registered again (a host removed and added
    back) changes nothing of the new one's."""

    def __init__(self, registry: LoopRegistry, name: str, generation: int = 0) -> None:
        self._registry = registry
        self.name = name
        self.generation = generation

    def succeeded(self) -> None:
        now = self._registry.clock()
        self._registry.update(self.name, lambda s: replace(s, last_success=now, failures=0),
                              self.generation)

    def failed(self, error: BaseException) -> None:
        kind = type(error).__name__
        self._registry.update(
            self.name, lambda s: replace(s, failures=s.failures + 1, last_error=kind),
            self.generation)

    def ended(self) -> None:
        self._registry.update(self.name, lambda s: replace(s, ended=True), self.generation)

    def unregister(self) -> None:
        """The loop stopped on purpose: no longer part of the health."""
        self._registry.unregister(self.name, self.generation)

    def report(self) -> LoopReport:
        return self._registry.report(self.name)


class LoopRegistry:
    """The loops of one process, by name."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 floor_seconds: float = STALE_FLOOR_SECONDS) -> None:
        self.clock = clock
        self.floor_seconds = floor_seconds
        self._lock = threading.Lock()
        self._states: dict[str, LoopState] = {}
        self._generations = 0

    def register(self, name: str, interval: float, stale_seconds: float | None = None) -> Loop:
        """Start watching a loop (again, if the name is known: a restarted loop starts over)."""
        limit = (stale_after(interval, self.floor_seconds) if stale_seconds is None
                 else stale_seconds)
        with self._lock:
            self._generations += 1
            generation = self._generations
            self._states[name] = LoopState(name, interval, limit, self.clock(),
                                           generation=generation)
        return Loop(self, name, generation)

    def unregister(self, name: str, generation: int | None = None) -> None:
        """The loop stopped on purpose (shutdown): no longer part of the health. With a
        generation, only while the name is still that registration."""
        with self._lock:
            state = self._states.get(name)
            if state is not None and generation in (None, state.generation):
                del self._states[name]

    def update(self, name: str, change: Callable[[LoopState], LoopState],
               generation: int | None = None) -> None:
        with self._lock:
            state = self._states.get(name)
            if state is not None and generation in (None, state.generation):
                self._states[name] = change(state)

    def report(self, name: str) -> LoopReport:
        now = self.clock()
        with self._lock:
            return assess(self._states[name], now)

    def reports(self) -> list[LoopReport]:
        now = self.clock()
        with self._lock:
            states = sorted(self._states.values(), key=lambda s: s.name)
        return [assess(state, now) for state in states]

    def healthy(self) -> bool:
        return all(report.ok for report in self.reports())
