"""A host's health from the age of its last heartbeat (seed 003 §2.1)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from herder.config import FleetSection, RuntimeSection


class HostHealth(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Heartbeat ages at which a host turns degraded and then down."""

    degraded_after_seconds: float = FleetSection.healthy_within
    down_after_seconds: float = FleetSection.degraded_within


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
    """Degraded hosts still get work (seed 003 §5): a slow heartbeat is not a dead host,
    while dispatching to a dead or never-seen one is the worse failure."""
    return health in (HostHealth.HEALTHY, HostHealth.DEGRADED)


@dataclass(frozen=True, slots=True)
class Liveness:
    """When an agent host stops counting as live for placement: after it has missed
    `missed_heartbeats` of its heartbeats. The health thresholds above were made for cron
    heartbeats every few minutes; an agent beats every few seconds, so its silence means
    something long before it turns degraded."""

    heartbeat_interval_seconds: float = RuntimeSection.heartbeat_interval
    missed_heartbeats: int = FleetSection.missed_heartbeats

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
