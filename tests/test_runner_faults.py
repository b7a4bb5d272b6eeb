"""No unsupervised process: a store that fails at any point of spawn → start → finish.

A work source wraps the real `ClaimSource` on a real store and raises on demand from one of
its calls (`take` once the jobs run, `started`, `heartbeat`, `finished`, `cancel_requested`).
While it fails, the runner's processes stay supervised: a timeout still kills one, a cancel
still stops another. Once it works again, each result is recorded exactly once.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime

import pytest
from support.local import Harness, shell
from support.waits import wait_for
from test_runner import submit_in_missing_workdir

from herder.core.errors import StoreUnavailable
from herder.core.model import AttemptToken, HeartbeatReply, Job, JobStatus, Outcome
from herder.core.settings.sections import RuntimeSection
from herder.runtime.maintenance import Rescuer
from herder.runtime.process import token_markers
from herder.runtime.runner import Runner
from herder.runtime.runner_options import RunnerOptions
from herder.runtime.sources import ClaimSource
from herder.store import open_store


class FaultySource(ClaimSource):
    """The real source, but every call named in `failing` raises as an outage would."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.failing: set[str] = set()
        self.failures: Counter[str] = Counter()
        self.renewed: dict[AttemptToken, float] = {}
        self.lock = threading.Lock()

    def _fault(self, name: str) -> None:
        with self.lock:
            if name in self.failing:
                self.failures[name] += 1
                raise StoreUnavailable(f"{name}: connection refused (injected)")

    def take(self, free: int, now: datetime) -> list[Job]:
        self._fault("take")
        return super().take(free, now)

    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        self._fault("started")
        return super().started(token, pid, log_path, now)

    def heartbeat(self, tokens, now: datetime) -> HeartbeatReply:  # type: ignore[no-untyped-def]
        self._fault("heartbeat")
        sent = time.monotonic()
        reply = super().heartbeat(tokens, now)
        for token in reply.live:  # when the last renewal of each attempt was sent
            self.renewed[token] = sent
        return reply

    def maintain(self, now: datetime) -> None:
        self._fault("maintain")
        super().maintain(now)

    def finished(self, job, outcome, exit_code, now, retry_after=None,  # type: ignore[no-untyped-def]
                 ending=None):
        self._fault("finished")
        return super().finished(job, outcome, exit_code, now, retry_after, ending)

    def cancel_requested(self, job_ids) -> set[AttemptToken]:  # type: ignore[no-untyped-def]
        self._fault("cancel_requested")
        return super().cancel_requested(job_ids)


class RunnerThread:
    """A Runner on a FaultySource, looping in a thread of this process."""

    def __init__(self, h: Harness, failing: set[str] | None = None,
                 source_class: Callable[..., FaultySource] = FaultySource,
                 **overrides: float) -> None:
        self.store = open_store(h.db)
        values = {"heartbeat_interval": 0.2, "attempt_lease": 60.0, "kill_grace": 1.0,
                  "poll_interval": 0.2, **overrides}
        runtime = RuntimeSection(concurrency=3, **values)  # type: ignore[arg-type]
        self.options = RunnerOptions(host=h.host, log_dir=h.log_dir, runtime=runtime)
        rescuer = Rescuer(self.store, h.host, runtime.attempt_lease, runtime.kill_grace,
                          runtime.max_lost)
        self.source = source_class(self.store, h.host, self.options.limits, rescuer)
        self.source.failing.update(failing or ())
        self.runner = Runner(None, self.options, source=self.source)
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.runner.run(install_signals=False)
        except BaseException as exc:
            self.errors.append(exc)
            raise

    def stop(self) -> None:
        self.source.failing.clear()
        self.runner.request_shutdown()
        self.runner.request_shutdown()
        self.thread.join(timeout=30)
        self.store.close()
        assert not self.thread.is_alive(), "the runner thread did not stop"
        assert not self.errors, self.errors


POINTS = ["take", "started", "heartbeat", "finished", "cancel_requested"]


@pytest.mark.parametrize("point", POINTS)
def test_a_failing_store_call_leaves_processes_supervised(harness: Harness, point: str):
    h = harness
    timed = h.submit(shell("sleep 300 & sleep 300 & wait"), timeout_seconds=1.0,
                     max_attempts=1)
    cancelled = h.submit(shell("sleep 300 & sleep 300 & wait"), max_attempts=1)
    runner = RunnerThread(h, failing=set() if point == "take" else {point})
    try:
        trees = wait_for(lambda: (len(a := h.marked(timed, 1)) == 3
                                  and len(b := h.marked(cancelled, 1)) == 3 and (a, b)),
                         20, "both attempts' trees (shell and two sleeps)", h.describe)
        if point == "take":  # with a free slot the runner keeps asking for work
            runner.source.failing.add(point)
        if point == "started":
            assert h.job(timed).status is JobStatus.CLAIMED, "the start was recorded anyway"

        h.client.cancel(cancelled)
        for tree, what in zip(trees, ("the timeout", "the cancel"), strict=True):
            wait_for(lambda tree=tree: not any(p.alive() for p in tree), 20,
                     f"{what} to stop its tree while {point} fails", h.describe)
        wait_for(lambda: runner.source.failures[point] > 0, 10,
                 f"the runner to call {point} (and fail)", h.describe)
        if point == "finished":
            wait_for(lambda: runner.source.failures[point] >= 4, 20,
                     "the result to be retried", h.describe)
            assert h.job(timed).status is JobStatus.RUNNING, "a result was recorded anyway"
            assert h.job(cancelled).status is JobStatus.RUNNING

        runner.source.failing.clear()
        job = h.wait_status(timed, JobStatus.FAILED)
        assert job.failure_reason == "timeout", job
        h.wait_status(cancelled, JobStatus.CANCELLED)
    finally:
        runner.stop()

    assert [a.outcome for a in h.attempts(timed)] == [Outcome.TIMEOUT]
    assert [a.outcome for a in h.attempts(cancelled)] == [Outcome.CANCELLED]
    for job_id in (timed, cancelled):
        finished = [e for e in h.events(job_id) if e.kind == "finished"]
        assert len(finished) == 1, finished
    assert h.marked() == []


def test_a_launch_failure_is_recorded_once_the_store_answers(harness: Harness):
    """Spawn fails and so does the report of it: the job is not left claimed for good."""
    h = harness
    job_id = submit_in_missing_workdir(h, max_attempts=1)
    runner = RunnerThread(h, failing={"finished"})
    try:
        wait_for(lambda: runner.source.failures["finished"] >= 2, 20,
                 "the launch failure's report to fail and be retried", h.describe)
        assert h.job(job_id).status is JobStatus.CLAIMED
        runner.source.failing.clear()
        job = h.wait_status(job_id, JobStatus.FAILED)
        assert job.failure_reason == "launch_failed", job
    finally:
        runner.stop()
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.LAUNCH_FAILED]


class StallingSource(FaultySource):
    """Stalls once inside `take` (a frozen runner, a stuck call) for `stall` seconds, and
    records what the runner tells the watchdog, with whether the attempt's process exists."""

    def __init__(self, *args, stall: float = 0.0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.stall = stall
        self.published: list[tuple[str, bool]] = []

    def take(self, free: int, now: datetime) -> list[Job]:
        jobs = super().take(free, now)
        if jobs and self.stall:
            time.sleep(self.stall)  # the fault itself: the runner is held up here
            self.stall = 0.0
        return jobs

    def leases(self, deadlines) -> None:  # type: ignore[no-untyped-def]
        markers = token_markers()
        self.published.extend((marker, marker in markers) for marker in deadlines)


def stalled_runner(h: Harness, stall: float, **overrides: float) -> RunnerThread:
    return RunnerThread(h, source_class=functools.partial(StallingSource, stall=stall),
                        **overrides)


def test_an_attempt_whose_lease_ran_out_before_its_start_is_handed_back(harness: Harness):
    """The runner stalls between asking for work and starting it for longer than its fence
    allows: it must not start the job (the server may be running it elsewhere by now)."""
    h = harness
    marker = h.dir / "ran"
    job_id = h.submit(shell(f"touch {marker}"), max_attempts=3)
    runner = stalled_runner(h, stall=1.0, attempt_lease=1.0, fence_margin=0.25)
    try:
        wait_for(lambda: h.job(job_id).lost >= 1, 30, "the stale attempt to be handed back",
                 h.describe)
        first = next(a for a in h.attempts(job_id) if a.attempt == 1)
        assert (first.outcome, first.pid, first.started_at) == (Outcome.LOST, None, None)
        # Given a fresh lease, the job runs on its next attempt.
        wait_for(lambda: h.job(job_id).status is JobStatus.DONE, 30, "the rerun", h.describe)
    finally:
        runner.stop()
    assert h.job(job_id).attempt == 2 and marker.exists()


def test_the_watchdog_hears_of_an_attempt_before_its_process_exists(harness: Harness):
    h = harness
    job_id = h.submit(shell("sleep 0.2"))
    runner = stalled_runner(h, stall=0.0)
    try:
        wait_for(lambda: h.job(job_id).status is JobStatus.DONE, 30, "the job", h.describe)
    finally:
        runner.stop()
    published = runner.source.published  # type: ignore[attr-defined]
    mine = [(marker, alive) for marker, alive in published
            if marker.startswith(f"{job_id}.1@")]
    assert mine, published
    assert mine[0][1] is False, "the first deadline came after the process was spawned"
    assert any(alive for _, alive in mine), "the deadline was never kept while it ran"


class LongPolledSource(StallingSource):
    """Says each attempt's request left `early` seconds before `take` (a long-poll answer
    that sat in the inbox while the runner was frozen)."""

    def __init__(self, *args, early: float = 0.0, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.early = early

    def asked_at(self, token: AttemptToken) -> float | None:
        return time.monotonic() - self.early


def test_the_lease_counts_from_when_the_long_poll_left_not_from_take(harness: Harness):
    h = harness
    marker = h.dir / "ran"
    job_id = h.submit(shell(f"touch {marker}"), max_attempts=3)
    runner = RunnerThread(h, source_class=functools.partial(LongPolledSource, early=5.0),
                          attempt_lease=4.0, fence_margin=1.0)
    try:
        wait_for(lambda: h.job(job_id).lost >= 2, 30,
                 "attempts whose lease ran out in the inbox to be handed back", h.describe)
    finally:
        runner.stop()
    assert not marker.exists(), "an attempt whose lease had run out was started"
    assert all(a.pid is None for a in h.attempts(job_id))
