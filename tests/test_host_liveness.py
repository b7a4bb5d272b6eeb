"""`herder hosts` shows drain state, liveness, last heartbeat, allow-lists and floor, the
same through the database and the server; a killed agent's host reads down within
placement's liveness window; the server logs where it listens and each host going down
and coming back (real server, real agents)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from support.cli import run_herder
from support.fleet import FleetHarness
from support.waits import wait_for

TYPES = "".join(f"[job_types.{name}]\ncommand = ['true']\n\n"
                for name in ("dev-issue", "review-pr"))
MOVING = ("heartbeat_age_seconds", "liveness", "missed_heartbeats", "last_heartbeat",
          "health", "agent_down", "measured_available_gb")
"""What may change between two reads a moment apart."""


def table(text: str) -> dict[str, dict[str, str]]:
    """`herder hosts` as {label: {column: cell}} (columns two spaces or more apart)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = re.split(r"\s{2,}", lines[0].strip())
    rows = {}
    for line in lines[1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) == len(header):
            rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def log_events(fleet: FleetHarness) -> list[dict[str, Any]]:
    """The server's JSON log lines (`--log-format json`)."""
    assert fleet.server is not None
    found = []
    for line in fleet.stderr_of(fleet.server).splitlines():
        if line.startswith("{"):
            found.append(json.loads(line))
    return found


def events_named(fleet: FleetHarness, name: str, host: str | None = None
                 ) -> list[dict[str, Any]]:
    return [event for event in log_events(fleet) if event.get("event") == name
            and (host is None or event.get("host") == host)]


def test_hosts_and_the_server_log_say_what_happened_to_each_host(make_fleet, tmp_path: Path,
                                                                  store_url: str):
    fleet = make_fleet(tmp_path, store_url, extra=TYPES)
    fleet.add_hosts({
        "alpha": ("--ram", "16", "--job-types", "dev-issue,review-pr", "--weights", "light",
                  "--priority-floor", "5"),
        "beta": ("--ram", "8"),
    })
    fleet.start_server("--log-format", "json")
    [listening] = wait_for(lambda: events_named(fleet, "server_listening"), 30,
                           "the listening line", fleet.describe)
    assert listening["message"] == f"listening on {fleet.url}"
    assert listening["url"] == fleet.url
    fleet.start_agent("alpha")
    wait_for(lambda: fleet.hosts_api()["alpha"]["liveness"] in ("live", "late"), 30,
             "alpha to be live", fleet.describe)

    rows = table(fleet.cli("hosts").stdout)
    alpha, beta = rows["alpha"], rows["beta"]
    assert (alpha["STATE"], alpha["JOB TYPES"], alpha["WEIGHTS"], alpha["FLOOR"]) == (
        "enabled", "dev-issue,review-pr", "light", "5"), alpha
    assert re.fullmatch(r"live|missed \d+ heartbeats?", alpha["LIVENESS"]), alpha
    assert re.fullmatch(r"\d+s ago", alpha["HEARTBEAT"]), alpha
    assert (beta["STATE"], beta["LIVENESS"], beta["HEARTBEAT"], beta["HEALTH"],
            beta["JOB TYPES"], beta["FLOOR"]) == (
        "enabled", "never seen", "never", "unknown", "any", "-"), beta

    # The same over the server, with an operator's read token and no database.
    operator = tmp_path / "operator"
    remote = fleet.operator(operator)

    def steady(views: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{key: value for key, value in view.items() if key not in MOVING}
                for view in views]

    over_http = json.loads(run_herder("hosts", "--json", cwd=operator, env=remote,
                                      check=True).stdout)
    assert steady(over_http) == steady(json.loads(fleet.cli("hosts", "--json").stdout))
    assert {view["label"]: view["condition"] for view in over_http} == {
        "alpha": "enabled", "beta": "enabled"}
    remote_rows = table(run_herder("hosts", cwd=operator, env=remote, check=True).stdout)
    assert remote_rows["beta"] == beta
    assert remote_rows["alpha"]["JOB TYPES"] == "dev-issue,review-pr"

    # One word for a drained host: `hosts`, `why` and the fleet-stopped alert's reasons.
    fleet.cli("host", "drain", "beta")
    assert table(fleet.cli("hosts").stdout)["beta"]["STATE"] == "drained"
    held = fleet.submit(["true"])
    answer = wait_for(lambda: "beta drained" in (text := fleet.why(held)) and text, 30,
                      "why to name the drained host", fleet.describe)
    assert "alpha refuses job type adhoc" in answer, answer

    # A SIGKILLed agent (its guardian reports it dead): down at once, and logged.
    fleet.kill_agent("alpha")
    wait_for(lambda: fleet.hosts_api()["alpha"]["liveness"] == "down", 30,
             "alpha to read down", fleet.describe)
    assert table(fleet.cli("hosts").stdout)["alpha"]["LIVENESS"] == "down"
    [down] = wait_for(lambda: events_named(fleet, "host_down", "alpha"), 30,
                      "the host-down line", fleet.describe)
    assert down["level"] == "WARNING"
    # its guardian's report, or the silence, whichever the leader saw first
    assert re.match(r"host alpha down: (agent gone|no heartbeat for)", down["message"]), down

    # (its first connection after the server started was a "back" already: it had not
    # been live for this leader before)
    seen = len(events_named(fleet, "host_back", "alpha"))
    fleet.start_agent("alpha")
    backs = wait_for(lambda: (found := events_named(fleet, "host_back", "alpha"))[seen:]
                     and found, 30, "the host-back line", fleet.describe)
    assert (backs[-1]["level"], backs[-1]["message"]) == ("INFO", "host alpha back")

    # The whole host dies (no guardian left to tell): down within the missed heartbeats.
    fleet.kill_host("alpha")
    wait_for(lambda: len(events_named(fleet, "host_down", "alpha")) == 2, 30,
             "the second host-down line", fleet.describe)
    silent = events_named(fleet, "host_down", "alpha")[1]
    assert re.fullmatch(r"host alpha down: no heartbeat for [\d.]+s \(\d+ missed\)",
                        silent["message"]), silent
    view = fleet.hosts_api()["alpha"]
    assert (view["liveness"], view["condition"]) == ("down", "enabled"), view
    # one word on every screen: a host placement counts as down reads down, not healthy
    assert view["health"] == "down", view
    assert view["missed_heartbeats"] >= 6, view


def test_the_listening_url_is_the_address_and_port_the_socket_has():
    from herder.core.urls import listen_url

    assert listen_url("http", ("127.0.0.1", 8470)) == "http://127.0.0.1:8470"
    assert listen_url("https", ("::1", 8471, 0, 0)) == "https://[::1]:8471"


def test_a_host_row_reads_a_new_view_and_one_from_a_server_older_than_its_fields():
    from herder.cli.hosts import HOST_COLUMNS, host_row
    from herder.wire.hosts import HostView

    older = {  # what a server before `condition` and `liveness` sent
        "label": "alpha", "enabled": True, "agent": None, "transport": "agent",
        "health": "healthy", "last_heartbeat": "2026-06-01T12:00:00+00:00",
        "agent_down": "agent down: no heartbeat for 31.0s (3 missed)", "ram_total_gb": 16.0,
        "ram_reserved_gb": 0.0, "bookable_gb": 12.8, "booked_gb": 0.0, "free_gb": 12.8,
        "cpus": 4, "workers": 0, "window": "prime", "max_workers": 2, "max_weight": None,
        "prime": {"max_workers": 2, "max_weight": None},
        "night": {"max_workers": 2, "max_weight": None}, "allowed_job_types": None,
        "allowed_weights": ["light"], "priority_floor": 5, "labels": [], "ssh_target": None}
    view = HostView.model_validate(older).model_dump(mode="json")
    row = dict(zip(HOST_COLUMNS, host_row(view), strict=True))
    assert (row["STATE"], row["LIVENESS"], row["HEARTBEAT"], row["JOB TYPES"], row["WEIGHTS"],
            row["FLOOR"]) == ("enabled", "down", "-", "any", "light", "5"), row
    newer = {**view, "enabled": False, "condition": "drained", "liveness": "late",
             "missed_heartbeats": 2, "heartbeat_age_seconds": 754.0}
    row = dict(zip(HOST_COLUMNS, host_row(newer), strict=True))
    assert (row["STATE"], row["LIVENESS"], row["HEARTBEAT"]) == (
        "drained", "missed 2 heartbeats", "12m ago"), row
