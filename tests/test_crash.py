"""Crashes, shutdowns and fencing of `herder up`, with real processes, signals and databases.

* kill -9 of `herder up` while attempts run: survivors are killed by the next `up` before
  their jobs run again, the attempts are recorded as lost, and no two attempts of a job
  ever overlap (each job holds an exclusive flock for its whole process tree).
* SIGTERM: `up` stops its attempts, requeues them as lost and exits 0.
* Fencing: a runner whose attempt was declared lost elsewhere kills it at its next
  heartbeat, and its late result is rejected.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.local import Harness, open_harness, shell
from support.processes import Proc
from support.waits import wait_for

from herder.core.model import (
    AttemptResult,
    AttemptToken,
    Decision,
    HeartbeatReply,
    JobStatus,
    Outcome,
)
from herder.core.settings.sections import RuntimeSection
from herder.runtime.process import processes_with_token
from herder.runtime.runner import Runner
from herder.runtime.runner_options import RunnerOptions
from herder.store import open_store

FLOCK_JOB = """\
#!/bin/sh
# One herder job: an exclusive lock per job, held by the whole tree (fd 9 is inherited).
dir="$(dirname "$0")"
exec 9>>"$dir/locks/$HERDER_JOB_ID.lock"
if ! flock -n 9; then
    echo "OVERLAP $HERDER_JOB_ID $HERDER_ATTEMPT" >> "$dir/overlap.txt"
    exit 1
fi
echo "start $HERDER_JOB_ID $HERDER_ATTEMPT" >> "$dir/record.txt"
sleep 30 &
sleep 2
echo "end $HERDER_JOB_ID $HERDER_ATTEMPT" >> "$dir/record.txt"
"""



def submit_flock_jobs(h: Harness, count: int) -> list[int]:
    """`count` jobs of FLOCK_JOB, whose overlaps land in overlap.txt."""
    (h.dir / "locks").mkdir()
    script = h.dir / "job.sh"
    script.write_text(FLOCK_JOB)
    script.chmod(0o755)
    return [h.submit([str(script)]) for _ in range(count)]


def read_record(path: Path) -> list[tuple[str, int, int]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        kind, job, attempt = line.split()
        rows.append((kind, int(job), int(attempt)))
    return rows


@pytest.mark.slow
def test_kill_9_of_up_loses_running_attempts_and_never_overlaps(harness: Harness):
    """`up` is killed with three jobs running: its guardian stops them, and the next `up`
    declares them lost after the lease and reruns each once, never two at a time."""
    h = harness
    job_ids = submit_flock_jobs(h, 6)

    first = h.up("--concurrency", "3")

    def running() -> list[int]:
        return [j.id for j in h.client.list([JobStatus.RUNNING])]

    wait_for(lambda: len(running()) == 3 and len({p.token for p in h.marked()}) == 3, 30,
             "3 attempts running", h.describe)
    survivors = h.marked()
    os.kill(first.pid, signal.SIGKILL)  # only `up` itself: its jobs are in their own sessions
    first.wait(timeout=10)

    # What was in flight when `up` died: nothing changes in the store until the restart.
    in_flight = {
        (job.id, job.attempt): job.status
        for job in h.client.list([JobStatus.CLAIMED, JobStatus.RUNNING])
    }
    assert JobStatus.RUNNING in in_flight.values(), in_flight
    tokens = {p.token for p in survivors}
    # Its guardian (another session, so alive) stops them: no process runs unsupervised.
    wait_for(lambda: not any(p.alive() for p in survivors), 30,
             "the guardian to stop the dead runner's jobs", h.describe)

    second = h.up("--concurrency", "3", "--exit-when-idle")
    assert h.wait_exit(second, 60, "the restarted `herder up --exit-when-idle`") == 0, (
        h.describe())

    assert not (h.dir / "overlap.txt").exists(), (h.dir / "overlap.txt").read_text()
    assert h.marked() == [], "job processes of this test outlived `up`"
    for token in tokens:
        assert processes_with_token(token) == []

    record = read_record(h.dir / "record.txt")
    starts: dict[int, list[int]] = defaultdict(list)
    for kind, job_id, attempt in record:
        if kind == "start":
            starts[job_id].append(attempt)
    for job_id in job_ids:
        job = h.job(job_id)
        assert job.status is JobStatus.DONE, h.describe()
        attempts = h.attempts(job_id)
        numbers = [a.attempt for a in attempts]
        assert numbers == list(range(1, job.attempt + 1)), numbers
        assert starts[job_id] == sorted(set(starts[job_id])), (
            f"job {job_id}: attempts started out of order or twice: {starts[job_id]}")
        ok = [a for a in attempts if a.outcome is Outcome.OK]
        assert [a.attempt for a in ok] == [job.attempt], (
            f"job {job_id} must end done exactly once, on its last attempt: {attempts}")
        assert ("end", job_id, job.attempt) in record
        done_events = [e for e in h.events(job_id) if e.to_status is JobStatus.DONE]
        assert len(done_events) == 1, done_events
        for a in attempts[:-1]:
            assert a.outcome is Outcome.LOST, f"job {job_id}: earlier attempt {a} not lost"

    for (job_id, attempt) in in_flight:
        row = {a.attempt: a for a in h.attempts(job_id)}[attempt]
        assert row.outcome is Outcome.LOST, row
        assert row.ended_at is not None
        finished = [e for e in h.events(job_id) if e.kind == "finished" and e.attempt == attempt]
        assert len(finished) == 1, finished
        assert finished[0].detail["outcome"] == "lost"
        assert finished[0].to_status is JobStatus.QUEUED
        job = h.job(job_id)
        assert job.attempt > attempt and job.lost == 1, job


@pytest.fixture
def postgres_harness(tmp_path: Path, postgres_url: str) -> Iterator[Harness]:
    with open_harness(tmp_path, postgres_url) as h:
        yield h


@pytest.mark.slow
def test_a_frozen_up_s_jobs_are_stopped_by_its_guardian_before_another_up_reruns_them(
        postgres_harness: Harness):
    """`up` is frozen (SIGSTOP) with jobs running: it can neither renew their leases nor
    fence itself. Its guardian kills them at their backstop, before the lease ends and a
    second `up` on the same store declares them lost and reruns them: the per-job lock sees
    no overlap. Thawed, the first `up` records them lost, not failed.

    On PostgreSQL: runners on several machines share a store there. A runner frozen while
    it holds SQLite's write lock (a heartbeat's transaction) stops every runner of that
    file, and those all run on one machine, so nothing can run twice there anyway."""
    h = postgres_harness
    job_ids = submit_flock_jobs(h, 2)
    first = h.up("--concurrency", "2")
    wait_for(lambda: len({p.token for p in h.marked()}) == 2, 30, "2 attempts running",
             h.describe)
    # The runner spawns a job, then records its start: freeze it only once both are recorded.
    wait_for(lambda: all(h.job(job_id).status is JobStatus.RUNNING for job_id in job_ids), 30,
             "both starts recorded", h.describe)
    frozen = h.marked()
    os.kill(first.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: not any(p.alive() for p in frozen), 30,
                 "the guardian to stop the frozen runner's jobs", h.describe)
        for job_id in job_ids:
            assert h.job(job_id).status is JobStatus.RUNNING, (
                "the store moved the job on before its processes were gone\n" + h.describe())
        second = h.up("--concurrency", "2", "--exit-when-idle", host=h.host + "b")
        assert h.wait_exit(second, 60, "the second `herder up --exit-when-idle`") == 0, (
            h.describe())
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert not (h.dir / "overlap.txt").exists(), (h.dir / "overlap.txt").read_text()
    for job_id in job_ids:
        job = h.job(job_id)
        assert (job.status, job.failures, job.lost) == (JobStatus.DONE, 0, 1), job
        assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LOST, Outcome.OK]
    assert "outlived its lease unrenewed" in h.stderr_of(first)
    first.send_signal(signal.SIGTERM)
    assert h.wait_exit(first, 30, "the thawed `herder up`") == 0, h.describe()
    for job_id in job_ids:  # its late results were refused: nothing changed
        assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LOST, Outcome.OK]


@pytest.mark.slow
def test_sigterm_requeues_running_attempt_and_exits_0(harness: Harness):
    h = harness
    job_id = h.submit(shell(
        'if [ "$HERDER_ATTEMPT" = 1 ]; then sleep 300 & sleep 300 & wait; fi; echo finished'))
    up = h.up()
    h.wait_status(job_id, JobStatus.RUNNING)
    tree = wait_for(lambda: len(procs := h.marked(job_id, 1)) == 3 and procs, 10,
                    "the attempt's shell and both sleeps", h.describe)

    up.send_signal(signal.SIGTERM)
    assert h.wait_exit(up, 30, "`herder up` after SIGTERM") == 0, h.describe()

    job = h.job(job_id)
    assert job.status is JobStatus.QUEUED, h.describe()
    assert job.lost == 1 and job.failures == 0, job
    [attempt] = h.attempts(job_id)
    assert attempt.outcome is Outcome.LOST, attempt
    assert [p for p in tree if p.alive()] == []
    assert h.marked(job_id) == []

    again = h.up("--exit-when-idle")
    assert h.wait_exit(again, 30, "`herder up --exit-when-idle`") == 0, h.describe()
    job = h.job(job_id)
    assert job.status is JobStatus.DONE and job.attempt == 2, h.describe()
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LOST, Outcome.OK]


def leader_of(h: Harness, job_id: int, attempt: int) -> list[Proc]:
    """The attempt's leader process (its recorded pid) once it runs, else []."""
    pids = [a.pid for a in h.attempts(job_id) if a.attempt == attempt and a.pid is not None]
    return [p for p in h.marked(job_id, attempt) if p.pid in pids]


def test_second_sigterm_kills_at_once(tmp_path: Path, store_url: str):
    h = Harness(tmp_path, store_url, runtime={"kill_grace": '"60s"'})
    try:
        job_id = h.submit(shell(
            "trap 'echo TERM >> term.txt' TERM; while :; do sleep 0.05; done"))
        up = h.up()
        h.wait_status(job_id, JobStatus.RUNNING)
        # The leader is the process whose pid the attempt recorded, not "the /bin/sh": the
        # looping shell forks a copy of itself (argv included) before each `sleep` execs.
        [leader] = wait_for(lambda: leader_of(h, job_id, 1), 10, "the attempt's shell",
                            h.describe)

        up.send_signal(signal.SIGTERM)
        wait_for((h.dir / "term.txt").exists, 10, "the job to get SIGTERM",
                 h.describe)
        assert up.poll() is None, "`herder up` must wait out the grace after one SIGTERM"
        assert leader.alive()
        up.send_signal(signal.SIGTERM)
        # kill_grace is 60s: exiting well before proves the second request killed at once.
        assert h.wait_exit(up, 20, "`herder up` after a second SIGTERM") == 0, h.describe()
        job = h.job(job_id)
        assert job.status is JobStatus.QUEUED and job.lost == 1, job
        assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LOST]
        assert not leader.alive()
        assert h.marked(job_id) == []
    finally:
        h.close()


# -- fencing ------------------------------------------------------------------------------------


class ThreadRunner:
    """A Runner looping in a thread of this process (as `herder up` would in its own)."""

    def __init__(self, h: Harness) -> None:
        self.store = open_store(h.db)
        options = RunnerOptions(host=h.host, log_dir=h.log_dir, runtime=RuntimeSection(
            concurrency=2, heartbeat_interval=0.2, attempt_lease=60, kill_grace=1,
            poll_interval=0.2, max_lost=5))
        self.runner = Runner(self.store, options)
        # What each report of an ended attempt returned: the job's new status, or None when
        # the store rejected it (the attempt had been fenced out).
        self.reports: list[tuple[AttemptToken, Outcome, JobStatus | None]] = []
        source = self.runner.source
        report = source.finished

        def finished(job, outcome, exit_code, now, retry_after=None, ending=None):
            status = report(job, outcome, exit_code, now, retry_after, ending)
            self.reports.append((job.token, outcome, status))
            return status

        source.finished = finished  # type: ignore[method-assign]
        self.result: list[int] = []
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result.append(self.runner.run(install_signals=False))
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def report_of(self, token: AttemptToken) -> tuple[Outcome, JobStatus | None] | None:
        found = [(outcome, status) for t, outcome, status in self.reports if t == token]
        return found[0] if found else None

    def stop(self) -> None:
        self.runner.request_shutdown()
        self.runner.request_shutdown()  # the second request kills at once
        self.thread.join(timeout=20)
        self.store.close()
        assert not self.thread.is_alive(), "the runner thread did not stop"
        assert not self.errors, self.errors


@pytest.mark.parametrize("rescued_to", [JobStatus.FAILED, JobStatus.QUEUED])
def test_runner_kills_attempt_declared_lost_elsewhere(
    harness: Harness, rescued_to: JobStatus
):
    h = harness
    job_id = h.submit(shell(
        'if [ "$HERDER_ATTEMPT" = 1 ]; then exec sleep 300; fi; echo second attempt'))
    runner = ThreadRunner(h)
    try:
        h.wait_status(job_id, JobStatus.RUNNING)
        [proc] = wait_for(lambda: h.marked(job_id, 1), 10, "attempt 1's process", h.describe)

        # A rescuer on another host decides attempt 1 is lost.
        if rescued_to is JobStatus.FAILED:
            decision = Decision(JobStatus.FAILED, failure_reason="lost", spend_lost=True)
        else:
            decision = Decision(JobStatus.QUEUED, available_at=datetime.now(UTC),
                                spend_lost=True)
        token = AttemptToken(job_id, 1)
        applied = h.store.attempt_finish(
            [AttemptResult(token, Outcome.LOST, None, decision)], datetime.now(UTC))
        assert applied == [(token, rescued_to)]
        [rescued_row] = [a for a in h.attempts(job_id) if a.attempt == 1]

        wait_for(lambda: not proc.alive(), 10, "the fenced-out attempt to be killed",
                 h.describe)
        late = wait_for(lambda: runner.report_of(token), 10,
                        "the runner to report attempt 1's end", h.describe)
        assert late == (Outcome.LOST, None), f"the late result was not rejected: {late}"
        if rescued_to is JobStatus.QUEUED:
            h.wait_status(job_id, JobStatus.DONE)
    finally:
        runner.stop()

    assert h.marked(job_id) == []
    job = h.job(job_id)
    attempts = {a.attempt: a for a in h.attempts(job_id)}
    assert attempts[1] == rescued_row, "the late result overwrote the rescuer's attempt row"
    assert attempts[1].outcome is Outcome.LOST and attempts[1].exit_code is None
    finished_1 = [e for e in h.events(job_id) if e.kind == "finished" and e.attempt == 1]
    assert len(finished_1) == 1, finished_1
    assert job.lost == 1, job
    if rescued_to is JobStatus.FAILED:
        assert job.status is JobStatus.FAILED and job.failure_reason == "lost", job
        assert job.attempt == 1 and list(attempts) == [1]
    else:
        assert job.status is JobStatus.DONE and job.attempt == 2, job
        assert attempts[2].outcome is Outcome.OK


class Partition:
    """Makes a runner's heartbeats and claims stop reaching the store (while it believes
    all is well), then heals; the runner's processes keep running throughout."""

    def __init__(self, store) -> None:
        self.store = store
        self.cut = False
        self._heartbeat = store.attempt_heartbeat
        self._claim = store.job_claim
        store.attempt_heartbeat = self.attempt_heartbeat
        store.job_claim = self.job_claim

    def attempt_heartbeat(self, host, tokens, now):
        if self.cut:
            return HeartbeatReply(frozenset(tokens), frozenset())
        return self._heartbeat(host, tokens, now)

    def job_claim(self, host, worker, limit, now):
        return [] if self.cut else self._claim(host, worker, limit, now)


@pytest.mark.slow
def test_stale_attempt_is_taken_over_and_its_runner_stops_it(harness: Harness):
    """Two runners on two host labels. While A heartbeats, B leaves A's attempt alone even
    past the lease; once A's heartbeats stop landing, B declares it lost and reruns the job;
    when A is heard again, A kills its attempt and its late result is rejected."""
    h = harness
    lease = 2.0  # attempt_lease in the harness config
    job_id = h.submit(shell(
        'if [ "$HERDER_ATTEMPT" = 1 ]; then exec sleep 300; fi; echo "second on $HERDER_HOST"'))
    a = ThreadRunner(h)
    try:
        h.wait_status(job_id, JobStatus.RUNNING)
        [proc] = wait_for(lambda: h.marked(job_id, 1), 10, "attempt 1's process", h.describe)
        b = h.up(host=h.host + "b")
        h.wait_ready(b)
        b_ready = datetime.now(UTC)

        def heartbeat_past_lease() -> bool:
            job = h.job(job_id)
            assert (job.status, job.attempt) == (JobStatus.RUNNING, 1), h.describe()
            [attempt] = h.attempts(job_id)
            return (attempt.heartbeat_at - b_ready).total_seconds() > lease + 1.5

        wait_for(heartbeat_past_lease, 20, "A's heartbeats to renew the lease past its length",
                 h.describe)

        partition = Partition(a.store)
        partition.cut = True
        lost = wait_for(lambda: [x for x in h.attempts(job_id) if x.outcome is Outcome.LOST],
                        20, "B to declare A's silent attempt lost", h.describe)
        assert [x.attempt for x in lost] == [1]
        job = h.wait_status(job_id, JobStatus.DONE)
        assert (job.attempt, job.host) == (2, h.host + "b"), job
        assert proc.alive(), "A's attempt should run on while A is cut off"
        [rescued_row] = [x for x in h.attempts(job_id) if x.attempt == 1]

        partition.cut = False
        wait_for(lambda: not proc.alive(), 10, "A to kill its fenced-out attempt", h.describe)
        late = wait_for(lambda: a.report_of(AttemptToken(job_id, 1)), 10,
                        "A to report attempt 1's end", h.describe)
        assert late == (Outcome.LOST, None), f"A's late result was not rejected: {late}"
    finally:
        a.stop()
    attempts = h.attempts(job_id)
    assert attempts[0] == rescued_row, "A's late result overwrote the attempt row"
    assert [(x.attempt, x.outcome) for x in attempts] == [(1, Outcome.LOST), (2, Outcome.OK)]
    job = h.job(job_id)
    assert (job.status, job.attempt, job.lost, job.failures) == (JobStatus.DONE, 2, 1, 0), job
    assert h.marked(job_id) == []
