"""The coordinator is composition: its parts (leader, local hosts, relay, agent service, read
models) share one `ServerState`, so what one changes the others see; and they load nothing
of the services layer or the API."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.coordinator import coordinator_in

from herder.core.backoff import Backoff
from herder.core.errors import StoreUnavailable
from herder.runtime.loop_health import LoopRegistry
from herder.runtime.server_state import ServerState, run_cycle

ENGINE_PARTS = ["herder.runtime.leader", "herder.runtime.local_hosts", "herder.runtime.relay",
                "herder.runtime.agent_service", "herder.runtime.read_models"]
SERVICES = ["herder.client", "herder.remote", "herder.intake", "herder.views",
            "herder.webhooks", "herder.dispatch_check", "herder.services", "herder.api",
            "fastapi"]


def test_the_parts_share_one_state(tmp_path, store):
    coordinator = coordinator_in(tmp_path, store, "here")
    coordinator.is_leader = True
    assert coordinator.state.is_leader and coordinator.reads.health_view()["leader"]
    assert coordinator.leader.state is coordinator.relay.state is coordinator.state
    registry = LoopRegistry(floor_seconds=0.5)
    coordinator.loops = registry  # the parts register their loops in the registry in use
    coordinator.loops.register("probe", 1.0)
    assert list(coordinator.reads.health_view()["loops"]) == ["probe"]
    heard: list[set[str]] = []
    coordinator.assignment_listeners.append(heard.append)
    coordinator.scheduler.on_assigned({"a"})  # the scheduler tells every listener
    assert heard == [{"a"}]


def test_a_loop_cycle_reports_its_failure_and_backs_off():
    loop = LoopRegistry().register("probe", 1.0)
    # The jitter's draw takes the top of its range, so the delay is the backoff's bound.
    backoff = Backoff(base=0.5, cap=4.0, draw=lambda low, high: high)

    def down() -> None:
        raise StoreUnavailable("the database is down")

    assert run_cycle(loop, backoff, "probe", down) == pytest.approx(0.5)
    assert run_cycle(loop, backoff, "probe", down) == pytest.approx(1.0)
    assert loop.report().failures == 2 and loop.report().last_error == "StoreUnavailable"
    assert run_cycle(loop, backoff, "probe", lambda: None) is None
    assert loop.report().failures == 0 and backoff.failures == 0


def test_a_listener_added_late_is_told():
    state = ServerState()
    heard: list[set[str]] = []
    state.assigned({"a"})
    state.listeners.append(heard.append)
    state.assigned({"b"})
    assert heard == [{"b"}]


@pytest.mark.parametrize("module", ENGINE_PARTS)
def test_an_engine_part_loads_nothing_above_the_runtime(module):
    script = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=True)
    loaded = set(json.loads(result.stdout))
    assert module in loaded
    assert {name for name in loaded for above in SERVICES
            if name == above or name.startswith(above + ".")} == set()
