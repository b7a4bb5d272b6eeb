"""Restarts that lose nothing: an agent's attempts run under supervisors that outlive it, and
the host's next agent adopts them (herder.runtime.supervisor, Adoption.adopt_predecessors,
the guardian's adopt_grace). Real server, real agents, real signals; every wait is on a file
a job writes or on the store, with a deadline."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from support.fleet import FleetHarness
from support.waits import wait_for

from herder.core.model import AttemptToken, JobStatus, Outcome, WorkerId
from herder.runtime.attempt_files import (
    HANDOVER_FOLDER,
    Status,
    agent_path_for,
    note_agent,
    note_launch,
    read_status,
    status_path_for,
    write_record,
)
from herder.runtime.guardian import await_successor
from herder.runtime.supervisor import write_status

HOST = f"adopt{secrets.token_hex(3)}"
"""Not a common label such as alpha: an agent of that label in another test on this machine
kills what dead agents of its label left, so these tests' host is theirs alone."""

LEASE = "30s"
"""Long enough that no agent's absence here outlasts it: adoption, not the lease, decides."""


def ticking(tmp_path: Path, name: str) -> list[str]:
    """A job that writes its pid, then a numbered line every 0.05 s until `name`.release
    exists, then `done after N` and exit 0: its log shows whether any of it went missing."""
    folder = tmp_path / name
    return ["/bin/sh", "-c",
            f"echo $$ > '{folder}.pid'; i=0; "
            f"while [ ! -e '{folder}.release' ]; do i=$((i+1)); echo tick $i; sleep 0.05; "
            f"done; echo done after $i"]


def ending(tmp_path: Path, name: str, code: int) -> list[str]:
    """A job that writes its pid and waits for `name`.go, then exits `code`."""
    folder = tmp_path / name
    return ["/bin/sh", "-c",
            f"echo $$ > '{folder}.pid'; echo waiting; "
            f"while [ ! -e '{folder}.go' ]; do sleep 0.05; done; echo exiting {code}; "
            f"exit {code}"]


def agent_log(fleet: FleetHarness, job_id: int) -> Path:
    return fleet.root / "agents" / HOST / str(job_id) / "1.log"


def server_log(fleet: FleetHarness, job_id: int) -> str:
    path = fleet.root / "server-logs" / str(job_id) / "1.log"
    return path.read_text() if path.exists() else ""


def pid_of(tmp_path: Path, name: str) -> int | None:
    text = (tmp_path / f"{name}.pid").read_text().strip() \
        if (tmp_path / f"{name}.pid").exists() else ""
    return int(text) if text.isdigit() else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rpartition(")")[2].split()[0] != "Z"


def fleet_with_host(make_fleet, tmp_path: Path, url: str, adopt_grace: str) -> FleetHarness:
    # The watchdog, not cgroups: a runner of another herder on this machine (another test)
    # that starts while the host has no agent would sweep the dead agent's cgroups (one that
    # predates the sweep's regard for supervisors; test_memory_core covers it).
    fleet = make_fleet(tmp_path, url, runtime={"attempt_lease": LEASE,
                                                "adopt_grace": adopt_grace,
                                                "memory_enforcement": "watchdog"})
    fleet.add_host(HOST, "--ram", "32", "--prime-workers", "3", "--night-workers", "3")
    fleet.start_server(wait=False)
    fleet.start_agent(HOST)
    return fleet


def running(fleet: FleetHarness, tmp_path: Path, job_id: int, name: str) -> int:
    """Until the job runs (its pid written, its start on the server); its pid."""
    wait_for(lambda: fleet.job(job_id).status is JobStatus.RUNNING and pid_of(tmp_path, name),
             30, f"job {name} to run", fleet.describe)
    pid = pid_of(tmp_path, name)
    assert pid is not None
    return pid


def stop_agent(fleet: FleetHarness, how: str) -> None:
    """`restart`: SIGHUP (a restart is requested), then SIGTERM; `kill`: SIGKILL."""
    agent = fleet.agents[HOST]
    if how == "restart":
        os.kill(agent.pid, signal.SIGHUP)
        wait_for(lambda: "restart requested" in fleet.stderr_of(agent), 30,
                 "the agent to take the restart request", fleet.describe)
        os.kill(agent.pid, signal.SIGTERM)
        assert fleet.wait_exit(agent, 30, "the restarting agent") == 0
        assert "left running for the next agent" in fleet.stderr_of(agent)
    else:
        fleet.kill_agent(HOST, signal.SIGKILL)
        fleet.wait_exit(agent, 30, "the killed agent")


@pytest.mark.parametrize("how", ["restart", "kill"])
def test_a_new_agent_adopts_a_running_attempt_and_reports_one_that_ended_meanwhile(
        make_fleet, tmp_path, store_url, how):
    """Three jobs run on a host; its agent stops (a requested restart, or -9). While no
    agent is up one job exits 3 and one exits 0; the next agent reports those exits (failed
    and done, not `lost`, no rerun) and supervises the third on: same process, one attempt,
    its log whole on the server."""
    fleet = fleet_with_host(make_fleet, tmp_path, store_url, adopt_grace="60s")
    first = fleet.agents[HOST]
    runs = fleet.submit(ticking(tmp_path, "runs"), max_attempts=1)
    ends = fleet.submit(ending(tmp_path, "ends", 3), max_attempts=1)
    succeeds = fleet.submit(ending(tmp_path, "succeeds", 0), max_attempts=1)
    runs_pid = running(fleet, tmp_path, runs, "runs")
    ends_pid = running(fleet, tmp_path, ends, "ends")
    running(fleet, tmp_path, succeeds, "succeeds")
    wait_for(lambda: "tick 3\n" in server_log(fleet, runs), 30,
             "the running job's log to reach the server", fleet.describe)
    guardian = fleet.guardian(HOST)

    stop_agent(fleet, how)
    (tmp_path / "ends.go").touch()
    (tmp_path / "succeeds.go").touch()
    # They ended while no agent was up: their supervisors wrote how.
    wait_for(lambda: read_status(agent_log(fleet, ends))
             and read_status(agent_log(fleet, succeeds)), 30,
             "the ended jobs' supervisors to record their exits", fleet.describe)
    status = read_status(agent_log(fleet, ends))
    assert status is not None and (status.exit_code, status.pid) == (3, ends_pid)
    assert alive(runs_pid) and guardian.alive()  # the guardian waits for a next agent

    second = fleet.start_agent(HOST)
    failed = fleet.wait_status(ends, JobStatus.FAILED)
    ended, *rerun = fleet.attempts(ends)
    assert not rerun, fleet.describe()
    assert (ended.outcome, ended.exit_code, failed.attempt, failed.lost) == (
        Outcome.FAILED, 3, 1, 0)
    assert "exiting 3" in server_log(fleet, ends)
    done = fleet.wait_status(succeeds, JobStatus.DONE)
    [succeeded] = fleet.attempts(succeeds)
    assert (succeeded.outcome, succeeded.exit_code, done.attempt) == (Outcome.OK, 0, 1)

    wait_for(lambda: not guardian.alive(), 30, "the old guardian to stand down",
             fleet.describe)
    assert "guardian: the next agent adopted this agent's attempts" in fleet.stderr_of(first)
    assert alive(runs_pid), "the guardian killed the adopted job"
    [adopted] = fleet.attempts(runs)
    assert adopted.worker.startswith(f"{HOST}/{second.pid}/") and adopted.outcome is None
    (tmp_path / "runs.release").touch()
    done = fleet.wait_status(runs, JobStatus.DONE)
    [attempt] = fleet.attempts(runs)
    assert (done.attempt, done.lost, attempt.exit_code, attempt.pid) == (1, 0, 0, runs_pid)
    wait_for(lambda: "\ndone after" in server_log(fleet, runs), 30,
             "the rest of the adopted job's log to reach the server", fleet.describe)
    text = server_log(fleet, runs)
    ticks = [int(line.split()[1]) for line in text.splitlines() if line.startswith("tick ")]
    [last] = [int(line.split()[2]) for line in text.splitlines()
              if line.startswith("done after ")]
    assert ticks == list(range(1, last + 1)), "the server's copy of the log has a gap"
    assert f"(ok; adopted by agent {HOST}/{second.pid}/" in text
    stderr = fleet.stderr_of(second)
    assert f"job {runs} attempt 1: adopted from dead agent" in stderr
    assert f"job {ends} attempt 1: adopted from dead agent" in stderr
    assert "belonged to a dead agent" not in stderr and "survived a dead agent" not in stderr


def test_an_adopted_attempt_keeps_its_timeout_and_can_be_cancelled(
        make_fleet, tmp_path, sqlite_url):
    """The next agent supervises what it adopts as its own: a timeout counted from the
    attempt's start, and a cancel."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="60s")
    timed = fleet.submit(ticking(tmp_path, "timed"), max_attempts=1, timeout_seconds=8)
    cancelled = fleet.submit(ticking(tmp_path, "cancelled"), max_attempts=1)
    timed_pid = running(fleet, tmp_path, timed, "timed")
    cancelled_pid = running(fleet, tmp_path, cancelled, "cancelled")
    stop_agent(fleet, "kill")
    second = fleet.start_agent(HOST)
    wait_for(lambda: f"job {cancelled} attempt 1: adopted" in fleet.stderr_of(second), 30,
             "the adoption", fleet.describe)
    fleet.cli("cancel", str(cancelled))
    fleet.wait_status(cancelled, JobStatus.CANCELLED)
    assert fleet.attempts(cancelled)[0].outcome is Outcome.CANCELLED
    assert not alive(cancelled_pid)
    timed_out = fleet.wait_status(timed, JobStatus.FAILED, timeout=60)
    assert (fleet.attempts(timed)[0].outcome, timed_out.attempt) == (Outcome.TIMEOUT, 1)
    assert not alive(timed_pid)


def test_no_adopt_grace_kills_at_once_and_reports_lost(make_fleet, tmp_path, sqlite_url):
    """adopt_grace = "0s": the dead agent's guardian kills its jobs at once and the server
    declares them lost, as before adoption existed; the next agent adopts nothing."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="0s")
    job_id = fleet.submit(ticking(tmp_path, "runs"), max_attempts=3)
    pid = running(fleet, tmp_path, job_id, "runs")
    fleet.kill_agent(HOST, signal.SIGKILL)
    wait_for(lambda: not alive(pid), 30, "the guardian to kill the job", fleet.describe)
    wait_for(lambda: fleet.attempts(job_id)[0].outcome is Outcome.LOST, 30,
             "the guardian's report to end the attempt as lost", fleet.describe)
    fleet.start_agent(HOST)
    wait_for(lambda: len(fleet.attempts(job_id)) == 2, 30, "the job to run again",
             fleet.describe)
    assert "adopted from dead agent" not in fleet.stderr_of(fleet.agents[HOST])
    # The second attempt ends too: its supervisor would outlive the agents the harness kills.
    (tmp_path / "runs.release").touch()
    done = fleet.wait_status(job_id, JobStatus.DONE, 60)
    assert (done.attempt, done.lost) == (2, 1)


def gone_on_the_server(fleet: FleetHarness, tmp_path: Path, job_id: int) -> None:
    """The server stops holding the attempt live: its agent is reported gone (as a guardian
    with the host's token would), so the attempt is lost there."""
    worker = fleet.attempts(job_id)[0].worker
    reply = httpx.post(f"{fleet.url}/api/v1/agent/{HOST}/gone", params={"worker": worker},
                       headers={"Authorization": f"Bearer {fleet.tokens[HOST]}"})
    assert reply.status_code == 200, reply.text
    assert fleet.attempts(job_id)[0].outcome is Outcome.LOST


def garbled_folder(fleet: FleetHarness, tmp_path: Path, job_id: int) -> None:
    """The attempt's record cannot be read."""
    (agent_log(fleet, job_id).with_suffix(".attempt.json")).write_text("{not json")


def supervisor_killed(fleet: FleetHarness, tmp_path: Path, job_id: int) -> None:
    """Its supervisor dies too (the job runs on, orphaned): nobody can say how it ends."""
    record = json.loads(agent_log(fleet, job_id).with_suffix(".attempt.json").read_text())
    os.kill(record["supervisor"], signal.SIGKILL)
    wait_for(lambda: not alive(record["supervisor"]), 30, "the supervisor to die",
             fleet.describe)


@pytest.mark.parametrize("fault", [gone_on_the_server, garbled_folder, supervisor_killed])
def test_what_cannot_be_adopted_is_killed(make_fleet, tmp_path, sqlite_url, fault):
    """Fencing is unchanged: an attempt the server no longer holds live is killed, never
    adopted; one whose folder cannot be read, or whose supervisor died too, is killed and
    reported lost as before adoption existed. The old guardian stands down either way."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="60s")
    job_id = fleet.submit(ticking(tmp_path, "runs"), max_attempts=3)
    pid = running(fleet, tmp_path, job_id, "runs")
    guardian = fleet.guardian(HOST)
    fleet.kill_agent(HOST, signal.SIGKILL)
    fleet.wait_exit(fleet.agents[HOST], 30, "the killed agent")
    fault(fleet, tmp_path, job_id)
    assert alive(pid)

    fleet.start_agent(HOST)
    wait_for(lambda: not alive(pid), 30, "the next agent to kill the job", fleet.describe)
    wait_for(lambda: fleet.attempts(job_id)[0].outcome is Outcome.LOST, 30,
             "the attempt to end as lost", fleet.describe)
    wait_for(lambda: not guardian.alive(), 30, "the old guardian to stand down",
             fleet.describe)
    assert "adopted from dead agent" not in fleet.stderr_of(fleet.agents[HOST])
    assert not (tmp_path / "runs.release").exists()
    # It runs again, on the new agent, once: the dead agent's long poll cannot take the new
    # placement (test_only_the_hosts_live_agent_takes_a_placement).
    wait_for(lambda: len(fleet.attempts(job_id)) == 2
             and fleet.job(job_id).status is JobStatus.RUNNING, 30, "the job to run again",
             fleet.describe)
    lost, again = fleet.attempts(job_id)
    assert lost.outcome is Outcome.LOST and again.outcome is None
    assert again.worker.startswith(f"{HOST}/{fleet.agents[HOST].pid}/"), fleet.describe()
    # The second attempt ends too: its supervisor would outlive the agents the harness kills.
    (tmp_path / "runs.release").touch()
    done = fleet.wait_status(job_id, JobStatus.DONE, 60)
    assert (done.attempt, done.lost) == (2, 1)


def test_the_guardian_holds_no_connection_of_its_agent(make_fleet, tmp_path, sqlite_url):
    """The guardian closes the sockets it inherits: a dead agent's connection closes with
    it, so the server sees its long poll end instead of holding it for the agent's guardian
    (which waits adopt_grace) and handing it placements."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="60s")
    guardian = fleet.guardian(HOST)
    folder = Path(f"/proc/{guardian.pid}/fd")
    held = [os.readlink(folder / name) for name in os.listdir(folder)]
    assert held and not [link for link in held if link.startswith("socket:")], held


def place_on_a_dead_agent(make_fleet, tmp_path, sqlite_url
                          ) -> tuple[FleetHarness, int, WorkerId]:
    """A placement taken by an agent of HOST that is gone (a pid of no process), unstarted
    as far as the server knows."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": LEASE,
                                                       "adopt_grace": "60s",
                                                       "memory_enforcement": "watchdog"})
    fleet.add_host(HOST, "--ram", "32", "--prime-workers", "3", "--night-workers", "3")
    fleet.start_server()
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = WorkerId(HOST, gone.pid, 1)  # a process of this host that is no more
    token = fleet.tokens[HOST]
    agent = f"/api/v1/agent/{HOST}"
    assert fleet.api("POST", f"{agent}/heartbeat", token=token,
                     json={"worker": str(dead)}).status_code == 200
    job_id = fleet.submit(["/bin/sh", "-c", "echo ran"], max_attempts=1)
    wait_for(lambda: fleet.job(job_id).status is JobStatus.CLAIMED, 30, "the placement",
             fleet.describe)
    taken = fleet.api("GET", f"{agent}/assignments", token=token,
                      params={"worker": str(dead), "free": 1})
    assert [job["id"] for job in taken.json()["jobs"]] == [job_id]
    # It ran with the log folder the next agent gets.
    note_agent(fleet.root / "agents" / HOST / HANDOVER_FOLDER, dead)
    return fleet, job_id, dead


def test_a_placement_a_dead_agent_took_and_never_started_runs_on_the_next_agent(
        make_fleet, tmp_path, sqlite_url):
    """An agent takes a placement and dies before it starts the job (nothing of it on the
    host: no log, no process). The next agent takes the attempt over and runs it: the same
    attempt, nothing lost, nothing spent."""
    fleet, job_id, dead = place_on_a_dead_agent(make_fleet, tmp_path, sqlite_url)
    second = fleet.start_agent(HOST)
    done = fleet.wait_status(job_id, JobStatus.DONE, 60)
    [attempt] = fleet.attempts(job_id)
    assert (done.attempt, done.lost, attempt.outcome) == (1, 0, Outcome.OK), fleet.describe()
    assert attempt.worker.startswith(f"{HOST}/{second.pid}/")
    assert f"job {job_id} attempt 1: taken by dead agent {dead}" in fleet.stderr_of(second)
    # It noted itself for an agent after it; the dead one's note is gone with it, and so is
    # the attempt's launch note once its result was recorded (it has done its job).
    handover = fleet.root / "agents" / HOST / HANDOVER_FOLDER
    assert not agent_path_for(handover, dead).exists()
    assert any(path.name.startswith(f"{second.pid}-") for path in handover.glob("*.agent"))
    wait_for(lambda: not list(handover.glob(f"{job_id}.1-*.launching")), 30,
             "the recorded attempt's launch note to go", fleet.describe)


def first_attempt_lost(fleet: FleetHarness, job_id: int) -> bool:
    return any(attempt.attempt == 1 and attempt.outcome is Outcome.LOST
               for attempt in fleet.attempts(job_id))


def test_a_placement_a_dead_agent_noted_as_launched_is_not_run_again(
        make_fleet, tmp_path, sqlite_url):
    """The dead agent noted the launch (then the job ran and ended, or it died before the
    spawn) and no log of it is anywhere: the next agent cannot tell, so it does not run
    the job again under the same attempt; it reports it lost."""
    fleet, job_id, dead = place_on_a_dead_agent(make_fleet, tmp_path, sqlite_url)
    note_launch(fleet.root / "agents" / HOST / HANDOVER_FOLDER, AttemptToken(job_id, 1), dead)
    second = fleet.start_agent(HOST)
    wait_for(lambda: first_attempt_lost(fleet, job_id), 60, "attempt 1 reported lost",
             fleet.describe)
    assert "which never started it" not in fleet.stderr_of(second)


def test_a_placement_of_an_agent_with_another_log_folder_is_not_run_again(
        make_fleet, tmp_path, sqlite_url):
    """The dead agent used another --log-dir: its launch notes would be there, unseen, so
    the next agent cannot tell whether it launched the job, and reports it lost."""
    fleet, job_id, dead = place_on_a_dead_agent(make_fleet, tmp_path, sqlite_url)
    agent_path_for(fleet.root / "agents" / HOST / HANDOVER_FOLDER, dead).unlink()
    second = fleet.start_agent(HOST)
    wait_for(lambda: first_attempt_lost(fleet, job_id), 60, "attempt 1 reported lost",
             fleet.describe)
    assert "which never started it" not in fleet.stderr_of(second)


def test_a_placement_whose_log_reached_the_server_is_not_run_again(
        make_fleet, tmp_path, sqlite_url):
    """The dead agent ran the job under another log folder, and its start report never
    reached the server, but some of its log did: the next agent reports it lost."""
    fleet, job_id, _dead = place_on_a_dead_agent(make_fleet, tmp_path, sqlite_url)
    shipped = fleet.api("POST", f"/api/v1/agent/{HOST}/attempts/{job_id}/1/log",
                        token=fleet.tokens[HOST], content=b"ran\n",
                        headers={"content-type": "application/octet-stream"})
    assert shipped.status_code == 200, shipped.text
    second = fleet.start_agent(HOST)
    wait_for(lambda: first_attempt_lost(fleet, job_id), 60, "attempt 1 reported lost",
             fleet.describe)
    assert "which left 4 bytes of log on the server" in fleet.stderr_of(second)


# -- the parts, alone ----------------------------------------------------------------------------


def test_a_supervisor_status_is_written_whole_and_read_back(tmp_path):
    log_path = tmp_path / "7" / "1.log"
    log_path.parent.mkdir()
    assert read_status(log_path) is None
    write_status(str(status_path_for(log_path)), {"pid": 5, "exit_code": None, "signal": 9,
                                                  "peak_rss": 4096, "ended_at": 1.5})
    assert read_status(log_path) == Status(1.5, 5, None, 9, 4096)
    assert read_status(log_path).returncode == -9
    assert not status_path_for(log_path).with_suffix(".json.tmp").exists()
    assert os.stat(status_path_for(log_path)).st_mode & 0o077 == 0
    status_path_for(log_path).write_text('{"ended_at": "x"}')
    assert read_status(log_path) is None


def test_a_record_that_cannot_be_written_fails_loudly(tmp_path):
    from test_agent_client import make_job

    from herder.runtime.attempt_files import AttemptRecord, read_record

    log_path = tmp_path / "1.log"
    record = AttemptRecord("7.1@a/1/1", "a/1/1", 10, 20, 11, make_job(7), time.time())
    write_record(log_path, record)
    assert read_record(log_path) == record
    assert os.stat(log_path.with_suffix(".attempt.json")).st_mode & 0o077 == 0
    with pytest.raises(OSError):
        write_record(tmp_path / "missing" / "1.log", record)


def test_the_guardian_waits_for_the_handover_and_keeps_the_deadlines(tmp_path):
    now = [0.0]
    killed: list[list[str]] = []
    handed = tmp_path / "handover"

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] >= 3.0:
            handed.touch()

    deadlines = {"a": 1.0, "b": 100.0}
    assert await_successor(deadlines, handed, 10.0, killed.append, lambda: True,
                           clock=lambda: now[0], sleep=sleep)
    assert killed == [["a"]] and deadlines == {"b": 100.0} and 3.0 <= now[0] < 3.2
    # No next agent within the grace: False once it is over.
    handed.unlink()
    now[0] = 0.0
    assert not await_successor({}, tmp_path / "never", 2.0, killed.append, lambda: True,
                               clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert now[0] >= 2.0
    # Nothing of the dead agent is left: nothing to wait for.
    assert await_successor({}, tmp_path / "never", 60.0, killed.append, lambda: False,
                           clock=lambda: 0.0, sleep=lambda s: None)


def test_the_server_hands_over_only_a_live_attempt_of_the_worker_named(
        make_fleet, tmp_path, sqlite_url):
    """POST .../adopt: 409 unless the attempt is live on the host under `previous`, 422
    for a worker of another host, nothing changed either way; the agent's own works."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="60s")
    job_id = fleet.submit(ticking(tmp_path, "runs"), max_attempts=1)
    running(fleet, tmp_path, job_id, "runs")
    worker = fleet.attempts(job_id)[0].worker
    wait_for(lambda: "tick 3\n" in server_log(fleet, job_id), 30,
             "the job's log to reach the server", fleet.describe)

    def adopt(previous: str, new: str, attempt: int = 1) -> httpx.Response:
        return httpx.post(f"{fleet.url}/api/v1/agent/{HOST}/attempts/{job_id}/{attempt}/adopt",
                          json={"worker": new, "previous": previous},
                          headers={"Authorization": f"Bearer {fleet.tokens[HOST]}"})

    assert adopt(f"{HOST}/1/1", f"{HOST}/2/2").status_code == 409
    assert adopt(worker, f"{HOST}/2/2", attempt=2).status_code == 409
    assert adopt(worker, "beta/2/2").status_code == 422  # not a worker of this host
    assert fleet.attempts(job_id)[0].worker == worker
    reply = adopt(worker, worker)  # its own: a no-op that answers the log's size
    assert reply.status_code == 200
    assert reply.json()["log_size"] >= len(b"tick 1\ntick 2\ntick 3\n")
    (tmp_path / "runs.release").touch()
    fleet.wait_status(job_id, JobStatus.DONE)


def test_a_running_attempt_has_its_launch_note_until_its_result_is_recorded(
        make_fleet, tmp_path, sqlite_url):
    """The note a next agent reads (`note_launch`) is there while the attempt runs, and goes
    once the server has recorded its result."""
    fleet = fleet_with_host(make_fleet, tmp_path, sqlite_url, adopt_grace="10s")
    job_id = fleet.submit(ticking(tmp_path, "runs"))
    running(fleet, tmp_path, job_id, "runs")
    handover = fleet.root / "agents" / HOST / HANDOVER_FOLDER
    assert list(handover.glob(f"{job_id}.1-{fleet.agents[HOST].pid}-*.launching")), \
        list(handover.iterdir())
    (tmp_path / "runs.release").touch()
    fleet.wait_status(job_id, JobStatus.DONE, 60)
    wait_for(lambda: not list(handover.glob(f"{job_id}.1-*.launching")), 30,
             "the recorded attempt's launch note to go", fleet.describe)
