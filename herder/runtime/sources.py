"""Where a runner gets attempts from and where it reports them.

The runner loop (process trees, timeouts, cancels, heartbeats) is the same everywhere; only
the source differs: `herder up` claims straight from the store, a `local` host under
`herder server` takes what the scheduler placed on it, and `herder agent` talks HTTP.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from herder.config import Settings
from herder.model import AttemptResult, AttemptToken, HeartbeatReply, Job, JobStatus, Outcome
from herder.runtime.guardian import GuardianLink
from herder.runtime.maintenance import Rescuer
from herder.scheduling.policy import RetryState, decide
from herder.store import Store, Waker


@dataclass(frozen=True, slots=True)
class PolicyLimits:
    max_lost: int
    max_spawn_failures: int
    spawn_backoff_seconds: float

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyLimits:
        return cls(settings.runtime.max_lost, settings.fleet.max_spawn_failures,
                   settings.fleet.spawn_backoff)


def decide_for(
    job: Job, outcome: Outcome, now: datetime, limits: PolicyLimits,
    retry_after: float | None = None,
) -> AttemptResult:
    """The policy decision for one ended attempt of `job`, as the store applies it."""
    state = RetryState(job.failures, job.lost, job.max_attempts, job.backoff_base_seconds,
                       job.backoff_max_seconds, job.spawn_failures)
    decision = decide(outcome, state, now, limits.max_lost, retry_after=retry_after,
                      max_spawn_failures=limits.max_spawn_failures,
                      spawn_backoff_seconds=limits.spawn_backoff_seconds)
    return AttemptResult(job.token, outcome, None, decision)


class WorkSource(abc.ABC):
    worker: str = ""
    guardian: GuardianLink | None = None
    """This process's guardian (`herder.runtime.guardian`), when it has one."""
    lease_seconds: float | None = None
    """The lease the other side enforces, when it says (the server's); else the runner's
    own `attempt_lease`."""

    def attach(self, worker: str) -> None:
        """The runner's identity (host/pid/start time), recorded on every attempt."""
        self.worker = worker

    @abc.abstractmethod
    def take(self, free: int, now: datetime) -> list[Job]:
        """Up to `free` attempts to start now (already claimed for this runner)."""

    @abc.abstractmethod
    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        """False when the attempt was fenced out before it started; an exception means
        "not recorded yet" (the runner retries it, the process stays supervised)."""

    @abc.abstractmethod
    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        """Renew the attempts' leases; raise when they could not be renewed (the runner
        stops them before their lease ends if that lasts)."""

    @abc.abstractmethod
    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None,
    ) -> JobStatus | None:
        """Report an ended attempt; None when its result was rejected (fenced out)."""

    @abc.abstractmethod
    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]: ...

    @abc.abstractmethod
    def idle(self) -> bool:
        """True when nothing is queued, claimed or running anywhere this source serves."""

    @abc.abstractmethod
    def waker(self) -> Waker: ...

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def asked_at(self, token: AttemptToken) -> float | None:
        """When (monotonic) the request that brought this attempt left, if it came in
        ahead of `take` (a long-poll); None means "when `take` was called"."""
        return None

    def fenced_out(self) -> set[AttemptToken]:
        """Attempts the other side has said are no longer live since the last call."""
        return set()

    def leases(self, deadlines: Mapping[str, float]) -> None:
        """The running attempts' backstop deadlines (attempt marker -> monotonic seconds),
        after each change, for the guardian that outlives a frozen runner."""
        if self.guardian is not None:
            self.guardian.publish(self.worker, deadlines)

    def maintain(self, now: datetime) -> None:
        """Periodic upkeep (rescuing orphans); nothing by default."""

    def close(self) -> None:
        """Release what the source holds."""


class StoreSource(WorkSource):
    """Shared by the store-backed sources: reports go straight to the store."""

    def __init__(self, store: Store, host: str, limits: PolicyLimits, rescuer: Rescuer) -> None:
        self.store = store
        self.host = host
        self.limits = limits
        self.rescuer = rescuer

    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        return self.store.attempt_start(token, pid, log_path, now)

    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        return self.store.attempt_heartbeat(tokens, now)

    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None,
    ) -> JobStatus | None:
        result = decide_for(job, outcome, now, self.limits, retry_after)
        result = AttemptResult(result.token, result.outcome, exit_code, result.decision)
        applied = self.store.attempt_finish([result], now)
        return applied[0][1] if applied else None

    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        return self.store.job_cancel_requested(job_ids)

    def waker(self) -> Waker:
        return self.store.listen()

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def maintain(self, now: datetime) -> None:
        self.rescuer.run_once(now)
        self.store.statistics_refresh()


class ClaimSource(StoreSource):
    """`herder up`: claim due jobs in priority order with SKIP LOCKED / BEGIN IMMEDIATE."""

    def take(self, free: int, now: datetime) -> list[Job]:
        return self.store.job_claim(self.host, self.worker, free, now)

    def idle(self) -> bool:
        return not any(self.store.job_counts().values())


class AssignmentSource(StoreSource):
    """A `local` host under `herder server`: run what the scheduler placed on this host."""

    def take(self, free: int, now: datetime) -> list[Job]:
        jobs = self.store.attempt_list_assigned(self.host, free)
        return [job for job in jobs
                if self.store.attempt_set_worker(job.token, self.worker, now)]

    def idle(self) -> bool:
        return not any(self.store.job_counts().values())
