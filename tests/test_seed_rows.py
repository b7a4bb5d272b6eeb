"""Issue 24's remaining seed rows, end to end under `herder up` on both backends: a timeout
moves a job up one weight once; a job's own mutex_collision or stale_duplicate ends it
quietly; the spawn-failure cap fails a job for a human."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.local import Harness, shell

from herder.model import JobStatus, Outcome

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
