"""`herder agent` on SIGTERM drains: no new work, running jobs finish, or are handed back
once the drain deadline passes. And the systemd unit it prints."""

from __future__ import annotations

import signal
from pathlib import Path

from support.cli import run_herder
from support.waits import wait_for

from herder.core.model import JobStatus, Outcome


def _agent_running_a_job(make_fleet, tmp_path, sqlite_url, label: str, workers: str,
                         drain_timeout: str, then: str):
    """A server, an agent for `label` and a job it has started (the job then runs `then`)."""
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.add_host(label, "--ram", "16", "--prime-workers", workers, "--night-workers", workers)
    fleet.start_server(wait=False)
    agent = fleet.start_agent(label, "--drain-timeout", drain_timeout)
    marker = tmp_path / "running"
    job_id = fleet.submit(["/bin/sh", "-c", f"touch {marker}; {then}"])
    wait_for(marker.exists, 20, "the job to start", fleet.describe)
    return fleet, agent, job_id


def test_sigterm_lets_the_running_job_finish_and_takes_nothing_new(
        make_fleet, tmp_path, sqlite_url):
    fleet, agent, first = _agent_running_a_job(
        make_fleet, tmp_path, sqlite_url, "d1", "2", "60s", "sleep 1.5; echo finished")

    fleet.kill_agent("d1", signal.SIGTERM)
    wait_for(lambda: "draining" in fleet.stderr_of(agent), 10, "the agent to drain",
             fleet.describe)
    second = fleet.submit(["/bin/true"])
    assert agent.wait(30) == 0, fleet.stderr_of(agent)
    done = fleet.job(first)
    assert done.status is JobStatus.DONE, fleet.describe()
    assert [a.outcome for a in fleet.attempts(first)] == [Outcome.OK]
    # A draining agent asks for no work: the second job was never started anywhere.
    assert all(a.started_at is None for a in fleet.attempts(second))
    assert fleet.job(second).status in (JobStatus.QUEUED, JobStatus.CLAIMED)


def test_past_the_drain_deadline_running_jobs_are_handed_back(make_fleet, tmp_path, sqlite_url):
    fleet, agent, job_id = _agent_running_a_job(
        make_fleet, tmp_path, sqlite_url, "d2", "1", "1s", "sleep 120")
    processes = fleet.job_processes(job_id)
    assert processes

    fleet.kill_agent("d2", signal.SIGTERM)
    assert agent.wait(30) == 0, fleet.stderr_of(agent)
    job = fleet.wait_status(job_id, JobStatus.QUEUED)
    assert [a.outcome for a in fleet.attempts(job_id)] == [Outcome.LOST]
    assert job.failures == 0 and job.lost == 1
    assert not [p for p in processes if p.alive()], "handed back means stopped"
    # The stopped agent said so with its last heartbeat: nothing is placed on d2 any more.
    wait_for(lambda: "d2 agent stopped" in fleet.why_api(job_id), 10,
             "why to say the stopped host takes no work", fleet.describe)
    assert [a.outcome for a in fleet.attempts(job_id)] == [Outcome.LOST]


def test_install_systemd_prints_a_unit_without_the_token(tmp_path: Path):
    result = run_herder("agent", "install-systemd", "--server", "https://coordinator:8470",
                        "--host", "bms-4", "--user", "herder", cwd=tmp_path, check=True)
    unit = result.stdout
    assert "Restart=always" in unit
    assert ("--server https://coordinator:8470 --host bms-4 "
            "--token-file /etc/herder/agent-token") in unit
    assert "User=herder" in unit
    # The token lives in a 0600 file, never in the unit or its environment.
    assert "EnvironmentFile=" not in unit and "HERDER_AGENT_TOKEN" not in unit
    assert "--token " not in unit
    assert "install -m 600 -o herder /dev/null /etc/herder/agent-token" in unit


def test_the_token_comes_from_a_0600_file_or_the_variable_and_never_reaches_a_job(
        make_fleet, tmp_path, sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url)
    caps = ("--ram", "16", "--prime-workers", "1", "--night-workers", "1")
    fleet.add_hosts({"by-file": caps, "by-variable": caps})
    fleet.start_server()
    home = tmp_path / "home"
    token_file = home / ".config" / "herder" / "agent-token"
    token_file.parent.mkdir(parents=True)
    token_file.write_text(fleet.tokens["by-file"] + "\n")
    token_file.chmod(0o600)
    environments = {"by-file": {"HOME": str(home)},
                    "by-variable": {"HERDER_AGENT_TOKEN": fleet.tokens["by-variable"]}}
    for label, extra in environments.items():
        fleet.agents[label] = fleet.start(
            f"agent-{label}", "agent", "--server", fleet.url, "--host", label, "--no-ram-check",
            "--log-dir", str(tmp_path / "agents" / label), env=extra)
    for label in environments:
        fleet.wait_agent(label)
    for label in environments:
        printed = tmp_path / f"env-{label}.txt"
        job_id = fleet.submit(["/bin/sh", "-c", f"env > {printed}"], affinity=label)
        assert fleet.wait_status(job_id, JobStatus.DONE).host == label
        seen = printed.read_text()
        assert f"HERDER_HOST={label}" in seen  # the job's own environment
        assert "HERDER_AGENT_TOKEN" not in seen
        assert fleet.tokens[label] not in seen
        assert fleet.tokens[label] not in fleet.stderr_of(fleet.agents[label])
