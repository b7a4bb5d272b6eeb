"""Fleet hosts and placement: hosts, assignment, the due list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
from support.store import (
    T0,
    at,
    get,
    spec,
    submit,
)

from herder.core.model import (
    AttemptResult,
    AttemptToken,
    Decision,
    HostRecord,
    JobStatus,
    Outcome,
    RunnerPresence,
    Scope,
    Transport,
)


def test_host_agent_gone_marks_only_the_dead_workers_agent_stopped(store):
    """The guardian's report stops the host only while its dead worker is the last one
    heard from: a new agent that heartbeated meanwhile is left alone."""
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    store.host_heartbeat("h1", at(1), {"worker": "h1/10/1", "gate": {"weights": None}})
    assert not store.host_agent_gone("h1", "h1/99/1")
    assert not store.host_agent_gone("nowhere", "h1/10/1")
    assert store.host_agent_gone("h1", "h1/10/1")
    host = store.host_get("h1")
    assert host is not None and host.last_heartbeat == at(1)
    assert dict(host.agent_info) == {"worker": "h1/10/1", "gate": {"weights": None},
                                     "stopped": True, "gone": "h1/10/1"}
    store.host_heartbeat("h1", at(2), {"worker": "h1/11/1"})
    assert not store.host_agent_gone("h1", "h1/10/1")
    host = store.host_get("h1")
    assert host is not None and dict(host.agent_info) == {"worker": "h1/11/1"}
    # a clean stop stays a clean stop
    store.host_heartbeat("h1", at(3), {"worker": "h1/11/1", "stopped": True})
    assert not store.host_agent_gone("h1", "h1/11/1")
    store.host_heartbeat("h1", at(4), {"worker": "h1/12/1", "stopped": False})
    assert store.host_agent_gone("h1", "h1/12/1")


# -- fleet: hosts ---------------------------------------------------------------------------


FULL_HOST = HostRecord(
    "h2", ram_total_gb=64.0, ram_reserved_gb=4.0, cpus=16, enabled=False,
    transport=Transport.SSH, ssh_target="ops@h2", prime_max_workers=3, prime_max_weight="medium",
    night_max_workers=6, night_max_weight="heavy", allowed_job_types=frozenset({"ci", "agent"}),
    allowed_weights=frozenset({"light"}), priority_floor=50, labels=frozenset({"gpu", "ssd"}))


def test_host_insert_round_trips_every_field_and_refuses_a_second_insert(store):
    assert store.host_insert(FULL_HOST, at(0))
    assert not store.host_insert(HostRecord("h2", ram_total_gb=1.0), at(1))
    assert store.host_get("h2") == FULL_HOST
    assert store.host_get("nowhere") is None


def test_host_update_replaces_the_configuration_of_a_known_host_only(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    changed = HostRecord("h1", ram_total_gb=32, cpus=8, labels=frozenset({"big"}),
                         allowed_job_types=frozenset())
    assert store.host_update(changed, at(1))
    assert store.host_get("h1") == changed
    assert not store.host_update(HostRecord("nowhere", ram_total_gb=1), at(1))


def test_host_list_is_ordered_by_label_and_shows_a_live_token(store):
    for label in ("b", "a", "c"):
        store.host_insert(HostRecord(label, ram_total_gb=8), at(0))
    token_id = store.token_insert("agent-a", Scope.AGENT, "hash-a", at(0), host="a")
    assert [(h.label, h.has_token) for h in store.host_list()] == [
        ("a", True), ("b", False), ("c", False)]
    assert store.token_revoke(token_id, at(1))
    assert not any(h.has_token for h in store.host_list())


def test_host_heartbeat_stores_the_agents_report(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    assert store.host_heartbeat("h1", at(5), {"worker": "h1/10/1", "ram_free_gb": 7.5})
    host = store.host_get("h1")
    assert host is not None and host.last_heartbeat == at(5)
    assert dict(host.agent_info) == {"worker": "h1/10/1", "ram_free_gb": 7.5}
    assert not store.host_heartbeat("nowhere", at(5), {})


def test_host_remove_refuses_while_the_host_has_live_jobs(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    [job_id] = submit(store)
    [token] = store.job_assign("h1", [(job_id, 2.0)], 2, 16.0, at(1))
    assert not store.host_remove("h1")
    store.attempt_finish([AttemptResult(token, Outcome.OK, 0, Decision(JobStatus.DONE))], at(2))
    assert store.host_remove("h1")
    assert store.host_get("h1") is None
    assert not store.host_remove("h1")


def test_job_assign_books_within_workers_and_ram_and_says_where(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    ids = submit(store, spec(), spec(), spec(), spec())
    # 3 + 3 fit 6.5; the 4 GB job does not, the next 0.5 GB one does; then no worker is left.
    placed = store.job_assign("h1", [(ids[0], 3.0), (ids[1], 3.0), (ids[2], 4.0),
                                     (ids[3], 0.5)], 3, 6.5, at(1))
    assert placed == [AttemptToken(ids[0], 1), AttemptToken(ids[1], 1), AttemptToken(ids[3], 1)]
    assert store.job_assign("h1", [(ids[2], 0.0)], 3, 100.0, at(1)) == []
    assert store.job_assign("nowhere", [(ids[2], 0.0)], 3, 100.0, at(1)) == []
    assert store.job_assign("h1", [(ids[0], 0.0)], 9, 100.0, at(1)) == []  # not queued
    usage = store.host_usage(at(1))["h1"]
    assert (usage.workers, usage.jobs_gb, usage.reserved_gb) == (3, 6.5, 0.0)
    job = get(store, ids[0])
    assert (job.status, job.host, job.ram_gb, job.attempt) == (JobStatus.CLAIMED, "h1", 3.0, 1)
    placed_event = store.event_list(ids[0])[-1]
    assert (placed_event.kind, placed_event.from_status, placed_event.to_status,
            placed_event.attempt) == ("placed", JobStatus.QUEUED, JobStatus.CLAIMED, 1)
    assert dict(placed_event.detail) == {"host": "h1", "ram_gb": 3.0}


def test_an_assigned_attempt_goes_to_one_runner(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    ids = submit(store, spec(priority=5), spec(priority=1))
    tokens = store.job_assign("h1", [(ids[0], 1.0), (ids[1], 1.0)], 2, 16.0, at(1))
    assert [job.id for job in store.attempt_list_assigned("h1", 10)] == [ids[1], ids[0]]
    assert store.attempt_set_worker(tokens[0], "w1", at(2))
    assert store.attempt_set_worker(tokens[0], "w1", at(3))  # the same runner again
    assert not store.attempt_set_worker(tokens[0], "w2", at(3))
    assert not store.attempt_set_worker(AttemptToken(ids[1], 9), "w1", at(3))
    assert [job.id for job in store.attempt_list_assigned("h1", 10)] == [ids[1]]
    assert store.attempt_list_assigned("other", 10) == []


def test_only_the_hosts_live_agent_takes_a_placement(store):
    """The race of an agent's replacement: a job is placed on h1 while its agent h1/1/1 is
    being replaced by h1/2/2. The old agent's long poll, still held by the server, takes
    nothing once the new agent has heartbeated (nor after it said it stopped, nor after its
    guardian said it is gone); the new agent picks the placement up. Nothing is spent."""
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    store.host_insert(HostRecord("h2", ram_total_gb=16, prime_max_workers=2), at(0))
    ids = submit(store, spec(), spec())
    assert not store.attempt_take("h1", AttemptToken(ids[0], 1), "h1/1/1", at(1))  # unplaced
    tokens = store.job_assign("h1", [(ids[0], 1.0), (ids[1], 1.0)], 2, 16.0, at(1))
    assert not store.attempt_take("h1", tokens[0], "h1/1/1", at(1))  # never heartbeated
    store.host_heartbeat("h1", at(1), {"worker": "h1/1/1"})
    store.host_heartbeat("h2", at(1), {"worker": "h2/1/1"})
    assert not store.attempt_take("h2", tokens[0], "h2/1/1", at(1))  # another host's
    store.host_heartbeat("h1", at(2), {"worker": "h1/2/2"})  # the new agent
    assert not store.attempt_take("h1", tokens[0], "h1/1/1", at(2))  # the dead one's poll
    assert store.attempt_take("h1", tokens[0], "h1/2/2", at(3))
    assert store.attempt_take("h1", tokens[0], "h1/2/2", at(4))  # the same agent again
    live = {item.attempt.token: item for item in store.attempt_list_live("h1")}
    assert (live[tokens[0]].attempt.worker, live[tokens[0]].attempt.heartbeat_at,
            live[tokens[0]].lost) == ("h1/2/2", at(4), 0)
    assert store.attempt_start(tokens[0], 100, None, at(5))
    store.host_heartbeat("h1", at(6), {"worker": "h1/2/2", "stopped": True})  # a clean stop
    assert not store.attempt_take("h1", tokens[1], "h1/2/2", at(6))
    store.host_heartbeat("h1", at(7), {"worker": "h1/3/3"})
    assert store.host_agent_gone("h1", "h1/3/3")  # its guardian: it died
    assert not store.attempt_take("h1", tokens[1], "h1/3/3", at(8))
    assert [job.id for job in store.attempt_list_assigned("h1", 10)] == [ids[1]]


def test_an_attempt_is_adopted_only_from_its_worker_while_live_on_its_host(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16, prime_max_workers=2), at(0))
    ids = submit(store, spec(), spec())
    tokens = store.job_assign("h1", [(ids[0], 1.0), (ids[1], 1.0)], 2, 16.0, at(1))
    assert store.attempt_set_worker(tokens[0], "h1/1/1", at(2))
    assert store.attempt_start(tokens[0], 100, None, at(2))
    assert not store.attempt_adopt("h1", tokens[0], "h1/9/9", "h1/2/2", at(3))  # not its worker
    assert not store.attempt_adopt("h2", tokens[0], "h1/1/1", "h1/2/2", at(3))  # another host
    assert not store.attempt_adopt("h1", tokens[1], "h1/1/1", "h1/2/2", at(3))  # not that one's
    assert store.attempt_adopt("h1", tokens[0], "h1/1/1", "h1/2/2", at(3))
    assert store.attempt_adopt("h1", tokens[0], "h1/1/1", "h1/2/2", at(4))  # asked again
    live = {item.attempt.token: item.attempt for item in store.attempt_list_live("h1")}
    assert live[tokens[0]].worker == "h1/2/2"
    assert live[tokens[0]].heartbeat_at == at(4)  # the lease restarts with the adoption
    assert not store.attempt_adopt("h1", tokens[0], "h1/1/1", "h1/3/3", at(5))  # h1/2/2's now
    store.attempt_finish([AttemptResult(tokens[0], Outcome.OK, 0, Decision(JobStatus.DONE))],
                         at(6))
    assert not store.attempt_adopt("h1", tokens[0], "h1/2/2", "h1/3/3", at(7))  # ended


def test_job_list_due_lists_queued_jobs_in_claim_order(store):
    ids = submit(store, spec(priority=5, job_type="ci", weight="heavy", affinity="h1"),
                 spec(priority=1), spec(available_at=at(60)))
    due = store.job_list_due(at(1), 10)
    assert [job.id for job in due] == [ids[1], ids[0]]
    assert (due[1].priority, due[1].job_type, due[1].weight, due[1].affinity,
            due[1].created_at, due[1].available_at) == (5, "ci", "heavy", "h1", T0, T0)
    assert [job.id for job in store.job_list_due(at(60), 1)] == [ids[1]]


# -- `herder up`'s presence -----------------------------------------------------------------


def listed(store, now: datetime = T0) -> list[RunnerPresence]:
    """The presences on `now`'s clock, each checked written within the last minute by the
    database's clock, then with `now` as its last turn (to compare whole)."""
    found = store.runner_list(now)
    for presence in found:
        assert now - timedelta(minutes=1) <= presence.last_turn_at <= now, presence
    return [msgspec.structs.replace(presence, last_turn_at=now) for presence in found]


def test_a_runner_publishes_its_presence_in_one_row_per_label(store):
    first = RunnerPresence("box", "box/10/1", concurrency=3, running=0, cpus=8,
                           ram_total_gb=31.5, ram_booked_gb=0.0, ram_available_gb=20.25,
                           started_at=at(0), last_turn_at=T0)
    store.runner_publish(first)
    assert listed(store) == [first]
    later = msgspec.structs.replace(first, running=3, ram_booked_gb=12.5, ram_available_gb=None)
    store.runner_publish(later)
    other = msgspec.structs.replace(first, label="another", worker="another/3/1")
    store.runner_publish(other)
    assert listed(store) == [other, later]
    assert store.host_list() == [], "a runner's presence is not a registered host"


def test_the_database_clock_stamps_a_presence_whatever_the_runners_clock(store):
    """A runner's clock a day fast or slow decides nothing: the row's age is the
    database's measure, told on the reader's clock."""
    fast = RunnerPresence("fast", "fast/10/1", 2, 0, 4, 8.0, 0.0, None, at(0),
                          last_turn_at=datetime.now(UTC) + timedelta(days=2))
    slow = msgspec.structs.replace(fast, label="slow", worker="slow/10/1",
                                   last_turn_at=datetime.now(UTC) - timedelta(days=2))
    store.runner_publish(fast)
    store.runner_publish(slow)
    reader = at(1000)  # a reader whose clock is years off
    assert [presence.label for presence in listed(store, reader)] == ["fast", "slow"]


def test_only_the_runner_that_wrote_the_presence_removes_it(store):
    old = RunnerPresence("box", "box/10/1", 2, 0, 4, 8.0, 0.0, None, at(0), T0)
    store.runner_publish(old)
    newer = msgspec.structs.replace(old, worker="box/11/1", started_at=at(3))
    store.runner_publish(newer)  # the label restarted before the old one's clean exit ended
    assert not store.runner_remove("box", "box/10/1")
    assert listed(store) == [newer]
    assert store.runner_remove("box", "box/11/1")
    assert listed(store) == []


def test_presences_not_written_for_long_by_the_database_clock_are_forgotten(store):
    """Pruning counts by the database's clock: a runner whose clock is far ahead (the
    caller's `now` plays no part) forgets no live presence."""
    live = RunnerPresence("live", "live/10/1", 2, 0, 4, 8.0, 0.0, None, at(0),
                          last_turn_at=datetime.now(UTC) + timedelta(days=400))
    store.runner_publish(live)
    assert store.runner_prune(timedelta(days=1)) == 0
    assert store.runner_prune(timedelta(hours=1)) == 0  # written by the database just now
    assert [presence.label for presence in store.runner_list(T0)] == ["live"]
    # Not written since (a stand-in for a day passing): forgotten.
    assert store.runner_prune(timedelta(seconds=-60)) == 1
    assert store.runner_list(T0) == []
