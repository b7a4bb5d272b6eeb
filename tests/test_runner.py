"""`herder up` running real jobs: process trees, cancel, timeout, retries, environment, logs.

Every test runs `herder up` (and other `herder` commands) as subprocesses against a real
SQLite file and a real PostgreSQL database, with a herder.toml of small timings, and waits
on observed events (store rows, files, processes), never on fixed sleeps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.local import Harness, shell
from support.processes import Proc, process_group
from support.waits import wait_for

from herder.core.model import JobStatus, Outcome
from herder.runtime.process import process_alive

KILL_GRACE = 1.0



def sleeps(procs: list[Proc]) -> list[Proc]:
    return [p for p in procs if p.argv[:2] == ("sleep", "300")]


# -- cancel and timeout stop whole trees ----------------------------------------------------------


@pytest.mark.parametrize("escape", [False, True], ids=["same-group", "setsid-grandchild"])
def test_cancel_kills_all_grandchildren(harness: Harness, escape: bool):
    h = harness
    second = "setsid sleep 300" if escape else "sleep 300"
    job_id = h.submit(shell(f"sleep 300 & {second} & wait"))
    up = h.up()
    h.wait_status(job_id, JobStatus.RUNNING)
    grandchildren = wait_for(lambda: len(found := sleeps(h.marked(job_id, 1))) == 2 and found,
                             10, "both `sleep 300` grandchildren", h.describe)
    [attempt] = h.attempts(job_id)
    assert attempt.pid is not None
    groups = {p.pid: process_group(p.pid) for p in grandchildren}
    if escape:  # the variant must really test a process outside the attempt's group
        assert sorted(g == attempt.pid for g in groups.values()) == [False, True], groups
    else:
        assert set(groups.values()) == {attempt.pid}, groups
    tree = h.marked(job_id, 1)

    result = h.cli("cancel", str(job_id))
    assert "cancel requested" in result.stdout

    job = h.wait_status(job_id, JobStatus.CANCELLED)
    assert job.failure_reason == "cancelled"
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.CANCELLED]
    # The runner reports an attempt only once its whole tree is gone.
    assert [p for p in tree if p.alive()] == [], "processes survived the cancel"
    assert h.marked(job_id) == []
    assert up.poll() is None, "`herder up` must keep running after a cancel"


def test_stragglers_of_an_exited_leader_are_killed(harness: Harness):
    h = harness
    job_id = h.submit(shell(
        "setsid sh -c 'echo $$ > straggler.pid; exec sleep 300' & "
        "while [ ! -s straggler.pid ]; do sleep 0.01; done; echo leader-done"))
    up = h.up("--exit-when-idle")
    assert h.wait_exit(up, 30, "`herder up --exit-when-idle`") == 0, h.describe()
    job = h.job(job_id)
    assert (job.status, job.exit_code) == (JobStatus.DONE, 0), job
    straggler = int((h.dir / "straggler.pid").read_text())
    assert not process_alive(straggler), "a process of the attempt outlived it"
    assert h.marked(job_id) == []


TIMEOUT_TREES = {
    # The leader dies of SIGTERM; two grandchildren do not: one ignores it, one traps it.
    "grandchildren-survive-term": (
        "sleep 300 & "
        "sh -c 'trap \"\" TERM; sleep 300' & "  # ignores SIGTERM (inherited by its sleep)
        "sh -c 'trap \"echo TERM >> term.txt\" TERM; while :; do sleep 0.05; done' & "
        "wait"
    ),
    # The leader itself traps SIGTERM and keeps running.
    "leader-survives-term": (
        "trap 'echo TERM >> term.txt' TERM; sleep 300 & while :; do sleep 0.05; done"
    ),
}


@pytest.mark.parametrize("tree_kind", list(TIMEOUT_TREES))
def test_timeout_escalates_to_sigkill_after_grace(harness: Harness, tree_kind: str):
    h = harness
    job_id = h.submit(shell(TIMEOUT_TREES[tree_kind]), timeout_seconds=1.0, max_attempts=1)
    up = h.up()
    h.wait_status(job_id, JobStatus.RUNNING)
    expected_sleeps = 2 if tree_kind == "grandchildren-survive-term" else 1
    tree = wait_for(lambda: len(sleeps(found := h.marked(job_id, 1))) == expected_sleeps
                    and found, 10, "the attempt's process tree", h.describe)

    job = h.wait_status(job_id, JobStatus.FAILED, timeout=20)
    assert job.failure_reason == "timeout", job
    [attempt] = h.attempts(job_id)
    assert attempt.outcome is Outcome.TIMEOUT
    # SIGTERM came and was survived (the trap ran) ...
    assert "TERM" in (h.dir / "term.txt").read_text()
    # ... so only SIGKILL can have ended the processes that trap or ignore SIGTERM.
    assert [p for p in tree if p.alive()] == [], "processes survived the timeout"
    assert h.marked(job_id) == []
    # The SIGKILL came no sooner than the grace period after the timeout's SIGTERM.
    assert job.started_at is not None and job.finished_at is not None
    ran = (job.finished_at - job.started_at).total_seconds()
    assert ran >= 1.0 + KILL_GRACE - 0.5, f"killed after {ran:.2f}s: grace not honoured"
    assert up.poll() is None


# -- retries --------------------------------------------------------------------------------------

FLAKY = """
[job_types.flaky]
command = ["sh", "-c", "n=$(cat \\"$1\\" 2>/dev/null || echo 0); n=$((n+1)); echo $n > \\"$1\\"; test $n -ge 2", "sh", "{counter}"]
backoff_base = "1s"
"""  # noqa: E501


def test_retries_until_max_attempts_and_backoff(tmp_path: Path, store_url: str):
    h = Harness(tmp_path, store_url, extra_config=FLAKY)
    try:
        always = h.submit(shell("exit 3"), max_attempts=3)
        once = h.submit(shell("n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); "
                              "echo $n > count; test $n -ge 2"))
        slow_retry = h.client.submit(
            "flaky", payload={"counter": str(tmp_path / "flaky-count")}).job_id
        up = h.up("--exit-when-idle")
        assert h.wait_exit(up, 40, "`herder up --exit-when-idle`") == 0, h.describe()

        job = h.job(always)
        assert (job.status, job.attempt, job.failures) == (JobStatus.FAILED, 3, 3), job
        assert (job.exit_code, job.failure_reason) == (3, "implementation_error"), job
        assert [(a.attempt, a.outcome, a.exit_code) for a in h.attempts(always)] == [
            (n, Outcome.FAILED, 3) for n in (1, 2, 3)]

        job = h.job(once)
        assert (job.status, job.attempt, job.failures) == (JobStatus.DONE, 2, 1), job
        assert job.exit_code == 0
        assert [a.outcome for a in h.attempts(once)] == [Outcome.FAILED, Outcome.OK]
        assert (tmp_path / "count").read_text().strip() == "2"

        job = h.job(slow_retry)
        assert job.status is JobStatus.DONE and job.attempt == 2, job
        first, second = h.attempts(slow_retry)
        assert first.ended_at is not None
        gap = (second.claimed_at - first.ended_at).total_seconds()
        assert gap >= 0.9, f"retried {gap:.2f}s after a failure with a 1s backoff"
    finally:
        h.close()


# -- launch failures ------------------------------------------------------------------------------


def submit_in_missing_workdir(h: Harness, max_attempts: int) -> int:
    """A job whose workdir is gone by the time it runs: its launch fails."""
    gone = h.dir / "gone"
    gone.mkdir()
    job_id = h.submit(["true"], workdir=str(gone), max_attempts=max_attempts)
    gone.rmdir()
    return job_id


def test_launch_failure_is_retried_then_fails(harness: Harness):
    h = harness
    no_workdir = submit_in_missing_workdir(h, max_attempts=2)
    missing = h.dir / "missing-program"
    result = h.cli("submit", "--no-check", "--max-attempts", "2", "--workdir", str(h.dir),
                   "--", str(missing))
    no_program = int(result.stdout.strip())

    up = h.up("--exit-when-idle")
    assert h.wait_exit(up, 30, "`herder up --exit-when-idle`") == 0, h.describe()
    for job_id in (no_workdir, no_program):
        job = h.job(job_id)
        assert job.status is JobStatus.FAILED, h.describe()
        assert job.failure_reason == "launch_failed", job
        assert job.attempt == 2 and job.failures == 2, job
        attempts = h.attempts(job_id)
        assert [(a.outcome, a.exit_code) for a in attempts] == [(Outcome.LAUNCH_FAILED, None)] * 2
        log = h.log_dir / str(job_id) / "2.log"
        assert "launch failed" in log.read_text()


# -- environment and logs -------------------------------------------------------------------------

ENV_DUMP = """
[job_types.envdump]
command = ["sh", "-c", "env | grep -E '^(HERDER_[A-Z_]+|GREETING)=' | sort; echo \\"pwd=$(pwd)\\"; echo on-stderr >&2"]
env = { GREETING = "hello {name}" }
export = ["name"]
workdir = "{dir}"
workdir_base = "BASE"
weight = "heavy"
"""  # noqa: E501


def test_job_environment_workdir_and_log(tmp_path: Path, store_url: str):
    h = Harness(tmp_path, store_url, extra_config=ENV_DUMP.replace("BASE", str(tmp_path)))
    try:
        workdir = tmp_path / "work"
        workdir.mkdir()
        result = h.cli("submit", "envdump", "-p", "name=world", "-p", f"dir={workdir}")
        job_id = int(result.stdout.strip())
        up = h.up("--exit-when-idle")
        assert h.wait_exit(up, 30, "`herder up --exit-when-idle`") == 0, h.describe()
        assert h.job(job_id).status is JobStatus.DONE, h.describe()

        [attempt] = h.attempts(job_id)
        log_path = h.log_dir / str(job_id) / "1.log"
        assert attempt.log_path == str(log_path)
        printed = h.cli("logs", str(job_id)).stdout
        assert printed == log_path.read_text()
        lines = printed.splitlines()
        env = dict(line.split("=", 1) for line in lines
                   if "=" in line and not line.startswith("#"))
        assert env["HERDER_JOB_ID"] == str(job_id)
        assert env["HERDER_ATTEMPT"] == "1"
        assert env["HERDER_JOB_TYPE"] == "envdump"
        assert env["HERDER_WEIGHT"] == "heavy"
        assert env["HERDER_HOST"] == h.host
        assert env["HERDER_LOG"] == str(log_path)
        assert json.loads(env["HERDER_PAYLOAD"]) == {"name": "world", "dir": str(workdir)}
        assert env["HERDER_PAYLOAD_NAME"] == "world"
        assert env["GREETING"] == "hello world"
        assert env["HERDER_ATTEMPT_TOKEN"].startswith(f"{job_id}.1@{h.host}/")
        assert env["pwd"] == str(workdir.resolve())
        assert env["HERDER_WORKDIR_BASE"] == str(tmp_path)
        assert "on-stderr" in lines
        assert lines[-1].startswith("# herder: exit 0")
    finally:
        h.close()


def test_logs_follow_streams_until_the_attempt_ends(harness: Harness):
    h = harness
    job_id = h.submit(shell(
        "echo first; while [ ! -e release ]; do sleep 0.05; done; echo last; echo oops >&2"))
    h.up()
    h.wait_status(job_id, JobStatus.RUNNING)
    out_path = h.dir / "follow.out"
    with open(out_path, "wb") as out:
        follower = h.spawn("logs", str(job_id), "-f", stdout=out)
    wait_for(lambda: b"\nfirst\n" in out_path.read_bytes(), 15,
             "`logs -f` to print the job's first line", h.describe)
    assert follower.poll() is None, "`herder logs -f` exited while the attempt still ran"
    (h.dir / "release").touch()  # `last` exists only after this
    assert h.wait_exit(follower, 15, "`herder logs -f` after the attempt ended") == 0
    text = out_path.read_text()
    output = [line for line in text.splitlines() if not line.startswith("# herder: ")]
    assert output == ["first", "last", "oops"], text  # (the header repeats the argv)
    assert text.splitlines()[-1].startswith("# herder: exit 0"), text
    assert h.job(job_id).status is JobStatus.DONE


# -- submit --wait and start -----------------------------------------------------------------


def test_submit_wait_exit_codes(harness: Harness):
    h = harness
    up = h.up()
    ok = h.cli("submit", "--wait", "--", "true", timeout=30)
    assert ok.returncode == 0
    assert h.job(int(ok.stdout.strip())).status is JobStatus.DONE
    bad = h.cli("submit", "--wait", "--max-attempts", "1", "--", "sh", "-c", "exit 3",
                timeout=30, check=False)
    assert bad.returncode == 1, bad
    job = h.job(int(bad.stdout.strip()))
    assert (job.status, job.exit_code) == (JobStatus.FAILED, 3)
    assert up.poll() is None


def test_idle_up_starts_a_submitted_job(tmp_path: Path, store_url: str):
    """Sanity only (latency is measured in bench/): an idle `up` picks up a new job.

    The fallback poll is set far beyond the deadline, so the job can only start this soon
    through the store's wake-up (NOTIFY on PostgreSQL, data_version on SQLite).
    """
    h = Harness(tmp_path, store_url, runtime={"poll_interval": '"120s"'})
    try:
        up = h.up()
        h.wait_ready(up)
        job_id = h.submit(shell('echo "ran $HERDER_JOB_ID" > ran.txt'))
        h.wait_status(job_id, JobStatus.DONE, timeout=30)
        assert (tmp_path / "ran.txt").read_text().strip() == f"ran {job_id}"
        assert up.poll() is None
    finally:
        h.close()


def test_exit_when_idle_on_an_empty_queue(harness: Harness):
    up = harness.up("--exit-when-idle")
    assert harness.wait_exit(up, 20, "`herder up --exit-when-idle` on an empty queue") == 0
