"""The runner's collaborators on their own: its retried steps and its leases (the loop's
use of them is what test_runner, test_runner_faults and test_fence drive end to end)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from herder.core.model import AttemptToken
from herder.core.settings.sections import RuntimeSection
from herder.runtime.leases import Leases
from herder.runtime.sources import WorkSource
from herder.runtime.steps import BUSY_TICK, Steps


def test_a_failed_step_backs_off_alone_and_a_success_resets_it():
    steps = Steps()

    def fail() -> int:
        raise ConnectionError("store away")

    assert steps.call("claim", fail, 100.0) is None
    due = steps.retry("claim").due
    assert due > 100.0 and steps.due(100.0) == [due]
    calls: list[str] = []
    assert steps.call("claim", lambda: calls.append("claim") or 1, 100.0) is None
    assert calls == []  # still backing off
    assert steps.call("heartbeat", lambda: 2, 100.0) == 2  # the other steps go on
    assert steps.call("claim", lambda: 3, due) == 3
    assert steps.retry("claim").due == 0.0 and steps.due(due) == []


class Source(WorkSource):
    """Records the backstops; its heartbeat fails (the store is away). Leases call no other
    method of a source."""

    def __init__(self, lease_seconds: float | None = None) -> None:
        self.lease_seconds = lease_seconds
        self.published: list[dict[str, float]] = []

    def leases(self, deadlines: Mapping[str, float]) -> None:
        self.published.append(dict(deadlines))

    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> Any:
        raise ConnectionError("store away")

    def take(self, free: int, now: datetime) -> Any:
        raise NotImplementedError

    def started(self, *args: Any) -> Any:
        raise NotImplementedError

    def finished(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def cancel_requested(self, job_ids: Sequence[int]) -> Any:
        raise NotImplementedError

    def idle(self) -> Any:
        raise NotImplementedError

    def waker(self) -> Any:
        raise NotImplementedError


def leases_of(source: Source, runtime: RuntimeSection) -> Leases:
    return Leases(source, runtime, {}, Steps(), lambda: datetime(2026, 1, 1, tzinfo=UTC))


def test_the_lease_is_the_servers_when_it_says_and_the_margin_fits_inside_it():
    runtime = RuntimeSection(attempt_lease=60.0, fence_margin=10.0)
    assert leases_of(Source(), runtime).lease() == (60.0, 10.0)
    assert leases_of(Source(lease_seconds=8.0), runtime).lease() == (8.0, 2.0)


def test_a_starting_attempts_backstop_is_half_a_margin_before_its_lease_ends():
    source = Source()
    leases = leases_of(source, RuntimeSection(attempt_lease=60.0, fence_margin=10.0))
    leases.publish({"marker": 100.0})
    assert source.published == [{"marker": 155.0}]


def test_a_failed_heartbeat_is_retried_well_before_the_next_interval():
    runtime = RuntimeSection(attempt_lease=60.0, heartbeat_interval=10.0)
    leases = leases_of(Source(), runtime)
    leases.renew(100.0)
    assert 100.0 + BUSY_TICK <= leases.next_renewal < 110.0
