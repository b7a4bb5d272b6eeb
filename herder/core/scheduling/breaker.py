"""The circuit breaker per host and job type: after a run of
transient outcomes (a rate limit, an overloaded API) a host stops launching that job type
for a pause instead of burning attempts into the same wall, then tries one job.

The state is derived from the attempts' history, not stored: the newest ended attempts of
the type on the host, and whether one is running now. Closed: launch freely. Open: the last
`threshold` attempts ended transient and the last of them less than `pause` ago; launch
nothing. Half-open: the pause is over; launch one job, and while it runs nothing more. Its
outcome closes the breaker (anything but transient) or opens it again (transient: a new
run, a new pause).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime, timedelta

import msgspec

from herder.core.model import Outcome
from herder.core.settings.sections import DEFAULTS


class BreakerState(enum.StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker(msgspec.Struct, frozen=True):
    state: BreakerState
    transient_in_a_row: int = 0
    until: datetime | None = None
    """While open: when it turns half-open."""
    trying: bool = False
    """Half-open with its one trial job running."""

    @property
    def blocks(self) -> bool:
        return self.state is BreakerState.OPEN or self.trying

    def describe(self) -> str:
        if self.state is BreakerState.OPEN and self.until is not None:
            return (f"breaker open: {self.transient_in_a_row} transient outcomes in a row, "
                    f"until {self.until:%H:%M:%S}")
        if self.state is BreakerState.HALF_OPEN:
            return ("breaker half-open: one job is trying" if self.trying
                    else "breaker half-open: the next job is a trial")
        return "breaker closed"


class Ended(msgspec.Struct, frozen=True):
    """One ended attempt of the job type on the host."""

    outcome: Outcome
    ended_at: datetime


def breaker(history: Sequence[Ended], running_since: datetime | None, now: datetime,
            threshold: int = DEFAULTS.fleet.breaker_threshold,
            pause: float = DEFAULTS.fleet.breaker_pause) -> Breaker:
    """The breaker for one host and job type. `history` is its ended attempts, newest
    first (at least `threshold` of them when there are that many); `running_since` is when
    the newest attempt of the type still running there started, if any. `threshold`
    transient outcomes in a row open it (`breaker_threshold`) for `pause` seconds
    (breaker_pause_seconds)."""
    streak = 0
    for ended in history:
        if ended.outcome is not Outcome.TRANSIENT:
            break
        streak += 1
    if streak < threshold:
        return Breaker(BreakerState.CLOSED, streak)
    last = history[0].ended_at
    until = last + timedelta(seconds=pause)
    if now < until:
        return Breaker(BreakerState.OPEN, streak, until)
    # The one trial job, once it runs: nothing more until its outcome says which way to go.
    trying = running_since is not None and running_since >= until
    return Breaker(BreakerState.HALF_OPEN, streak, trying=trying)
