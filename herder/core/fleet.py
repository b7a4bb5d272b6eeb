"""The fleet-wide rules from herder.toml in the pure core's terms, and the fleet's cap.

Values only: the runtime reads the store (breaker history, the run-time cap) and hands the
results to these and to placement.
"""

from __future__ import annotations

from datetime import datetime, time
from typing import Any

import msgspec

from herder.core.model import RUNNER_PRESENCE_INTERVAL, HostRecord, RunnerPresence
from herder.core.scheduling.accounts import AccountRules
from herder.core.scheduling.capacity import (
    Shedding,
    WeightTable,
    WindowCaps,
    WindowSchedule,
    bookable_gb,
)
from herder.core.scheduling.health import (
    DEFAULT_LIVENESS,
    HealthThresholds,
    HostHealth,
    HostLiveness,
    Liveness,
    LivenessState,
    agent_down,
    down_reason,
    host_health,
    host_liveness,
)
from herder.core.scheduling.placement import PlacementPolicy
from herder.core.settings.fleet import FleetSection
from herder.core.settings.sections import Settings


class Fleet(msgspec.Struct, frozen=True):
    """The fleet-wide rules from herder.toml, in the pure core's terms."""

    weights: WeightTable
    policy: PlacementPolicy
    thresholds: HealthThresholds
    liveness: Liveness = DEFAULT_LIVENESS
    max_due: int = 100_000
    accounts: AccountRules = msgspec.field(default_factory=lambda: AccountRules({}))
    settings: FleetSection = FleetSection()
    """[fleet] as herder.toml says: the breaker, the alert grace and emergency_max_workers as
    it starts (`fleet_cap` reads the run-time value)."""

    @property
    def max_workers(self) -> int | None:
        """`[fleet] emergency_max_workers` as herder.toml starts it."""
        return self.settings.emergency_max_workers

    @classmethod
    def from_settings(cls, settings: Settings) -> Fleet:
        fleet = settings.fleet
        schedule = WindowSchedule(
            timezone=fleet.timezone,
            night_start=time.fromisoformat(fleet.night_start),
            night_end=time.fromisoformat(fleet.night_end),
        )
        policy = PlacementPolicy(
            bookable_fraction=fleet.bookable_fraction,
            strategy=fleet.strategy,
            starvation_wait_seconds=fleet.starvation_wait,
            # A loaded herder.toml names only existing weights here (the load refuses
            # others); Settings built in code without them shed nothing at those steps.
            shedding=Shedding(tuple((ratio, weight if weight in settings.weights else None)
                                    for ratio, weight in fleet.shedding)),
            schedule=schedule,
            pinned={name: frozenset(job_type.hosts)
                    for name, job_type in settings.job_types.items()
                    if job_type.hosts is not None},
        )
        return cls(
            weights=WeightTable.from_settings(settings),
            policy=policy,
            thresholds=HealthThresholds(fleet.healthy_within, fleet.degraded_within),
            liveness=Liveness(settings.runtime.heartbeat_interval, fleet.missed_heartbeats),
            accounts=AccountRules.from_settings(settings), settings=fleet,
        )

    def caps(self, host: HostRecord, now: datetime) -> WindowCaps:
        if self.policy.schedule.window_at(now) == "night":
            return WindowCaps(host.night_max_workers, host.night_max_weight)
        return WindowCaps(host.prime_max_workers, host.prime_max_weight)

    def bookable(self, host: HostRecord) -> float:
        return bookable_gb(host.ram_total_gb, host.ram_reserved_gb,
                           self.policy.bookable_fraction)

    def health(self, host: HostRecord, now: datetime) -> HostHealth:
        return host_health(host.last_heartbeat, now, self.thresholds)

    def agent_down(self, host: HostRecord, now: datetime) -> str | None:
        """Why a host whose agent heartbeats is not live for placement; None when it is,
        and for hosts no agent heartbeats for (ssh hosts, cron's `herder heartbeat`),
        which go by the health thresholds alone. A server's local hosts have agents."""
        info = _agent_info(host)
        if info is None:
            return None
        return agent_down(host.last_heartbeat, info, now, self.liveness)

    def liveness_of(self, host: HostRecord, now: datetime) -> HostLiveness:
        """Live, late, down or stopped by the rule placement uses (`agent_down`)."""
        return host_liveness(host.last_heartbeat, _agent_info(host), self.health(host, now),
                             now, self.liveness)

    def down(self, host: HostRecord, now: datetime) -> str | None:
        """Why placement counts the host as down now; None while it is live."""
        return down_reason(host.last_heartbeat, self.health(host, now),
                           self.agent_down(host, now), now)

    def runner_liveness(self, presence: RunnerPresence, now: datetime) -> HostLiveness:
        """A `herder up` runner's, by its writes as an agent's by its heartbeats: late once
        it has missed one, down after `missed_heartbeats` (a runner that died or froze).
        A write counts as missed after twice its interval, so a busy turn is not one."""
        health = host_health(presence.last_turn_at, now, self.thresholds)
        return host_liveness(presence.last_turn_at, {}, health, now,
                             Liveness(2 * RUNNER_PRESENCE_INTERVAL,
                                      self.liveness.missed_heartbeats))

    def runner_down(self, presence: RunnerPresence, now: datetime) -> str | None:
        """Why a `herder up` runner counts as gone now; None while its loop turns."""
        silent = (now - presence.last_turn_at).total_seconds()
        if self.runner_liveness(presence, now).state is LivenessState.DOWN:
            return f"`herder up` silent: its loop last wrote {silent:.0f}s ago"
        return None


def _agent_info(host: HostRecord) -> dict[str, Any] | None:
    """The heartbeat info of a host an agent heartbeats for (an agent host, or a server's
    local host); None for the others (ssh hosts, cron's `herder heartbeat`), which go by
    the health thresholds alone."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    if not host.transport.pulls or "worker" not in info:
        return None
    return info


class FleetCap(msgspec.Struct, frozen=True):
    """The fleet-wide cap on running jobs now: herder.toml's start value until an operator
    sets or lifts it (`herder fleet cap`), which holds for every replica, across restarts,
    until changed again (`--reset` hands it back to herder.toml)."""

    max_workers: int | None
    at_run_time: bool = False
    updated_at: datetime | None = None
    updated_by: str | None = None
