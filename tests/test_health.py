"""Host health from heartbeat age (seed 003 thresholds)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.core.scheduling.health import (
    HealthThresholds,
    HostHealth,
    HostLiveness,
    Liveness,
    LivenessChange,
    LivenessState,
    accepts_work,
    agent_down,
    down_reason,
    host_health,
    host_liveness,
    liveness_changes,
    shown_health,
)

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


# -- liveness of hosts whose agent heartbeats ---------------------------------------------

LIVENESS = Liveness(heartbeat_interval_seconds=10, missed_heartbeats=3)


@pytest.mark.parametrize(
    ("age_seconds", "live"),
    [(0, True), (29.9, True), (30, False), (299, False), (-30, True)],
)
def test_an_agent_is_live_until_it_misses_its_heartbeats(age_seconds, live):
    down = agent_down(NOW - timedelta(seconds=age_seconds), {"worker": "a/1/2"}, NOW, LIVENESS)
    assert (down is None) is live
    if not live:
        assert down == f"agent down: no heartbeat for {age_seconds:.1f}s (3 missed)"
    # the display health still says healthy: the cron-era thresholds are far longer
    assert host_health(NOW - timedelta(seconds=age_seconds), NOW) is HostHealth.HEALTHY


def test_an_agent_that_stopped_or_was_reported_gone_is_not_live_however_fresh():
    fresh = NOW - timedelta(seconds=1)
    assert agent_down(fresh, {"stopped": True}, NOW, LIVENESS) == "agent stopped"
    assert agent_down(fresh, {"stopped": True, "gone": "a/1/2"}, NOW, LIVENESS) == (
        "agent gone: its guardian reported it dead")
    assert agent_down(None, {}, NOW, LIVENESS) == "agent never heartbeated"


def test_an_agent_advertising_a_slower_heartbeat_gets_its_own_window():
    info = {"heartbeat_interval": 30}
    assert agent_down(NOW - timedelta(seconds=60), info, NOW, LIVENESS) is None
    assert agent_down(NOW - timedelta(seconds=90), info, NOW, LIVENESS) is not None
    # a faster or malformed one never shortens the server's window
    for odd in (1, True, "30", None):
        assert agent_down(NOW - timedelta(seconds=20), {"heartbeat_interval": odd}, NOW,
                          LIVENESS) is None


@given(st.floats(-1e6, 1e7), st.floats(-1e6, 1e7))
def test_liveness_only_worsens_with_age(first, second):
    younger, older = sorted((first, second))
    young = agent_down(NOW - timedelta(seconds=younger), {}, NOW, LIVENESS)
    old = agent_down(NOW - timedelta(seconds=older), {}, NOW, LIVENESS)
    assert young is None or old is not None


# -- liveness as `herder hosts` shows it ------------------------------------------------------

AGENT = {"worker": "alpha/10/20"}
TEN_BY_THREE = Liveness(heartbeat_interval_seconds=10, missed_heartbeats=3)


@pytest.mark.parametrize(
    ("age_seconds", "state", "missed"),
    [
        (0, LivenessState.LIVE, 0),
        (9.9, LivenessState.LIVE, 0),
        (10, LivenessState.LATE, 1),
        (29.9, LivenessState.LATE, 2),
        (30, LivenessState.DOWN, 3),  # the very age at which placement stops using it
        (600, LivenessState.DOWN, 60),
        (-5, LivenessState.LIVE, 0),
    ],
)
def test_an_agent_host_is_late_after_one_missed_beat_and_down_by_placements_rule(
        age_seconds, state, missed):
    beat = NOW - timedelta(seconds=age_seconds)
    liveness = host_liveness(beat, AGENT, HostHealth.HEALTHY, NOW, TEN_BY_THREE)
    assert liveness == HostLiveness(state, missed)
    # the same boundary as placement's: down exactly when agent_down says why
    assert (state is LivenessState.DOWN) == (agent_down(beat, AGENT, NOW, TEN_BY_THREE)
                                             is not None)


def test_liveness_words_name_the_missed_heartbeats():
    assert HostLiveness(LivenessState.LIVE).describe() == "live"
    assert HostLiveness(LivenessState.LATE, 1).describe() == "missed 1 heartbeat"
    assert HostLiveness(LivenessState.LATE, 2).describe() == "missed 2 heartbeats"
    assert HostLiveness(LivenessState.DOWN, 7).describe() == "down"
    assert HostLiveness(LivenessState.UNKNOWN).describe() == "never seen"


def test_a_stopped_agent_is_stopped_a_dead_one_down_and_a_slower_one_has_its_interval():
    fresh = NOW - timedelta(seconds=1)
    stopped = host_liveness(fresh, {**AGENT, "stopped": True}, HostHealth.HEALTHY, NOW,
                            TEN_BY_THREE)
    assert stopped.state is LivenessState.STOPPED
    gone = host_liveness(fresh, {**AGENT, "stopped": True, "gone": True}, HostHealth.HEALTHY,
                         NOW, TEN_BY_THREE)
    assert gone.state is LivenessState.DOWN  # its guardian reported it dead
    slow = {**AGENT, "heartbeat_interval": 60}
    assert host_liveness(NOW - timedelta(seconds=100), slow, HostHealth.HEALTHY, NOW,
                         TEN_BY_THREE) == HostLiveness(LivenessState.LATE, 1)


def test_hosts_without_an_agent_go_by_their_health():
    beat = NOW - timedelta(seconds=100)
    assert host_liveness(beat, None, HostHealth.DEGRADED, NOW,
                         TEN_BY_THREE).state is LivenessState.LIVE
    assert host_liveness(beat, None, HostHealth.DOWN, NOW,
                         TEN_BY_THREE).state is LivenessState.DOWN
    assert host_liveness(None, None, HostHealth.UNKNOWN, NOW,
                         TEN_BY_THREE).state is LivenessState.UNKNOWN


def test_down_reason_is_the_agents_word_or_the_silence():
    assert down_reason(NOW, HostHealth.HEALTHY, None, NOW) is None
    assert down_reason(NOW, HostHealth.HEALTHY,
                       "agent down: no heartbeat for 35.0s (3 missed)", NOW) == (
        "no heartbeat for 35.0s (3 missed)")
    assert down_reason(NOW, HostHealth.HEALTHY, "agent stopped", NOW) == "agent stopped"
    assert down_reason(NOW - timedelta(seconds=1000), HostHealth.DOWN, None, NOW) == (
        "no heartbeat for 1000s")
    assert down_reason(None, HostHealth.UNKNOWN, None, NOW) == "never heartbeated"


def test_liveness_changes_are_transitions_between_cycles_only():
    assert liveness_changes({}, {"a": "no heartbeat for 40s", "b": None}) == []  # baseline
    previous = {"a": None, "b": "agent stopped", "c": None, "d": "x"}
    current = {"a": "no heartbeat for 31s", "b": None, "c": None, "d": "y", "e": "never"}
    assert liveness_changes(previous, current) == [
        LivenessChange("a", "no heartbeat for 31s"), LivenessChange("b", None)]
    assert liveness_changes(current, current) == []


@pytest.mark.parametrize(("health", "liveness", "shown"), [
    (HostHealth.HEALTHY, HostLiveness(LivenessState.LIVE), HostHealth.HEALTHY),
    (HostHealth.HEALTHY, HostLiveness(LivenessState.LATE, 1), HostHealth.DEGRADED),
    (HostHealth.HEALTHY, HostLiveness(LivenessState.DOWN, 7), HostHealth.DOWN),
    (HostHealth.HEALTHY, HostLiveness(LivenessState.STOPPED), HostHealth.DOWN),
    (HostHealth.DEGRADED, HostLiveness(LivenessState.LATE, 2), HostHealth.DEGRADED),
    (HostHealth.DOWN, HostLiveness(LivenessState.DOWN), HostHealth.DOWN),
    (HostHealth.UNKNOWN, HostLiveness(LivenessState.UNKNOWN), HostHealth.UNKNOWN),
])
def test_shown_health_is_never_healthier_than_placements_liveness(health, liveness, shown):
    assert shown_health(health, liveness) is shown
