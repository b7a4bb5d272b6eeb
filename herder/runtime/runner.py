"""`herder up`: claim jobs, run them under supervision, report, and rescue orphans.

One thread, one loop. Each turn it reaps ended processes, enforces timeouts and kills,
claims work while slots are free, heartbeats, and runs maintenance; then it waits on the
store's waker (NOTIFY on PostgreSQL, `data_version` on SQLite) so a submitted job starts
within milliseconds without a busy poll.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from herder.model import AttemptToken, Job, Outcome
from herder.runtime.executor import LaunchError, RunningAttempt, append_log, spawn
from herder.runtime.maintenance import Rescuer, WorkerId
from herder.runtime.process import process_start_time
from herder.runtime.sources import ClaimSource, PolicyLimits, WorkSource
from herder.store import Store, Waker

log = logging.getLogger("herder.runner")

BUSY_TICK = 0.02
CANCEL_CHECK_PERIOD = 0.05


def utcnow() -> datetime:
    return datetime.now(UTC)


def default_host() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


@dataclass(frozen=True)
class RunnerOptions:
    host: str
    log_dir: Path
    concurrency: int = 4
    heartbeat_interval: float = 10.0
    attempt_lease: float = 60.0
    kill_grace: float = 10.0
    poll_interval: float = 1.0
    max_lost: int = 5
    exit_when_idle: bool = False
    max_spawn_failures: int = 5
    spawn_backoff: float = 300.0
    drain_timeout: float | None = None
    """On the first SIGTERM, let running attempts finish for this long before handing them
    back; None stops them at once (they are requeued either way)."""
    pass_env: tuple[str, ...] = ()
    """The runner's variables a job gets besides the base allow-list (executor.py)."""
    fence_margin: float | None = None
    """Stop attempts this long before their lease ends when heartbeats fail; None is a
    quarter of the lease."""

    @property
    def limits(self) -> PolicyLimits:
        return PolicyLimits(self.max_lost, self.max_spawn_failures, self.spawn_backoff)


class Runner:
    def __init__(
        self,
        store: Store | None,
        options: RunnerOptions,
        clock: Callable[[], datetime] = utcnow,
        source: WorkSource | None = None,
    ) -> None:
        self.options = options
        self.clock = clock
        pid = os.getpid()
        self.worker = str(WorkerId(options.host, pid, process_start_time(pid) or 0))
        # Keyed by attempt, not job: a fenced-out attempt of a job may still be stopping when
        # the same job's next attempt is claimed here, and both must stay supervised.
        self.running: dict[AttemptToken, RunningAttempt] = {}
        if source is None:
            if store is None:
                raise ValueError("a runner needs a store or a work source")
            rescuer = Rescuer(store, options.host, options.attempt_lease, options.kill_grace,
                              options.max_lost)
            source = ClaimSource(store, options.host, options.limits, rescuer)
        self.source = source
        source.attach(self.worker)
        self._stopping = 0
        self._drain_deadline: float | None = None
        self._next_heartbeat = 0.0
        self._next_maintenance = 0.0
        self._next_cancel_check = 0.0
        self._next_claim = 0.0
        self.started = 0
        self.finished = 0

    # -- signals ----------------------------------------------------------------------------

    def request_shutdown(self, *_args: object) -> None:
        """First request: stop claiming, stop running attempts gracefully (they are
        requeued). A second request kills them at once."""
        self._stopping += 1

    def _install_signals(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: shutting down", signal.Signals(signum).name)
            self.request_shutdown()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            self._install_signals()
        if not self._first_maintenance():
            self.source.close()
            return 0
        self.options.log_dir.mkdir(parents=True, exist_ok=True)
        waker = self.source.waker()
        log.info("runner %s up: concurrency %d", self.worker, self.options.concurrency)
        trouble = 0.0
        try:
            while True:
                try:
                    if self._turn() is None:
                        return 0
                    trouble = 0.0
                except Exception as exc:
                    # The store (or the server) is unreachable: keep supervising what runs,
                    # retry the rest. Results not yet recorded stay in `running` and are
                    # reported again on the next turn.
                    trouble = min(max(trouble * 2, 0.25), 5.0)
                    log.error("runner turn failed (%s: %s); retrying in %.2fs",
                              type(exc).__name__, exc, trouble)
                timeout = BUSY_TICK if self.running else self.options.poll_interval
                try:
                    if waker.wait(trouble or timeout):
                        self._next_claim = 0.0
                        self._next_cancel_check = 0.0
                except Exception as exc:
                    log.error("waker failed (%s); reconnecting", exc)
                    waker = self._reconnect(waker)
        finally:
            waker.close()
            self.source.close()

    def _first_maintenance(self) -> bool:
        """The first rescue pass, before any claim: retried while the store is busy or
        unreachable (the loop's own failures are retried the same way). False when a stop
        signal arrived first."""
        delay = 0.25
        while True:
            try:
                self.source.maintain(self.clock())
                return True
            except Exception as exc:
                if self._stopping:
                    return False
                log.error("first maintenance pass failed (%s: %s); retrying in %.2fs",
                          type(exc).__name__, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _reconnect(self, waker: Waker) -> Waker:
        with contextlib.suppress(Exception):
            waker.close()
        while True:
            try:
                return self.source.waker()
            except Exception as exc:
                log.error("cannot reconnect the waker (%s); retrying", exc)
                time.sleep(1.0)
                with contextlib.suppress(Exception):
                    self._reap(time.monotonic())

    def _turn(self) -> bool | None:
        """One pass; None when the runner should exit."""
        mono = time.monotonic()
        self._reap(mono)
        if self._stopping:
            self.source.drain()
            if self._draining(mono):
                if not self.running:
                    return None
                self._supervise(mono)
                return True
            self._stop_all(mono, Outcome.LOST)
            if not self.running:
                return None
            return True
        self._supervise(mono)
        free = self.options.concurrency - len(self.running)
        claimed_none = False
        if free > 0 and mono >= self._next_claim:
            claimed = self._claim(free)
            claimed_none = not claimed
            self._next_claim = mono + self.options.poll_interval if claimed_none else 0.0
        if mono >= self._next_maintenance:
            self._next_maintenance = mono + max(self.options.attempt_lease / 4, 1.0)
            self.source.maintain(self.clock())
        if (self.options.exit_when_idle and claimed_none and not self.running
                and self.source.idle()):
            log.info("nothing queued, claimed or running: exiting")
            return None
        return True

    def _draining(self, mono: float) -> bool:
        if self._stopping > 1 or not self.options.drain_timeout:
            return False
        if self._drain_deadline is None:
            self._drain_deadline = mono + self.options.drain_timeout
            log.info("draining: no new work; %d running attempt(s) get %.0fs to finish",
                     len(self.running), self.options.drain_timeout)
        return mono < self._drain_deadline

    def _supervise(self, mono: float) -> None:
        if self.running and mono >= self._next_cancel_check:
            self._next_cancel_check = mono + CANCEL_CHECK_PERIOD
            self._check_cancels(mono)
        if self.running and mono >= self._next_heartbeat:
            self._heartbeat(mono)

    # -- steps ------------------------------------------------------------------------------

    def _claim(self, free: int) -> list[Job]:
        jobs = self.source.take(free, self.clock())
        for job in jobs:
            self._start(job)
        return jobs

    def _start(self, job: Job) -> None:
        for older in self.running.values():
            if older.job.id == job.id:
                # The store handed out a newer attempt, so this one was declared lost
                # elsewhere: it must not overlap the new one. Kill it now.
                log.warning("job %d attempt %d was fenced out by attempt %d: killing it",
                            job.id, older.job.attempt, job.attempt)
                older.request_stop(Outcome.LOST, time.monotonic(), grace=0.0)
                older.kill()
        try:
            attempt = spawn(job, self.options.host, self.worker, self.options.log_dir,
                            self.options.kill_grace, self.options.pass_env)
        except LaunchError as exc:
            log.error("job %d attempt %d: launch failed: %s", job.id, job.attempt, exc)
            self._finish(job, Outcome.LAUNCH_FAILED, None)
            return
        if not self.source.started(job.token, attempt.process.pid, str(attempt.log_path),
                                   self.clock()):
            # Fenced out between claim and start (declared lost meanwhile): never run it.
            attempt.request_stop(Outcome.LOST, time.monotonic(), grace=0.0)
            attempt.kill()
            append_log(attempt.log_path, "attempt was fenced out before it started; killed")
        self.running[job.token] = attempt
        self.started += 1
        log.info("job %d attempt %d started: pid %d", job.id, job.attempt, attempt.process.pid)

    def _reap(self, mono: float) -> None:
        for token, attempt in list(self.running.items()):
            if attempt.poll(mono):
                outcome = attempt.outcome()
                if not attempt.logged_exit:
                    attempt.logged_exit = True
                    elapsed = mono - attempt.started
                    append_log(attempt.log_path, f"exit {attempt.returncode} after "
                                                 f"{elapsed:.1f}s ({outcome})")
                # Forget the attempt only once its result is recorded: if the store is
                # down, the next turn reports it again.
                self._finish(attempt.job, outcome, attempt.returncode)
                del self.running[token]

    def _finish(self, job: Job, outcome: Outcome, exit_code: int | None) -> None:
        status = self.source.finished(job, outcome, exit_code, self.clock())
        self.finished += 1
        if status is not None:
            log.info("job %d attempt %d: %s -> %s", job.id, job.attempt, outcome, status)
        else:
            log.info("job %d attempt %d: %s reported", job.id, job.attempt, outcome)

    def _check_cancels(self, mono: float) -> None:
        wanted = self.source.cancel_requested([token.job_id for token in self.running])
        for token in wanted:
            attempt = self.running.get(token)
            if attempt is not None:
                log.info("job %d: cancel requested", token.job_id)
                attempt.request_stop(Outcome.CANCELLED, mono)

    def _heartbeat(self, mono: float) -> None:
        self._next_heartbeat = mono + self.options.heartbeat_interval
        tokens = [attempt.token for attempt in self.running.values()]
        reply = self.source.heartbeat(tokens, self.clock())
        for attempt in self.running.values():
            if attempt.token not in reply.live:
                log.warning("job %d attempt %d was fenced out: stopping it", attempt.job.id,
                            attempt.job.attempt)
                attempt.request_stop(Outcome.LOST, mono)
            elif attempt.token in reply.cancel:
                attempt.request_stop(Outcome.CANCELLED, mono)

    def _stop_all(self, mono: float, outcome: Outcome) -> None:
        for attempt in self.running.values():
            attempt.request_stop(outcome, mono)
            if self._stopping > 1 and not attempt.killed:
                attempt.kill()
