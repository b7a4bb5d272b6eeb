"""One retry delay for every loop that retries: capped exponential backoff with full jitter.

Full jitter (a uniform draw between zero and the capped exponential) spreads a thousand
agents that lost the server at the same moment over the whole window, so they do not
reconnect in lockstep when it comes back (AWS Architecture Blog, "Exponential Backoff
And Jitter"). Pure but for the random source, which tests pass in.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field


def full_jitter(attempt: int, base: float, cap: float,
                draw: Callable[[float, float], float] = random.uniform) -> float:
    """Seconds to wait before retry number `attempt` (1 for the first retry)."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    return draw(0.0, ceiling)


@dataclass
class Backoff:
    """The state of one retry loop: call `next()` after a failure, `reset()` after a
    success."""

    base: float = 0.2
    cap: float = 30.0
    draw: Callable[[float, float], float] = random.uniform
    failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def next(self) -> float:
        with self._lock:
            self.failures += 1
            failures = self.failures
        return full_jitter(failures, self.base, self.cap, self.draw)

    def reset(self) -> None:
        with self._lock:
            self.failures = 0

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Sleep the next delay; True when `stop` was set meanwhile."""
        delay = self.next()
        if stop is None:
            threading.Event().wait(delay)
            return False
        return stop.wait(delay)
