"""Issue 15's memory, end to end: a fake agent that allocates past its weight's budget is
stopped and its job escalated, under `herder up` and under an agent, on both backends; by a
cgroup where this machine lets a runner make one, by the watchdog always. Each test prints
which enforcement ran (`pytest -s`, or the captured output of a failure)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from support.local import Harness
from support.waits import wait_for

from herder.core.model import Attempt, Enforcement, Job, JobStatus, Outcome
from herder.runtime.cgroup import detect

MB = 1024**2

HOG = """\
import os, sys, time
print("niceness", os.nice(0), flush=True)
# Touch every page (b"x" * n writes them; a zeroed bytearray might not), then hold them.
hog = b"x" * (int(sys.argv[1]) * 1024 * 1024)
print("allocated", len(hog) // 1048576, "MB", flush=True)
time.sleep(float(sys.argv[2]))
"""

WEIGHTS = """
[weights]
small = 0.0625
big = 0.5
light = 3.0
"""
"""small: a 64 MB budget the hog's 200 MB overruns; big: 512 MB, where it fits."""


def hog_job_type(folder: Path) -> str:
    script = folder / "hog.py"
    script.write_text(HOG)
    return (f'[job_types.hog]\ncommand = ["{sys.executable}", "{script}", "{{mb}}", '
            f'"{{hold}}"]\nweight = "small"\npreflight = false\n')


def cgroup_reason() -> str | None:
    """Why the cgroup path cannot run here, or None when it can."""
    if detect() is None:
        return ("no writable memory cgroup on this machine (cgroup v2 with the memory "
                "controller delegated, or a writable cgroup v1 memory hierarchy)")
    return None


def enforcement_of(mode: str) -> Enforcement:
    """What `mode` (the test's parameter) must have recorded; skips the cgroup path where
    the machine does not allow it, saying why."""
    if mode == "watchdog":
        print("memory enforcement under test: watchdog (sampled RSS of the process tree)")
        return Enforcement.WATCHDOG
    reason = cgroup_reason()
    if reason is not None:
        print(f"memory enforcement under test: cgroup SKIPPED: {reason}")
        pytest.skip(f"cgroup path: {reason}")
    parent = detect()
    assert parent is not None
    print(f"memory enforcement under test: {parent.enforcement} under {parent.path}")
    return parent.enforcement


def assert_escalated(job: Job, attempts: list[Attempt], expected: Enforcement) -> None:
    """Attempt 1 ran out of memory at `small` and was stopped; the job climbed to `big`,
    where attempt 2 fit and recorded its peak."""
    assert (job.status, job.weight, job.escalations) == (JobStatus.DONE, "big", 1)
    first, second = attempts
    assert first.outcome is Outcome.OOM, attempts
    assert first.memory is not None and first.memory.enforcement is expected, first
    assert first.memory.budget_bytes == 64 * MB
    assert second.outcome is Outcome.OK
    assert second.memory is not None and second.memory.enforcement is expected, second
    assert second.memory.budget_bytes == 512 * MB
    assert second.memory.peak_rss_bytes is not None
    assert second.memory.peak_rss_bytes >= 200 * MB, second.memory
    print(f"attempt 1: {first.memory.describe()}; attempt 2: {second.memory.describe()}")


@pytest.fixture
def local(tmp_path: Path, store_url: str, request: pytest.FixtureRequest
          ) -> Iterator[tuple[Harness, str]]:
    """`herder up`'s harness with the weights above and the memory mode of the test's
    parameter (sampled every 0.2 s)."""
    mode = request.param
    h = Harness(tmp_path, store_url, runtime={
        "memory_enforcement": f'"{mode}"', "memory_sample_interval": '"0.2s"',
        "memory_margin": "0.1", "nice": "{big = 7}"},
        defaults={"weight": '"small"'},
        extra_config=hog_job_type(tmp_path) + WEIGHTS
        + '\n[fleet]\nescalation = ["small", "big"]\n')
    try:
        yield h, mode
    finally:
        h.close()


@pytest.mark.slow
@pytest.mark.parametrize("local", ["watchdog", "cgroup"], indirect=True)
def test_a_job_past_its_budget_is_stopped_as_oom_and_escalated_under_up(
        local: tuple[Harness, str]):
    h, mode = local
    expected = enforcement_of(mode)
    job_id = h.client.submit("hog", payload={"mb": "200", "hold": "3"}).job_id
    up = h.up()
    try:
        job = h.wait_status(job_id, JobStatus.DONE, timeout=90)
    finally:
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
    assert_escalated(job, h.attempts(job_id), expected)
    first = h.cli("logs", str(job_id), "--attempt", "1").stdout
    second = h.cli("logs", str(job_id), "--attempt", "2").stdout
    # nice per weight, added to the runner's own niceness (this test's, which CI may raise)
    base = os.nice(0)
    assert f"niceness {base}\n" in first, first
    assert f"niceness {min(base + 7, 19)}\n" in second, second
    if expected is Enforcement.WATCHDOG:
        assert "memory over its limit" in first, first
    shown = h.cli("show", str(job_id)).stdout
    assert f"of budget 64 MB (enforced by {expected})" in shown, shown
    assert f"of budget 512 MB (enforced by {expected})" in shown, shown


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["watchdog", "cgroup"])
def test_an_agent_stops_a_job_past_its_budget_and_the_server_escalates_it(
        make_fleet, tmp_path: Path, store_url: str, mode: str):
    expected = enforcement_of(mode)
    fleet = make_fleet(tmp_path, store_url,
                       runtime={"memory_enforcement": mode, "memory_sample_interval": "0.2s"},
                       fleet={"escalation": ["small", "big"]},
                       defaults={"weight": "small"},
                       extra=hog_job_type(tmp_path) + WEIGHTS)
    fleet.add_hosts({"alpha": ("--ram", "16")})
    fleet.start_server()
    fleet.start_agent("alpha")
    job_id = fleet.submit(job_type="hog", payload={"mb": "200", "hold": "3"})
    job = fleet.wait_status(job_id, JobStatus.DONE, timeout=90)
    assert_escalated(job, fleet.store.attempt_list(job_id), expected)
    as_json = fleet.api("GET", f"/api/v1/jobs/{job_id}").json()
    first = as_json["attempts"][0]
    assert (first["outcome"], first["memory_enforcement"], first["memory_budget_bytes"]) == (
        "oom", str(expected), 64 * MB)


@pytest.mark.slow
@pytest.mark.parametrize("local", ["cgroup"], indirect=True)
def test_the_cgroup_kills_what_left_the_session_and_cleared_its_environment(
        local: tuple[Harness, str]):
    """`setsid env -i`: neither the process group nor the attempt marker finds it; the
    attempt's cgroup still holds it, and the attempt ends only once it is killed."""
    h, mode = local
    enforcement_of(mode)
    escapee = h.dir / "escapee.pid"
    script = (f"setsid env -i /bin/sh -c 'echo $$ > {escapee}; exec sleep 300' "
              "</dev/null >/dev/null 2>&1 & "
              f"while [ ! -s {escapee} ]; do sleep 0.05; done; exit 0")
    job_id = h.submit(["/bin/sh", "-c", script], weight="big")
    up = h.up()
    pid = None
    try:
        job = h.wait_status(job_id, JobStatus.DONE, timeout=60)
        pid = int(escapee.read_text())
        wait_for(lambda: not _alive(pid), 30, "the escaped process to be killed", h.describe)
        assert job.status is JobStatus.DONE
        [attempt] = h.attempts(job_id)
        assert attempt.memory is not None and attempt.memory.enforcement in (
            Enforcement.CGROUP_V1, Enforcement.CGROUP_V2)
        print(f"escaped pid {pid} killed through the attempt's {attempt.memory.enforcement}")
    finally:
        up.send_signal(signal.SIGTERM)
        h.wait_exit(up, 30, "herder up")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize("local", ["cgroup"], indirect=True)
def test_a_dead_runner_s_guardian_kills_its_attempts_cgroups(local: tuple[Harness, str]):
    """`herder up` killed with -9: its guardian kills what the marker scan cannot find, an
    attempt's process that left the session and cleared its environment."""
    h, mode = local
    enforcement_of(mode)
    escapee = h.dir / "escapee.pid"
    script = (f"setsid env -i /bin/sh -c 'echo $$ > {escapee}; exec sleep 300' "
              "</dev/null >/dev/null 2>&1 & exec sleep 300")
    h.submit(["/bin/sh", "-c", script], weight="big")
    up = h.up()
    pid = None
    try:
        pid = wait_for(lambda: escapee.exists() and escapee.read_text().strip()
                       and int(escapee.read_text()), 60, "the escaped process", h.describe)
        assert _alive(pid)
        up.kill()  # the runner only: its guardian lives in a session of its own
        h.wait_exit(up, 30, "herder up")
        wait_for(lambda: not _alive(pid), 30, "the guardian to kill the escaped process",
                 h.describe)
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
