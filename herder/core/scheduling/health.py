"""A host's health from the age of its last heartbeat: healthy, degraded (late) or dead."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import msgspec

from herder.core.settings.sections import DEFAULTS


class HostHealth(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


class HealthThresholds(msgspec.Struct, frozen=True):
    """Heartbeat ages at which a host turns degraded and then down."""

    degraded_after_seconds: float = DEFAULTS.fleet.healthy_within
    down_after_seconds: float = DEFAULTS.fleet.degraded_within


DEFAULT_THRESHOLDS = HealthThresholds()


def host_health(
    last_heartbeat: datetime | None,
    now: datetime,
    thresholds: HealthThresholds = DEFAULT_THRESHOLDS,
) -> HostHealth:
    """Never seen is unknown, not down: nothing proves the host ever existed as configured.

    A heartbeat from the future (clock skew) counts as fresh.
    """
    if last_heartbeat is None:
        return HostHealth.UNKNOWN
    age = (now - last_heartbeat).total_seconds()
    if age < thresholds.degraded_after_seconds:
        return HostHealth.HEALTHY
    if age < thresholds.down_after_seconds:
        return HostHealth.DEGRADED
    return HostHealth.DOWN


def accepts_work(health: HostHealth) -> bool:
    """Degraded hosts still get work: a slow heartbeat is not a dead host,
    while dispatching to a dead or never-seen one is the worse failure."""
    return health in (HostHealth.HEALTHY, HostHealth.DEGRADED)


class Liveness(msgspec.Struct, frozen=True):
    """When an agent host stops counting as live for placement: after it has missed
    `missed_heartbeats` of its heartbeats. The health thresholds above were made for cron
    heartbeats every few minutes; an agent beats every few seconds, so its silence means
    something long before it turns degraded."""

    heartbeat_interval_seconds: float = DEFAULTS.runtime.heartbeat_interval
    missed_heartbeats: int = DEFAULTS.fleet.missed_heartbeats

    def window_seconds(self, advertised_interval: object = None) -> float:
        """The silence allowed; an agent that advertises a slower heartbeat gets its own."""
        interval = self.heartbeat_interval_seconds
        if (isinstance(advertised_interval, int | float) and not isinstance(
                advertised_interval, bool) and advertised_interval > interval):
            interval = float(advertised_interval)
        return self.missed_heartbeats * interval


def agent_down(
    last_heartbeat: datetime | None,
    agent_info: Mapping[str, Any],
    now: datetime,
    liveness: Liveness,
) -> str | None:
    """Why an agent host is not live, or None while it is. Pure; the clock is passed in.

    Not live: never heard from, said it stopped (a clean shutdown, or its guardian reported
    it dead), or silent for `missed_heartbeats` heartbeats. A heartbeat from the future
    (clock skew) counts as fresh.
    """
    if last_heartbeat is None:
        return "agent never heartbeated"
    if agent_info.get("stopped"):
        return "agent gone: its guardian reported it dead" if agent_info.get("gone") else (
            "agent stopped")
    age = (now - last_heartbeat).total_seconds()
    window = liveness.window_seconds(agent_info.get("heartbeat_interval"))
    if age >= window:
        return (f"agent down: no heartbeat for {age:.1f}s "
                f"({liveness.missed_heartbeats} missed)")
    return None


DEFAULT_LIVENESS = Liveness()


class LivenessState(enum.StrEnum):
    LIVE = "live"
    LATE = "late"
    """Live for placement, but it has missed a heartbeat or more."""
    DOWN = "down"
    STOPPED = "stopped"
    UNKNOWN = "unknown"
    """Never heard from."""


class HostLiveness(msgspec.Struct, frozen=True):
    """Whether placement counts a host as live, and how many heartbeats it has missed."""

    state: LivenessState
    missed: int = 0

    def describe(self) -> str:
        """The word `herder hosts` shows: live, missed N heartbeats, down, stopped."""
        if self.state is LivenessState.LATE:
            return f"missed {self.missed} heartbeat{'' if self.missed == 1 else 's'}"
        if self.state is LivenessState.UNKNOWN:
            return "never seen"
        return str(self.state)


def host_liveness(last_heartbeat: datetime | None, agent_info: Mapping[str, Any] | None,
                  health: HostHealth, now: datetime, liveness: Liveness) -> HostLiveness:
    """A host's liveness by the rule placement uses. Pure.

    `agent_info` is the agent's last heartbeat info for a host an agent heartbeats for
    (None for ssh and cron hosts, which go by the health thresholds): live until
    it has missed `missed_heartbeats` beats, late once it has missed one."""
    if last_heartbeat is None:
        return HostLiveness(LivenessState.UNKNOWN)
    if agent_info is None:
        return HostLiveness(LivenessState.LIVE if accepts_work(health) else LivenessState.DOWN)
    age = max(0.0, (now - last_heartbeat).total_seconds())
    interval = liveness.window_seconds(agent_info.get("heartbeat_interval")) / max(
        liveness.missed_heartbeats, 1)
    missed = int(age // interval) if interval > 0 else 0
    if agent_down(last_heartbeat, agent_info, now, liveness) is not None:
        # Stopped cleanly is the agent's word; one its guardian reported dead is down.
        stopped = bool(agent_info.get("stopped")) and not agent_info.get("gone")
        return HostLiveness(LivenessState.STOPPED if stopped else LivenessState.DOWN, missed)
    return HostLiveness(LivenessState.LATE if missed else LivenessState.LIVE, missed)


def shown_health(health: HostHealth, liveness: HostLiveness) -> HostHealth:
    """The health `herder hosts`, `/queue` and the dashboard show: the heartbeat-age
    thresholds, but never healthier than placement's liveness says (a SIGKILLed agent's
    host is down at once, not healthy for the minutes the thresholds allow). Pure."""
    if liveness.state in (LivenessState.DOWN, LivenessState.STOPPED):
        return HostHealth.DOWN
    if liveness.state is LivenessState.LATE and health is HostHealth.HEALTHY:
        return HostHealth.DEGRADED
    return health


def down_reason(last_heartbeat: datetime | None, health: HostHealth,
                agent_reason: str | None, now: datetime) -> str | None:
    """Why placement counts a host as down now (its agent's reason, or no heartbeat within
    the health thresholds); None while it is live. Pure."""
    if agent_reason is not None:
        return agent_reason.removeprefix("agent down: ")
    if accepts_work(health):
        return None
    if last_heartbeat is None:
        return "never heartbeated"
    return f"no heartbeat for {(now - last_heartbeat).total_seconds():.0f}s"


class LivenessChange(msgspec.Struct, frozen=True):
    """A host that went down (`down` says why) or came back (`down` is None)."""

    host: str
    down: str | None


def liveness_changes(previous: Mapping[str, str | None],
                     current: Mapping[str, str | None]) -> list[LivenessChange]:
    """The hosts that went down or came back between two scheduler cycles, by label. Pure.

    Each maps a label to why it is down (None: live). A host seen for the first time (a
    new leader's first cycle, a host just added) is only a baseline: a fresh server must
    not report every host it has not heard from yet."""
    changes = []
    for label in sorted(current):
        if label not in previous:
            continue
        before, after = previous[label], current[label]
        if before is None and after is not None:
            changes.append(LivenessChange(label, after))
        elif before is not None and after is None:
            changes.append(LivenessChange(label, None))
    return changes
