"""`herder server` serves its `local` hosts itself, and follows the store while it runs: a
local host added after the start is served (its runner, heartbeat and probes), one removed
is stopped and leaves the health report, and neither is fatal."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

from msgspec.structs import replace
from support.waits import wait_for

from herder.client import Client
from herder.config import load_config
from herder.model import HostRecord, JobStatus, Transport
from herder.runtime.coordinator import Coordinator
from herder.runtime.loop_health import LoopRegistry

LOCAL = HostRecord(label="late", ram_total_gb=8, transport=Transport.LOCAL,
                   prime_max_workers=2, night_max_workers=2)


def coordinator_on(tmp_path, store) -> Coordinator:  # type: ignore[no-untyped-def]
    path = tmp_path / "herder.toml"
    path.write_text(f'[herder]\nlog_dir = "{tmp_path}/logs"\n'
                    '[fleet]\nscheduler_interval = "0.05s"\n'
                    '[runtime]\nheartbeat_interval = "1s"\npoll_interval = "0.2s"\n')
    coordinator = Coordinator(store, load_config(path), host="server-host")
    coordinator.loops = LoopRegistry(floor_seconds=30)
    return coordinator


def threads_of(label: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith(f"-{label}")]


def test_a_local_host_added_while_running_is_served_then_stopped_when_removed(tmp_path, store):
    coordinator = coordinator_on(tmp_path, store)
    fatal = threading.Event()
    coordinator.on_fatal = fatal.set
    coordinator.start()
    try:
        loops = lambda: set(coordinator.health_view()["loops"])  # noqa: E731
        assert "local-hosts" in loops() and "heartbeat:late" not in loops()

        store.host_insert(LOCAL, datetime.now(UTC))
        wait_for(lambda: "heartbeat:late" in loops(), 30, "the new local host to be served",
                 coordinator.health_view)
        assert sorted(threads_of("late")) == [
            "herder-heartbeat-late", "herder-local-late", "herder-probes-late"]

        client = Client.over(store, coordinator.config)
        job_id = client.submit(command=["true"], affinity="late", check_command=False).job_id
        job = wait_for(lambda: (j := store.job_get(job_id)) and not j.status.active and j, 60,
                       "the job on the new host to end", coordinator.health_view)
        assert (job.status, job.host) == (JobStatus.DONE, "late")

        client.host_remove("late")
        wait_for(lambda: not threads_of("late"), 30, "the removed host's threads to end",
                 threading.enumerate)
        assert "heartbeat:late" not in loops()
        assert coordinator.health_view()["ok"], coordinator.health_view()
        assert not fatal.is_set() and coordinator.fatal is None
    finally:
        coordinator.stop()
    assert not fatal.is_set()


def test_sync_starts_and_stops_by_transport(tmp_path, store):
    """A host switched from local to agent is no longer served here; back to local, it is
    again. Each pass says what it did."""
    coordinator = coordinator_on(tmp_path, store)
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    coordinator.start()
    try:
        assert "late" in coordinator._local
        assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 0}
        store.host_update(replace(LOCAL, transport=Transport.AGENT), now)
        assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 1}
        wait_for(lambda: not threads_of("late"), 30, "the host's threads to end")
        store.host_update(LOCAL, now)
        assert coordinator.sync_local_hosts() == {"started": 1, "stopped": 0}
        assert "late" in coordinator._local
    finally:
        coordinator.stop()
    assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 0}
    wait_for(lambda: not threads_of("late"), 30, "every thread to end at stop")
