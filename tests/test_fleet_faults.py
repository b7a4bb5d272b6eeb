"""Fleet fault tests: kill -9 of an agent, a server restart, a host that stops heartbeating.

Real processes throughout (see tests/support/fleet.py). Jobs that must never run twice at
once take an flock for their whole run; a second attempt that finds it held records OVERLAP
and exits 1, so an overlap is evidence on disk, not a guess from timing.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.fleet import FleetHarness, read_intervals, read_lines, recorder
from support.processes import Proc
from support.waits import holds_for, wait_for

from herder.core.model import JobStatus, Outcome
from herder.runtime.scheduler import NO_HEALTHY_HOST

LEASE = 2.0  # FAST_RUNTIME's attempt_lease (> missed_heartbeats × heartbeat_interval)
FIRST_ATTEMPT_HANGS = 'if [ "$HERDER_ATTEMPT" = 1 ]; then sleep 60; else sleep 0.3; fi'




def attempt_of(fleet: FleetHarness, job_id: int, number: int):
    return next((a for a in fleet.attempts(job_id) if a.attempt == number), None)


def started_line(events: Path, job_id: int, attempt: int) -> bool:
    return any((i.job, i.attempt) == (job_id, attempt) for i in read_intervals(events))


def alive(procs: list[Proc]) -> list[Proc]:
    return [proc for proc in procs if proc.alive()]


def hanging_job(fleet: FleetHarness, tmp_path: Path) -> tuple[int, Path, Path]:
    """A job whose first attempt hangs (under the overlap lock), once that attempt started.
    Returns the job id, its recorder's events file and its overlap file."""
    events, lock, overlap = tmp_path / "events", tmp_path / "lock", tmp_path / "overlap"
    job_id = fleet.submit(recorder(events, FIRST_ATTEMPT_HANGS, lock, overlap),
                          max_attempts=100)
    wait_for(lambda: started_line(events, job_id, 1), 20, "attempt 1 to start", fleet.describe)
    return job_id, events, overlap


def hanging_job_on_alpha(fleet: FleetHarness, tmp_path: Path) -> tuple[int, Path, Path]:
    """alpha (32 GB) and beta (8 GB, so best fit prefers it once both are up) are added,
    only alpha's agent runs, and a `hanging_job` has started there."""
    fleet.add_hosts({
        "alpha": ("--ram", "32", "--prime-workers", "2", "--night-workers", "2"),
        "beta": ("--ram", "8", "--prime-workers", "1", "--night-workers", "1"),
    })
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    job_id, events, overlap = hanging_job(fleet, tmp_path)
    assert fleet.job(job_id).host == "alpha"
    return job_id, events, overlap


# -- 5. kill -9 of an agent -------------------------------------------------------------------


@pytest.mark.slow
def test_kill9_agent_jobs_are_requeued_and_rerun_elsewhere(make_fleet, tmp_path, store_url):
    """alpha's agent dies with -9 while a job runs there. The server declares the attempt
    lost once its lease runs out and the job runs again on beta, never overlapping attempt 1.

    The job's first attempt would run for a minute and its processes live in a session of
    their own, so they survive the agent: the agent's guardian (a watchdog in its own
    session) kills them as soon as the agent dies, within kill_grace, well inside the
    lease. The flock records any overlap."""
    fleet = make_fleet(tmp_path, store_url)
    job_id, events, overlap = hanging_job_on_alpha(fleet, tmp_path)
    survivors = fleet.job_processes(job_id)
    assert survivors and {p.attempt for p in survivors} == {1}, survivors
    fleet.start_agent("beta")

    killed = time.monotonic()
    fleet.kill_agent("alpha")
    lost = wait_for(lambda: (a := attempt_of(fleet, job_id, 1)) and a.outcome is Outcome.LOST,
                    6 * LEASE, "the server to declare attempt 1 lost", fleet.describe)
    lost_after = time.monotonic() - killed
    assert lost and lost_after <= 2 * LEASE + 1.0, f"declared lost {lost_after:.1f}s after kill"
    rerun = wait_for(lambda: attempt_of(fleet, job_id, 2), 10, "attempt 2 to be placed",
                     fleet.describe)
    assert rerun.host == "beta", rerun
    rerun_seen = time.monotonic()
    survived_rerun = alive(survivors)
    # Attempt 2 has had its chance to run (it ran or it hit the lock).
    wait_for(lambda: started_line(events, job_id, 2) or read_lines(overlap)
             or fleet.job(job_id).attempt > 2, 15, "attempt 2 to run", fleet.describe)

    # Orphan recovery: alpha's agent comes back and kills what its predecessor left.
    fleet.start_agent("alpha")
    wait_for(lambda: not alive(survivors), 15,
             "the restarted alpha agent to kill the dead agent's job processes",
             fleet.describe)
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert done.lost == 1, done
    winner = attempt_of(fleet, job_id, done.attempt)
    assert winner is not None and winner.outcome is Outcome.OK
    assert [i.attempt for i in read_intervals(events) if i.end is not None] == [done.attempt]

    overlaps = read_lines(overlap)
    assert not overlaps, (
        f"never twice at once is broken: after kill -9 of alpha's agent its job processes "
        f"{[p.pid for p in survivors]} were alive when attempt 2 ran on beta "
        f"({rerun_seen - killed:.1f}s after the kill; still alive then: "
        f"{[p.pid for p in survived_rerun]}); {len(overlaps)} attempt(s) found the job's lock "
        f"held: {overlaps[:3]}")
    # The agent's guardian killed them, before the server declared the attempt lost.
    assert not survived_rerun, survived_rerun


@pytest.mark.slow
def test_a_frozen_agents_jobs_are_killed_by_its_guardian_before_they_run_elsewhere(
        make_fleet, tmp_path, sqlite_url):
    """alpha's agent is frozen (SIGSTOP of its process group) while its job runs: it can
    neither heartbeat nor fence itself, and its job's processes, in a session of their own,
    run on. Its guardian (not frozen: another session) kills them at their backstop
    deadline, before the server declares the attempt lost and the job runs on beta; the
    flock sees no overlap. Thawed, the agent's late report is dropped."""
    fleet = make_fleet(tmp_path, sqlite_url,
                       runtime={"attempt_lease": "6s", "fence_margin": "2s"})
    job_id, events, overlap = hanging_job_on_alpha(fleet, tmp_path)
    survivors = fleet.job_processes(job_id)
    assert survivors and {p.attempt for p in survivors} == {1}, survivors
    fleet.start_agent("beta")
    agent = fleet.agents["alpha"]

    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not alive(survivors), 30,
                 "the guardian to kill the frozen agent's job processes", fleet.describe)
        first = attempt_of(fleet, job_id, 1)
        assert first is not None and first.outcome is None, (
            f"the server declared attempt 1 {first.outcome if first else None} before its "
            "processes were gone")
        rerun = wait_for(lambda: started_line(events, job_id, 2) or read_lines(overlap), 30,
                         "attempt 2 to run on beta", fleet.describe)
        assert rerun
    finally:
        os.killpg(agent.pid, signal.SIGCONT)

    assert read_lines(overlap) == [], "attempt 2 found attempt 1 still holding the job's lock"
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert attempt_of(fleet, job_id, done.attempt).host == "beta"
    assert attempt_of(fleet, job_id, 1).outcome is Outcome.LOST
    assert f"guardian: attempt {job_id}.1 outlived its lease unrenewed" in fleet.stderr_of(agent)


@pytest.mark.slow
def test_agent_restarted_within_the_lease_kills_survivors_before_the_rerun(
        make_fleet, tmp_path, sqlite_url):
    """The agent's guardian kills the dead agent's job processes at once and reports the
    agent gone, so the server declares its attempt lost without waiting for the lease (or
    for the restarted agent); the rerun waits for an agent of the host and never
    overlaps."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": "8s"})
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    job_id, _events, overlap = hanging_job(fleet, tmp_path)
    survivors = fleet.job_processes(job_id)
    assert survivors

    fleet.kill_agent("alpha")
    wait_for(lambda: not alive(survivors), 10,
             "the dead agent's guardian to kill its job processes", fleet.describe)
    first = wait_for(lambda: (a := attempt_of(fleet, job_id, 1)) and a.outcome and a, 10,
                     "the guardian's report to end attempt 1", fleet.describe)
    assert first.outcome is Outcome.LOST
    # Nothing is placed on alpha while its agent is known dead.
    holds_for(lambda: fleet.job(job_id).status is JobStatus.QUEUED, 1.0,
              "the job to wait for a live agent on alpha", fleet.describe)
    assert "agent gone" in fleet.why_api(job_id)
    fleet.start_agent("alpha")
    done = fleet.wait_status(job_id, JobStatus.DONE)
    # Declared lost on the guardian's word, not by the server's lease rescue, nor by the
    # restarted agent (the attempt was over when it came).
    assert "of alpha is gone (its guardian says): 1 attempt(s) lost" in fleet.stderr_of(
        fleet.server)
    assert "declared lost" not in fleet.stderr_of(fleet.server)
    assert "belonged to a dead agent" not in fleet.stderr_of(fleet.agents["alpha"])
    assert (done.attempt, done.lost, done.host) == (2, 1, "alpha")
    assert read_lines(overlap) == []


@pytest.mark.slow
def test_dead_agents_pending_long_poll_does_not_swallow_a_job(make_fleet, tmp_path,
                                                               sqlite_url):
    """An idle host dies with -9 (agent and guardian, so nobody tells the server) while its
    agent's long-poll for assignments is open on the server (heartbeat 30 s: the poll waits
    the full 25 s long_poll). A job placed on its host right then must go to the host's
    next agent, not to the dead one's request."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"heartbeat_interval": "30s"},
                       fleet={"pickup_timeout": "60s"})
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    first = fleet.start_agent("alpha")
    fleet.kill_host("alpha")
    events = tmp_path / "events"
    job_id = fleet.submit(recorder(events, body="true"))
    wait_for(lambda: fleet.job(job_id).status is JobStatus.CLAIMED, 10, "the job to be placed",
             fleet.describe)
    second = fleet.start_agent("alpha")
    done = fleet.wait_status(job_id, JobStatus.DONE, timeout=15)
    assert (done.attempt, done.lost) == (1, 0), fleet.describe()
    worker = attempt_of(fleet, job_id, 1).worker
    assert worker.startswith(f"alpha/{second.pid}/"), (worker, first.pid, second.pid)


# -- 6. a dead host is noticed in heartbeats, not minutes --------------------------------------


def start_time(events: Path, job_id: int, attempt: int) -> float | None:
    return next((i.start for i in read_intervals(events)
                 if (i.job, i.attempt) == (job_id, attempt)), None)


@pytest.mark.slow
def test_a_crashed_agents_jobs_run_elsewhere_on_its_guardians_word(make_fleet, tmp_path,
                                                                  store_url):
    """alpha's agent dies with -9 while a job runs there; its guardian lives. The guardian
    kills the job's processes and tells the server, which declares the attempt lost and
    reruns it on beta at once: long before the 30 s lease could have, never overlapping."""
    fleet = make_fleet(tmp_path, store_url, runtime={"attempt_lease": "30s"})
    job_id, events, overlap = hanging_job_on_alpha(fleet, tmp_path)
    fleet.start_agent("beta")

    killed = time.time()
    fleet.kill_agent("alpha")
    rerun = wait_for(lambda: start_time(events, job_id, 2), 20,
                     "attempt 2 to start after the crash", fleet.describe)
    recovery = rerun - killed
    print(f"crashed agent, guardian alive: job running again {recovery:.2f}s after the kill")
    assert attempt_of(fleet, job_id, 2).host == "beta"
    assert recovery < 15, f"{recovery:.1f}s: the guardian's report should beat the 30 s lease"
    server = fleet.stderr_of(fleet.server)
    assert "of alpha is gone (its guardian says): 1 attempt(s) lost" in server, server
    assert "declared lost" not in server  # not the lease rescue
    # alpha takes nothing until an agent of it heartbeats again
    view = fleet.hosts_api()["alpha"]
    assert (view["agent"], view["agent_down"]) == (
        "stopped", "agent gone: its guardian reported it dead")
    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert (done.attempt, done.lost, done.host) == (2, 1, "beta")
    assert read_lines(overlap) == []


@pytest.mark.slow
def test_a_dead_host_gets_no_new_work_and_its_jobs_run_elsewhere(make_fleet, tmp_path,
                                                                 store_url):
    """The whole of alpha dies with -9 (guardian, agent, jobs: nobody tells the server)
    while a job runs there. Jobs submitted right then still go to alpha (it has not missed
    its heartbeats yet), are never picked up and come back after the pickup timeout,
    without spending an attempt, to run on beta; the running job runs on beta after its
    lease. Nothing is placed on alpha once it has missed its heartbeats."""
    heartbeat, missed, lease = 0.3, 10, 4.0
    fleet = make_fleet(tmp_path, store_url, runtime={"attempt_lease": f"{lease}s"},
                       fleet={"missed_heartbeats": missed, "pickup_timeout": "1.5s"})
    fleet.add_hosts({
        # Best fit packs the fuller host: alpha, while it counts as live.
        "alpha": ("--ram", "16", "--prime-workers", "4", "--night-workers", "4"),
        "beta": ("--ram", "32", "--prime-workers", "4", "--night-workers", "4"),
    })
    fleet.start_server(wait=False)
    fleet.start_agents("alpha", "beta")
    running, events, overlap = hanging_job(fleet, tmp_path)
    assert fleet.job(running).host == "alpha"

    killed = time.time()
    fleet.kill_host("alpha")
    placed = [fleet.submit(recorder(events, "sleep 0.3"), max_attempts=1) for _ in range(2)]
    bound = fleet.submit(["true"], affinity="alpha")
    for job_id in [running, *placed]:
        fleet.wait_status(job_id, JobStatus.DONE, timeout=60)
    recovery = start_time(events, running, 2)
    assert recovery is not None
    recovery -= killed
    print(f"dead host: its running job ran again {recovery:.2f}s after the kill "
          f"(bound: 2 heartbeats + lease = {2 * heartbeat + lease:.1f}s)")
    assert recovery < 2 * heartbeat + lease + 10, f"{recovery:.1f}s"

    def alpha_attempts(job_id: int) -> list:
        return [a for a in fleet.attempts(job_id) if a.host == "alpha"]

    for job_id in placed:
        done = fleet.job(job_id)
        # max_attempts 1: a pickup timeout spends nothing, or the job would have failed
        assert (done.host, done.failures, done.lost) == ("beta", 0, 0), fleet.describe()
        assert all(a.started_at is None and a.outcome is Outcome.LOST
                   and a.worker == "pickup-timeout" for a in alpha_attempts(job_id))
    assert any(alpha_attempts(job_id) for job_id in placed), (
        "no job was placed on alpha before it missed its heartbeats: the case is untested\n"
        + fleet.describe())
    assert (attempt_of(fleet, running, 2).host, fleet.job(running).lost) == ("beta", 1)

    # Nothing was placed on alpha after it had missed its heartbeats (a scheduler cycle of
    # slack), and a job bound to it says why it waits.
    last = fleet.store.host_get("alpha").last_heartbeat
    window = missed * heartbeat
    late = [a for job_id in [running, *placed, bound] for a in alpha_attempts(job_id)
            if (a.claimed_at - last).total_seconds() > window + 1.0]
    assert late == [], late
    assert fleet.job(bound).status is JobStatus.QUEUED
    assert "bound to alpha: alpha agent down: no heartbeat for" in fleet.why_api(bound)
    view = fleet.hosts_api()["alpha"]
    assert view["agent_down"].startswith("agent down: no heartbeat for"), view
    assert read_lines(overlap) == []


# -- 7. server restart --------------------------------------------------------------------------


def silent_for(fleet: FleetHarness, job_id: int) -> float:
    """Seconds since the job's current attempt last heartbeated, as the store has it."""
    job = fleet.job(job_id)
    attempt = attempt_of(fleet, job_id, job.attempt)
    assert attempt is not None
    return (datetime.now(UTC) - attempt.heartbeat_at).total_seconds()


@pytest.mark.slow
def test_agent_keeps_its_jobs_across_a_server_restart(make_fleet, tmp_path, sqlite_url):
    """The server restarts within the lease (minus the fence margin). One job ends meanwhile
    (its result waits in the agent's outbox), another runs on across the restart: both are
    recorded done by their first attempt."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": "30s"})
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    events = tmp_path / "events"
    early, late = tmp_path / "early", tmp_path / "late"
    ends_early = fleet.submit(recorder(events, f"while [ ! -e '{early}' ]; do sleep 0.05; done"))
    runs_on = fleet.submit(recorder(events, f"while [ ! -e '{late}' ]; do sleep 0.05; done"))
    for job_id in (ends_early, runs_on):
        wait_for(lambda j=job_id: started_line(events, j, 1), 20, f"job {job_id} to start",
                 fleet.describe)
        fleet.wait_status(job_id, JobStatus.RUNNING)

    fleet.stop_server(signal.SIGKILL)
    early.touch()
    wait_for(lambda: not fleet.job_processes(ends_early), 10, "the early job to exit",
             fleet.describe)
    wait_for(lambda: "server unreachable" in fleet.stderr_of(fleet.agents["alpha"]), 10,
             "the agent to notice the server is gone", fleet.describe)
    fleet.start_server()
    first = fleet.wait_status(ends_early, JobStatus.DONE)
    assert (first.attempt, first.lost) == (1, 0), fleet.describe()
    assert fleet.job_processes(runs_on), "the running job did not survive the restart"
    late.touch()
    second = fleet.wait_status(runs_on, JobStatus.DONE)
    assert (second.attempt, second.lost) == (1, 0), fleet.describe()
    assert [(i.job, i.attempt) for i in read_intervals(events)] == [(ends_early, 1),
                                                                    (runs_on, 1)]


@pytest.mark.slow
def test_agent_stops_its_jobs_when_the_server_is_gone_past_the_lease(make_fleet, tmp_path,
                                                                       sqlite_url):
    """Self-fencing against a real server that stays down: the agent cannot tell that from
    a network cut, so it stops its running attempt before the lease the server counts from
    its last accepted heartbeat runs out, and reports it lost when the server is back. A
    result that was waiting in the outbox is still recorded; the stopped job runs again,
    never overlapping its first attempt."""
    lease = 8.0  # with the default margin (a quarter) the fence leaves 2 s to spare
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": f"{lease:g}s"})
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    events, overlap = tmp_path / "events", tmp_path / "overlap"
    early, late = tmp_path / "early", tmp_path / "late"
    ends_early = fleet.submit(recorder(events, f"while [ ! -e '{early}' ]; do sleep 0.05; done"))
    fenced = fleet.submit(recorder(events, f"while [ ! -e '{late}' ]; do sleep 0.05; done",
                                   lock=tmp_path / "fenced.lock", overlap=overlap))
    for job_id in (ends_early, fenced):
        wait_for(lambda j=job_id: started_line(events, j, 1), 20, f"job {job_id} to start",
                 fleet.describe)
        fleet.wait_status(job_id, JobStatus.RUNNING)
    tree = fleet.job_processes(fenced)
    assert tree

    fleet.stop_server(signal.SIGKILL)
    early.touch()
    wait_for(lambda: not alive(tree), 4 * lease, "the agent to stop its cut-off attempt",
             fleet.describe)
    # Seen gone before the lease ran out, as the server counts it (same machine, same clock).
    assert silent_for(fleet, fenced) < lease, fleet.describe()
    assert attempt_of(fleet, fenced, 1).outcome is None  # nobody has judged it yet

    fleet.start_server()
    first = fleet.wait_status(ends_early, JobStatus.DONE)
    assert (first.attempt, first.lost) == (1, 0), fleet.describe()
    wait_for(lambda: started_line(events, fenced, 2), 30, "the stopped job to run again",
             fleet.describe)
    late.touch()
    again = fleet.wait_status(fenced, JobStatus.DONE)
    assert (again.attempt, again.lost) == (2, 1), fleet.describe()
    assert attempt_of(fleet, fenced, 1).outcome is Outcome.LOST
    assert not overlap.exists(), overlap.read_text()
    assert "lease not renewed" in (tmp_path / "agents" / "alpha" / str(fenced) /
                                   "1.log").read_text()


@pytest.mark.slow
def test_agent_keeps_supervising_while_the_server_is_down(make_fleet, tmp_path, sqlite_url):
    """With the server down, one job ends (its log and result wait in the outbox) and
    another reaches its timeout: the agent still stops it on time, and both results are
    recorded once the server is back."""
    # A lease longer than the outage: the timeout, not the fence, must stop the job.
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": "30s"})
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    events, release = tmp_path / "events", tmp_path / "release"
    ends = fleet.submit(recorder(events, f"while [ ! -e '{release}' ]; do sleep 0.05; done"))
    hangs = fleet.submit(recorder(events, "sleep 60"), timeout_seconds=4, max_attempts=1)
    for job_id in (ends, hangs):
        wait_for(lambda j=job_id: started_line(events, j, 1), 20, "both jobs to start",
                 fleet.describe)

    fleet.stop_server(signal.SIGKILL)
    release.touch()
    wait_for(lambda: not fleet.job_processes(ends), 10, "the first job to exit",
             fleet.describe)
    wait_for(lambda: not fleet.job_processes(hangs), 15,
             "the agent to stop the timed-out job while the server is down", fleet.describe)
    assert fleet.server is None

    fleet.start_server()
    assert fleet.wait_status(ends, JobStatus.DONE).attempt == 1
    timed_out = fleet.wait_status(hangs, JobStatus.FAILED)
    assert (timed_out.attempt, timed_out.failure_reason) == (1, "timeout")
    log = tmp_path / "server-logs" / str(ends) / "1.log"
    wait_for(lambda: log.exists() and "exit 0" in log.read_text(), 10,
             "the first job's whole log to reach the server", fleet.describe)


@pytest.mark.slow
def test_late_result_of_an_attempt_declared_lost_is_fenced(make_fleet, tmp_path, sqlite_url):
    """The agent is frozen (SIGSTOP) while the server restarts and declares its attempt lost
    and places the job again. The frozen attempt's process ends meanwhile; when the agent
    thaws, its late `ok` is rejected, and the job is done by the next attempt."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"max_lost": 20})
    token = fleet.add_host("alpha", "--ram", "32", "--prime-workers", "2",
                           "--night-workers", "2")
    fleet.start_server(wait=False)
    agent = fleet.start_agent("alpha")
    events, release = tmp_path / "events", tmp_path / "release"
    job_id = fleet.submit(recorder(events, f"while [ ! -e '{release}' ]; do sleep 0.05; done"))
    wait_for(lambda: started_line(events, job_id, 1), 20, "attempt 1 to start", fleet.describe)
    fleet.wait_status(job_id, JobStatus.RUNNING)

    os.killpg(agent.pid, signal.SIGSTOP)
    try:
        fleet.stop_server(signal.SIGKILL)
        fleet.start_server()
        wait_for(lambda: (a := attempt_of(fleet, job_id, 1)) and a.outcome is Outcome.LOST,
                 8 * LEASE, "the new server to declare attempt 1 lost", fleet.describe)
        release.touch()
        wait_for(lambda: not fleet.job_processes(job_id), 10, "attempt 1's process to exit",
                 fleet.describe)
    finally:
        os.killpg(agent.pid, signal.SIGCONT)

    done = fleet.wait_status(job_id, JobStatus.DONE)
    assert done.attempt >= 2 and done.host == "alpha", done
    first = attempt_of(fleet, job_id, 1)
    assert first is not None and (first.outcome, first.exit_code) == (Outcome.LOST, None)
    wait_for(lambda: f"attempt {job_id}.1: finish dropped, the attempt is no longer live here"
             in fleet.stderr_of(agent), 10, "the agent to log its fenced-out report",
             fleet.describe)
    # The same late report sent again by hand is still refused and changes nothing.
    late = fleet.api("POST", f"/api/v1/agent/alpha/attempts/{job_id}/1/finish", token=token,
                     json={"outcome": "failed", "exit_code": 3})
    assert late.status_code == 409, late.text
    after = fleet.job(job_id)
    assert (after.status, after.attempt, after.exit_code) == (JobStatus.DONE, done.attempt,
                                                              done.exit_code)
    assert attempt_of(fleet, job_id, 1).outcome is Outcome.LOST


# -- 8. a host that stops heartbeating ----------------------------------------------------------


@pytest.mark.slow
def test_silent_host_goes_degraded_then_down_and_alerts_once(make_fleet, tmp_path,
                                                             sqlite_url):
    """A push host (`herder heartbeat`, no agent): never seen is unknown; a heartbeat makes
    it healthy; silence makes it degraded, then down. While no host can take work, one
    `fleet:no_healthy_host` alert is open (raised once per outage, not once per cycle) and
    a heartbeat clears it."""
    fleet = make_fleet(tmp_path, sqlite_url,
                       fleet={"healthy_within": "1s", "degraded_within": "2s",
                              "alert_grace": "0s"})
    token = fleet.add_host("cron1", "--ram", "16")
    fleet.start_server()

    def alerts(open_only: bool = False) -> list:
        return [a for a in fleet.store.alert_list(open_only=open_only, limit=1000)
                if a.key == NO_HEALTHY_HOST]

    def health() -> str:
        return str(fleet.hosts_api()["cron1"]["health"])

    # Never seen: unknown, which takes no work, so the alert is up at once.
    assert fleet.hosts()["cron1"]["health"] == "unknown"
    unknown = wait_for(lambda: alerts(True), 10, "the alert for an unknown host",
                       fleet.describe)
    assert "cron1 (unknown)" in unknown[0].message

    fleet.cli("heartbeat", "--host", "cron1")
    assert health() == "healthy"
    wait_for(lambda: not alerts(True), 10, "the alert to clear", fleet.describe)

    seen = ["healthy"]

    def watch() -> bool:
        state = health()
        if state != seen[-1]:
            seen.append(state)
        return state == "down"

    wait_for(watch, 15, "cron1 to go down", fleet.describe, interval=0.02)
    assert seen == ["healthy", "degraded", "down"], seen
    assert fleet.hosts()["cron1"]["health"] == "down"
    raised = wait_for(lambda: alerts(True), 10, "the alert for a down host", fleet.describe)
    assert "cron1 (down)" in raised[0].message
    # Every cycle (0.2 s) still finds no healthy host; the alert stays one alert.
    holds_for(lambda: len(alerts()) == 2 and len(alerts(True)) == 1, 1.5,
              "exactly one open alert while cron1 stays down", fleet.describe)
    assert fleet.stderr_of(fleet.server).count("ALERT: no healthy host") == 2

    # A heartbeat pushed through the server (as cron would) brings it back; the alert clears.
    fleet.cli("heartbeat", "--host", "cron1", "--server", fleet.url, "--token", token)
    wait_for(lambda: not alerts(True), 10, "the alert to clear again", fleet.describe)
    history = alerts()
    assert len(history) == 2 and all(a.cleared_at is not None for a in history), history
