"""`[fleet] emergency_max_workers` (seed 004): a fleet-wide cap on running jobs, set and lifted
at run time. Placement on hand-made snapshots; the run-time value in the store on both
backends; the CLI's validation (exit 2, store unchanged); and through a real server and agent:
an admin sets it, a read token may not, new starts beyond it wait saying why, running jobs go
on, and lifting it starts the waiting work."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from support.cli import run_herder
from support.waits import wait_for

from herder.client import Client
from herder.core.errors import InputError
from herder.core.fleet import Fleet
from herder.core.model import JobStatus, Scope
from herder.core.scheduling.capacity import WindowCaps
from herder.core.scheduling.explanation import explain
from herder.core.scheduling.health import HostHealth
from herder.core.scheduling.placement import (
    HostLoad,
    HostSpec,
    PendingJob,
    Reason,
    Snapshot,
    place,
    stopped,
)
from herder.core.settings.loading import Config
from herder.core.settings.sections import Settings
from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS, fleet_cap

NOON = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)
ALPHA = HostSpec("alpha", 32, prime=WindowCaps(4), night=WindowCaps(4))
BETA = HostSpec("beta", 32, prime=WindowCaps(4), night=WindowCaps(4))
SLEEP = ["/bin/sh", "-c", "sleep 120"]


def snapshot(jobs: int, running: dict[str, int], cap: int | None) -> Snapshot:
    loads = {label: HostLoad(label, HostHealth.HEALTHY, count, 3.0 * count)
             for label, count in running.items()}
    return Snapshot(NOON, [PendingJob(i, 10, "light", "dev") for i in range(1, jobs + 1)],
                    [ALPHA, BETA], loads, max_workers=cap)


# -- placement (pure) ----------------------------------------------------------------------------


def test_placement_starts_only_as_many_as_the_cap_leaves_and_says_why_the_rest_wait():
    plan = place(snapshot(4, {"alpha": 1, "beta": 1}, cap=3))
    assert [a.job_id for a in plan.assignments] == [1]
    for job_id in (2, 3, 4):
        assert {r.reason for r in plan.waiting[job_id]} == {Reason.FLEET_CAP}
    line = explain(2, plan, snapshot(4, {"alpha": 1, "beta": 1}, cap=3))
    assert "fleet cap reached (3 running, fleet cap 3" in line and "herder fleet cap" in line
    assert line.count("fleet cap reached") == 1  # one fleet-wide reason, not one per host
    # An operator's cap is not a stopped fleet: no fleet-stopped alert for it.
    assert stopped(place(snapshot(2, {"alpha": 0, "beta": 0}, cap=0))) is None


def test_a_cap_below_what_runs_starts_nothing_and_no_cap_starts_everything():
    lowered = place(snapshot(3, {"alpha": 2, "beta": 2}, cap=1))
    assert lowered.assignments == ()
    assert "4 running, fleet cap 1" in lowered.waiting[1][0].detail
    assert len(place(snapshot(3, {"alpha": 2, "beta": 2}, cap=None)).assignments) == 3
    assert len(place(snapshot(3, {"alpha": 0, "beta": 0}, cap=0)).assignments) == 0
    assert len(place(snapshot(3, {"alpha": 0, "beta": 0}, cap=None)).assignments) == 3


def test_a_full_or_unsuitable_host_says_its_own_reason_before_the_cap():
    bound = Snapshot(NOON, [PendingJob(1, 10, "light", "dev", affinity="alpha")], [ALPHA],
                     {"alpha": HostLoad("alpha", HostHealth.DOWN, 0, 0.0)}, max_workers=0)
    (rejection,) = place(bound).waiting[1]
    assert rejection.reason is Reason.HEALTH


# -- the store, both backends --------------------------------------------------------------------


def test_the_run_time_cap_is_stored_for_every_replica(store):
    now = datetime(2026, 7, 1, tzinfo=UTC)
    assert store.fleet_setting_get(EMERGENCY_MAX_WORKERS) is None
    assert fleet_cap(store, 5).max_workers == 5 and not fleet_cap(store, 5).at_run_time
    store.fleet_setting_put(EMERGENCY_MAX_WORKERS, 3, now, "ops")
    setting = store.fleet_setting_get(EMERGENCY_MAX_WORKERS)
    assert (setting.value, setting.updated_at, setting.updated_by) == (3, now, "ops")
    cap = fleet_cap(store, 5)
    assert (cap.max_workers, cap.at_run_time, cap.updated_by) == (3, True, "ops")
    store.fleet_setting_put(EMERGENCY_MAX_WORKERS, None, now + timedelta(seconds=1), "ops2")
    assert fleet_cap(store, 5).max_workers is None  # lifted beats herder.toml's 5
    assert store.fleet_setting_delete(EMERGENCY_MAX_WORKERS)
    assert not store.fleet_setting_delete(EMERGENCY_MAX_WORKERS)
    assert fleet_cap(store, 5) == fleet_cap(store, 5) and fleet_cap(store, 5).max_workers == 5


def test_the_client_refuses_a_cap_that_is_not_a_count_and_leaves_the_store(store, store_url):
    client = Client.over(store, Config(settings=Settings(), path=None))
    client.fleet_cap_set(2)
    for bad in (-1, True, 2.5, "3"):
        with pytest.raises(InputError) as refused:
            client.fleet_cap_set(bad)  # type: ignore[arg-type]
        assert refused.value.field == "max_workers"
    assert client.fleet_cap().max_workers == 2


def test_the_snapshot_reads_the_run_time_cap(store):
    fleet = Fleet.from_settings(Settings())
    assert fleet.max_workers is None
    store.fleet_setting_put(EMERGENCY_MAX_WORKERS, 0, datetime.now(UTC), "ops")
    from herder.runtime.scheduler import take_snapshot

    assert take_snapshot(store, fleet, datetime.now(UTC), {}).max_workers == 0


# -- the CLI against the database ------------------------------------------------------------------


def test_cli_sets_lifts_and_resets_and_refuses_bad_input_with_exit_2(make_fleet, tmp_path,
                                                                     store_url):
    local = make_fleet(tmp_path, store_url, fleet={"emergency_max_workers": 4})
    assert "fleet cap: 4 (herder.toml" in local.cli("fleet", "cap").stdout
    assert "fleet cap: 2 (set at run time by cli" in local.cli("fleet", "cap", "2").stdout
    for bad in (["-1"], ["abc"], ["2.5"], ["3", "--lift"], ["--lift", "--reset"]):
        refused = local.cli("fleet", "cap", *bad, check=False)
        assert refused.returncode == 2, (bad, refused.stdout, refused.stderr)
    assert local.store.fleet_setting_get(EMERGENCY_MAX_WORKERS).value == 2
    assert "fleet cap: none (set at run time" in local.cli("fleet", "cap", "--lift").stdout
    assert "fleet cap: 4 (herder.toml" in local.cli("fleet", "cap", "--reset").stdout


# -- through a real server and agent --------------------------------------------------------------


def test_cap_through_the_api_holds_new_starts_and_lifting_it_starts_them(make_fleet, tmp_path,
                                                                         store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_host("alpha", "--ram", "32", "--prime-workers", "4", "--night-workers", "4")
    fleet.start_server()
    fleet.start_agent("alpha")

    # Who may: a read token reads it, only an admin changes it; bad bodies are refused.
    (tmp_path / "tokens").mkdir()
    reader = fleet.token_file(tmp_path / "tokens", Scope.READ).read_text().strip()
    submitter = fleet.token_file(tmp_path / "tokens", Scope.SUBMIT).read_text().strip()
    assert fleet.api("GET", "/api/v1/fleet/cap", token=reader).json()["max_workers"] is None
    for token in (reader, submitter):
        refused = fleet.api("PUT", "/api/v1/fleet/cap", token=token, json={"max_workers": 0})
        assert refused.status_code == 403, refused.text
        assert fleet.api("DELETE", "/api/v1/fleet/cap", token=token).status_code == 403
    assert fleet.api("PUT", "/api/v1/fleet/cap", token="",
                     json={"max_workers": 0}).status_code == 401
    for body in ({"max_workers": -1}, {"max_workers": "1"}, {"max_workers": True}, {},
                 {"max_workers": 1, "other": 2}):
        assert fleet.api("PUT", "/api/v1/fleet/cap", json=body).status_code == 422, body
    assert fleet.store.fleet_setting_get(EMERGENCY_MAX_WORKERS) is None

    first = fleet.submit(SLEEP, weight="light")
    fleet.wait_status(first, JobStatus.RUNNING, timeout=60)
    answer = fleet.api("PUT", "/api/v1/fleet/cap", json={"max_workers": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json()["max_workers"] == 1 and answer.json()["at_run_time"] is True
    assert answer.json()["updated_by"] == "tests" and answer.json()["running"] == 1

    second = fleet.submit(SLEEP, weight="light")
    why = wait_for(lambda: "fleet cap reached" in (text := fleet.why_api(second)) and text,
                   30, "the second job waiting for the fleet cap", fleet.describe)
    assert "1 running, fleet cap 1" in why
    assert "fleet cap reached" in fleet.why(second)  # the CLI, from the store, says it too
    queue = fleet.api("GET", "/queue").json()
    assert queue["fleet_cap"]["max_workers"] == 1 and queue["fleet_cap"]["running"] == 1
    assert fleet.store.job_get(second).status is JobStatus.QUEUED

    # A lower cap stops nothing that runs; lifting it (the CLI, over the API) starts the rest.
    assert fleet.api("PUT", "/api/v1/fleet/cap", json={"max_workers": 0}).status_code == 200
    assert fleet.store.job_get(first).status is JobStatus.RUNNING
    lifted = run_herder("fleet", "cap", "--lift", cwd=tmp_path,
                        env=fleet.operator(tmp_path / "admin", Scope.ADMIN), check=True)
    assert "fleet cap: none (set at run time by cli-admin" in lifted.stdout, lifted.stdout
    fleet.wait_status(second, JobStatus.RUNNING, timeout=60)
    assert fleet.store.job_get(first).status is JobStatus.RUNNING
    denied = run_herder("fleet", "cap", "1", cwd=tmp_path,
                        env=fleet.operator(tmp_path / "r2", Scope.READ))
    assert denied.returncode == 2 and "token refused" in denied.stderr
    assert fleet.store.fleet_setting_get(EMERGENCY_MAX_WORKERS).value is None


# -- herder up (no scheduler: its claims honour the cap) ----------------------------------------


def test_herder_up_claims_no_more_than_the_cap_lets_start(harness):
    from support.waits import holds_for

    harness.cli("fleet", "cap", "1")
    first = harness.submit(SLEEP)
    second = harness.submit(SLEEP)
    up = harness.up("--concurrency", "4")
    harness.wait_ready(up)
    harness.wait_status(first, JobStatus.RUNNING, timeout=60)
    holds_for(lambda: harness.store.job_get(second).status is JobStatus.QUEUED, 3,
              "the second job to wait for the cap", harness.describe)
    harness.cli("fleet", "cap", "--lift")
    harness.wait_status(second, JobStatus.RUNNING, timeout=60)
    for job_id in (first, second):
        harness.client.cancel(job_id)
    for job_id in (first, second):
        harness.wait_status(job_id, JobStatus.CANCELLED, timeout=60)


def test_herder_toml_refuses_a_cap_that_is_not_a_count(tmp_path):
    from herder.core.errors import ConfigError
    from herder.core.settings.loading import load_config

    path = tmp_path / "herder.toml"
    for bad in ("-1", "2.5", "true", '"many"'):
        path.write_text(f"[fleet]\nemergency_max_workers = {bad}\n")
        with pytest.raises(ConfigError) as refused:
            load_config(path)
        assert "fleet.emergency_max_workers" in str(refused.value), bad
    path.write_text("[fleet]\nemergency_max_workers = 0\n")
    assert load_config(path).settings.fleet.emergency_max_workers == 0
