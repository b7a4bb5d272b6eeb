"""The RAM-spike alert (seed 004: "worker RAM headroom below 4 GB for 5 minutes"): the pure
decision on a measured value and the clock; the leader's watch over the hosts in the store,
on both backends; and end to end, a real server whose host reports low RAM in its heartbeats
over HTTP, the alert delivered to a real local receiver and resolved when RAM comes back."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from support.waits import wait_for
from test_alert_delivery import Receiver, receiver  # noqa: F401  (the receiver fixture)

from herder.core.model import HostRecord
from herder.core.scheduling.alerting import LowRam, ram_spike
from herder.runtime.maintenance import RamSpikeWatch
from herder.runtime.read_models import measured_available_gb

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
HOLD = 300.0


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the decision (pure) -------------------------------------------------------------------------


def test_low_ram_opens_the_alert_only_after_the_hold_and_clears_when_it_recovers():
    first = ram_spike(3.5, None, T0, 4.0, HOLD)
    assert first == LowRam(T0, None)  # below, the clock starts, nothing opens yet
    assert ram_spike(3.9, first.below_since, at(299), 4.0, HOLD) == LowRam(T0, None)
    assert ram_spike(0.5, first.below_since, at(300), 4.0, HOLD) == LowRam(T0, True)
    assert ram_spike(4.0, T0, at(400), 4.0, HOLD) == LowRam(None, False)  # at it: recovered
    assert ram_spike(12.0, None, at(400), 4.0, HOLD) == LowRam(None, False)


def test_an_unknown_measurement_restarts_the_clock_and_changes_nothing():
    assert ram_spike(None, T0, at(1000), 4.0, HOLD) == LowRam(None, None)
    assert ram_spike(2.0, None, at(1000), 4.0, HOLD) == LowRam(at(1000), None)


def test_no_hold_opens_at_once_and_a_zero_threshold_turns_it_off():
    assert ram_spike(1.0, None, T0, 4.0, 0.0) == LowRam(T0, True)
    assert ram_spike(0.0, T0, at(9999), 0.0, HOLD) == LowRam(None, False)
    # A clock that went back (a new leader's) starts afresh rather than alerting early.
    assert ram_spike(1.0, at(50), T0, 4.0, HOLD) == LowRam(T0, None)


# -- the leader's watch, over the store -----------------------------------------------------------


def test_the_watch_raises_ram_host_while_low_for_the_hold_and_clears_it(store):
    for label in ("alpha", "beta"):
        assert store.host_insert(HostRecord(label=label, ram_total_gb=32.0), T0)
    watch = RamSpikeWatch(store, 4.0, HOLD, lambda host, now: measured_available_gb(host))

    def report(label: str, gb: float | None, seconds: float) -> None:
        info = {} if gb is None else {"mem_available_gb": gb}
        store.host_heartbeat(label, at(seconds), info)

    def open_keys() -> set[str]:
        return {alert.key for alert in store.alert_list() if alert.key.startswith("ram:")}

    report("alpha", 2.5, 0)
    report("beta", 20.0, 0)
    assert watch.run_once(at(0)) == {"low": 1, "opened": 0, "cleared": 0}
    assert watch.run_once(at(299)) == {"low": 1, "opened": 0, "cleared": 0}
    assert watch.run_once(at(300)) == {"low": 1, "opened": 1, "cleared": 0}
    (alert,) = [a for a in store.alert_list() if a.key == "ram:alpha"]
    assert "2.5 GB RAM available, below 4 GB" in alert.message
    assert watch.run_once(at(301))["opened"] == 0  # open once, not once per look
    assert open_keys() == {"ram:alpha"}

    report("alpha", 9.0, 310)
    assert watch.run_once(at(310)) == {"low": 0, "opened": 0, "cleared": 1}
    assert open_keys() == set()

    # Low again, then the host is removed while its alert is open: the alert goes with it.
    report("beta", 1.0, 400)
    watch.run_once(at(400))
    assert watch.run_once(at(700))["opened"] == 1 and open_keys() == {"ram:beta"}
    report("beta", None, 710)  # a heartbeat that says nothing of RAM: unknown, left open
    assert watch.run_once(at(710)) == {"low": 0, "opened": 0, "cleared": 0}
    assert store.host_remove("beta")
    assert watch.run_once(at(720))["cleared"] == 1 and open_keys() == set()


# -- end to end: a real server, heartbeats over HTTP, a real receiver ------------------------------


def test_a_host_low_on_ram_alerts_through_the_server_and_resolves(make_fleet, tmp_path: Path,
                                                                   sqlite_url: str,
                                                                   receiver: Receiver):  # noqa: F811
    fleet = make_fleet(tmp_path, sqlite_url, extra=(
        f'[alerts]\nurls = ["{receiver.url}"]\ninterval = "0.1s"\nretries = 0\n'
        'ram_low_gb = 4\nram_low_for = "1s"\n'))
    token = fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2",
                           "--night-workers", "2")
    fleet.start_server()
    available = {"gb": 1.5}
    stop = threading.Event()

    def heartbeats() -> None:  # the host's agent, as far as the server can tell
        while not stop.is_set():
            fleet.api("POST", "/api/v1/agent/alpha/heartbeat", token=token,
                      json={"worker": "alpha/1/1", "info": {"mem_available_gb": available["gb"]}})
            stop.wait(0.2)

    beating = threading.Thread(target=heartbeats, daemon=True)
    beating.start()
    try:
        wait_for(lambda: "herder ALERT: ram:alpha" in receiver.titles(), 60,
                 "the RAM-spike alert delivered", fleet.describe)
        (message,) = [m for m in receiver.messages if m["title"] == "herder ALERT: ram:alpha"]
        assert "1.5 GB RAM available, below 4 GB" in message["message"]
        assert any(a["key"] == "ram:alpha" for a in fleet.api("GET", "/queue").json()["alerts"])
        available["gb"] = 12.0
        wait_for(lambda: "herder RESOLVED: ram:alpha" in receiver.titles(), 60,
                 "the RAM-spike alert resolved", fleet.describe)
    finally:
        stop.set()
        beating.join(10)
    assert token not in fleet.stderr_of(fleet.server)
