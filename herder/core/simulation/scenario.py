"""What one simulation runs: the fleet, its outages and accounts, the trace, and herder's
rules as herder.toml gives them. Values only; the service layer reads them from files."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from datetime import datetime

import msgspec

from herder.core.model import Outcome
from herder.core.scheduling.accounts import AccountRules
from herder.core.scheduling.capacity import WeightTable
from herder.core.scheduling.placement import HostSpec, PlacementPolicy
from herder.core.scheduling.policy import DEFAULT_RULES, Rule


class TraceOutcome(enum.StrEnum):
    """How a job of the trace ends (docs/simulate.md says when each one applies)."""

    DONE = "done"
    USAGE_LIMIT = "usage_limit"
    OOM = "oom"
    NEEDS_HEAVIER = "needs_heavier"
    TRANSIENT = "transient"
    FAIL = "fail"


FIRST_ATTEMPT_OUTCOMES: Mapping[TraceOutcome, Outcome] = {
    TraceOutcome.USAGE_LIMIT: Outcome.USAGE_BLOCKED,
    TraceOutcome.OOM: Outcome.OOM,
    TraceOutcome.NEEDS_HEAVIER: Outcome.NEEDS_HEAVIER,
    TraceOutcome.TRANSIENT: Outcome.TRANSIENT,
}
"""Trace outcomes that end the job's first attempt (and, for the memory ones, every attempt
whose weight's budget is below the job's true peak) in this outcome; later attempts end ok."""


class TraceJob(msgspec.Struct, frozen=True):
    """One job of the workload: when it arrives (seconds after the start), what it is, how
    long each attempt runs, the RAM it really peaks at, and how it ends."""

    id: int
    arrival: float
    job_type: str
    weight: str
    priority: int
    duration: float
    peak_gb: float
    outcome: TraceOutcome = TraceOutcome.DONE
    affinity: str | None = None


class Outage(msgspec.Struct, frozen=True):
    """A host down from `start` to `end` (seconds after the start): its attempts are lost."""

    host: str
    start: float
    end: float


class SimAccount(msgspec.Struct, frozen=True):
    """An account of a host. `quota_jobs` attempts may start under it per quota period
    (None: no quota); the next one hits the usage limit. Its quota resets every
    `reset_every` seconds, first at `first_reset` seconds after the start."""

    host: str
    name: str
    max_sessions: int = 1
    job_types: frozenset[str] | None = None
    quota_jobs: int | None = None
    reset_every: float = 5 * 3600.0
    first_reset: float = 5 * 3600.0

    def next_reset(self, at: float) -> float:
        """The first quota reset after `at` (seconds after the start)."""
        if at < self.first_reset:
            return self.first_reset
        periods = int((at - self.first_reset) // self.reset_every) + 1
        return self.first_reset + periods * self.reset_every

    def period(self, at: float) -> int:
        """Which quota period `at` falls in (0 before the first reset)."""
        if at < self.first_reset:
            return 0
        return int((at - self.first_reset) // self.reset_every) + 1


class Rules(msgspec.Struct, frozen=True):
    """herder's rules for the run, as the server builds them from herder.toml."""

    weights: WeightTable
    policy: PlacementPolicy
    accounts: AccountRules = msgspec.field(default_factory=lambda: AccountRules({}))
    outcome_rules: Mapping[str, Mapping[Outcome, Rule]] = msgspec.field(default_factory=dict)
    """Job type -> its outcome table where herder.toml overrides one; else DEFAULT_RULES."""
    max_attempts: Mapping[str, int] = msgspec.field(default_factory=dict)
    max_transient: Mapping[str, int] = msgspec.field(default_factory=dict)
    backoff: Mapping[str, tuple[float, float]] = msgspec.field(default_factory=dict)
    """Job type -> (backoff base, backoff max) seconds."""
    default_max_attempts: int = 3
    default_max_transient: int = 5
    default_backoff: tuple[float, float] = (10.0, 600.0)
    max_lost: int = 3
    max_spawn_failures: int = 5
    spawn_backoff: float = 30.0
    breaker_threshold: int = 3
    breaker_pause: float = 300.0
    breaker_history: float = 86400.0
    max_workers: int | None = None
    cycle: float = 1.0
    """Seconds between placement passes (`[fleet] scheduler_interval`): a change is acted on
    at the next cycle."""
    job_types: frozenset[str] = frozenset()

    def rules_for(self, job_type: str) -> Mapping[Outcome, Rule]:
        return self.outcome_rules.get(job_type, DEFAULT_RULES)


class Scenario(msgspec.Struct, frozen=True):
    """A fleet, its rules and a workload, starting at `start` (the clock windows read)."""

    start: datetime
    hosts: tuple[HostSpec, ...]
    jobs: tuple[TraceJob, ...]
    rules: Rules
    outages: tuple[Outage, ...] = ()
    accounts: tuple[SimAccount, ...] = ()
    spawn_failure: Mapping[str, float] = msgspec.field(default_factory=dict)
    """Host -> the chance that an attempt placed there fails to start (`spawn_failed`)."""
    seed: int = 1
    """Seeds the draws of spawn failures: the same seed, the same run."""
