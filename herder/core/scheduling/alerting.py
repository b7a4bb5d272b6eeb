"""Which alerts to send now: deduplication, a window per key, a rate limit. Pure.

The store's `herder_alerts` rows are the input (opened, cleared, and when each was sent);
the answer is the notices to hand to delivery. The rules:

- an open alert is sent once; a new opening of a key whose last opening was sent less than
  `window` ago waits until the window has passed (a flapping cause sends one per window),
  and is never sent if it clears before then;
- a cleared alert whose opening was sent gets one "resolved" notice;
- at most `max_per_hour` notices in any hour, across keys; the rest wait, oldest first.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Protocol

import msgspec

from herder.core.model import Attempt, Outcome
from herder.core.settings.sections import AlertsSection

HOUR = timedelta(hours=1)


class AlertRow(Protocol):
    """What the decision reads of an alert (`herder.store.Alert` has it)."""

    @property
    def id(self) -> int: ...
    @property
    def key(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def opened_at(self) -> datetime: ...
    @property
    def cleared_at(self) -> datetime | None: ...
    @property
    def sent_at(self) -> datetime | None: ...
    @property
    def resolved_sent_at(self) -> datetime | None: ...


class AlertRules(msgspec.Struct, frozen=True):
    window: timedelta
    max_per_hour: int

    @classmethod
    def from_settings(cls, section: AlertsSection) -> AlertRules:
        return cls(timedelta(seconds=section.window), section.max_per_hour)


class NoticeKind(enum.StrEnum):
    OPENED = "opened"
    RESOLVED = "resolved"


class Notice(msgspec.Struct, frozen=True):
    """One message to send about one alert row."""

    alert_id: int
    key: str
    kind: NoticeKind
    message: str
    opened_at: datetime
    cleared_at: datetime | None = None

    @property
    def title(self) -> str:
        state = "ALERT" if self.kind is NoticeKind.OPENED else "RESOLVED"
        return f"herder {state}: {self.key}"

    @property
    def body(self) -> str:
        if self.kind is NoticeKind.OPENED:
            return f"{self.message} (since {self.opened_at:%Y-%m-%d %H:%M:%S} UTC)"
        cleared = f" at {self.cleared_at:%Y-%m-%d %H:%M:%S} UTC" if self.cleared_at else ""
        return f"cleared{cleared}: {self.message}"


def sent_times(alerts: Iterable[AlertRow]) -> list[datetime]:
    return [stamp for alert in alerts for stamp in (alert.sent_at, alert.resolved_sent_at)
            if stamp is not None]


def pending_notices(alerts: Sequence[AlertRow], now: datetime,
                    window: timedelta) -> list[Notice]:
    """Every notice the dedup rules allow at `now`, oldest first, the hour's budget aside."""
    last_opening: dict[str, datetime] = {}
    for alert in alerts:
        if alert.sent_at is not None:
            last_opening[alert.key] = max(alert.sent_at,
                                          last_opening.get(alert.key, alert.sent_at))
    due: list[tuple[datetime, Notice]] = []
    for alert in alerts:
        if alert.cleared_at is None and alert.sent_at is None:
            last = last_opening.get(alert.key)
            if last is None or now - last >= window:
                due.append((alert.opened_at, Notice(alert.id, alert.key, NoticeKind.OPENED,
                                                    alert.message, alert.opened_at)))
        elif (alert.cleared_at is not None and alert.sent_at is not None
              and alert.resolved_sent_at is None):
            due.append((alert.cleared_at, Notice(alert.id, alert.key, NoticeKind.RESOLVED,
                                                 alert.message, alert.opened_at,
                                                 alert.cleared_at)))
    due.sort(key=lambda item: (item[0], item[1].alert_id))
    return [notice for _, notice in due]


def hour_budget(alerts: Iterable[AlertRow], now: datetime, max_per_hour: int) -> int:
    """How many more notices may go out now: sends in the last hour count against it."""
    spent = sum(1 for stamp in sent_times(alerts) if now - stamp < HOUR)
    return max(0, max_per_hour - spent)


def due_notices(alerts: Sequence[AlertRow], now: datetime, rules: AlertRules) -> list[Notice]:
    """The notices to send at `now`: the pending ones, oldest first, within the hour's
    budget. `alerts` must hold every open alert and every one opened or cleared in the last
    window and hour (`Store.alert_list_since`)."""
    return pending_notices(alerts, now, rules.window)[
        :hour_budget(alerts, now, rules.max_per_hour)]


HEAVY_OUTCOMES = frozenset({Outcome.NEEDS_HEAVIER, Outcome.OOM})


def in_memory_loop(attempts: Iterable[Attempt], now: datetime, count: int,
                   window: timedelta) -> bool:
    """An exit-4 / OOM loop: at least `count` attempts of one job ended needing more memory
    within `window` of `now` (escalation is not helping, or the heaviest weight is not
    enough)."""
    recent = [attempt for attempt in attempts
              if attempt.outcome in HEAVY_OUTCOMES and attempt.ended_at is not None
              and now - attempt.ended_at <= window]
    return len(recent) >= count


def silent_for(last_cycle_age: float | None, limit: float) -> bool:
    """The scheduler is silent: no completed cycle for longer than `limit` seconds."""
    return last_cycle_age is not None and last_cycle_age > limit


def in_start_grace(leader_since: datetime | None, now: datetime, grace_seconds: float) -> bool:
    """A new leader's first `grace_seconds` (`[fleet] alert_grace`): agents have had no
    chance to check in yet, so "no healthy host" and "fleet stopped" would be false alarms.
    None (not leading yet) is within it."""
    return leader_since is None or (now - leader_since).total_seconds() < grace_seconds


class LowRam(msgspec.Struct, frozen=True):
    """A host's RAM-spike watch after one look. `below_since`: since when its measured
    available RAM has stayed below the threshold (None: it is not, or nobody knows);
    `alert`: open it (True), clear it (False), or leave it as it is (None)."""

    below_since: datetime | None
    alert: bool | None


def ram_spike(measured_gb: float | None, below_since: datetime | None, now: datetime,
              threshold_gb: float, hold_seconds: float) -> LowRam:
    """"RAM headroom below 4 GB for 5 minutes", said before the OOM killer acts: measured
    available RAM below `threshold_gb` for `hold_seconds` opens the alert; back at or above
    it clears it. An unknown measurement (no agent, a stale heartbeat) restarts the clock
    and changes nothing; a threshold of 0 turns the alert off."""
    if threshold_gb <= 0:
        return LowRam(None, False)
    if measured_gb is None:
        return LowRam(None, None)
    if measured_gb >= threshold_gb:
        return LowRam(None, False)
    since = now if below_since is None or below_since > now else below_since
    return LowRam(since, True if (now - since).total_seconds() >= hold_seconds else None)


UNREACHABLE = "unreachable"
TOKEN_REFUSED = "token_refused"
TROUBLE_KINDS = (UNREACHABLE, TOKEN_REFUSED)
"""An agent's own trouble: its server does not answer (or answers 5xx), or refuses its token."""


class Trouble(msgspec.Struct, frozen=True):
    """One stretch of time in which an agent's calls to its server failed: since the first
    failure after the last success; `kind` and `problem` are the latest failure's (never
    the token: the server's answer or the network error), but a raised trouble keeps its
    kind. `raised`: the agent's own alert URLs were given it."""

    kind: str
    since: datetime
    problem: str
    raised: bool = False

    def key(self, label: str) -> str:
        return f"agent:{label}:{self.kind}"

    def describe(self, label: str) -> str:
        what = ("cannot reach its server" if self.kind == UNREACHABLE
                else "has its token refused by the server")
        return f"the agent of host {label} {what} ({self.problem})"


def track_trouble(current: Trouble | None, failure: str | None, problem: str,
                  now: datetime) -> Trouble | None:
    """The trouble after one call: `failure` is its kind, None when the server answered
    and took the token (which ends any trouble)."""
    if failure is None:
        return None
    if current is None:
        return Trouble(failure, now, problem)
    # Once raised under its kind, the alert keeps its key until it is resolved.
    return msgspec.structs.replace(current, kind=current.kind if current.raised else failure,
                                   problem=problem)


def trouble_due(trouble: Trouble | None, now: datetime, hold_seconds: float) -> bool:
    """Whether the trouble is worth an alert by `now`: a refused token at once (no retry
    cures it), a server out of reach once that has lasted `hold_seconds`."""
    if trouble is None:
        return False
    return (trouble.raised or trouble.kind == TOKEN_REFUSED
            or (now - trouble.since).total_seconds() >= hold_seconds)
