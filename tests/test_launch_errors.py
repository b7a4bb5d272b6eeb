"""A launch failure's cause (the OS error) reaches the attempt, `herder show` and `herder
why`: under `herder up`, under an agent (through its finish report) and over `--server`."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from support.cli import run_herder
from support.local import Harness

from herder.core.fleet import Fleet
from herder.core.model import JobSpec, JobStatus, Outcome, launch_errors
from herder.core.settings.sections import Settings
from herder.runtime.endings import Ending, PolicyLimits, record_ending
from herder.services.why import why

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MISSING = "spawn failed: [Errno 2] No such file or directory: 'claud'"


def test_a_retry_backoff_after_a_launch_failure_says_why_the_attempt_could_not_start(store):
    [inserted] = store.job_insert([JobSpec(command=("claud",), max_attempts=3,
                                           backoff_base_seconds=60)], NOW)
    [job] = store.job_claim("h1", "h1/1/1", 1, NOW)
    status = record_ending(store, job, Outcome.LAUNCH_FAILED, NOW,
                           PolicyLimits.from_settings(Settings()),
                           ending=Ending(launch_error=MISSING))
    assert status is JobStatus.QUEUED
    assert launch_errors(store.event_list(inserted.job_id)) == {1: MISSING}
    answer = why(store, Fleet.from_settings(Settings()), inserted.job_id,
                 NOW + timedelta(seconds=1))
    assert answer.startswith("waiting ") and "after launch_failed" in answer, answer
    assert answer.endswith(f"; its last attempt on h1 could not start: {MISSING}"), answer


def test_the_finish_route_keeps_the_detail_of_a_launch_failure_and_old_agents_still_work(
        make_fleet, tmp_path: Path, sqlite_url: str):
    """A finish report with `detail` (this agent) records it as the launch error; one
    without (an older agent) is accepted as before, with no cause recorded."""
    fleet = make_fleet(tmp_path, sqlite_url, runtime={"attempt_lease": "60s"},
                       fleet={"pickup_timeout": "60s"})
    fleet.add_host("cron1", "--ram", "16", "--prime-workers", "2", "--night-workers", "2")
    fleet.cli("heartbeat", "--host", "cron1")  # healthy: placement uses it
    fleet.start_server()
    old, new = (fleet.submit(["claud"], max_attempts=1) for _ in range(2))
    for job_id in (old, new):
        fleet.wait_status(job_id, JobStatus.CLAIMED, 30)
    for job_id, body in ((old, {"outcome": "launch_failed"}),
                         (new, {"outcome": "launch_failed", "detail": MISSING})):
        response = fleet.api("POST", f"/api/v1/agent/cron1/attempts/{job_id}/1/finish",
                             token=fleet.tokens["cron1"], json=body)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "failed"
    assert launch_errors(fleet.store.event_list(old)) == {}
    assert launch_errors(fleet.store.event_list(new)) == {1: MISSING}
    assert fleet.why(old) == "failed (launch_failed); exit code None"
    assert fleet.why(new).endswith(f"its last attempt on cron1 could not start: {MISSING}")


def test_herder_up_records_the_os_error_of_each_launch_that_failed(harness: Harness):
    h = harness
    gone = h.dir / "gone"
    gone.mkdir()
    not_executable = h.dir / "not-executable.sh"
    not_executable.write_text("#!/bin/sh\necho never\n")
    not_executable.chmod(0o644)
    garbage = h.dir / "garbage"
    garbage.write_bytes(b"\x7fELF not really a program\n")
    garbage.chmod(0o755)
    cases = {
        "claud": (str(h.dir), "spawn failed: [Errno 2] No such file or directory: 'claud'"),
        str(not_executable): (str(h.dir), "spawn failed: [Errno 13] Permission denied: "
                                          f"'{not_executable}'"),
        str(garbage): (str(h.dir), f"spawn failed: [Errno 8] Exec format error: '{garbage}'"),
        "true": (str(gone), "spawn failed: [Errno 2] No such file or directory: "
                            f"'{gone.resolve()}'"),
    }
    ids = {}
    for program, (workdir, _) in cases.items():
        result = h.cli("submit", "--no-check", "--max-attempts", "1", "--workdir", workdir,
                       "--", program)
        ids[program] = int(result.stdout.strip())
    gone.rmdir()  # the workdir existed at submit; it is gone when the job runs

    up = h.up("--exit-when-idle")
    assert h.wait_exit(up, 60, "`herder up --exit-when-idle`") == 0, h.describe()
    for program, (_, error) in cases.items():
        job_id = ids[program]
        job = h.job(job_id)
        assert (job.status, job.failure_reason) == (JobStatus.FAILED, "launch_failed"), job
        assert launch_errors(h.events(job_id)) == {1: error}
        assert h.cli("why", str(job_id)).stdout == (
            f"failed (launch_failed); exit code None; its last attempt on {h.host} "
            f"could not start: {error}\n")
        shown = h.cli("show", str(job_id)).stdout
        assert f"launch_error  {error}\n" in shown, shown
        assert f"could not start on {h.host}: {error}\n" in shown, shown
        assert json.loads(h.cli("show", str(job_id), "--json").stdout)["launch_error"] == error
        [alert] = [a for a in h.store.alert_list() if a.key == f"job:{job_id}:failed"]
        assert error in alert.message, alert.message


def test_an_agents_launch_failure_reaches_show_and_why_through_the_database_and_the_server(
        make_fleet, tmp_path: Path, sqlite_url: str):
    fleet = make_fleet(tmp_path, sqlite_url)
    fleet.add_host("alpha", "--ram", "16")
    fleet.start_server()
    fleet.start_agent("alpha")
    job_id = fleet.submit(["claud-not-installed", "--version"], max_attempts=1)
    fleet.wait_status(job_id, JobStatus.FAILED, 60)
    error = "spawn failed: [Errno 2] No such file or directory: 'claud-not-installed'"
    assert launch_errors(fleet.store.event_list(job_id)) == {1: error}

    operator = tmp_path / "operator"
    remote = fleet.operator(operator)
    for args in (("why", str(job_id)), ("show", str(job_id)),
                 ("show", str(job_id), "--json")):
        local = fleet.cli(*args).stdout
        over_http = run_herder(*args, cwd=operator, env=remote, check=True).stdout
        assert over_http == local, args
    assert fleet.cli("why", str(job_id)).stdout == (
        f"failed (launch_failed); exit code None; its last attempt on alpha could not start: "
        f"{error}\n")
    assert f"could not start on alpha: {error}" in fleet.cli("show", str(job_id)).stdout
    assert not os.path.exists(operator / "herder.db")
