"""What an attempt's outcome means for its job: done, retry after a backoff, or fail."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from herder.config import FleetSection, RuntimeSection
from herder.model import Decision, JobStatus, Outcome

FAILURE_REASONS = {
    Outcome.FAILED: "exit_nonzero",
    Outcome.TIMEOUT: "timeout",
    Outcome.LAUNCH_FAILED: "launch_failed",
    Outcome.LOST: "lost",
    Outcome.CANCELLED: "cancelled",
    Outcome.RAM_CONTENTION: "spawn_ram",
    Outcome.SPAWN_FAILED: "spawn_failed",
}
SPAWN_OUTCOMES = frozenset({Outcome.RAM_CONTENTION, Outcome.SPAWN_FAILED})


@dataclass(frozen=True, slots=True)
class RetryState:
    """The counters a decision needs, as they were before this attempt ended."""

    failures: int
    lost: int
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    spawn_failures: int = 0


def backoff_seconds(failures: int, base: float, cap: float) -> float:
    """Exponential backoff after the n-th failure (n >= 1): base, 2*base, 4*base ... capped."""
    if failures <= 0 or base <= 0:
        return 0.0
    exponent = min(failures - 1, 62)
    return float(min(base * (2**exponent), cap))


def decide(
    outcome: Outcome,
    state: RetryState,
    now: datetime,
    max_lost: int = RuntimeSection.max_lost,
    *,
    retry_after: float | None = None,
    max_spawn_failures: int = FleetSection.max_spawn_failures,
    spawn_backoff_seconds: float = FleetSection.spawn_backoff,
) -> Decision:
    """Map an outcome to the job's next state.

    A lost attempt (the runner died, the host vanished) is not the job's fault: it is retried
    at once and spends a separate budget, so infrastructure churn cannot fail a healthy job.
    A refusal (a host's allow-list said no) spends nothing. Spawn failures (RAM contention on
    the host, an unreachable host) spend their own counter, so host trouble never burns the
    job's attempts (seed 004: the two-counter split).
    """
    if retry_after is not None:
        retry_after = max(0.0, retry_after)
    if outcome is Outcome.REFUSED:
        delay = retry_after or 0.0
        return Decision(JobStatus.QUEUED, available_at=now + timedelta(seconds=delay))
    if outcome in SPAWN_OUTCOMES:
        reason = FAILURE_REASONS[outcome]
        if state.spawn_failures + 1 >= max_spawn_failures:
            return Decision(JobStatus.FAILED, failure_reason=reason, spend_spawn_failure=True)
        delay = spawn_backoff_seconds if retry_after is None else retry_after
        return Decision(JobStatus.QUEUED, available_at=now + timedelta(seconds=delay),
                        failure_reason=reason, spend_spawn_failure=True)
    if outcome is Outcome.OK:
        return Decision(JobStatus.DONE)
    if outcome is Outcome.CANCELLED:
        return Decision(JobStatus.CANCELLED, failure_reason=FAILURE_REASONS[outcome])
    if outcome is Outcome.LOST:
        if state.lost + 1 >= max_lost:
            return Decision(JobStatus.FAILED, failure_reason="lost", spend_lost=True)
        return Decision(JobStatus.QUEUED, available_at=now, spend_lost=True)
    failures = state.failures + 1
    reason = FAILURE_REASONS[outcome]
    if failures >= state.max_attempts:
        return Decision(JobStatus.FAILED, failure_reason=reason, spend_failure=True)
    delay = backoff_seconds(failures, state.backoff_base_seconds, state.backoff_max_seconds)
    return Decision(
        JobStatus.QUEUED,
        available_at=now + timedelta(seconds=delay),
        failure_reason=reason,
        spend_failure=True,
    )
