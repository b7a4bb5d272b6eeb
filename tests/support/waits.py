"""Waiting on an observed event (a store row, a file, an HTTP answer) with a deadline.

Tests never sleep for a fixed time: they poll what they wait for, and a timeout fails with
what did not happen and, when given, the state around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from herder.core.model import Job, JobStatus

T = TypeVar("T")

INTERVAL = 0.02  # short: the wait ends soon after the event, and a check is cheap


def wait_for(
    predicate: Callable[[], T],
    timeout: float,
    what: str,
    detail: Callable[[], object] | None = None,
    interval: float = INTERVAL,
) -> T:
    """Poll `predicate` until it returns something truthy, and return that; fail clearly
    after `timeout` seconds. An exception from `predicate` ends the wait at once."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout:.0f}s waiting for {what}"
            if detail is not None:
                message += f"\n--- state ---\n{detail()}"
            raise AssertionError(message)
        time.sleep(interval)


def holds_for(
    predicate: Callable[[], bool],
    seconds: float,
    what: str,
    detail: Callable[[], object] | None = None,
    interval: float = 0.05,
) -> None:
    """Assert that `predicate` stays true for `seconds` (how a test checks that something
    does NOT happen: over a window of several scheduler cycles)."""
    deadline = time.monotonic() + seconds
    while True:
        if not predicate():
            message = f"expected {what} to hold for {seconds:.1f}s, but it stopped holding"
            if detail is not None:
                message += f"\n--- state ---\n{detail()}"
            raise AssertionError(message)
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


def wait_status(
    read: Callable[[int], Job],
    job_id: int,
    statuses: JobStatus | Iterable[JobStatus],
    timeout: float,
    detail: Callable[[], object] | None = None,
) -> Job:
    """Until `read(job_id)` is in one of `statuses`; returns that job."""
    wanted = {statuses} if isinstance(statuses, JobStatus) else set(statuses)

    def reached() -> Job | None:
        job = read(job_id)
        return job if job.status in wanted else None

    return wait_for(reached, timeout, f"job {job_id} to be {'/'.join(sorted(wanted))}", detail)
