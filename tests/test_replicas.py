"""`herder server` replicas over one PostgreSQL: one leads and places; the others hear of
its placements through the store's NOTIFY, so agents long-polling a follower (and its ssh
launcher) are woken at once, not at the end of their long-poll."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from support.coordinator import coordinator_in
from support.waits import wait_for

from herder.core.model import HostRecord, JobSpec, JobStatus
from herder.runtime.coordinator import Coordinator
from herder.store import open_store


def replica(folder, store, label: str) -> Coordinator:  # type: ignore[no-untyped-def]
    return coordinator_in(folder, store, label, fleet={"scheduler_interval": "0.1s"})


@pytest.mark.postgres
def test_a_follower_hears_of_the_leaders_placements(tmp_path, postgres_url):
    with open_store(postgres_url) as leader_store, open_store(postgres_url) as follower_store:
        leader = replica(tmp_path / "a", leader_store, "server-a")
        follower = replica(tmp_path / "b", follower_store, "server-b")
        heard: list[set[str]] = []
        woken = threading.Event()

        def listener(hosts: set[str]) -> None:
            heard.append(set(hosts))
            woken.set()

        follower.assignment_listeners.append(listener)
        leader.start()
        try:
            wait_for(lambda: leader.is_leader, 30, "the first replica to lead")
            follower.start()
            try:
                wait_for(follower.relay.listening.is_set, 30, "the follower to listen",
                         follower.reads.health_view)
                assert not follower.is_leader and heard == []
                now = datetime.now(UTC)
                leader_store.host_insert(HostRecord("agent-host", 16.0), now)
                leader_store.host_heartbeat("agent-host", now, {})
                [inserted] = leader_store.job_insert([JobSpec(command=("true",))], now)
                leader.poke()
                wait_for(woken.is_set, 30, "the follower to hear of the placement",
                         leader.reads.health_view)
                assert {"agent-host"} in heard
                job = leader_store.job_get(inserted.job_id)
                assert job is not None and (job.status, job.host) == (
                    JobStatus.CLAIMED, "agent-host")
            finally:
                follower.stop()
        finally:
            leader.stop()
