"""Fleet integration tests: a real `herder server`, real `herder agent` processes posing as
hosts of different sizes on this machine, and the `herder` CLI, all as subprocesses.

What each test proves is observed from outside: the jobs record where and when they ran,
the store and the HTTP API show the rest. See tests/support/fleet.py for the harness.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.fleet import WEIGHTS, bookable, peaks, read_intervals, read_lines, recorder
from support.waits import holds_for, wait_for

from herder.core.model import JobStatus, Outcome

# -- 1. RAM and worker caps hold across several agents ---------------------------------------

# label: (total GB, reserved GB, workers, extra `host add` options)
HOSTS = {
    "big": (32.0, 4.0, 3, ()),          # 22.4 GB bookable: RAM binds before the 3 workers do
    "small": (8.0, 0.0, 2, ()),         # 6.4 GB: no heavy, one playwright at a time
    "lite": (8.0, 0.0, 2, ("--weights", "light")),  # light only
}
WORKLOAD = ["orchestrator"] * 2 + ["heavy"] * 4 + ["playwright"] * 3 + ["light"] * 9


@pytest.mark.slow
def test_ram_and_worker_caps_hold_across_agents(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_hosts({label: ("--ram", str(ram), "--reserved", str(reserved),
                             "--prime-workers", str(workers), "--night-workers", str(workers),
                             *extra)
                     for label, (ram, reserved, workers, extra) in HOSTS.items()})
    fleet.start_server()
    # Everything is queued before any host can take work, so the placements are made over
    # the whole queue at once (submitting one by one on a loaded machine could let each
    # half-second job end before the next arrives, and no cap would be tested).
    events = tmp_path / "events"
    order = [WORKLOAD[(i * 7) % len(WORKLOAD)] for i in range(len(WORKLOAD))]
    assert sorted(order) == sorted(WORKLOAD)
    ids = [fleet.submit(recorder(events), weight=weight) for weight in order]
    fleet.start_agents(*HOSTS)
    wait_for(lambda: all(v["health"] == "healthy" for v in fleet.hosts_api().values()),
             60, "every host to be healthy", fleet.describe)
    for job_id in ids:
        fleet.wait_status(job_id, JobStatus.DONE, timeout=90)

    intervals = read_intervals(events)
    assert Counter(interval.job for interval in intervals) == Counter(ids), intervals
    for interval in intervals:
        job = fleet.job(interval.job)
        assert (interval.host, interval.weight, interval.attempt) == (job.host, job.weight, 1)
    found = peaks(intervals)
    for label, (ram, reserved, workers, _extra) in HOSTS.items():
        if label not in found:
            continue
        most_workers, most_ram = found[label]
        assert most_workers.workers <= workers, (label, most_workers)
        assert most_ram.ram_gb <= bookable(ram, reserved) + 1e-9, (label, most_ram)
    heavier = {i.weight for i in intervals if i.host == "lite"} - {"light"}
    assert not heavier, f"lite ran {heavier}"
    for interval in intervals:
        if WEIGHTS[interval.weight] > bookable(8.0):
            assert interval.host == "big", interval
    # The run was a real test of the caps: big ran several jobs at once.
    assert found["big"][0].workers >= 2, found


# -- 2. the time window switches the caps -----------------------------------------------------


def _clock(moment: datetime) -> str:
    return moment.strftime("%H:%M")


@pytest.mark.slow
def test_window_switch_changes_caps(make_fleet, tmp_path, sqlite_url):
    now = datetime.now(UTC)
    night = {"timezone": "UTC", "night_start": _clock(now - timedelta(minutes=1)),
             "night_end": _clock(now + timedelta(minutes=30))}
    fleet = make_fleet(tmp_path, sqlite_url, fleet=night)
    fleet.add_host("owl", "--ram", "16", "--prime-workers", "1", "--night-workers", "0")
    fleet.start_server(wait=False)
    fleet.start_agent("owl")
    owl = fleet.hosts()["owl"]
    assert (owl["window"], owl["max_workers"]) == ("night", 0)

    job_id = fleet.submit(["true"])
    wait_for(lambda: "closed at night" in fleet.why_api(job_id), 20,
             "why to name the night window", fleet.describe)
    assert "owl closed at night" in fleet.why(job_id)
    holds_for(lambda: fleet.job(job_id).status is JobStatus.QUEUED
              and fleet.job(job_id).attempt == 0, 1.5, "the job to stay queued at night",
              fleet.describe)

    # Now it is prime time: the night starts in an hour.
    later = {"timezone": "UTC", "night_start": _clock(now + timedelta(minutes=60)),
             "night_end": _clock(now + timedelta(minutes=120))}
    fleet.write_config(fleet=later)
    fleet.stop_server()
    fleet.start_server()
    job = fleet.wait_status(job_id, JobStatus.DONE, timeout=30)
    assert job.host == "owl"
    assert fleet.hosts_api()["owl"]["window"] == "prime"


# -- 3. drain -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_drain_lets_running_job_finish_and_places_nothing_new(make_fleet, tmp_path,
                                                              sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.add_hosts(dict.fromkeys(("alpha", "beta"),
                                  ("--ram", "16", "--prime-workers", "2", "--night-workers", "2")))
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    release = tmp_path / "release"
    events = tmp_path / "events"
    waiting = f"while [ ! -e '{release}' ]; do sleep 0.05; done"
    first = fleet.submit(recorder(events, body=waiting))
    fleet.wait_status(first, JobStatus.RUNNING)
    assert fleet.job(first).host == "alpha"

    fleet.cli("host", "drain", "alpha")
    assert fleet.hosts()["alpha"]["enabled"] is False
    second = fleet.submit(recorder(events, body="true"))
    wait_for(lambda: "alpha drained" in fleet.why_api(second), 20,
             "why to say alpha is drained", fleet.describe)
    assert "alpha drained" in fleet.why(second)
    holds_for(lambda: fleet.job(second).attempt == 0, 1.0,
              "the new job to stay off the drained host", fleet.describe)

    release.touch()
    done = fleet.wait_status(first, JobStatus.DONE)
    assert (done.host, done.attempt) == ("alpha", 1)
    assert fleet.job(second).status is JobStatus.QUEUED

    fleet.start_agent("beta")
    placed = fleet.wait_status(second, JobStatus.DONE)
    assert placed.host == "beta"
    assert [(i.job, i.host) for i in read_intervals(events)] == [(first, "alpha"),
                                                                (second, "beta")]
    fleet.cli("host", "enable", "alpha")
    assert fleet.hosts_api()["alpha"]["enabled"] is True


# -- 4. allow-lists and affinity (seed 000 §5.5) ----------------------------------------------

WSL1_TYPES = "dev-issue,continue-issue,review-pr,review-plan"


def job_types(ran: Path) -> str:
    """wsl1's job types and infra-task: each records that it ran (and where) in `ran`."""
    command = f'echo "$HERDER_JOB_ID $HERDER_HOST $HERDER_JOB_TYPE" >> {ran}'
    return "".join(f"[job_types.{name}]\ncommand = ['/bin/sh', '-c', '{command}']\n"
                   f"priority = 10\n\n" for name in (*WSL1_TYPES.split(","), "infra-task"))


@pytest.mark.slow
def test_allow_lists_and_affinity_seed_cases(make_fleet, tmp_path, sqlite_url):
    ran = tmp_path / "ran"
    fleet = make_fleet(tmp_path, sqlite_url, extra=job_types(ran))
    fleet.add_hosts({
        "wsl1": ("--ram", "16", "--prime-workers", "2", "--night-workers", "2",
                 "--weights", "light", "--priority-floor", "5", "--job-types", WSL1_TYPES),
        "bms-4": ("--ram", "64", "--prime-workers", "2", "--night-workers", "2"),
    })
    fleet.start_server(wait=False)
    fleet.start_agent("wsl1", "--job-types", WSL1_TYPES, "--weights", "light",
                      "--priority-floor", "5")

    submitted = fleet.cli_many(["submit", "dev-issue", "--priority", "1"],
                               ["submit", "infra-task"],
                               ["submit", "dev-issue", "--weight", "heavy"],
                               ["submit", "dev-issue", "--host", "bms-4"])
    urgent, infra, heavy, bound = (int(result.stdout) for result in submitted)
    plain = fleet.submit_cli("dev-issue")  # the only one wsl1 may take, submitted last

    job = fleet.wait_status(plain, JobStatus.DONE)
    assert job.host == "wsl1"
    assert read_lines(ran) == [f"{plain} wsl1 dev-issue"]
    expected = {
        urgent: "wsl1 priority floor 5",
        infra: "wsl1 refuses job type infra-task",
        heavy: "wsl1 refuses weight heavy",
        bound: "bound to bms-4",
    }
    answers = fleet.cli_many(*(["why", str(job_id)] for job_id in expected))
    for (job_id, reason), answer in zip(expected.items(), answers, strict=True):
        waiting = fleet.job(job_id)
        assert (waiting.status, waiting.attempt) == (JobStatus.QUEUED, 0), waiting
        assert reason in answer.stdout, (job_id, answer.stdout)
    # bms-4 has no agent: its health is unknown, so it takes nothing either.
    assert "bms-4 health unknown" in answers[-1].stdout


@pytest.mark.slow
def test_agent_refuses_what_its_local_allow_list_forbids(make_fleet, tmp_path, sqlite_url):
    """An infra-task is placed on a host with no server-side allow-list before its agent is
    up; the agent's own list says dev-issue only, so it refuses (fail-closed) and never runs
    it. From then on placement knows the agent's list and stops offering it there."""
    ran = tmp_path / "ran"
    # The placement waits for an agent that is slow to start on a loaded machine: a pickup
    # timeout far above the 2 s lease, which must not hand the placement back meanwhile.
    fleet = make_fleet(tmp_path, sqlite_url, extra=job_types(ran),
                       fleet={"pickup_timeout": "60s"})
    fleet.add_host("gate", "--ram", "16", "--prime-workers", "1", "--night-workers", "1")
    fleet.cli("heartbeat", "--host", "gate")
    fleet.start_server(wait=False)
    infra = fleet.submit_cli("infra-task")
    wait_for(lambda: fleet.job(infra).status is JobStatus.CLAIMED, 20,
             "the infra-task to be placed on gate", fleet.describe)

    def first_placement_waits() -> bool:
        job = fleet.job(infra)
        return (job.status, job.attempt) == (JobStatus.CLAIMED, 1)

    holds_for(first_placement_waits, 4.0, "the placement to wait past the 2 s lease",
              fleet.describe)
    agent = fleet.start_agent("gate", "--job-types", "dev-issue")

    def refused() -> bool:
        return any(a.outcome is Outcome.REFUSED for a in fleet.attempts(infra))

    wait_for(refused, 20, "the agent to refuse the infra-task", fleet.describe)
    first = fleet.attempts(infra)[0]
    assert (first.host, first.outcome, first.started_at) == ("gate", Outcome.REFUSED, None)
    requeued = [e for e in fleet.store.event_list(infra)
                if e.kind == "finished" and e.attempt == 1]
    assert [(e.from_status, e.to_status) for e in requeued] == [
        (JobStatus.CLAIMED, JobStatus.QUEUED)], requeued
    assert fleet.job(infra).failures == 0
    assert "job type 'infra-task' is not allowed on this host" in fleet.stderr_of(agent)

    # Whatever it allows still runs there: the refused job does not hold the only slot.
    dev = fleet.submit_cli("dev-issue")
    assert fleet.wait_status(dev, JobStatus.DONE).host == "gate"
    # The agent advertised its list with its heartbeat: placement now refuses the job there.
    wait_for(lambda: "refuses job type infra-task" in fleet.why_api(infra), 20,
             "why to name the agent's job-type list", fleet.describe)
    assert fleet.job(infra).status is JobStatus.QUEUED
    assert fleet.api("POST", f"/api/v1/jobs/{infra}/cancel").status_code == 200
    fleet.wait_status(infra, JobStatus.CANCELLED)
    assert read_lines(ran) == [f"{dev} gate dev-issue"]
    assert all(a.started_at is None for a in fleet.attempts(infra))


# -- 6. a token is bound to its host ----------------------------------------------------------


def test_agent_token_is_bound_to_its_host(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url, runtime={"attempt_lease": "60s"})
    fleet.add_hosts({"host-a": ("--ram", "16"), "host-b": ("--ram", "16")})
    token_a, token_b = fleet.tokens["host-a"], fleet.tokens["host-b"]
    fleet.cli("heartbeat", "--host", "host-b")
    fleet.start_server()
    job_id = fleet.submit(["true"], affinity="host-b")
    placed = fleet.wait_status(job_id, JobStatus.CLAIMED)
    assert placed.host == "host-b"

    def snapshot() -> object:
        hosts = {h.label: (h.last_heartbeat, h.enabled) for h in fleet.store.host_list()}
        attempts = [(a.attempt, a.worker, a.pid, a.started_at, a.ended_at, a.outcome)
                    for a in fleet.attempts(job_id)]
        events = [e.id for e in fleet.store.event_list(job_id)]
        job = fleet.job(job_id)
        return hosts, attempts, events, (job.status, job.attempt, job.updated_at)

    before = snapshot()
    worker = "host-b/1/1"
    path = f"/api/v1/agent/host-b/attempts/{job_id}/{placed.attempt}"
    forbidden = [
        ("POST", "/api/v1/agent/host-b/heartbeat", {"json": {"worker": worker}}),
        ("GET", "/api/v1/agent/host-b/assignments",
         {"params": {"worker": worker, "free": 1}}),
        ("POST", f"{path}/start", {"json": {"pid": 1}}),
        ("POST", f"{path}/finish", {"json": {"outcome": "ok", "exit_code": 0}}),
        ("POST", f"{path}/log", {"content": b"forged\n"}),
        ("GET", "/api/v1/agent/host-b/cancels", {"params": {"jobs": str(job_id)}}),
        ("POST", "/api/v1/hosts/host-b/heartbeat", {}),
    ]
    for method, url, kwargs in forbidden:
        response = fleet.api(method, url, token=token_a, **kwargs)
        assert response.status_code == 403, (method, url, response.status_code, response.text)
        garbage = fleet.api(method, url, token="hdr_garbage", **kwargs)
        assert garbage.status_code in (401, 403), (method, url, garbage.status_code)
        anonymous = fleet.api(method, url, token="", **kwargs)
        assert anonymous.status_code == 401, (method, url, anonymous.status_code)
    # host-a's token on host-a's own path still cannot touch host-b's attempt.
    own = f"/api/v1/agent/host-a/attempts/{job_id}/{placed.attempt}"
    assert fleet.api("POST", f"{own}/start", token=token_a, json={"pid": 1}).status_code == 409
    assert fleet.api("POST", f"{own}/finish", token=token_a,
                     json={"outcome": "ok", "exit_code": 0}).status_code == 409
    assert snapshot() == before
    assert not (tmp_path / "server-logs" / str(job_id)).exists()

    # The same requests with host-b's token work, so the 403s were about the token alone
    # (the worker heartbeats first: only the host's live agent takes a placement).
    assert fleet.api("POST", "/api/v1/agent/host-b/heartbeat", token=token_b,
                     json={"worker": worker}).status_code == 200
    taken = fleet.api("GET", "/api/v1/agent/host-b/assignments", token=token_b,
                      params={"worker": worker, "free": 1})
    assert [job["id"] for job in taken.json()["jobs"]] == [job_id]
    assert fleet.api("POST", f"{path}/start", token=token_b,
                     json={"pid": 1}).json() == {"accepted": True}
    finished = fleet.api("POST", f"{path}/finish", token=token_b,
                         json={"outcome": "ok", "exit_code": 0})
    assert finished.json() == {"accepted": True, "status": "done"}


# -- 9. reservations through the CLI ------------------------------------------------------------


def test_reservations_and_ci_slots_via_cli(make_fleet, tmp_path, store_url):
    """Independent CLI calls run side by side (each costs a Python start); concurrent
    claims and releases of one CI run also show they are idempotent under a race."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_host("res1", "--ram", "16")  # 12.8 GB bookable

    reserved = fleet.cli("reserve", "parent-7", "--host", "res1", "--count", "10",
                         "--weight", "light")
    ids = [int(line) for line in reserved.stdout.split()]
    assert len(ids) == 4, reserved.stdout  # 4 × 3 GB = 12 ≤ 12.8 < 15
    assert "only 4 of 10" in reserved.stderr
    ram, more = fleet.cli_many(["ram", "res1"],
                               ["reserve", "parent-8", "--host", "res1", "--count", "1",
                                "--weight", "light"])
    assert ram.stdout.strip() == "0.8"
    assert more.stdout.strip() == ""
    assert "only 0 of 1" in more.stderr

    claims = fleet.cli_many(*[["slots", "claim", "ci-run-1", "--host", "res1",
                               "--weight", "heavy"]] * 2)
    assert claims[0].stdout.strip() == claims[1].stdout.strip() != ""
    ram, hosts, bogus, unknown, no_host = fleet.cli_many(
        ["ram", "res1"], ["hosts", "--json"], ["complete", str(ids[0]), "--status", "bogus"],
        ["complete", "99999", "--status", "done"], ["ram", "nope"], check=False)
    assert ram.stdout.strip() == "-7.2"  # a CI slot may overbook
    assert json.loads(hosts.stdout)[0]["free_gb"] == pytest.approx(-7.2)
    assert bogus.returncode == 2, (bogus.stdout, bogus.stderr)
    assert unknown.returncode == 2, (unknown.stdout, unknown.stderr)
    assert no_host.returncode == 2, (no_host.stdout, no_host.stderr)

    releases = fleet.cli_many(*[["slots", "release", "ci-run-1"]] * 2)
    assert sorted(r.stdout.strip() for r in releases) == ["nothing to release", "released"]
    assert fleet.cli("ram", "res1").stdout.strip() == "0.8"  # and bogus completed nothing

    done = fleet.cli("complete", str(ids[0]), "--status", "done")
    assert done.stdout.strip() == f"reservation {ids[0]}: done"
    ram, again = fleet.cli_many(["ram", "res1"],
                                ["complete", str(ids[0]), "--status", "failed"])
    assert ram.stdout.strip() == "3.8"
    assert again.stdout.strip() == f"reservation {ids[0]}: done"  # ended stays ended


# -- 10. long-poll ----------------------------------------------------------------------------


def test_idle_agent_receives_a_placed_job(make_fleet, tmp_path, sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.add_host("idle", "--ram", "16")
    fleet.start_server(wait=False)
    fleet.start_agent("idle")
    events = tmp_path / "events"
    job_id = fleet.submit(recorder(events, body="true"))
    job = fleet.wait_status(job_id, JobStatus.DONE)
    assert job.host == "idle"
    assert [(i.job, i.host) for i in read_intervals(events)] == [(job_id, "idle")]
