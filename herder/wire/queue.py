"""The queue at a glance (`GET /queue`)."""

from __future__ import annotations

from pydantic import Field

from herder.core.model import (
    JobStatus,
)
from herder.wire.accounts import AccountState
from herder.wire.base import (
    Reply,
    Timestamp,
)
from herder.wire.fleet import FleetCapView
from herder.wire.hosts import HostView


class QueueJob(Reply):
    """A recent job, short: what a glance at the queue needs (`/api/v1/jobs/{id}` has all)."""

    id: int
    status: JobStatus
    job_type: str
    host: str | None
    attempt: int
    priority: int
    weight: str
    failure_reason: str | None
    actionable: bool
    created_at: Timestamp
    updated_at: Timestamp



class QueueAccount(AccountState):
    pass  # no docstring of its own: the OpenAPI document describes it as before


class QueueAlert(Reply):
    key: str
    message: str
    opened_at: Timestamp


class Resilience(Reply):
    """`/queue.resilience`: what holds work back besides capacity."""

    breakers: dict[str, dict[str, str]]
    """Host -> job type -> its circuit breaker, where it is not closed."""
    preflight_failed: dict[str, dict[str, str]]
    """Host -> job type -> why its preflight failed there."""


class QueueView(Reply):
    """`GET /queue`: counts by status, the newest jobs, each host's slots and RAM, what
    holds work back (breakers, preflight, accounts) and the open alerts."""

    counts: dict[str, int]
    """Every status, zero included."""
    recent: list[QueueJob]
    hosts: list[HostView]
    resilience: Resilience
    accounts: list[QueueAccount]
    alerts: list[QueueAlert]
    leader: bool
    """Whether the replica that answered is the scheduler's leader."""
    capacity_ratio: float = 1.0
    """The share of the enabled slots on hosts accepting work."""
    shed_max_weight: str | None = None
    """The heaviest weight placement still starts at that ratio ([fleet] shedding)."""
    spawn_failures: dict[str, dict[str, int]] = Field(default_factory=dict)
    """Host -> outcome -> attempts that failed to start there in the last hour."""
    fleet_cap: FleetCapView | None = None

