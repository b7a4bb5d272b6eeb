"""Loop heartbeats and what the server does with them: /healthz turns unhealthy when a loop
is stale or its thread is gone, and a leader whose scheduler cannot complete a cycle gives up
the lease so a replica can take over."""

from __future__ import annotations

import threading

import pytest
from support.coordinator import coordinator_in
from support.waits import wait_for

from herder.core.errors import StoreUnavailable
from herder.runtime.coordinator import Coordinator
from herder.runtime.loop_health import LoopRegistry, LoopState, assess, stale_after


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stale_after_scales_with_the_interval_above_a_floor():
    assert stale_after(1.0) == 30.0
    assert stale_after(10.0) == 100.0
    assert stale_after(0.2, floor=0.5) == 2.0


def test_a_loop_is_judged_from_its_start_until_its_first_success():
    state = LoopState("scheduler", 1.0, 30.0, started=100.0)
    assert assess(state, 130.0).ok
    assert not assess(state, 130.5).ok
    fresh = assess(LoopState("scheduler", 1.0, 30.0, started=0.0, last_success=125.0), 130.5)
    assert fresh.ok and fresh.age_seconds == pytest.approx(5.5)


def test_registry_tracks_success_failure_and_an_ended_thread():
    clock = Clock()
    registry = LoopRegistry(clock)
    loop = registry.register("heartbeat:a", 1.0)
    clock.now += 20
    loop.failed(StoreUnavailable("the database is unavailable: secret detail"))
    report = loop.report()
    assert report.ok and report.failures == 1
    assert report.last_error == "StoreUnavailable", "only the type: messages may hold secrets"
    clock.now += 11
    assert not registry.healthy()
    loop.succeeded()
    assert registry.healthy() and loop.report().failures == 0
    loop.ended()
    assert not registry.healthy() and registry.reports()[0].ended
    registry.unregister("heartbeat:a")
    assert registry.healthy() and registry.reports() == []


# -- the coordinator, in process, on a real store -------------------------------------------


def coordinator_on(tmp_path, store) -> Coordinator:  # type: ignore[no-untyped-def]
    # Stale after 0.5 s, not 30.
    return coordinator_in(tmp_path, store, "test-host", stale_after=0.5,
                          fleet={"scheduler_interval": "0.05s"})


def test_a_stuck_leader_gives_up_the_lease_and_reports_unhealthy(tmp_path, store):
    coordinator = coordinator_on(tmp_path, store)
    fatal = threading.Event()
    coordinator.on_fatal = fatal.set
    failing = threading.Event()
    healthy_cycle = coordinator.scheduler.run_once

    def run_once(now):  # type: ignore[no-untyped-def]
        if failing.is_set():
            raise StoreUnavailable("the database is unavailable: injected")
        return healthy_cycle(now)

    coordinator.scheduler.run_once = run_once  # type: ignore[method-assign]
    other = store.leader_lease()
    coordinator.start()
    try:
        wait_for(lambda: coordinator.is_leader, 20, "the coordinator to lead")
        assert coordinator.reads.health_view()["ok"]
        failing.set()
        # Stale after 0.5 s without a cycle: unhealthy, and the lease is free for a replica.
        wait_for(lambda: not coordinator.reads.health_view()["ok"], 20,
                 "/healthz to turn unhealthy", coordinator.reads.health_view)
        wait_for(other.try_acquire, 20, "a replica to get the lease", coordinator.reads.health_view)
        view = coordinator.reads.health_view()
        assert view["loops"]["scheduler"]["last_error"] == "StoreUnavailable"
        assert not fatal.is_set(), "a store error is ridden out, not fatal"
        # The replica leads; the old leader's loop, now a follower, works and heals.
        failing.clear()
        wait_for(lambda: coordinator.reads.health_view()["ok"], 20, "/healthz to be ok again",
                 coordinator.reads.health_view)
        assert not coordinator.is_leader
        other.release()
        wait_for(lambda: coordinator.is_leader, 30, "the coordinator to lead again")
    finally:
        other.release()
        coordinator.stop()
    assert not fatal.is_set()


def test_a_server_thread_that_ends_takes_the_process_down(tmp_path, store):
    coordinator = coordinator_on(tmp_path, store)
    fatal = threading.Event()
    coordinator.on_fatal = fatal.set

    def crash() -> None:
        raise RuntimeError("a bug in a loop")

    coordinator._spawn(crash, "herder-test-loop")
    wait_for(fatal.is_set, 20, "the fatal hook")
    view = coordinator.reads.health_view()
    assert not view["ok"] and view["fatal"] == (
        "thread herder-test-loop ended while the server was running")
    coordinator.stop()


def test_a_thread_ending_at_shutdown_is_not_fatal(tmp_path, store):
    coordinator = coordinator_on(tmp_path, store)
    fatal = threading.Event()
    coordinator.on_fatal = fatal.set
    coordinator.start()
    wait_for(lambda: coordinator.reads.health_view()["loops"].get("scheduler"), 20,
             "the scheduler loop to register")
    coordinator.stop()
    assert not fatal.is_set() and coordinator.fatal is None
