"""What a runner holds between an attempt's end and its recording: the result, retried on its
own backoff until the store or server takes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from herder.core.backoff import Backoff
from herder.core.model import LAUNCH_ERROR_CHARS, Job, Outcome
from herder.runtime.endings import Ending


@dataclass
class Retry:
    """When a failed call may be tried again (capped exponential backoff, full jitter)."""

    due: float = 0.0
    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.25, cap=5.0))

    def ready(self, now: float) -> bool:
        return now >= self.due

    def failed(self, now: float, cap: float | None = None) -> float:
        delay = self.backoff.next()
        if cap is not None:
            delay = min(delay, cap)
        self.due = now + delay
        return delay

    def succeeded(self) -> None:
        self.backoff.reset()
        self.due = 0.0


@dataclass
class Result:
    """An ended attempt (or one that could not be launched) whose result is not recorded."""

    job: Job
    outcome: Outcome
    exit_code: int | None
    retry: Retry = field(default_factory=Retry)
    ending: Ending | None = None
    """The log's tail and $HERDER_RESULT, for an attempt that ran."""


def launch_failed(job: Job, error: str) -> Result:
    """An attempt that never started, with why in the OS's words."""
    return Result(job, Outcome.LAUNCH_FAILED, None,
                  ending=Ending(launch_error=error[:LAUNCH_ERROR_CHARS]))
