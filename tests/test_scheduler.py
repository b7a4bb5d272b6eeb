"""The scheduler commits plans without ever overbooking a host, and one leader schedules."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from support.cli import herder_argv
from support.ports import free_port
from support.waits import wait_for

from herder.core.errors import Conflict
from herder.core.fleet import Fleet
from herder.core.model import AttemptToken, HostRecord, JobSpec, JobStatus, Outcome
from herder.core.scheduling.alerting import in_start_grace
from herder.core.scheduling.health import HostHealth
from herder.core.settings.fleet import FleetSection
from herder.core.settings.loading import Config
from herder.core.settings.sections import Settings
from herder.runtime.coordinator import Coordinator
from herder.runtime.maintenance import PICKUP_FENCE, PickupWatch, Rescuer
from herder.runtime.scheduler import Scheduler, take_snapshot
from herder.services.why import why
from herder.store import open_store

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)  # prime window (night is 20:00–03:00 UTC)


def test_two_schedulers_racing_never_overbook_a_host(store_url):
    """Each scheduler plans from its own snapshot; the SQL re-check under the host lock is
    what keeps the other one's stale plan from overbooking."""
    fleet = Fleet.from_settings(Settings())
    setup = open_store(store_url)
    hosts = [HostRecord("a", 20, prime_max_workers=3), HostRecord("b", 10, prime_max_workers=2)]
    for host in hosts:
        setup.host_insert(host, NOW)
        setup.host_heartbeat(host.label, NOW, {})
    weights = ["light", "heavy", "light", "playwright"] * 25
    setup.job_insert([JobSpec(command=("true",), weight=w) for w in weights], NOW)
    setup.close()

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def schedule() -> None:
        store = open_store(store_url)
        try:
            scheduler = Scheduler(store, fleet)
            barrier.wait()
            for _ in range(5):
                scheduler.run_once(NOW)
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=schedule) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors

    store = open_store(store_url)
    try:
        active = store.job_list([JobStatus.CLAIMED, JobStatus.RUNNING], 1000)
        assert active, "the schedulers placed nothing"
        for host in hosts:
            mine = [job for job in active if job.host == host.label]
            assert len(mine) <= host.prime_max_workers
            booked = sum(fleet.weights.budget(job.weight) for job in mine)
            assert booked <= fleet.bookable(host) + 1e-9, (host.label, booked)
            assert all(job.ram_gb == fleet.weights.budget(job.weight) for job in mine)
        # every placed job has exactly one attempt: nothing was placed twice
        for job in active:
            assert job.attempt == 1
            assert len(store.attempt_list(job.id)) == 1
    finally:
        store.close()


def test_a_stale_plan_cannot_overbook_because_assign_rechecks_capacity(store):
    """Two schedulers planned from the same empty snapshot: each plan alone fits host `a`
    (3 workers, 16 GB bookable), together they would not. The second commit is cut short."""
    store.host_insert(HostRecord("a", 20, prime_max_workers=3), NOW)
    ids = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",), weight="heavy") for _ in range(4)], NOW)]
    first = store.job_assign("a", [(ids[0], 8.0), (ids[1], 8.0)], 3, 16.0, NOW)
    second = store.job_assign("a", [(ids[2], 8.0), (ids[3], 8.0)], 3, 16.0, NOW)
    assert len(first) == 2
    assert second == [], "16 GB are booked already: nothing more fits"
    usage = store.host_usage(NOW)["a"]
    assert usage.workers == 2 and usage.booked_gb == 16.0
    # the slot cap is re-checked too, and reservations count as booked RAM
    light = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",), weight="light") for _ in range(3)], NOW)]
    store.host_update(HostRecord("a", 40, prime_max_workers=3), NOW)
    assert len(store.job_assign("a", [(j, 3.0) for j in light], 3, 32.0, NOW)) == 1
    assert store.host_usage(NOW)["a"].workers == 3


def test_an_agent_host_takes_no_work_after_its_missed_heartbeats_a_push_host_does(store):
    """Liveness (3 heartbeats of 10 s) applies to hosts whose agent heartbeats; a host that
    cron heartbeats keeps the display thresholds (healthy for 5 minutes)."""
    fleet = Fleet.from_settings(Settings())
    for label in ("agent1", "cron1"):
        store.host_insert(HostRecord(label, 20, prime_max_workers=2), NOW)
    store.host_heartbeat("agent1", NOW, {"worker": "agent1/10/20"})
    store.host_heartbeat("cron1", NOW, {"via": "heartbeat"})
    job_id, bound = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",)), JobSpec(command=("true",), affinity="agent1")], NOW)]

    later = NOW + timedelta(seconds=31)
    snapshot = take_snapshot(store, fleet, later)
    assert snapshot.loads["agent1"].agent_down == "agent down: no heartbeat for 31.0s (3 missed)"
    assert snapshot.loads["agent1"].health is HostHealth.HEALTHY  # for display
    assert snapshot.loads["cron1"].agent_down is None
    assert why(store, fleet, bound, later).endswith(
        "bound to agent1: agent1 agent down: no heartbeat for 31.0s (3 missed)")
    scheduler = Scheduler(store, fleet)
    assert scheduler.run_once(later)["placed"] == 1
    assert store.job_get(job_id).host == "cron1"
    assert store.job_get(bound).status is JobStatus.QUEUED

    # an agent that said it stopped is not live however fresh its heartbeat
    store.host_heartbeat("agent1", later, {"worker": "agent1/10/20", "stopped": True})
    assert take_snapshot(store, fleet, later).loads["agent1"].agent_down == "agent stopped"


def test_a_placement_nobody_picks_up_goes_back_to_the_queue_and_elsewhere(store):
    """The pickup watch fences an untaken placement (no runner can take it any more), hands
    it back without spending an attempt, and placement then passes over its host."""
    fleet = Fleet.from_settings(Settings())
    for label in ("a", "b"):
        store.host_insert(HostRecord(label, 20, prime_max_workers=2), NOW)
        store.host_heartbeat(label, NOW, {"worker": f"{label}/1/2"})
    untaken, taken = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",)), JobSpec(command=("true",))], NOW)]
    store.job_assign("a", [(untaken, 3.0), (taken, 3.0)], 2, 16.0, NOW)
    assert store.attempt_set_worker(AttemptToken(taken, 1), "a/1/2", NOW)
    watch = PickupWatch(store, timeout_seconds=25)

    assert watch.run_once(NOW + timedelta(seconds=24)) == {"timed_out": 0, "requeued": 0}
    later = NOW + timedelta(seconds=25)
    for label in ("a", "b"):  # both agents still beat: only the pickup says anything
        store.host_heartbeat(label, later, {"worker": f"{label}/1/2"})
    assert watch.run_once(later) == {"timed_out": 1, "requeued": 1}
    # the agent of `a` asking now gets nothing: the placement is fenced and gone
    assert not store.attempt_set_worker(AttemptToken(untaken, 1), "a/1/2", later)
    job = store.job_get(untaken)
    assert (job.status, job.failures, job.lost, job.available_at) == (
        JobStatus.QUEUED, 0, 0, later)
    [ended] = store.attempt_list(untaken)
    assert (ended.host, ended.worker, ended.outcome) == ("a", PICKUP_FENCE, Outcome.LOST)
    assert store.job_get(taken).status is JobStatus.CLAIMED  # a runner has it: the lease's

    # b is emptier, but best fit prefers a (fuller): the avoided host is passed over
    assert why(store, fleet, untaken, later) == (
        "placed on b, not a: its last attempt there ended for the host's reasons; "
        "another host fits")
    Scheduler(store, fleet).run_once(later)
    again = store.job_get(untaken)
    assert (again.host, again.attempt) == ("b", 2)


def test_a_dead_agents_report_ends_only_its_own_attempts_and_stops_its_host(store, tmp_path):
    """The guardian's report (AgentService.agent_gone) declares the dead worker's attempts
    lost at once, hands back what nobody took, leaves another worker's attempt alone and
    keeps placement off the host until an agent heartbeats again."""
    coordinator = Coordinator(store, Config(Settings(), tmp_path / "herder.toml"), "server")
    store.host_insert(HostRecord("a", 40, prime_max_workers=4), NOW)
    dead, other = "a/10/1", "a/11/1"
    store.host_heartbeat("a", NOW, {"worker": dead})
    mine, theirs, untaken = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",)) for _ in range(3)], NOW)]
    store.job_assign("a", [(mine, 3.0), (theirs, 3.0), (untaken, 3.0)], 4, 32.0, NOW)
    for job_id, worker in ((mine, dead), (theirs, other)):
        assert store.attempt_set_worker(AttemptToken(job_id, 1), worker, NOW)
        assert store.attempt_start(AttemptToken(job_id, 1), 100 + job_id, "/log", NOW)

    assert coordinator.agents.agent_gone("a", dead) == {"lost": 1, "host_stopped": 1,
                                                 "handed_back": 1}
    assert [store.job_get(j).status for j in (mine, theirs, untaken)] == [
        JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.QUEUED]
    assert store.job_get(mine).lost == 1 and store.job_get(untaken).lost == 0
    now = datetime.now(UTC)
    assert take_snapshot(store, coordinator.fleet, now).loads["a"].agent_down == (
        "agent gone: its guardian reported it dead")
    # a report about a worker that is not the host's last one changes no host
    store.host_heartbeat("a", now, {"worker": "a/12/1"})
    assert coordinator.agents.agent_gone("a", dead) == {"lost": 0, "host_stopped": 0,
                                                 "handed_back": 0}
    assert take_snapshot(store, coordinator.fleet, now).loads["a"].agent_down is None


def test_a_placement_made_as_the_hosts_agent_is_replaced_goes_to_the_new_agent(
        store, tmp_path):
    """The race of an agent's replacement: a job is placed on `a` as its agent dies and a
    new one starts. The dead agent's long poll, still held by the server, cannot take it
    once the new agent has heartbeated; the new agent picks it up and runs it, and the dead
    agent's guardian reporting it gone later leaves it alone: nothing lost, nothing spent."""
    coordinator = Coordinator(store, Config(Settings(), tmp_path / "herder.toml"), "server")
    agents = coordinator.agents
    store.host_insert(HostRecord("a", 40, prime_max_workers=4), NOW)
    dead, new = "a/10/1", "a/11/1"
    agents.agent_heartbeat("a", dead, [], {}, with_attempts=False)
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], NOW)]
    [token] = store.job_assign("a", [(job_id, 3.0)], 4, 32.0, NOW)
    reply = agents.agent_heartbeat("a", new, [], {}, with_attempts=True)
    assert reply.attempts == [(job_id, 1, "")]  # a placement, no dead agent's attempt

    assert agents.take_assigned("a", dead, 1) == []  # the dead agent's late poll
    [job] = agents.take_assigned("a", new, 1)
    assert job.token == token
    agents.start_attempt("a", token, 4242, None)
    assert agents.agent_gone("a", dead) == {"lost": 0, "host_stopped": 0, "handed_back": 0}
    [attempt] = store.attempt_list(job_id)
    assert (attempt.worker, attempt.outcome) == (new, None)
    job = store.job_get(job_id)
    assert job is not None and (job.status, job.attempt, job.lost) == (
        JobStatus.RUNNING, 1, 0)


def test_a_placement_made_as_the_hosts_agent_dies_waits_for_the_next_agent_or_goes_back(
        store, tmp_path):
    """Before a next agent heartbeats, the dead agent is the host's last: its late poll
    takes nothing once its guardian reported it gone, and the report hands the placement
    back to the queue without spending anything."""
    coordinator = Coordinator(store, Config(Settings(), tmp_path / "herder.toml"), "server")
    agents = coordinator.agents
    store.host_insert(HostRecord("a", 40, prime_max_workers=4), NOW)
    dead = "a/10/1"
    agents.agent_heartbeat("a", dead, [], {}, with_attempts=False)
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], NOW)]
    [token] = store.job_assign("a", [(job_id, 3.0)], 4, 32.0, NOW)
    assert agents.agent_gone("a", dead) == {"lost": 0, "host_stopped": 1, "handed_back": 1}
    assert agents.take_assigned("a", dead, 1) == []
    job = store.job_get(job_id)
    assert job is not None and (job.status, job.lost, job.failures) == (JobStatus.QUEUED, 0, 0)
    [ended] = store.attempt_list(job_id)
    assert (ended.attempt, ended.worker) == (token.attempt, PICKUP_FENCE)


def test_leader_lease_is_exclusive_and_passes_on_release(store_url):
    first, second = open_store(store_url), open_store(store_url)
    lease_a, lease_b = first.leader_lease(), second.leader_lease()
    try:
        assert lease_a.try_acquire()
        assert not lease_b.try_acquire()
        assert lease_a.try_acquire(), "the holder keeps it"
        lease_a.release()
        assert lease_b.try_acquire()
        assert not lease_a.try_acquire()
    finally:
        lease_a.release()
        lease_b.release()
        first.close()
        second.close()


def leader(port: int) -> bool | None:
    try:
        return bool(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).json()["leader"])
    except httpx.HTTPError:
        return None


@pytest.mark.slow
def test_a_replica_takes_over_when_the_leader_is_killed(postgres_url, tmp_path):
    config = tmp_path / "herder.toml"
    config.write_text(f'[herder]\ndb = "{postgres_url}"\nlog_dir = "{tmp_path}/logs"\n'
                      '[fleet]\nscheduler_interval = "0.2s"\n')
    store = open_store(postgres_url)
    store.host_insert(HostRecord("h", 16, prime_max_workers=1, night_max_workers=1),
                      datetime.now(UTC))
    replicas: dict[int, subprocess.Popen[bytes]] = {}
    try:
        for _ in range(2):
            port = free_port()
            replicas[port] = subprocess.Popen(
                herder_argv("server", "--listen", f"127.0.0.1:{port}", config=config),
                cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(lambda: sorted(leader(p) or False for p in replicas) == [False, True], 30,
                 "one replica to lead", lambda: {p: leader(p) for p in replicas})
        old = next(p for p in replicas if leader(p))
        other = next(p for p in replicas if p != old)
        os.killpg(replicas[old].pid, signal.SIGKILL)
        replicas[old].wait(10)
        wait_for(lambda: leader(other), 30, "the other replica to take over")
        # The new leader schedules: a job is placed on the (heartbeating) host.
        store.host_heartbeat("h", datetime.now(UTC), {})
        job_id = store.job_insert([JobSpec(command=("true",))], datetime.now(UTC))[0].job_id
        job = wait_for(lambda: (found := store.job_get(job_id)) is not None
                       and found.status is not JobStatus.QUEUED and found, 60,
                       "the new leader to place the job")
        assert job.host == "h"
    finally:
        store.close()
        for process in replicas.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(20)


def test_handing_a_placement_to_a_runner_starts_its_lease_again(store):
    """A placement may wait for its agent up to the pickup timeout; the runner counts its
    lease from when it asked, so the server must too, or a cut right after the handout
    would let the server rescue the attempt before the runner fences it."""
    store.host_insert(HostRecord("a", 20, prime_max_workers=2), NOW)
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], NOW)]
    store.job_assign("a", [(job_id, 3.0)], 2, 16.0, NOW)
    handout = NOW + timedelta(seconds=20)
    assert store.attempt_set_worker(AttemptToken(job_id, 1), "a/1/2", handout)
    [live] = store.attempt_list_live("a")
    assert (live.attempt.worker, live.attempt.heartbeat_at) == ("a/1/2", handout)


def test_the_lease_rescue_leaves_an_untaken_placement_to_the_pickup_watch(store):
    """A lease shorter than the pickup timeout (fast test timings) once let the rescuer
    hand back a placement whose agent was still starting: the agent then refused or ran a
    later attempt and the first one read `lost`. Without a runner there is nothing to be
    silent; a taken attempt past its lease is still the rescuer's."""
    store.host_insert(HostRecord("a", 20, prime_max_workers=2), NOW)
    untaken, taken = [r.job_id for r in store.job_insert(
        [JobSpec(command=("true",)), JobSpec(command=("true",))], NOW)]
    store.job_assign("a", [(untaken, 3.0), (taken, 3.0)], 2, 16.0, NOW)
    assert store.attempt_set_worker(AttemptToken(taken, 1), "a/1/2", NOW)
    later = NOW + timedelta(seconds=10)  # past the 2 s lease, within the 25 s pickup timeout

    rescued = Rescuer(store, "server", lease_seconds=2.0, kill_grace=1.0,
                      max_lost=5).run_once(later)
    assert (rescued["stale"], rescued["requeued"]) == (1, 1)
    assert store.job_get(taken).status is JobStatus.QUEUED
    assert store.job_get(untaken).status is JobStatus.CLAIMED
    assert PickupWatch(store, timeout_seconds=25).run_once(later)["timed_out"] == 0
    # the agent, up at last, takes its placement
    assert store.attempt_set_worker(AttemptToken(untaken, 1), "a/1/2", later)


def test_a_lost_attempt_spends_the_lost_budget_once_a_runner_took_it():
    """Untaken placements go back for free; a taken one spends `lost` even if its start
    report never arrived (the runner may have died with it, perhaps killed by its job)."""
    from herder.core.model import Attempt
    from herder.runtime.maintenance import lost_result
    from herder.store import LiveAttempt

    def live(worker: str, started: datetime | None) -> LiveAttempt:
        attempt = Attempt(7, 1, "a", worker, None, None, NOW, started, NOW, None, None, None)
        return LiveAttempt(attempt, JobStatus.CLAIMED if started is None else JobStatus.RUNNING,
                           failures=0, lost=0, max_attempts=3, backoff_base_seconds=1.0,
                           backoff_max_seconds=1.0)

    later = NOW + timedelta(seconds=30)
    for worker, started, spends in [("", None, False), (PICKUP_FENCE, None, False),
                                    ("a/1/2", None, True), ("a/1/2", NOW, True)]:
        decision = lost_result(live(worker, started), later, max_lost=5).decision
        assert (decision.status, decision.spend_lost) == (JobStatus.QUEUED, spends), worker


def test_the_cycle_heartbeat_is_info_when_work_is_placed_and_once_a_minute_idle(store, caplog):
    """Seed 004's `dispatch_cycle`: a log-based "dispatcher silent" alert needs a line at
    INFO at least once a minute, and the placements at once; idle cycles between are DEBUG."""
    fleet = Fleet.from_settings(Settings())
    store.host_insert(HostRecord("cron1", 20, prime_max_workers=2), NOW)
    store.host_heartbeat("cron1", NOW, {"via": "heartbeat"})
    scheduler = Scheduler(store, fleet)

    def levels(at: datetime) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="herder.scheduler"):
            scheduler.run_once(at)
        return [record.levelname for record in caplog.records
                if getattr(record, "event", None) == "dispatch_cycle"]

    assert levels(NOW) == ["INFO"]  # the first cycle
    assert levels(NOW + timedelta(seconds=1)) == ["DEBUG"]
    store.job_insert([JobSpec(command=("true",))], NOW)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="herder.scheduler"):
        scheduler.run_once(NOW + timedelta(seconds=2))
    cycle = [r for r in caplog.records if getattr(r, "event", None) == "dispatch_cycle"]
    scheduled = [r for r in caplog.records if getattr(r, "event", None) == "dispatch_scheduled"]
    assert [(r.levelname, r.placed) for r in cycle] == [("INFO", 1)]
    assert [(r.host, r.attempt) for r in scheduled] == [("cron1", 1)]
    assert levels(NOW + timedelta(seconds=3)) == ["DEBUG"]
    assert levels(NOW + timedelta(seconds=62)) == ["INFO"]  # a minute after the last


def test_a_new_leader_gives_agents_the_grace_before_alerting_no_healthy_host(store):
    """A server that just started has heard from no agent: it does not page before
    `alert_grace`, and does once the grace has passed with no host healthy."""

    from herder.runtime.scheduler import NO_HEALTHY_HOST

    fleet = Fleet.from_settings(Settings(fleet=FleetSection(alert_grace=60.0)))
    store.host_insert(HostRecord("agent1", 20, prime_max_workers=2), NOW)  # never seen
    scheduler = Scheduler(store, fleet)

    def open_alerts() -> list[str]:
        return [a.key for a in store.alert_list() if a.key == NO_HEALTHY_HOST]

    scheduler.run_once(NOW)
    scheduler.run_once(NOW + timedelta(seconds=59))
    assert open_alerts() == []
    scheduler.run_once(NOW + timedelta(seconds=61))
    assert open_alerts() == [NO_HEALTHY_HOST]
    # A heartbeat clears it at the next cycle.
    later = NOW + timedelta(seconds=62)
    store.host_heartbeat("agent1", later, {"via": "heartbeat"})
    scheduler.run_once(later)
    assert open_alerts() == []


def test_the_start_grace_is_a_new_leaders_first_alert_grace_seconds():
    assert in_start_grace(None, NOW, 60.0)  # not leading yet
    assert in_start_grace(NOW, NOW + timedelta(seconds=59.9), 60.0)
    assert not in_start_grace(NOW, NOW + timedelta(seconds=60), 60.0)
    assert not in_start_grace(NOW, NOW, 0.0)


def test_a_new_leader_gives_agents_the_grace_before_alerting_fleet_stopped(store):
    """Work queued for a host that is healthy but closed now: `fleet:stopped`, but not in
    a new leader's first `alert_grace`."""

    fleet = Fleet.from_settings(Settings(fleet=FleetSection(alert_grace=60.0)))
    store.host_insert(HostRecord("cron1", 20, prime_max_workers=0), NOW)  # closed by day
    store.host_heartbeat("cron1", NOW, {"via": "heartbeat"})
    store.job_insert([JobSpec(command=("true",))], NOW)
    scheduler = Scheduler(store, fleet)

    def stopped_alerts() -> list[str]:
        return [a.message for a in store.alert_list() if a.key == "fleet:stopped"]

    scheduler.run_once(NOW)
    scheduler.run_once(NOW + timedelta(seconds=59))
    assert stopped_alerts() == []
    scheduler.run_once(NOW + timedelta(seconds=61))
    [message] = stopped_alerts()
    assert "cron1: closed in prime time" in message, message


def test_the_leader_logs_a_host_going_down_and_coming_back(store, caplog):
    fleet = Fleet.from_settings(Settings())  # an agent is down after 3 missed 10 s beats
    store.host_insert(HostRecord("agent1", 20), NOW)
    store.host_heartbeat("agent1", NOW, {"worker": "agent1/10/20"})
    scheduler = Scheduler(store, fleet)

    def lines(at: datetime) -> list[tuple[str, str, str | None]]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="herder.scheduler"):
            scheduler.run_once(at)
        return [(r.levelname, r.getMessage(), getattr(r, "event", None))
                for r in caplog.records if getattr(r, "host", None) == "agent1"
                and getattr(r, "event", None) in ("host_down", "host_back")]

    assert lines(NOW) == []  # the first cycle is the baseline
    assert lines(NOW + timedelta(seconds=29)) == []
    assert lines(NOW + timedelta(seconds=31)) == [
        ("WARNING", "host agent1 down: no heartbeat for 31.0s (3 missed)", "host_down")]
    assert lines(NOW + timedelta(seconds=40)) == []  # still down: said once
    back = NOW + timedelta(seconds=41)
    store.host_heartbeat("agent1", back, {"worker": "agent1/11/21"})
    assert lines(back) == [("INFO", "host agent1 back", "host_back")]


def test_a_start_report_sent_again_after_a_lost_answer_is_accepted_once(store, tmp_path):
    """An agent retries a start whose answer it never got (the server died after the
    commit): the same attempt's start again is accepted, not a conflict that makes the
    agent kill a job that runs fine; another host's report is still refused."""
    coordinator = Coordinator(store, Config(Settings(), tmp_path / "herder.toml"), "server")
    store.host_insert(HostRecord("a", 40, prime_max_workers=4), NOW)
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], NOW)]
    store.job_assign("a", [(job_id, 3.0)], 4, 32.0, NOW)
    token = AttemptToken(job_id, 1)
    assert store.attempt_set_worker(token, "a/10/1", NOW)
    coordinator.agents.start_attempt("a", token, 4242, None)
    coordinator.agents.start_attempt("a", token, 4242, None)  # the retry: accepted, nothing changes
    job = store.job_get(job_id)
    assert job is not None and job.status is JobStatus.RUNNING
    assert [attempt.pid for attempt in store.attempt_list(job_id)] == [4242]
    with pytest.raises(Conflict):  # another host's report is still refused
        coordinator.agents.start_attempt("b", token, 4242, None)
