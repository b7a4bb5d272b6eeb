"""Issue 24's remaining seed rows, end to end under `herder up` on both backends: a timeout
moves a job up one weight once; a job's own mutex_collision or stale_duplicate ends it
quietly; the spawn-failure cap fails a job for a human."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.local import Harness, shell

from herder.client import Client
from herder.config import load_config
from herder.errors import ConfigError, InputError
from herder.model import HostRecord, JobStatus, Outcome
from herder.runtime.coordinator import Coordinator, why
from herder.runtime.scheduler import Fleet, Scheduler

WRAPPER = """\
#!/bin/sh
# An agent wrapper script speaking seed 004's exit codes: exit 3 is RAM contention.
exit 3
"""


@pytest.fixture
def seed_harness(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    script = tmp_path / "wrapper"
    script.write_text(WRAPPER)
    script.chmod(0o755)
    h = Harness(tmp_path, store_url, extra_config=(
        '[fleet]\nmax_spawn_failures = 2\nspawn_backoff = "0s"\n\n'
        f'[job_types.wrapper]\ncommand = ["{script}"]\npreflight = false\n'))
    try:
        yield h
    finally:
        h.close()


def stop(h: Harness, up) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM `herder up` and wait for it: every ending it judged is recorded by then,
    alerts included."""
    up.send_signal(signal.SIGTERM)
    h.wait_exit(up, 30, "herder up")


def job_alerts(h: Harness, job_id: int) -> list[str]:
    return [alert.key for alert in h.store.alert_list() if alert.key.startswith(f"job:{job_id}:")]


def test_a_timeout_moves_the_job_up_one_weight_then_fails_it(seed_harness: Harness):
    h = seed_harness
    job_id = h.submit(shell("sleep 60"), weight="light", timeout_seconds=1.0, max_attempts=2)
    up = h.up()
    try:
        job = h.wait_status(job_id, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    assert (job.weight, job.escalations, job.failures, job.failure_reason, job.actionable) == (
        "heavy", 1, 2, "timeout", True)


@pytest.mark.parametrize(("reason", "ending"), [
    ("mutex_collision", "exit 1"),  # the seed's worker: the lock is held
    ("stale_duplicate", "exit 0"),  # the work already shipped; no outcome named
])
def test_a_jobs_own_quiet_reason_ends_it_without_a_retry_or_an_alert(
        seed_harness: Harness, reason: str, ending: str):
    h = seed_harness
    said = h.submit(shell(f"printf '{{\"failure_reason\": \"{reason}\"}}' > \"$HERDER_RESULT\""
                          f"; {ending}"), max_attempts=3)
    broken = h.submit(shell("exit 1"), max_attempts=1)  # an actionable failure beside it
    up = h.up()
    try:
        job = h.wait_status(said, JobStatus.FAILED, timeout=60)
        h.wait_status(broken, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert (job.attempt, job.failures, job.failure_reason, job.actionable,
            job.human_action) == (1, 0, reason, False, False)
    assert job_alerts(h, said) == []
    assert job_alerts(h, broken) == [f"job:{broken}:failed"]
    listed = json.loads(h.cli("jobs", "--status", "failed", "--actionable", "--json").stdout)
    assert [job["id"] for job in listed] == [broken]


def test_the_spawn_failure_cap_fails_a_ram_contended_job_for_a_human(seed_harness: Harness):
    h = seed_harness
    job_id = h.client.submit("wrapper").job_id
    up = h.up()
    try:
        job = h.wait_status(job_id, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.RAM_CONTENTION] * 2
    assert (job.spawn_failures, job.failures, job.failure_reason, job.actionable,
            job.human_action) == (2, 0, "spawn_ram", True, True)
    assert job_alerts(h, job_id) == [f"job:{job_id}:human_action"]
    [alert] = [a for a in h.store.alert_list() if a.key == f"job:{job_id}:human_action"]
    assert "spawn_ram" in alert.message and "a human must act" in alert.message


# -- a job type pinned to hosts (seed 000's hard affinity per type) ---------------------------

PINNED = """\
[job_types.infra]
command = ["true"]
preflight = false
allow_host = true
hosts = ["ops-1"]

[job_types.anywhere]
command = ["true"]
preflight = false
"""


@pytest.mark.parametrize(("hosts", "message"), [
    ("[]", "names no host"),
    ('["ops 1"]', "'ops 1' is not a valid host label"),
    ('["ops-1", "ops-1"]', "names a host twice"),
])
def test_a_pin_that_cannot_work_stops_the_load_naming_the_key(tmp_path: Path, hosts: str,
                                                              message: str):
    path = tmp_path / "herder.toml"
    path.write_text(f'[job_types.infra]\ncommand = ["true"]\nhosts = {hosts}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "job_types.infra.hosts" in str(caught.value) and message in str(caught.value)


def test_a_pin_to_a_declared_host_that_refuses_the_type_stops_the_load(tmp_path: Path):
    path = tmp_path / "herder.toml"
    path.write_text(PINNED + '\n[hosts.ops-1]\nram_total_gb = 16\njob_types = ["anywhere"]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "job_types.infra.hosts" in text and "hosts.ops-1.job_types" in text, text
    assert "add 'infra' to hosts.ops-1.job_types" in text
    # A label the file does not declare loads: `herder host add` may register it later.
    path.write_text(PINNED)
    assert load_config(path).settings.job_types["infra"].hosts == ["ops-1"]


def test_a_pinned_type_runs_only_on_its_hosts_through_the_store(store, tmp_path: Path, caplog):
    path = tmp_path / "herder.toml"
    path.write_text(PINNED)
    config = load_config(path)
    fleet = Fleet.from_settings(config.settings)
    now = datetime.now(UTC)  # jobs are submitted at the real time: so is all the rest
    for label in ("big", "ops-1"):
        store.host_insert(HostRecord(label, 32 if label == "big" else 8,
                                     prime_max_workers=1, night_max_workers=1), now)
        store.host_heartbeat(label, now, {})
    client = Client.over(store, config)
    first, second = (client.submit("infra", check_command=False).job_id for _ in range(2))
    free = client.submit("anywhere", check_command=False).job_id
    now = datetime.now(UTC)
    Scheduler(store, fleet).run_once(now)
    assert {job_id: store.job_get(job_id).host for job_id in (first, second, free)} == {
        first: "ops-1", second: None, free: "big"}
    text = why(store, fleet, second, now)
    assert "ops-1 full (1/1 workers)" in text, text
    assert "big not used (job type infra runs only on ops-1)" in text, text
    # Bound elsewhere by a submitter: refused at the edge, nothing stored.
    count = len(store.job_list(None, 100))
    with pytest.raises(InputError) as caught:
        client.submit("infra", affinity="big", check_command=False)
    assert caught.value.field == "affinity"
    assert "job type infra runs only on ops-1" in str(caught.value)
    assert len(store.job_list(None, 100)) == count
    assert client.submit("infra", affinity="ops-1", check_command=False).created
    # A pin to hosts none of which is registered is refused while hosts are.
    path.write_text(PINNED.replace('["ops-1"]', '["ops-9"]'))
    ghost = Client.over(store, load_config(path))
    with pytest.raises(InputError) as caught:
        ghost.submit("infra", check_command=False)
    assert caught.value.field == "job_type" and "herder host add" in str(caught.value)
    # The server says so at start, since herder.toml alone cannot tell.
    with caplog.at_level(logging.WARNING, "herder.coordinator"):
        Coordinator(store, load_config(path)).sync_hosts()
    assert "job_types.infra.hosts names ops-9, not a registered host" in caplog.text
