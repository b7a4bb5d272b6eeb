"""[fleet] and [hosts.LABEL]: placement, health and retry rules of `herder server`'s
scheduler, the hosts herder.toml declares and their accounts, and the default weights."""

import re
import types
from collections.abc import Mapping
from typing import Annotated, Any

from msgspec import Meta, Struct, field

from herder.core.settings.fields import NAME, Duration, env_names, names, positive, rules


class WindowCapsSection(Struct, frozen=True):
    """[hosts.LABEL.prime] and [hosts.LABEL.night]: what the host takes in that window."""

    max_workers: Annotated[int, Meta(ge=0)] = 1
    max_weight: str | None = None


def _transport(value: str) -> str:
    if value not in ("local", "agent", "ssh"):
        raise ValueError("transport must be local, agent or ssh")
    return value


def _argv(value: list[str] | None) -> list[str] | None:
    if value is not None and not value:
        raise ValueError("the command is empty; give an argv list like [\"probe-claude\"]")
    return value


class AccountSection(Struct, frozen=True):
    """[hosts.LABEL.accounts.NAME]: a credential identity on the host that jobs run under
    (`herder accounts`). `env` is what it gives a job; its values may be secrets and are
    never shown or logged, only their names."""

    env: Annotated[dict[str, str], rules(check=env_names)] = field(default_factory=dict)
    max_sessions: Annotated[int, Meta(ge=1, le=10_000)] = 1
    job_types: list[str] | None = None
    """The job types it serves; left out: every type that asks for an account."""
    probe: Annotated[list[str] | None, rules(check=_argv)] = None
    """A command run on the host that prints {"credentials_present": .., "has_refresh_token":
    .., "access_expired": ..} (booleans only); anything else is ignored (fail-open)."""
    probe_timeout: Annotated[Duration, Meta(gt=0)] = 10.0
    probe_interval: Annotated[Duration, Meta(gt=0)] = 300.0
    """How long a probe's answer is kept before the probe runs again."""


class HostSection(Struct, frozen=True):
    """A host declared in herder.toml; `herder server` creates or updates it at start."""

    ram_total_gb: Annotated[float, Meta(ge=0)]
    ram_reserved_gb: Annotated[float, Meta(ge=0)] = 0.0
    cpus: Annotated[int, Meta(ge=1)] = 1
    transport: Annotated[str, rules(check=_transport)] = "agent"
    ssh_target: str | None = None
    prime: WindowCapsSection = WindowCapsSection()
    night: WindowCapsSection = WindowCapsSection()
    job_types: list[str] | None = None
    weights: list[str] | None = None
    priority_floor: int | None = None
    labels: list[str] = field(default_factory=list)
    enabled: bool = True
    accounts: Annotated[dict[str, AccountSection], rules(
        check=names(NAME, "{name!r} is not a valid account name"))] = field(default_factory=dict)


def _shedding(value: Any) -> Any:
    """TOML has no null: "any" (or "") stands for "every weight" in a step."""
    if isinstance(value, list):
        return [[step[0], None if step[1] in ("", "any") else step[1]]
                if isinstance(step, list | tuple) and len(step) == 2 else step
                for step in value]
    return value


def _clock(value: str) -> str:
    if not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", value):
        raise ValueError(f"{value!r} is not a time of day like 20:00")
    return value


def _timezone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {value!r}") from exc
    return value


def _strategy(value: str) -> str:
    if value not in ("best_fit", "spread"):
        raise ValueError("strategy must be best_fit or spread")
    return value


ESCALATION_CHAIN = ("light", "heavy", "playwright", "orchestrator")
"""The default weights in rank order (windows and shedding cap along it). playwright
books less than heavy (DEFAULT_WEIGHTS), so an escalation from heavy skips it."""

SHEDDING_STEPS: tuple[tuple[float, str | None], ...] = (
    (0.75, None), (0.5, "heavy"), (0.25, "heavy"), (0.0, "light"))
"""Fleet capacity ratio → the heaviest weight still placed."""

DEFAULT_WEIGHTS: Mapping[str, float] = types.MappingProxyType({
    "light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0,
})
"""GB of RAM one attempt of each weight books on its host."""


SEED_SUBAGENT_CAPS: Mapping[str, int] = types.MappingProxyType({
    "light": 0, "heavy": 16, "playwright": 16, "orchestrator": 10,
})
"""Subagent slots one job of each weight may hold on a host: a fleet's
max_subagents_for_weight on a 32 GB host (1 GB slots in the 80 % cap beside the job's own
RAM; light: none)."""


def _subagent_caps(value: dict[str, int | bool]) -> dict[str, int | bool]:
    for name, cap in value.items():
        if cap is True or (cap is not False and cap < 0):
            raise ValueError(f"{name} = {str(cap).lower()}: give a number of slots (0 or "
                             "more), or false for no cap")
    return value


class FleetSection(Struct, frozen=True):
    """[fleet]: placement, health and retry rules of `herder server`'s scheduler."""

    bookable_fraction: Annotated[float, Meta(gt=0, le=1)] = 0.8
    """Bookable RAM is this fraction of what the OS reservation leaves."""
    strategy: Annotated[str, rules(check=_strategy)] = "best_fit"
    starvation_wait: Duration = 600.0
    healthy_within: Duration = 300.0
    degraded_within: Duration = 900.0
    night_start: Annotated[str, rules(check=_clock)] = "20:00"
    night_end: Annotated[str, rules(check=_clock)] = "03:00"
    timezone: Annotated[str, rules(check=_timezone)] = "UTC"
    escalation: list[str] = field(default_factory=lambda: list(ESCALATION_CHAIN))
    """The weights' rank (window and shedding caps); an escalation follows it to the first
    weight of a strictly bigger budget (herder.core.scheduling.capacity.WeightTable.heavier)."""
    shedding: Annotated[list[tuple[float, str | None]], rules(before=_shedding)] = field(
        default_factory=lambda: list(SHEDDING_STEPS))
    max_spawn_failures: Annotated[int, Meta(ge=1)] = 5
    """Attempts in a row that fail to start before a job fails."""
    spawn_backoff: Duration = 300.0
    """The wait before a job that failed to start is tried again."""
    breaker_threshold: Annotated[int, Meta(ge=1)] = 3
    """Transient outcomes in a row of one job type on one host that open its breaker."""
    breaker_pause: Annotated[Duration, Meta(gt=0)] = 300.0
    """How long an open breaker launches nothing of that type there."""
    scheduler_interval: Duration = 1.0
    alert_grace: Annotated[Duration, Meta(ge=0)] = 60.0
    """A new leader waits this long for agents to check in before it alerts that no host
    is healthy: a server that just started has heard from nobody yet."""
    auth_revoked_cooldown: Duration = 1800.0
    """An account whose login was revoked is skipped this long."""
    missed_heartbeats: Annotated[int, Meta(ge=1)] = 3
    pickup_timeout: Annotated[Duration | None, positive(
        " (or left out for the default)")] = None
    """A placement no runner has taken by then goes back to the queue (None: 2 heartbeat
    intervals + 5 s, see herder.runtime.scheduler.pickup_timeout_seconds)."""
    reservation_ttl: Duration = 10800.0
    ci_slot_ttl: Duration = 28800.0
    max_subagents_for_weight: Annotated[dict[str, int | bool], rules(
        check=_subagent_caps)] = field(default_factory=dict)
    """Weight -> the subagent slots a job of it may hold on a host, over SEED_SUBAGENT_CAPS
    (`subagent_caps`); false: no cap."""
    ssh_command: list[str] = field(default_factory=lambda: ["ssh"])
    remote_herder: str = "herder"
    emergency_max_workers: Annotated[int | None, Meta(ge=0)] = None
    """A fleet-wide cap on running jobs; left out: none. The start value:
    `herder fleet cap N` / `--lift` change it at run time for every replica."""
