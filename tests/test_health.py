"""Host health from heartbeat age (seed 003 thresholds)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.scheduling.health import HealthThresholds, HostHealth, accepts_work, host_health

NOW = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("age_seconds", "health"),
    [
        (0, HostHealth.HEALTHY),
        (299.9, HostHealth.HEALTHY),
        (300, HostHealth.DEGRADED),
        (899.9, HostHealth.DEGRADED),
        (900, HostHealth.DOWN),
        (86_400, HostHealth.DOWN),
        (-30, HostHealth.HEALTHY),  # clock skew: a heartbeat from the future is fresh
    ],
)
def test_default_thresholds(age_seconds, health):
    assert host_health(NOW - timedelta(seconds=age_seconds), NOW) == health


def test_never_seen_is_unknown_not_down():
    assert host_health(None, NOW) == HostHealth.UNKNOWN


def test_thresholds_are_configurable():
    tight = HealthThresholds(degraded_after_seconds=10, down_after_seconds=20)
    assert host_health(NOW - timedelta(seconds=15), NOW, tight) == HostHealth.DEGRADED
    assert host_health(NOW - timedelta(seconds=20), NOW, tight) == HostHealth.DOWN


def test_degraded_still_accepts_work_down_and_unknown_do_not():
    assert {health for health in HostHealth if accepts_work(health)} == {
        HostHealth.HEALTHY, HostHealth.DEGRADED,
    }


@given(st.floats(-1e6, 1e7), st.floats(-1e6, 1e7))
def test_health_only_worsens_with_age(first, second):
    order = [HostHealth.HEALTHY, HostHealth.DEGRADED, HostHealth.DOWN]
    younger, older = sorted((first, second))
    young = host_health(NOW - timedelta(seconds=younger), NOW)
    old = host_health(NOW - timedelta(seconds=older), NOW)
    assert order.index(young) <= order.index(old)
