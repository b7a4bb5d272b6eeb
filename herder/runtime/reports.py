"""An attempt from its end to its record: a runner reaps ended processes into results and
reports starts and results to the store or server, each on its own backoff, so a result
is never dropped while the store is away."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from herder.core.model import AttemptToken, Outcome
from herder.runtime.attempt_files import append_log, collect_result, read_ending
from herder.runtime.endings import Ending
from herder.runtime.executor import RunningAttempt
from herder.runtime.fence import fence_due
from herder.runtime.leases import Leases
from herder.runtime.pending_results import Result, Retry
from herder.runtime.sources import WorkSource
from herder.runtime.workspace import release

log = logging.getLogger("herder.runner")


class Reports:
    """The runner's ended attempts until recorded (`unreported`) and its pending starts."""

    def __init__(self, source: WorkSource, worker: str, workspace_keep_failed: float,
                 clock: Callable[[], datetime], running: dict[AttemptToken, RunningAttempt],
                 leases: Leases) -> None:
        self.source = source
        self.worker = worker
        self.workspace_keep_failed = workspace_keep_failed
        self.clock = clock
        self.running = running
        self.leases = leases
        self.unreported: dict[AttemptToken, Result] = {}
        """Ended attempts whose result the store or server has not recorded yet."""
        self._start_retries: dict[AttemptToken, Retry] = {}
        self.finished = 0
        self.recorded: Callable[[AttemptToken], None] = lambda token: None
        """Told each attempt whose result was recorded (an agent drops its launch note)."""

    def pending_starts(self) -> bool:
        return any(not attempt.start_reported for attempt in self.running.values())

    def reap(self, mono: float) -> None:
        for token, attempt in list(self.running.items()):
            if attempt.poll(mono):
                outcome = attempt.outcome()
                lease, margin = self.leases.lease()
                if outcome is Outcome.FAILED and fence_due(attempt.renewed, mono, lease, margin):
                    # Ended unrenewed past this runner's fence: the guardian killed it while
                    # this runner was frozen. Not the job's failure; the job may run elsewhere.
                    outcome = Outcome.LOST
                if not attempt.logged_exit:
                    attempt.logged_exit = True
                    elapsed = mono - attempt.started
                    # Not at the adoption: the job still writes at its own offset.
                    adopted = f"; adopted by agent {self.worker}" if attempt.adopted else ""
                    append_log(attempt.log_path, f"exit {attempt.returncode} after "
                                                 f"{elapsed:.1f}s ({outcome}{adopted})")
                if attempt.workspace is not None:
                    kept = release(attempt.workspace, outcome is Outcome.OK,
                                   self.workspace_keep_failed, time.time())
                    if kept:
                        append_log(attempt.log_path, kept)
                # The tree is gone; its result is reported (and retried) from `unreported`.
                # A start report still pending is moot: the finish records the attempt.
                del self.running[token]
                self._start_retries.pop(token, None)
                if attempt.run_folder is not None:
                    ignored = collect_result(attempt.run_folder, attempt.log_path)
                    if ignored:
                        append_log(attempt.log_path, ignored)
                tail, result = read_ending(attempt.log_path)
                self.unreported[token] = Result(attempt.job, outcome,
                                                None if attempt.lost else attempt.returncode,
                                                ending=Ending(tail, result,
                                                              attempt.memory_use()))

    def report_start(self, attempt: RunningAttempt, mono: float) -> None:
        retry = self._start_retries.setdefault(attempt.token, Retry())
        if not retry.ready(mono):
            return
        try:
            accepted = self.source.started(attempt.token, attempt.job_pid,
                                           str(attempt.log_path), self.clock())
        except Exception as exc:
            delay = retry.failed(mono)
            log.error("job %d attempt %d: start not recorded (%s: %s); retrying in %.2fs",
                      attempt.job.id, attempt.job.attempt, type(exc).__name__, exc, delay)
            return
        attempt.start_reported = True
        del self._start_retries[attempt.token]
        if not accepted:
            # Fenced out between claim and start (declared lost meanwhile): never run it.
            attempt.fence_out(time.monotonic())
            append_log(attempt.log_path, "attempt was fenced out before it started; killed")

    def report(self, mono: float) -> None:
        """Pending start reports and results, each on its own backoff."""
        for attempt in list(self.running.values()):
            if not attempt.start_reported:
                self.report_start(attempt, mono)
        for token, result in list(self.unreported.items()):
            if result.retry.ready(mono) and self._finish(result, mono):
                del self.unreported[token]

    def _finish(self, result: Result, mono: float) -> bool:
        job = result.job
        try:
            status = self.source.finished(job, result.outcome, result.exit_code, self.clock(),
                                          ending=result.ending)
        except Exception as exc:
            delay = result.retry.failed(mono)
            log.error("job %d attempt %d: result %s not recorded (%s: %s); retrying in %.2fs",
                      job.id, job.attempt, result.outcome, type(exc).__name__, exc, delay)
            return False
        self.finished += 1
        self.recorded(job.token)
        if status is not None:
            log.info("job %d attempt %d: %s -> %s", job.id, job.attempt, result.outcome,
                     status)
        else:
            log.info("job %d attempt %d: %s reported", job.id, job.attempt, result.outcome)
        return True
