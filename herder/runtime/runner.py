"""`herder up`: claim jobs, run them under supervision, report, and rescue orphans.

One thread, one loop. Each turn it reaps ended processes, enforces timeouts and kills,
claims work while slots are free, heartbeats, and runs maintenance; then it waits on the
store's waker (NOTIFY on PostgreSQL, `data_version` on SQLite) so a submitted job starts
within milliseconds without a busy poll.

Every call to the store or server is a step of its own that may fail: a failed step is
retried with backoff on a later turn and never stops the others, so a spawned process is
always supervised (timeout, cancel, heartbeat, fence) and its result is reported once the
store answers again. Attempts whose lease could not be renewed for `lease - fence_margin`
are stopped before the lease ends, so a cut-off runner never overlaps the next attempt.

Here are the loop, the claims and the launches; the Runner owns the rest: `steps` (the retried
calls), `leases` (heartbeats and the fence), `reports` (ended attempts until recorded) and
`adoption` (a dead agent's attempts).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from collections.abc import Callable
from datetime import UTC, datetime
from types import FrameType

from herder.core.backoff import Backoff
from herder.core.model import AttemptToken, Job, Outcome, WorkerId
from herder.runtime.adoption import Adoption
from herder.runtime.attempt_files import HANDOVER_FOLDER, attempt_marker, forget_launch
from herder.runtime.cgroup import runner_prefix
from herder.runtime.executor import LaunchError, RunningAttempt, spawn
from herder.runtime.fence import fence_due
from herder.runtime.leases import Leases
from herder.runtime.maintenance import Rescuer
from herder.runtime.memory import MemoryControl
from herder.runtime.pending_results import Result, launch_failed
from herder.runtime.preflight import Refresher
from herder.runtime.presence import Presence
from herder.runtime.process import process_start_time
from herder.runtime.reports import Reports
from herder.runtime.runner_options import RunnerOptions
from herder.runtime.sources import ClaimSource, WorkSource
from herder.runtime.steps import BUSY_TICK, Steps
from herder.runtime.workspace import sweep
from herder.store import Store, Waker

log = logging.getLogger("herder.runner")
CANCEL_CHECK_PERIOD = 0.05


def utcnow() -> datetime:
    return datetime.now(UTC)


class Runner:
    """One runner's loop over the attempts it supervises (`running`, shared with its parts)."""

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
            runtime = options.runtime
            rescuer = Rescuer(store, options.host, runtime.attempt_lease, runtime.kill_grace,
                              runtime.max_lost)
            source = ClaimSource(store, options.host, options.limits, rescuer,
                                 options.fleet.emergency_max_workers,
                                 Refresher(options.preflight, options.runtime.pass_env)
                                 if options.preflight else None)
        self.source = source
        # An agent adopts its predecessor's attempts before dead runners' cgroups are swept.
        self.memory = MemoryControl.start(options.runtime,
                                          runner_prefix(pid, process_start_time(pid) or 0),
                                          sweep_gone=not source.supervised)
        source.attach(self.worker)
        self._stopping = 0
        self._restart_requested = False
        self.handing_over = False
        """Stopping for a restart: running attempts are left to the next agent."""
        self._drain_deadline: float | None = None
        self._next_maintenance = 0.0
        self._next_cancel_check = 0.0
        self._next_claim = 0.0
        self.started = 0
        self.last_turn = time.monotonic()
        """When the loop last completed a turn (the silent-scheduler alert of `herder up`)."""
        self.steps = Steps()
        self.leases = Leases(source, options.runtime, self.running, self.steps, clock)
        self.reports = Reports(source, self.worker, options.runtime.workspace_keep_failed,
                               clock, self.running, self.leases)
        self.unreported = self.reports.unreported
        if source.supervised:  # an agent: a recorded attempt's launch note has done its job
            self.reports.recorded = functools.partial(forget_launch,
                                                      options.log_dir / HANDOVER_FOLDER)
        """Ended attempts whose result the store or server has not recorded yet."""
        self.adoption = Adoption(source, options, self.worker, self.memory, self.running,
                                 self.unreported, self.leases)
        self.presence = Presence(options.host, self.worker, options.runtime.concurrency,
                                 options.outcome_rules.weights, clock())
        """What `herder up` writes so its machine shows like a host (`source.announces`)."""

    @property
    def finished(self) -> int:
        """Results the store or server has recorded."""
        return self.reports.finished

    # -- signals ----------------------------------------------------------------------------

    def request_shutdown(self, *_args: object) -> None:
        """First request: stop claiming, stop running attempts gracefully (they are
        requeued). A second request kills them at once."""
        self._stopping += 1

    def request_restart(self, *_args: object) -> None:
        """SIGHUP of an agent: the next stop (SIGTERM) is a restart, and the running
        attempts are left, supervised, for the next agent of the host to adopt."""
        self._restart_requested = True
        log.warning("restart requested: on SIGTERM this agent hands its %d running "
                    "attempt(s) to the next agent instead of stopping them", len(self.running))

    def _install_signals(self) -> None:
        def handler(signum: int, _frame: FrameType | None) -> None:
            if (signum == signal.SIGTERM and self._restart_requested and not self._stopping
                    and self.source.supervised):
                log.warning("signal SIGTERM after a restart request: stopping, %d running "
                            "attempt(s) left to the next agent", len(self.running))
                self.handing_over = True
            else:
                log.info("signal %s: shutting down", signal.Signals(signum).name)
            self.request_shutdown()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        if self.source.supervised:
            signal.signal(signal.SIGHUP, self.request_restart)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, install_signals: bool = True) -> int:
        if install_signals:
            self._install_signals()
        if not self._first_maintenance():
            self.source.close()
            return 0
        self.options.log_dir.mkdir(parents=True, exist_ok=True)
        waker: Waker | None = self.steps.call("waker", self.source.waker, time.monotonic())
        log.info("runner %s up: concurrency %d", self.worker, self.options.runtime.concurrency)
        try:
            while True:
                try:
                    if self._turn() is None:
                        return 0
                except Exception as exc:  # a bug, not the store: keep supervising
                    log.exception("runner turn failed (%s: %s)", type(exc).__name__, exc)
                mono = self.last_turn = time.monotonic()
                timeout = self._wait_time(mono)
                if waker is None:
                    waker = self.steps.call("waker", self.source.waker, mono)
                if waker is None:
                    time.sleep(timeout)
                    continue
                try:
                    if waker.wait(timeout):
                        self._next_claim = 0.0
                        self._next_cancel_check = 0.0
                except Exception as exc:
                    log.error("waker failed (%s); reconnecting", exc)
                    with contextlib.suppress(Exception):
                        waker.close()
                    waker = None
                    self.steps.retry("waker").failed(time.monotonic())
        finally:
            if waker is not None:
                waker.close()
            self.source.close()

    def _wait_time(self, mono: float) -> float:
        """Poll children every tick while any run; otherwise sleep until the next retry or
        the fallback poll."""
        if self.running:
            return BUSY_TICK
        due = self.steps.due(mono)
        due += [result.retry.due for result in self.unreported.values()
                if result.retry.due > mono]
        if self.source.announces and self.presence.next_due > mono:
            due.append(self.presence.next_due)
        if due:
            return max(BUSY_TICK, min(self.options.runtime.poll_interval, min(due) - mono))
        return self.options.runtime.poll_interval

    def _first_maintenance(self) -> bool:
        """The first rescue pass, before any claim: retried while the store is busy or
        unreachable (the loop's own failures are retried the same way). False when a stop
        signal arrived first."""
        backoff = Backoff(base=0.25, cap=5.0)
        while True:
            try:
                self.adoption.adopt_predecessors()
                self.source.maintain(self.clock())
                if self.source.supervised:
                    self.memory.sweep_gone()
                return True
            except Exception as exc:
                if self._stopping:
                    return False
                delay = backoff.next()
                log.error("first maintenance pass failed (%s: %s); retrying in %.2fs",
                          type(exc).__name__, exc, delay)
                time.sleep(delay)

    def _turn(self) -> bool | None:
        """One pass; None when the runner should exit."""
        mono = time.monotonic()
        self.reports.reap(mono)
        self.reports.report(mono)
        if self.source.announces:
            self.presence.publish(self.running, mono, self.clock(), self.steps,
                                  self.source.present)
        if self._stopping and self.handing_over and self._stopping < 2:
            self.steps.call("drain", self.source.drain, mono)
            if not self.unreported and not self.reports.pending_starts():
                # Nothing appended to their logs: each job writes at its own offset.
                log.warning("handing over: %d attempt(s) left running for the next agent",
                            len(self.running))
                return None
            self._supervise(mono)
            return True
        if self._stopping:
            self.steps.call("drain", self.source.drain, mono)
            if not self._draining(mono):
                self._stop_all(mono, Outcome.LOST)
            self._supervise(mono)
            if not self.running and (not self.unreported or self._stopping > 1):
                for token in self.unreported:
                    log.error("attempt %s: result not recorded before exit; the lease will "
                              "requeue the job", token)
                return None
            return True
        self._supervise(mono)
        free = self.options.runtime.concurrency - len(self.running)
        claimed_none = False
        if free > 0 and mono >= self._next_claim:
            claimed = self.steps.call("claim", lambda: self._claim(free), mono)
            claimed_none = claimed is not None and not claimed
            self._next_claim = mono + self.options.runtime.poll_interval if claimed_none else 0.0
        if mono >= self._next_maintenance:
            self._next_maintenance = mono + max(self.options.runtime.attempt_lease / 4, 1.0)
            self.steps.call("maintenance", lambda: self.source.maintain(self.clock()), mono)
            self.steps.call("workspace sweep",
                       lambda: sweep(self.options.workspaces.root, time.time(),
                                     self.options.runtime.workspace_keep_failed), mono)
        if (self.options.exit_when_idle and claimed_none and not self.running
                and not self.unreported and self.steps.call("idle check", self.source.idle, mono)):
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
            self.steps.call("cancel check", lambda: self._check_cancels(mono), mono)
        if self.running and mono >= self.leases.next_renewal:
            self.leases.renew(mono)
        for token in self.source.fenced_out():
            attempt = self.running.get(token)
            if attempt is not None and not attempt.killed:
                # The server refused its report: the attempt is not live there, and its job
                # may already run elsewhere. Do not wait for the next heartbeat to say so.
                log.warning("job %d attempt %d is no longer live on the server: killing it",
                            token.job_id, token.attempt)
                attempt.fence_out(mono)
        self.leases.fence(time.monotonic())

    # -- steps ------------------------------------------------------------------------------

    def _claim(self, free: int) -> list[Job]:
        # Before the claim is asked for: the store stamps its lease no earlier than this.
        asked = time.monotonic()
        jobs = self.source.take(free, self.clock())
        for job in jobs:
            came = self.source.asked_at(job.token)
            try:
                self._start(job, asked if came is None else min(asked, came))
            except Exception as exc:
                # Claimed, so never dropped: record it as not launched (retried by policy).
                log.exception("job %d attempt %d: start failed", job.id, job.attempt)
                if job.token not in self.running:
                    self.unreported[job.token] = launch_failed(
                        job, f"start failed: {type(exc).__name__}: {exc}")
        return jobs

    def _start(self, job: Job, asked: float) -> None:
        for older in self.running.values():
            if older.job.id == job.id:
                # The store handed out a newer attempt, so this one was declared lost
                # elsewhere: it must not overlap the new one. Kill it now.
                log.warning("job %d attempt %d was fenced out by attempt %d: killing it",
                            job.id, older.job.attempt, job.attempt)
                older.fence_out(time.monotonic())
        lease, margin = self.leases.lease()
        if fence_due(asked, time.monotonic(), lease, margin):
            # The runner stalled between asking and starting (frozen, a stuck store call):
            # its own fence already counts this lease as spent, and the server may be
            # running the job elsewhere. Starting it would only be killed again at once.
            log.warning("job %d attempt %d: its lease ran out before it could start; "
                        "handing it back", job.id, job.attempt)
            self.unreported[job.token] = Result(job, Outcome.LOST, None)
            self.reports.report(time.monotonic())
            return
        # The guardian learns the new attempt's backstop before there is a process to
        # fence: a freeze right after the spawn leaves nothing unwatched.
        self.leases.publish({attempt_marker(job.token, self.worker): asked})
        try:
            attempt = spawn(job, self.options.host, self.worker, self.options.log_dir,
                            self.options.runtime.kill_grace, self.options.runtime.pass_env,
                            self.options.workspaces,
                            self.memory.begin(job, self.options.outcome_rules.weights),
                            self.options.run_as, supervised=self.source.supervised)
        except (LaunchError, OSError) as exc:
            log.error("job %d attempt %d: launch failed: %s", job.id, job.attempt, exc,
                      extra={"event": "spawn_failed", "job_id": job.id,
                             "attempt": job.attempt, "host": self.options.host})
            self.unreported[job.token] = launch_failed(job, f"spawn failed: {exc}")
            self.reports.report(time.monotonic())
            return
        # Supervised from here on, whatever the store answers next.
        attempt.renewed = asked
        self.running[job.token] = attempt
        self.started += 1
        log.info("job %d attempt %d started: pid %d", job.id, job.attempt, attempt.job_pid,
                 extra={"event": "spawn_ok", "job_id": job.id, "attempt": job.attempt,
                        "host": self.options.host, "job_type": job.job_type,
                        "weight": job.weight, "pid": attempt.job_pid})
        self.reports.report_start(attempt, time.monotonic())

    def _check_cancels(self, mono: float) -> None:
        wanted = self.source.cancel_requested([token.job_id for token in self.running])
        for token in wanted:
            attempt = self.running.get(token)
            if attempt is not None:
                log.info("job %d: cancel requested", token.job_id)
                attempt.request_stop(Outcome.CANCELLED, mono)

    def _stop_all(self, mono: float, outcome: Outcome) -> None:
        for attempt in self.running.values():
            attempt.request_stop(outcome, mono)
            if self._stopping > 1 and not attempt.killed:
                attempt.kill()
