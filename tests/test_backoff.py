"""The shared retry delay: capped, exponential, fully jittered."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.core.backoff import Backoff, full_jitter


def upper(low: float, high: float) -> float:
    return high


@given(st.integers(min_value=1, max_value=10_000), st.floats(0.001, 100), st.floats(0.001, 1e4))
def test_delay_never_exceeds_the_cap_or_goes_negative(attempt, base, cap):
    delay = full_jitter(attempt, base, cap)
    assert 0.0 <= delay <= min(cap, base * 2 ** min(attempt - 1, 62)) + 1e-9


def test_ceiling_doubles_until_the_cap():
    assert [full_jitter(n, 0.5, 3.0, upper) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_spreads_the_delays():
    delays = {full_jitter(8, 1.0, 60.0) for _ in range(50)}
    assert len(delays) > 40
    assert min(delays) < 30.0 < max(delays)


def test_attempt_counts_from_one():
    with pytest.raises(ValueError):
        full_jitter(0, 1.0, 2.0)


def test_backoff_grows_and_resets():
    backoff = Backoff(base=1.0, cap=100.0, draw=upper)
    assert [backoff.next() for _ in range(3)] == [1.0, 2.0, 4.0]
    backoff.reset()
    assert backoff.next() == 1.0


def test_wait_returns_early_when_stopped():
    stop = threading.Event()
    stop.set()
    assert Backoff(base=100.0, cap=100.0).wait(stop) is True
