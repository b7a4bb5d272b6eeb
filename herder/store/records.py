"""What the store returns besides the model's records, and the names its callers share."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec

from herder.core.errors import Conflict
from herder.core.model import Attempt, InsertResult, JobStatus

ASSIGNED = "assigned:"
"""The topic a placement notifies (`job_assign`), followed by its host: it wakes the replicas
that are not the leader (their agents' long-polls, their ssh launchers)."""


class LiveAttempt(msgspec.Struct, frozen=True):
    """An attempt that has not ended, with the job counters its rescue decision needs."""

    attempt: Attempt
    job_status: JobStatus
    failures: int
    lost: int
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float


class DueJob(msgspec.Struct, frozen=True):
    """A queued job that may run now: what placement needs to know about it."""

    id: int
    priority: int
    weight: str
    job_type: str
    affinity: str | None
    created_at: datetime
    available_at: datetime
    avoid_host: str | None = None
    """The last host that failed to start it (placement prefers any other that fits)."""


class Alert(msgspec.Struct, frozen=True):
    id: int
    key: str
    message: str
    opened_at: datetime
    cleared_at: datetime | None
    sent_at: datetime | None = None
    """When its opening was handed to the delivery queue (None: not sent, or held back)."""
    resolved_sent_at: datetime | None = None
    """When its clearing was handed to the delivery queue."""
    sent_count: int = 0


class FleetSetting(msgspec.Struct, frozen=True):
    """A fleet setting an operator changed at run time (`herder fleet cap`): it overrides
    herder.toml for every replica; `value` None is "lifted"."""

    name: str
    value: int | None
    updated_at: datetime
    updated_by: str


class DeliveryRecord(msgspec.Struct, frozen=True):
    """What recording a webhook delivery did: `first` is False for a delivery seen before
    (nothing inserted; `job_ids` are what it enqueued then); `created` are the new jobs
    (the others were already held by their dedup keys)."""

    first: bool
    job_ids: tuple[int, ...]
    created: tuple[int, ...]

    @classmethod
    def of(cls, results: Sequence[InsertResult]) -> DeliveryRecord:
        return cls(True, tuple(result.job_id for result in results),
                   tuple(result.job_id for result in results if result.created))


class JobCapReached(Conflict):
    """A job's subagent slots on a host would pass its weight's cap; `held`: how many it
    holds there now."""

    def __init__(self, held: int) -> None:
        super().__init__(f"the job holds {held} subagent slot(s) on the host")
        self.held = held
