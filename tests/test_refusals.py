"""A job or a host setting that can never be satisfied is refused at the edge: exit 2 (or
HTTP 422) naming the field, the store unchanged. Through the database and the server."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import error_line, run_herder, store_state, submitted_id
from support.config import write_config
from support.ports import free_port

from herder.core.model import HostRecord, Scope
from herder.store import open_store

TYPES = "".join(f"[job_types.{name}]\ncommand = ['true']\n\n"
                for name in ("dev-issue", "review-pr"))
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOSTS = (
    # books 0.8 x (8 - 3) = 4 GB; takes dev-issue only, light only, priority 5 and up
    HostRecord("lap-1", 8, ram_reserved_gb=3, allowed_job_types=frozenset({"dev-issue"}),
               allowed_weights=frozenset({"light"}), priority_floor=5),
    HostRecord("tiny", 6, ram_reserved_gb=1),  # books 4 GB
)


@pytest.fixture
def project(tmp_path: Path, store_url: str) -> tuple[Path, str]:
    """A herder.toml with two job types and a database with two small hosts."""
    write_config(tmp_path / "herder.toml", {}, TYPES)
    with open_store(store_url) as store:
        for host in HOSTS:
            store.host_insert(host, NOW)
    return tmp_path, store_url


def herder(project: tuple[Path, str], *args: str) -> subprocess.CompletedProcess[str]:
    folder, url = project
    return run_herder(*args, cwd=folder, db=url, config=folder / "herder.toml")


@pytest.mark.parametrize(("args", "field", "words"), [
    (("dev-issue", "--weight", "heavy"), "weight",
     "heavy books 8 GB of RAM; the largest host, lap-1, can book 4.0 GB"),
    (("review-pr", "--host", "lap-1"), "affinity", "host lap-1 refuses job type review-pr"),
    (("dev-issue", "--host", "lap-9"), "affinity", "--host lap-9: no such host"),
    (("dev-issue", "--host", "lap-1", "--priority", "1"), "priority",
     "host lap-1 refuses priorities below 5"),
    (("dev-issue", "--host", "lap-1", "--weight", "playwright"), "weight",
     "host lap-1 refuses weight playwright"),
])
def test_a_submit_no_host_can_ever_take_is_refused(project, args, field, words):
    before = store_state(project[1])
    line = error_line(herder(project, "submit", *args))
    assert line.startswith(f"herder: error: {field}: ") and words in line, line
    assert store_state(project[1]) == before


def test_a_submit_some_host_can_take_is_accepted(project):
    submitted_id(herder(project, "submit", "dev-issue", "--host", "lap-1", "--priority", "5"))
    submitted_id(herder(project, "submit", "review-pr"))  # tiny takes it


@pytest.mark.parametrize(("args", "field", "words"), [
    (("add", "lap-2", "--ram", "8", "--job-types", "dev-issue,dev-isue"), "--job-types",
     "no job type named dev-isue"),
    (("add", "lap-2", "--ram", "8", "--reserved", "8"), "--reserved", "leaves nothing"),
    (("add", "lap-2", "--ram", "0"), "--ram", "more than 0"),
    (("set", "lap-1", "--reserved", "9"), "--reserved", "9 GB reserved of 8 GB"),
    (("set", "tiny", "--weights", "light,heavy"), "--weights", "heavy can never fit"),
    (("set", "tiny", "--job-types", "review-pr,infra"), "--job-types", "no job type named infra"),
    (("set", "tiny", "--prime-workers", "0", "--night-workers", "0"), "--prime-workers",
     "would never take work"),
])
def test_a_host_setting_that_contradicts_itself_is_refused(project, args, field, words):
    with open_store(project[1]) as store:
        before = store.host_list()
    line = error_line(herder(project, "host", *args))
    assert line.startswith(f"herder: error: {field}: ") and words in line, line
    with open_store(project[1]) as store:
        assert store.host_list() == before
        assert store.token_list() == []  # `host add` made no token either


def test_the_server_refuses_them_too_and_a_remote_submit_exits_2(make_fleet, tmp_path: Path,
                                                                 store_url: str):
    fleet = make_fleet(tmp_path, store_url, extra=TYPES)
    for host in HOSTS:
        fleet.store.host_insert(host, NOW)
    fleet.start_server()
    before = store_state(store_url)
    for body, field in (({"job_type": "review-pr", "affinity": "lap-1"}, "affinity"),
                        ({"job_type": "dev-issue", "weight": "heavy"}, "weight"),
                        ({"job_type": "dev-issue", "affinity": "lap-1", "priority": 1},
                         "priority")):
        response = fleet.api("POST", "/api/v1/jobs", json=body)
        assert response.status_code == 422, response.text
        assert response.json()["field"] == field, response.text
        assert response.json()["error"].startswith(f"{field}: "), response.text
    assert store_state(store_url) == before

    operator = tmp_path / "operator"
    remote = fleet.operator(operator, Scope.SUBMIT)
    line = error_line(run_herder("submit", "--host", "lap-1", "review-pr", cwd=operator,
                                 env=remote))
    assert "affinity" in line and "refuses job type review-pr" in line, line
    assert store_state(store_url) == before
    accepted = run_herder("submit", "--host", "lap-1", "--priority", "7", "dev-issue",
                          cwd=operator, env=remote)
    assert json.loads(fleet.api("GET", f"/api/v1/jobs/{submitted_id(accepted)}").text)[
        "affinity"] == "lap-1"


# -- hosts declared in herder.toml ----------------------------------------------------------------

GOOD_HOST = "[hosts.fine]\nram_total_gb = 16\n"


@pytest.mark.parametrize(("declared", "key", "words"), [
    ("[hosts.big]\nram_total_gb = 8\nram_reserved_gb = 8\n", "hosts.big.ram_reserved_gb",
     "8 GB reserved of 8 GB leaves nothing to book (reserve less than ram_total_gb)"),
    ("[hosts.big]\nram_total_gb = 0\n", "hosts.big.ram_total_gb",
     "must be more than 0 GB (set ram_total_gb to the host's RAM in GB)"),
    ("[hosts.big]\nram_total_gb = 8\njob_types = ['dev-isue']\n", "hosts.big.job_types",
     "no job type named dev-isue (use names from herder.toml: adhoc, dev-issue, review-pr)"),
    ("[hosts.big]\nram_total_gb = 8\n[hosts.big.prime]\nmax_workers = 0\n"
     "[hosts.big.night]\nmax_workers = 0\n", "hosts.big.prime.max_workers",
     "0 workers in prime time and at night: the host would never take work (give prime or "
     "night max_workers; to keep the host idle, drain it instead: `herder host drain`)"),
    ("[hosts.big]\nram_total_gb = 5\nweights = ['heavy']\n", "hosts.big.weights",
     "heavy can never fit: host big can book 4.0 GB (allow lighter weights, or raise a "
     "window's max_weight or ram_total_gb)"),
])
def test_a_declared_host_that_contradicts_itself_stops_the_server_at_start(
        tmp_path: Path, store_url: str, declared: str, key: str, words: str) -> None:
    """`herder server` stores the hosts herder.toml declares: one `host add` would refuse
    is refused at start, exit 2, naming its line and key; no host is stored, not even the
    good one declared before it."""
    config = tmp_path / "herder.toml"
    write_config(config, {}, TYPES + GOOD_HOST + declared)
    lines = config.read_text().splitlines()
    # The key's own line: the last line of the declaration that sets it (max_workers: the
    # first of the two, under [hosts.big.prime]).
    name = key.rsplit(".", 1)[1]
    number = next(index for index, text in enumerate(lines)
                  if text.startswith(f"{name} =") and index > lines.index("[hosts.big]")) + 1
    before = store_state(store_url)
    result = run_herder("server", "--listen", f"127.0.0.1:{free_port()}", cwd=tmp_path,
                        db=store_url, config=config)
    assert error_line(result) == f"herder: error: {config}:{number}: {key}: {words}"
    assert store_state(store_url) == before
    with open_store(store_url) as store:
        assert store.host_list() == []


def test_declared_hosts_that_fit_are_stored_by_the_server(make_fleet, tmp_path: Path,
                                                          sqlite_url: str) -> None:
    fleet = make_fleet(tmp_path, sqlite_url, extra=TYPES + GOOD_HOST)
    fleet.start_server()
    assert [host.label for host in fleet.store.host_list()] == ["fine"]
