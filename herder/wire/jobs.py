"""Operators' job bodies (`/api/v1/jobs`): submit, a job's view and history, why, cancel, retry
and the dispatch check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import AliasChoices, AliasPath, Field

from herder.core.job_result import Seconds
from herder.core.model import (
    INT_MAX,
    Attempt,
    Enforcement,
    Event,
    Job,
    JobStatus,
    Outcome,
)
from herder.core.settings.fields import MAX_DURATION
from herder.core.submission import DEDUP_KEY_LENGTH, NAME_LENGTH, WORKDIR_LENGTH
from herder.wire.base import (
    Body,
    Int32,
    Reply,
    Timestamp,
)


class SubmitBody(Body):
    """A job to submit over HTTP: the fields of `herder.core.submission.SubmitRequest` (what the
    client and the CLI build), with their limits checked at the edge."""

    job_type: str | None = Field(default=None, max_length=NAME_LENGTH)
    command: list[str] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: Int32 | None = None
    weight: str | None = Field(default=None, max_length=NAME_LENGTH)
    dedup_key: str | None = Field(default=None, max_length=DEDUP_KEY_LENGTH)
    force: bool = False
    affinity: str | None = Field(default=None, max_length=NAME_LENGTH)
    delay_seconds: Seconds | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=INT_MAX)
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_DURATION,
                                            allow_inf_nan=False)] | None = None
    workdir: str | None = Field(default=None, max_length=WORKDIR_LENGTH)
    env: dict[str, str] = Field(default_factory=dict)


class Submitted(Reply):
    """`created` is False when a job with the same dedup key already held it."""

    id: int
    created: bool
    status: JobStatus


class JobView(Reply):
    id: int
    status: JobStatus
    job_type: str
    priority: int
    weight: str
    attempt: int
    max_attempts: int
    failures: int
    lost: int
    spawn_failures: int = 0
    transient_attempts: int = 0
    escalations: int = 0
    host: str | None
    exit_code: int | None
    failure_reason: str | None
    actionable: bool = False
    """A failure someone should look at (a code fault, a timeout), not weather."""
    human_action: bool = False
    """Only a human can fix it (a revoked login)."""
    dedup_key: str | None
    affinity: str | None
    command: list[str]
    payload: dict[str, Any]
    workdir: str | None
    timeout_seconds: float | None
    cancel_requested: bool
    available_at: Timestamp
    created_at: Timestamp
    claimed_at: Timestamp | None
    started_at: Timestamp | None
    finished_at: Timestamp | None
    updated_at: Timestamp


class AttemptView(Reply):
    """An attempt; built from `herder.core.model.Attempt`, its memory fields are read from
    its `memory` (a client reads them by their own names)."""

    attempt: int
    host: str
    worker: str
    pid: int | None
    log_path: str | None
    claimed_at: Timestamp
    started_at: Timestamp | None
    heartbeat_at: Timestamp
    ended_at: Timestamp | None
    exit_code: int | None
    outcome: Outcome | None
    peak_rss_bytes: int | None = Field(default=None, validation_alias=AliasChoices(
        "peak_rss_bytes", AliasPath("memory", "peak_rss_bytes")))
    memory_budget_bytes: int | None = Field(default=None, validation_alias=AliasChoices(
        "memory_budget_bytes", AliasPath("memory", "budget_bytes")))
    memory_enforcement: Enforcement | None = Field(default=None, validation_alias=AliasChoices(
        "memory_enforcement", AliasPath("memory", "enforcement")))
    """How its memory was enforced; None when it was not measured (an older runner)."""


class EventView(Reply):
    id: int
    at: Timestamp
    kind: str
    from_status: JobStatus | None
    to_status: JobStatus | None
    attempt: int | None
    detail: dict[str, Any]


class JobDetail(JobView):
    """One job with its attempts and its whole event history, and what its last ended
    attempt said: its outcome, the job's own result ($HERDER_RESULT) and its cost."""

    outcome: Outcome | None = None
    result: dict[str, Any] | None = None
    cost_usd: float | None = None
    launch_error: str | None = None
    """Why its last ended attempt could not start (the OS error), if it could not."""
    attempts: list[AttemptView]
    events: list[EventView]

    @classmethod
    def of_history(cls, job: Job, attempts: Sequence[Attempt], events: Sequence[Event]
           ) -> JobDetail:
        finished = [e for e in events if e.kind == "finished"]
        last = dict(finished[-1].detail) if finished else {}
        ended = [a for a in attempts if a.outcome is not None]
        result = last.get("result")
        cost = last.get("cost_usd")
        launch = last.get("launch_error")
        return cls(**dict(JobView.model_validate(job)),
                   outcome=ended[-1].outcome if ended else None,
                   result=result if isinstance(result, dict) else None,
                   cost_usd=cost if isinstance(cost, int | float) else None,
                   launch_error=launch if isinstance(launch, str) else None,
                   attempts=[AttemptView.model_validate(one) for one in attempts],
                   events=[EventView.model_validate(one) for one in events])


class Why(Reply):
    id: int
    why: str


class Cancelled(Reply):
    """The job's status once the cancel was recorded (a running job stops soon after)."""

    id: int
    status: JobStatus


class Retried(Reply):
    """`retried` is False when the job was not done, failed or cancelled (`status` says)."""

    id: int
    retried: bool
    status: JobStatus


class DedupHolder(Reply):
    """`herder should-dispatch`: the job holding a dedup key, or none (dispatch)."""

    key: str
    job_id: int | None = None
    status: JobStatus | None = None


class DispatchCheckBody(Body):
    """`herder should-dispatch KEY --type T -p field=value`: run T's dispatch_check (its
    values are checked again by `herder.dispatch_check.check_payload`)."""

    job_type: str = Field(min_length=1, max_length=NAME_LENGTH)
    dedup_key: str = Field(min_length=1, max_length=DEDUP_KEY_LENGTH, pattern=r"^[^\x00]*$")
    payload: dict[str, str] = Field(default_factory=dict, max_length=64)


class DispatchChecked(Reply):
    """The check's word: skip (with its reason), dispatch, or `error` (it failed)."""

    skip: bool = False
    reason: str | None = None
    error: str | None = None

