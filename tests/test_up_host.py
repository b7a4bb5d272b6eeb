"""`herder up` is a host too (issue 26): the machine it runs on shows in `herder hosts` (local
and through a server), `/queue` (the dashboard's fleet view), `/metrics` and `herder why` like
a registered host, with its slots, booked and measured RAM and its loop's health, while it
keeps claiming its own work (no `herder_hosts` row, so placement is unchanged)."""

from __future__ import annotations

import json
import os
import signal
from datetime import UTC, datetime, timedelta

import httpx
from support.cli import run_herder
from support.local import open_harness, shell
from support.ports import free_port
from support.store import age_presences
from support.waits import wait_for

from herder.core.access import new_token, token_hash
from herder.core.fleet import Fleet
from herder.core.model import JobSpec, JobStatus, RunnerPresence, Scope
from herder.core.settings.sections import Settings
from herder.runtime.read_models import host_views
from herder.services.why import why

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LIGHT = Settings().weights["light"]
"""The default weight's budget: what each running job books."""


def test_up_shows_its_machine_as_a_host_with_busy_slots(tmp_path, store_url):
    with open_harness(tmp_path, store_url) as local:
        secret = new_token()
        local.store.token_insert("ops", Scope.ADMIN, token_hash(secret), NOW)
        port = free_port()
        process = local.up("--concurrency", "3", "--ui", "--ui-listen", f"127.0.0.1:{port}")
        local.wait_ready(process)
        running = [local.submit(shell("sleep 300")) for _ in range(3)]
        for job_id in running:
            local.wait_status(job_id, JobStatus.RUNNING, timeout=60)
        queued = local.submit(["true"])

        # -- `herder hosts`, on the store ---------------------------------------------------
        def machine(views: list[dict[str, object]]) -> dict[str, object] | None:
            return next((view for view in views if view["label"] == local.host
                         and view["workers"] == 3), None)

        found = wait_for(lambda: machine(json.loads(local.cli("hosts", "--json").stdout)),
                         30, "herder hosts to show 3 busy slots", local.describe)
        assert found["transport"] == "up" and found["max_workers"] == 3
        assert found["health"] == "healthy" and found["liveness"] == "live"
        assert found["agent_down"] is None and found["enabled"] is True
        assert found["booked_gb"] == 3 * LIGHT
        assert found["ram_total_gb"] > 0 and found["measured_available_gb"] > 0
        assert local.store.host_list() == [], "the machine is not a registered host"
        table = local.cli("hosts").stdout
        assert local.host in table and "3/3" in table and " up " in table, table

        # -- `herder why`: the busy slots the queued job waits for --------------------------
        assert local.cli("why", str(queued)).stdout.strip() == (
            f"queued; waits for one of 3 busy slots on {local.host} (0 job(s) ahead of it)")

        # -- through the server: /queue (the fleet view), /metrics, `herder hosts` ----------
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {secret}"}
        with httpx.Client(base_url=base, headers=headers, timeout=10) as http:
            view = http.get("/queue", params={"recent": 0}).json()
            (host,) = view["hosts"]
            assert (host["label"], host["transport"], host["workers"], host["max_workers"]) == (
                local.host, "up", 3, 3)
            metrics = http.get("/metrics").text
        for line in (f'herder_host_workers{{host="{local.host}"}} 3.0',
                     f'herder_host_max_workers{{host="{local.host}"}} 3.0',
                     f'herder_host_ram_booked_gb{{host="{local.host}"}} {3 * LIGHT}',
                     f'herder_host_health{{health="healthy",host="{local.host}"}} 1.0',
                     f'herder_host_agent_up{{host="{local.host}"}} 1.0'):
            assert line in metrics.splitlines(), (line, metrics)
        token = tmp_path / "token"
        token.write_text(secret)
        token.chmod(0o600)
        remote = run_herder("hosts", "--json", cwd=tmp_path, check=True,
                            env={"HERDER_SERVER": base, "HERDER_TOKEN_FILE": str(token)})
        (host,) = json.loads(remote.stdout)
        assert (host["label"], host["transport"], host["workers"]) == (local.host, "up", 3)

        # -- a clean exit takes the machine out of the view ---------------------------------
        os.killpg(process.pid, signal.SIGTERM)
        assert local.wait_exit(process, 60, "herder up") == 0
        assert local.store.runner_list(datetime.now(UTC)) == []
        assert json.loads(local.cli("hosts", "--json").stdout) == []


def presence(label: str, running: int, last_turn_at: datetime) -> RunnerPresence:
    return RunnerPresence(label, f"{label}/10/1", concurrency=3, running=running, cpus=4,
                          ram_total_gb=16.0, ram_booked_gb=running * LIGHT,
                          ram_available_gb=12.0, started_at=NOW - timedelta(hours=1),
                          last_turn_at=last_turn_at)


def test_a_free_slot_takes_the_job_and_a_silent_runner_shows_down(store, store_url):
    fleet = Fleet.from_settings(Settings())
    [first, second] = [result.job_id for result in store.job_insert(
        [JobSpec(command=("true",)), JobSpec(command=("true",))], NOW)]
    store.runner_publish(presence("box", 2, NOW))
    assert why(store, fleet, first, NOW) == (
        "queued; a free slot on box takes it on the runner's next turn (0 job(s) ahead of it)")
    assert why(store, fleet, second, NOW) == (
        "queued; waits for one of 3 busy slots on box (1 job(s) ahead of it)")
    (view,) = host_views(store, fleet, NOW)
    assert (view.workers, view.free_gb, view.measured_available_gb) == (2, 16 - 2 * LIGHT, 12.0)

    # A runner that stopped writing (killed, frozen) is down by its last write's age (by
    # the database's clock), and `why` no longer counts its slots.
    age_presences(store, store_url, 120)
    later = NOW + timedelta(minutes=2)  # the reader's clock plays no part
    (view,) = host_views(store, fleet, later)
    assert (view.health, view.liveness, view.workers) == ("down", "down", 0)
    assert view.agent_down == "`herder up` silent: its loop last wrote 120s ago"
    assert why(store, fleet, first, later) == (
        "queued; no hosts are registered, so `herder up` runs it (0 job(s) ahead of it)")


def test_a_runner_that_missed_a_write_is_late_not_down(store, store_url):
    fleet = Fleet.from_settings(Settings())
    store.runner_publish(presence("box", 0, NOW))
    age_presences(store, store_url, 12)
    (view,) = host_views(store, fleet, NOW)
    assert (view.health, view.liveness, view.agent_down) == ("degraded", "late", None)


def test_a_presence_write_that_backs_off_reads_nothing_meanwhile(monkeypatch):
    """While a failed presence write backs off, a turn (every 20 ms) neither reads the
    machine's RAM nor builds the presence: it waits for the retry."""
    from herder.runtime import presence as presence_module
    from herder.runtime.steps import Steps

    reads: list[float] = []

    def machine_ram_gb() -> tuple[float, float | None]:
        reads.append(1.0)
        return 16.0, 12.0

    monkeypatch.setattr(presence_module, "machine_ram_gb", machine_ram_gb)
    sent: list[RunnerPresence] = []
    failing = [True]

    def send(presence: RunnerPresence) -> None:
        if failing[0]:
            raise ConnectionError("the store is away")
        sent.append(presence)

    steps = Steps()
    writer = presence_module.Presence("box", "box/10/1", 3, None, NOW)
    writer.publish({}, 0.0, NOW, steps, send)
    assert (len(reads), sent) == (1, [])
    due = steps.retry("presence").due
    assert due > 0.0
    for turn in range(1, 5):  # turns within the back-off
        writer.publish({}, min(due, 0.02 * turn) / 2, NOW, steps, send)
    assert (len(reads), sent) == (1, [])
    failing[0] = False
    writer.publish({}, due, NOW, steps, send)
    assert (len(reads), len(sent)) == (2, 1)
