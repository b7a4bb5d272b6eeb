"""What an operator sees without SQL: `GET /queue`, `GET /metrics` (Prometheus) and JSON
logs with the seeds' event names, through a real `herder server` and a real agent, on both
backends. The pure parts (priority bands, the JSON formatter, the ending events) are unit
tested below them."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.cli import run_herder
from support.fleet import WEIGHTS, bookable
from support.waits import wait_for

from herder.core.fleet import Fleet
from herder.core.log_records import JsonFormatter
from herder.core.model import HostRecord, HostUsage, JobStatus, Outcome, Transport
from herder.core.scheduling.health import HostHealth
from herder.core.settings.sections import Settings
from herder.runtime.endings import ending_event
from herder.runtime.metrics import FleetSample, families, priority_band
from herder.runtime.read_models import host_sample

RUNNING = ["/bin/sh", "-c", "sleep 120"]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, sorted labels)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def json_lines(text: str) -> list[dict[str, Any]]:
    """The lines of a process's stderr, each parsed (a line that is not JSON fails)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_queue_metrics_and_json_logs_through_a_real_server(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.add_host("alpha", "--ram", "16", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server("--log-format", "json")
    fleet.start_agent("alpha", "--log-format", "json")

    running = fleet.submit(RUNNING, weight="light")
    done = fleet.submit(["true"])
    failed = fleet.submit(["false"], max_attempts=1)
    queued = fleet.submit(["true"], delay_seconds=3600, priority=5, weight="heavy")
    cancelled = fleet.submit(["true"], delay_seconds=3600)
    assert fleet.api("POST", f"/api/v1/jobs/{cancelled}/cancel").status_code == 200
    fleet.wait_status(running, JobStatus.RUNNING, timeout=60)
    fleet.wait_status(done, JobStatus.DONE, timeout=60)
    fleet.wait_status(failed, JobStatus.FAILED, timeout=60)

    # -- /queue: the seed's counts and recent jobs, and the rest of the picture -------------
    assert fleet.api("GET", "/queue", token="").status_code == 401
    assert fleet.api("GET", "/queue", token="hdr_not-a-token").status_code == 401
    answer = fleet.api("GET", "/queue")
    assert answer.status_code == 200, answer.text
    # The failed job's alert is opened just after its status is committed: wait for it.
    view = wait_for(lambda: (found := fleet.api("GET", "/queue").json())["alerts"] and found,
                    30, "the failed job's alert in /queue", fleet.describe)
    assert view["counts"] == {"queued": 1, "claimed": 0, "running": 1, "done": 1,
                              "failed": 1, "cancelled": 1}
    assert [job["id"] for job in view["recent"]] == [cancelled, queued, failed, done, running]
    by_id = {job["id"]: job for job in view["recent"]}
    assert by_id[failed]["failure_reason"] == "implementation_error"
    assert by_id[failed]["actionable"] is True
    assert by_id[running]["host"] == "alpha" and by_id[running]["status"] == "running"
    (host,) = view["hosts"]
    assert host["label"] == "alpha" and host["workers"] == 1 and host["max_workers"] == 2
    assert host["bookable_gb"] == bookable(16) and host["booked_gb"] == WEIGHTS["light"]
    assert view["resilience"] == {"breakers": {}, "preflight_failed": {}}
    assert view["accounts"] == []
    assert [alert["key"] for alert in view["alerts"]] == [f"job:{failed}:failed"]
    assert view["leader"] is True
    limited = fleet.api("GET", "/queue", params={"recent": 2}).json()
    assert [job["id"] for job in limited["recent"]] == [cancelled, queued]
    assert fleet.api("GET", "/queue", params={"recent": -1}).status_code == 422

    # -- /metrics ----------------------------------------------------------------------------
    assert fleet.api("GET", "/metrics", token="").status_code == 401
    scrape = fleet.api("GET", "/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    found = samples(scrape.text)
    for status, count in view["counts"].items():
        assert found[("herder_jobs", (("status", status),))] == count
    assert found[("herder_queue_depth", (("priority_band", "<10"), ("weight", "heavy")))] == 1
    assert found[("herder_host_ram_bookable_gb", (("host", "alpha"),))] == bookable(16)
    assert found[("herder_host_ram_booked_gb", (("host", "alpha"),))] == WEIGHTS["light"]
    assert found[("herder_host_ram_headroom_gb", (("host", "alpha"),))] == (
        bookable(16) - WEIGHTS["light"])
    assert found[("herder_job_failures", (("actionable", "true"),
                                          ("reason", "implementation_error")))] == 1
    assert found[("herder_host_health", (("health", "healthy"), ("host", "alpha")))] == 1
    assert found[("herder_host_agent_up", (("host", "alpha"),))] == 1
    assert found[("herder_agents", ())] == 1
    assert found[("herder_leader", ())] == 1
    # Three first attempts started through the server (the agent's start calls).
    assert found[("herder_job_start_latency_seconds_count", ())] == 3
    assert found[("herder_placement_cycle_seconds_count", ())] > 0

    # -- JSON logs: every line parses, the seeds' events are there --------------------------
    server_lines = json_lines(fleet.stderr_of(fleet.server))
    events = [line.get("event") for line in server_lines]
    assert "dispatch_cycle" in events and "dispatch_scheduled" in events
    failure = next(line for line in server_lines if line.get("event") == "dispatch_failed")
    assert (failure["job_id"], failure["failure_reason"], failure["actionable"]) == (
        failed, "implementation_error", True)
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in server_lines)
    agent_lines = json_lines(fleet.stderr_of(fleet.agents["alpha"]))
    started = {line["job_id"] for line in agent_lines if line.get("event") == "spawn_ok"}
    assert started == {running, done, failed}
    assert fleet.tokens["alpha"] not in fleet.stderr_of(fleet.agents["alpha"])
    assert fleet.admin_token not in fleet.stderr_of(fleet.server)


def test_metrics_public_serves_a_scraper_without_a_token(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url, extra="[server]\nmetrics_public = true\n")
    fleet.start_server()
    scrape = fleet.api("GET", "/metrics", token="")
    assert scrape.status_code == 200
    assert samples(scrape.text)[("herder_jobs", (("status", "queued"),))] == 0
    # Only /metrics: the queue and the other operator reads still need a token.
    assert fleet.api("GET", "/queue", token="").status_code == 401
    assert fleet.api("GET", "/api/v1/jobs", token="").status_code == 401


def test_up_logs_json_with_the_seeds_events(tmp_path, store_url):
    """`herder up` (no HTTP surface) has the same option: spawn_ok and dispatch_failed."""
    for command in (["true"], ["false"]):
        run_herder("submit", "--max-attempts", "1", "--", *command, cwd=tmp_path,
                   db=store_url, check=True)
    done = run_herder("up", "--exit-when-idle", "--log-format", "json", cwd=tmp_path,
                      db=store_url, timeout=120)
    assert done.returncode == 0, done.stderr
    events = [line.get("event") for line in json_lines(done.stderr)]
    assert events.count("spawn_ok") == 2 and events.count("dispatch_failed") == 1


# -- pure parts ------------------------------------------------------------------------------


def test_priority_bands():
    assert [priority_band(p) for p in (-5, 1, 9, 10, 49, 50, 99, 100, 5000)] == [
        "<10", "<10", "<10", "10-49", "10-49", "50-99", "50-99", ">=100", ">=100"]
    assert priority_band(3, (1,)) == ">=1" and priority_band(3, ()) == "any"


def test_the_ending_events_of_seed_004():
    assert ending_event(Outcome.OOM, JobStatus.QUEUED) == (logging.ERROR, "spawn_oom")
    assert ending_event(Outcome.RAM_CONTENTION, JobStatus.QUEUED) == (
        logging.WARNING, "spawn_ram_contention")
    assert ending_event(Outcome.FAILED, JobStatus.FAILED) == (logging.ERROR, "dispatch_failed")
    assert ending_event(Outcome.OK, JobStatus.DONE) is None


def test_families_count_every_status_and_fold_priorities_into_bands():
    sample = FleetSample(statuses={JobStatus.QUEUED: 3}, queue_depth={
        ("light", 1): 1, ("light", 5): 2, ("heavy", 100): 4}, failures={("spawn_ram", False): 2})
    text = "".join(
        f"{sample_.name} {sample_.labels} {sample_.value}\n"
        for family in families(sample) for sample_ in family.samples)
    assert "herder_jobs {'status': 'done'} 0" in text
    assert "herder_queue_depth {'weight': 'light', 'priority_band': '<10'} 3" in text
    assert "herder_queue_depth {'weight': 'heavy', 'priority_band': '>=100'} 4" in text
    assert "herder_job_failures {'reason': 'spawn_ram', 'actionable': 'false'} 2" in text
    assert "herder_agents {} 0" in text


def test_json_formatter_carries_the_event_and_its_fields():
    record = logging.LogRecord("herder.scheduler", logging.INFO, __file__, 1,
                               "placed %d", (2,), None)
    record.event = "dispatch_cycle"
    record.placed = 2
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "dispatch_cycle" and line["placed"] == 2
    assert line["message"] == "placed 2" and line["level"] == "INFO"
    assert line["logger"] == "herder.scheduler" and line["ts"].endswith("+00:00")
    plain = json.loads(JsonFormatter().format(logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "no event", None, None)))
    assert plain["event"] is None



def test_a_host_sample_says_what_its_agent_measured_and_whether_it_is_up():
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    fleet = Fleet.from_settings(Settings())
    live = HostRecord(label="a", ram_total_gb=16.0, last_heartbeat=now - timedelta(seconds=1),
                      agent_info={"worker": "a/1/1", "mem_available_gb": 9.5})
    sample = host_sample(fleet, live, HostUsage("a", 1, 3.0, 1.0), now)
    assert (sample.bookable_gb, sample.booked_gb, sample.measured_available_gb) == (
        12.8, 4.0, 9.5)
    assert sample.agent_up and sample.health is HostHealth.HEALTHY
    stopped = HostRecord(label="a", ram_total_gb=16.0, last_heartbeat=now,
                         agent_info={"worker": "a/1/1", "stopped": True,
                                     "mem_available_gb": True})
    sample = host_sample(fleet, stopped, None, now)
    assert not sample.agent_up and sample.measured_available_gb is None
    assert sample.booked_gb == 0.0
    ssh = HostRecord(label="s", ram_total_gb=16.0, last_heartbeat=now,
                     transport=Transport.SSH)
    assert not host_sample(fleet, ssh, None, now).agent_up
