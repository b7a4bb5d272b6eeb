"""PostgreSQL restarts on a private cluster (tests/support/postgres.py): a clean stop and a start
after a while, and `pg_ctl restart -m immediate`, which cuts every connection as a crash
would. `herder up`, `herder server` (with a local or an agent host) and `herder agent` ride
them out; a CLI command while the database is down, or failing after connect, is one line and
exit 2.

The test reads the store through fresh connections (`status`): pooled ones die with the
restart, and the test must observe the processes under test, not its own pool."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from support.cli import run_herder
from support.fleet import FleetHarness
from support.local import Harness, shell
from support.postgres import PostgresCluster
from support.waits import wait_for

from herder.store import open_store

RESTARTS = ["stop-start", "immediate"]


def status(url: str, job_id: int) -> str | None:
    """The job's status through a fresh connection; None while the database is down."""
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            row = conn.execute("SELECT status FROM herder_jobs WHERE id = %s",
                               (job_id,)).fetchone()
    except psycopg.OperationalError:
        return None
    assert row is not None, f"no job {job_id}"
    return str(row[0])


def outcomes(url: str, job_id: int) -> list[str | None]:
    with open_store(url) as store:
        return [attempt.outcome for attempt in store.attempt_list(job_id)]


def assert_one_line_exit_2(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("herder: error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


# -- herder up ----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("mode", RESTARTS)
def test_up_finishes_a_job_across_a_database_restart(tmp_path, private_postgres, mode):
    url = private_postgres.url
    open_store(url).close()
    work = tmp_path / "up"
    work.mkdir()
    # A lease longer than the outage: this test is about riding it out, not about leases.
    harness = Harness(work, url, runtime={"attempt_lease": '"60s"'})
    try:
        started, release = work / "started", work / "release"
        job_id = harness.submit(shell(
            f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done; echo finished"))
        up = harness.up("--exit-when-idle")
        harness.wait_ready(up)
        wait_for(started.exists, 30, "the job to start", harness.describe)
        # The runner records the start after the spawn, so the job can run (and touch
        # `started`) while its row still says claimed: wait for the record, not the file.
        wait_for(lambda: status(url, job_id) == "running", 30, "the start to be recorded",
                 harness.describe)
        if mode == "stop-start":
            private_postgres.stop()
            release.touch()  # the job ends while the database is down
            wait_for(lambda: not harness.marked(job_id), 30, "the job process to end")
            wait_for(lambda: "runner turn failed" in harness.stderr_of(up), 30,
                     "herder up to notice the outage", harness.describe)
            assert up.poll() is None, harness.stderr_of(up)
            private_postgres.start()
        else:
            release.touch()
            private_postgres.restart("immediate")
        assert harness.wait_exit(up, 120, "herder up") == 0, harness.stderr_of(up)
        assert status(url, job_id) == "done"
        assert outcomes(url, job_id) == ["ok"]
        assert "finished" in (harness.log_dir / str(job_id) / "1.log").read_text()
    finally:
        harness.close()


# -- herder server ------------------------------------------------------------------------------


def healthz(fleet: FleetHarness) -> tuple[int, dict[str, Any]] | None:
    try:
        response = httpx.get(f"{fleet.url}/healthz", timeout=2.0)
    except httpx.HTTPError:
        return None
    return response.status_code, response.json()


def healthy(fleet: FleetHarness, leader: bool = False) -> dict[str, Any] | None:
    """/healthz's view while it answers 200 (and, with `leader`, says leader)."""
    reply = healthz(fleet)
    if reply is None or reply[0] != 200 or (leader and not reply[1]["leader"]):
        return None
    return reply[1]


def unhealthy(fleet: FleetHarness) -> dict[str, Any] | None:
    """/healthz's view while it answers 503."""
    reply = healthz(fleet)
    return reply[1] if reply is not None and reply[0] == 503 else None


def submitted(fleet: FleetHarness, command: list[str]) -> Callable[[], int | None]:
    """A poll that submits once the server accepts it (it may answer 503 right after a
    restart); returns the job id."""
    def attempt() -> int | None:
        try:
            response = fleet.api("POST", "/api/v1/jobs", json={"command": command})
        except httpx.HTTPError:
            return None
        if response.status_code == 201:
            return int(response.json()["id"])
        assert response.status_code == 503, (response.status_code, response.text)
        return None

    return attempt


def run_to_done(fleet: FleetHarness, url: str, marker: Path) -> int:
    job_id = wait_for(submitted(fleet, shell(f"touch {marker}")), 60, "a submit to succeed",
                      fleet.describe)
    wait_for(lambda: status(url, job_id) == "done", 90, f"job {job_id} to be done",
             fleet.describe)
    assert marker.exists()
    return job_id


def server_on(make_fleet: Any, root: Path, cluster: PostgresCluster, transport: str
              ) -> FleetHarness:
    url = cluster.url
    open_store(url).close()
    root.mkdir()
    # Leases longer than the outages: riding them out is the point, not lease expiry.
    # A local host is declared in herder.toml (never with host add); an agent host is added.
    local = ('[hosts.host-a]\nram_total_gb = 16\ntransport = "local"\n'
             '[hosts.host-a.prime]\nmax_workers = 2\n[hosts.host-a.night]\nmax_workers = 2\n')
    fleet: FleetHarness = make_fleet(root, url, runtime={"attempt_lease": "60s"},
                                     extra=local if transport == "local" else "")
    if transport != "local":
        fleet.add_host("host-a", "--ram", "16", "--prime-workers", "2", "--night-workers", "2",
                       "--transport", transport)
    fleet.start_server()
    if transport == "agent":
        fleet.start_agent("host-a")
    return fleet


@pytest.mark.slow
@pytest.mark.postgres
def test_server_with_a_local_host_rides_out_restarts_and_healthz_follows(
        make_fleet, tmp_path, private_postgres):
    fleet = server_on(make_fleet, tmp_path / "fleet", private_postgres, "local")
    url = private_postgres.url
    run_to_done(fleet, url, tmp_path / "before")
    server = fleet.server
    assert server is not None

    private_postgres.stop()
    # Down: the scheduler cannot complete a cycle, and past its staleness limit /healthz says
    # so (503, ok false) while the process keeps running.
    view = wait_for(lambda: (v := unhealthy(fleet)) and not v["loops"]["scheduler"]["ok"] and v,
                    120, "/healthz to answer 503 for the scheduler", fleet.describe)
    assert view["ok"] is False and view["leader"] is False
    assert view["loops"]["scheduler"]["last_error"] == "StoreUnavailable", view
    assert server.poll() is None, fleet.describe()
    assert_one_line_exit_2(fleet.cli("jobs", check=False), "cannot connect")

    private_postgres.start()
    wait_for(lambda: healthy(fleet, leader=True), 90, "/healthz to be ok and leading again",
             fleet.describe)
    run_to_done(fleet, url, tmp_path / "after-stop")

    private_postgres.restart("immediate")
    run_to_done(fleet, url, tmp_path / "after-immediate")
    view = wait_for(lambda: healthy(fleet), 90, "/healthz to be ok", fleet.describe)
    assert set(view["loops"]) == {"scheduler", "ssh", "local-hosts", "assignments",
                                  "heartbeat:host-a"}
    assert server.poll() is None
    assert "scheduler cycle failed: cannot check the leader lease" in fleet.stderr_of(server)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.parametrize("mode", RESTARTS)
def test_server_and_agent_finish_and_place_across_a_restart(
        make_fleet, tmp_path, private_postgres, mode):
    fleet = server_on(make_fleet, tmp_path / "fleet", private_postgres, "agent")
    url = private_postgres.url
    started, release = tmp_path / "started", tmp_path / "release"
    running = fleet.submit(shell(
        f"touch {started}; while [ ! -e {release} ]; do sleep 0.1; done; echo finished"))
    wait_for(started.exists, 60, "the job to start on the agent", fleet.describe)
    if mode == "stop-start":
        private_postgres.stop()
        release.touch()  # the job ends while the database is down: its result must wait
        wait_for(lambda: not fleet.job_processes(running), 30, "the job process to end")
        server = fleet.server
        assert server is not None
        wait_for(lambda: "scheduler cycle failed" in fleet.stderr_of(server), 60,
                 "the server to notice the outage", fleet.describe)
        private_postgres.start()
    else:
        release.touch()
        private_postgres.restart("immediate")
    wait_for(lambda: status(url, running) == "done", 120, "the running job to be done",
             fleet.describe)
    assert outcomes(url, running) == ["ok"]
    run_to_done(fleet, url, tmp_path / "after")
    wait_for(lambda: healthy(fleet), 90, "/healthz to be ok", fleet.describe)
    for label, process in [("server", fleet.server), ("agent", fleet.agents["host-a"])]:
        assert process is not None and process.poll() is None, f"the {label} exited"


# -- the CLI --------------------------------------------------------------------------------------


@pytest.mark.postgres
def test_a_database_failure_after_connect_is_one_line_and_exit_2(tmp_path, postgres_url):
    """The store opens (connect, migrate), then the command's query cannot get its lock
    in time: the CLI says so in one line, no traceback."""
    config = tmp_path / "herder.toml"
    config.write_text("")
    impatient = f"{postgres_url}?options=-c%20lock_timeout%3D300"
    with psycopg.connect(postgres_url) as holder:
        holder.execute("LOCK TABLE herder_jobs IN ACCESS EXCLUSIVE MODE")
        result = run_herder("jobs", cwd=tmp_path, db=impatient, config=config)
    assert_one_line_exit_2(result, "the database is unavailable", "lock timeout")


def test_operational_errors_of_both_backends_are_store_unavailable():
    import sqlite3

    from herder.core.errors import StoreUnavailable
    from herder.store import as_unavailable

    locked = as_unavailable(sqlite3.OperationalError("database is locked"))
    assert isinstance(locked, StoreUnavailable)
    assert str(locked) == "the database is unavailable: database is locked"
    refused = as_unavailable(psycopg.OperationalError("connection refused\n\tIs it running?"))
    assert str(refused) == "the database is unavailable: connection refused Is it running?"
    already = StoreUnavailable("cannot open x")
    assert as_unavailable(already) is already
    assert as_unavailable(sqlite3.IntegrityError("UNIQUE")) is None
    assert as_unavailable(psycopg.errors.UniqueViolation("duplicate")) is None
    assert as_unavailable(ValueError("a bug")) is None


# -- the store's own connections ------------------------------------------------------------------


@pytest.mark.postgres
def test_waker_lease_and_pool_heal_after_a_restart(private_postgres):
    from herder.core.errors import StoreUnavailable
    from herder.store.postgres import PostgresWaker

    with open_store(private_postgres.url) as store:
        waker, lease = store.listen(), store.leader_lease()
        assert isinstance(waker, PostgresWaker) and waker.connected
        try:
            assert lease.try_acquire()
            private_postgres.restart("immediate")
            # The lost LISTEN connection wakes its waiter (a NOTIFY may have been lost) and
            # reconnects instead of raising into the thread that waits.
            assert waker.wait(5.0)
            wait_for(lambda: waker.wait(0.05) or waker.connected, 30, "the waker to reconnect")
            # Every pooled connection died with the restart: one call fails, and the pool
            # drops the other dead ones at once, so the next call works.
            with contextlib.suppress(StoreUnavailable):
                store.notify("probe")
            store.notify("after")
            assert waker.wait(10.0), "a NOTIFY after the restart wakes the waiter"
            # The lease's session died too: it is re-acquired, not assumed.
            assert lease.try_acquire()
            private_postgres.stop()
            lease.release()
            with pytest.raises(StoreUnavailable, match="cannot check the leader lease"):
                lease.try_acquire()
            # Down: the waiter sleeps its timeout (the caller's poll takes over), never raises.
            wait_for(lambda: not waker.wait(0.05) and not waker.connected, 30,
                     "the waker to see the database gone")
            assert not waker.wait(0.1)
        finally:
            waker.close()
            lease.release()
