"""A host's health from the age of its last heartbeat (seed 003 §2.1)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime


class HostHealth(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    DOWN = "down"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class HealthThresholds:
    """Heartbeat ages at which a host turns degraded and then down."""

    degraded_after_seconds: float = 300.0
    down_after_seconds: float = 900.0


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
