"""`herder server` serves its `local` hosts itself, and follows the store while it runs: a
local host added after the start is served (its runner, heartbeat and probes), one removed
is stopped and leaves the health report, and neither is fatal. Every replica serves them,
so a local attempt is rescued by its lease, not by a pid that may be another machine's."""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

from msgspec.structs import replace
from support.coordinator import coordinator_in
from support.waits import wait_for

from herder.client import Client
from herder.model import AttemptToken, HostRecord, JobSpec, JobStatus, Transport
from herder.runtime.coordinator import Coordinator
from herder.runtime.maintenance import Rescuer, WorkerId, local_worker_alive, rescue_plan
from herder.runtime.process import process_start_time

LOCAL = HostRecord(label="late", ram_total_gb=8, transport=Transport.LOCAL,
                   prime_max_workers=2, night_max_workers=2)


def coordinator_on(tmp_path, store) -> Coordinator:  # type: ignore[no-untyped-def]
    return coordinator_in(tmp_path, store, "server-host", fleet={"scheduler_interval": "0.05s"},
                          runtime={"heartbeat_interval": "1s", "poll_interval": "0.2s"})


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
        wait_for(lambda: sorted(threads_of("late")) == [
            "herder-heartbeat-late", "herder-local-late", "herder-probes-late"], 30,
            "the host's runner, heartbeat and probes threads", threading.enumerate)

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


def test_sync_follows_the_transport_and_the_workers(tmp_path, store):
    """A host switched from local to agent is no longer served here; back to local, it is
    again; its runner takes new workers as they are set. Each pass says what it did. (No
    start(): the passes here are the only ones.)"""
    coordinator = coordinator_on(tmp_path, store)
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    try:
        assert coordinator.sync_local_hosts() == {"started": 1, "stopped": 0, "resized": 0}
        assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 0, "resized": 0}
        store.host_update(replace(LOCAL, prime_max_workers=5), now)
        assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 0, "resized": 1}
        assert coordinator._local["late"].runner.options.concurrency == 5
        store.host_update(replace(LOCAL, transport=Transport.AGENT), now)
        assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 1, "resized": 0}
        wait_for(lambda: not threads_of("late"), 30, "the host's threads to end",
                 threading.enumerate)
        store.host_update(LOCAL, now)
        assert coordinator.sync_local_hosts() == {"started": 1, "stopped": 0, "resized": 0}
        assert coordinator._local["late"].runner.options.concurrency == 2
    finally:
        coordinator.stop()
    assert coordinator.sync_local_hosts() == {"started": 0, "stopped": 0, "resized": 0}
    wait_for(lambda: not threads_of("late"), 30, "every thread to end at stop",
             threading.enumerate)


def placed(store, worker: str, now: datetime) -> int:  # type: ignore[no-untyped-def]
    """A job placed on `late` and taken by `worker`."""
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], now)]
    store.job_assign("late", [(job_id, 3.0)], 2, 8.0, now)
    assert store.attempt_set_worker(AttemptToken(job_id, 1), worker, now)
    return job_id


def test_a_replica_leaves_another_machines_local_attempt_to_its_lease(store):
    """Replicas each serve the local hosts, so an attempt may run under another machine's
    server: its pid means nothing here. While its runner heartbeats, no replica rescues it;
    silent past the lease, it is requeued (its processes here, if any, killed first)."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    job_id = placed(store, f"late/{dead_pid()}/1", now)  # a runner not on this machine
    shared = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5, shared=True)
    assert shared.run_once(now + timedelta(seconds=30)) == {
        "orphaned": 0, "stale": 0, "requeued": 0, "failed": 0}
    assert store.job_get(job_id).status is JobStatus.CLAIMED
    assert shared.run_once(now + timedelta(seconds=61)) == {
        "orphaned": 1, "stale": 0, "requeued": 1, "failed": 0}
    assert store.job_get(job_id).status is JobStatus.QUEUED


def test_a_live_local_runner_silent_past_its_lease_loses_its_attempt(store):
    """Shared: even a runner alive here (wedged, its heartbeats failing) loses an attempt
    silent past the lease, which its job's processes here are killed for first."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    pid = os.getpid()
    job_id = placed(store, str(WorkerId("late", pid, process_start_time(pid) or 0)), now)
    [rescue] = rescue_plan(store.attempt_list_live(), now + timedelta(seconds=61), 60, "late",
                           local_worker_alive, shared=True)
    assert (rescue.reason, rescue.kill) == ("stale", True)
    shared = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5, shared=True)
    assert shared.run_once(now + timedelta(seconds=61))["stale"] == 1
    assert store.job_get(job_id).status is JobStatus.QUEUED


def test_up_still_requeues_its_own_orphans_at_once(store):
    """Not shared (`herder up`): a runner of this host that is gone is known at once."""
    now = datetime.now(UTC)
    store.host_insert(LOCAL, now)
    job_id = placed(store, f"late/{dead_pid()}/1", now)
    alone = Rescuer(store, "late", lease_seconds=60, kill_grace=1.0, max_lost=5)
    assert alone.run_once(now + timedelta(seconds=1))["orphaned"] == 1
    assert store.job_get(job_id).status is JobStatus.QUEUED


def dead_pid() -> int:
    """A pid with no process started 1 tick after boot here (a worker is pid and start
    time: even were this pid in use, its start time would differ)."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) - 1
