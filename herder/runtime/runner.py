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
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TypeVar

import msgspec

from herder.core.backoff import Backoff
from herder.core.model import AttemptToken, Job, Outcome, WorkerId
from herder.core.settings.fleet import FleetSection
from herder.core.settings.sections import RuntimeSection, Settings
from herder.runtime.attempt_files import (
    append_log,
    attempt_marker,
    collect_result,
    log_path_for,
    read_ending,
    read_record,
    write_record,
)
from herder.runtime.cgroup import runner_prefix
from herder.runtime.endings import Ending, OutcomeRules, PolicyLimits
from herder.runtime.executor import Adopted, LaunchError, RunningAttempt, spawn
from herder.runtime.fence import FENCE_KILL_SHARE, fence_due, fence_kill_at, fence_margin
from herder.runtime.job_user import JobUser, check_workspace_root
from herder.runtime.job_user import resolve as resolve_job_user
from herder.runtime.maintenance import Rescuer
from herder.runtime.memory import MemoryControl
from herder.runtime.pending_results import Result, Retry, launch_failed
from herder.runtime.preflight import Check, Refresher, job_type_checks
from herder.runtime.process import process_start_time
from herder.runtime.sources import ClaimSource, WorkSource
from herder.runtime.workspace import Workspaces, claim, release, sweep
from herder.store import Store, Waker

log = logging.getLogger("herder.runner")
T = TypeVar("T")

BUSY_TICK = 0.02
CANCEL_CHECK_PERIOD = 0.05


def utcnow() -> datetime:
    return datetime.now(UTC)


def default_host() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class RunnerOptions(msgspec.Struct, frozen=True):
    """What a runner needs to know: herder.toml's [runtime] and [fleet] as they are, and what
    the command decides for this run. Commands build it with `from_settings`; a test passes
    sections of its own (their defaults are herder.toml's)."""

    host: str
    log_dir: Path
    runtime: RuntimeSection = RuntimeSection()
    """Concurrency, heartbeats, the lease, pass_env, workspaces, memory: as the runner runs."""
    fleet: FleetSection = FleetSection()
    """max_spawn_failures, spawn_backoff and emergency_max_workers (the fleet-wide cap `herder
    up` claims under)."""
    exit_when_idle: bool = False
    drain_timeout: float | None = None
    """On the first SIGTERM, let running attempts finish for this long before handing them
    back; None stops them at once (they are requeued either way)."""
    outcome_rules: OutcomeRules = msgspec.field(default_factory=OutcomeRules)
    """The job types' exit-code maps and the weight chain (`herder up` judges endings)."""
    run_as: JobUser | None = None
    """Who jobs run as when herder is root ([runtime] run_as); None: herder's own user."""
    preflight: Mapping[str, Check] = msgspec.field(default_factory=dict)
    """Job type -> its preflight, run by `herder up` before it claims that type."""

    @classmethod
    def from_settings(
        cls, settings: Settings, host: str, log_dir: Path, *, concurrency: int | None = None,
        attempt_lease: float | None = None, poll_interval: float | None = None,
        exit_when_idle: bool = False, drain_timeout: float | None = None,
    ) -> RunnerOptions:
        """The one place herder.toml becomes a runner's options; the keywords are what a
        command or the server decides instead (None: the config's value)."""
        runtime = settings.runtime
        overrides = {name: value for name, value in (
            ("concurrency", concurrency), ("attempt_lease", attempt_lease),
            ("poll_interval", poll_interval)) if value is not None}
        options = cls(
            host=host, log_dir=log_dir, runtime=msgspec.structs.replace(runtime, **overrides),
            fleet=settings.fleet, exit_when_idle=exit_when_idle, drain_timeout=drain_timeout,
            outcome_rules=OutcomeRules.from_settings(settings),
            run_as=resolve_job_user(runtime.run_as, os.geteuid()),
            preflight=job_type_checks(settings.job_types),
        )
        check_workspace_root(options.run_as, options.workspaces.root)
        return options

    @property
    def workspaces(self) -> Workspaces:
        runtime = self.runtime
        root = self.log_dir.parent / Path(runtime.workspace_root).expanduser()
        return Workspaces(root, runtime.workspace_keep_failed, runtime.workspace_min_free_gb)

    @property
    def limits(self) -> PolicyLimits:
        return PolicyLimits(self.runtime.max_lost, self.fleet.max_spawn_failures,
                            self.fleet.spawn_backoff, self.outcome_rules)


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
        # Ended attempts whose result the store or server has not recorded yet.
        self.unreported: dict[AttemptToken, Result] = {}
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
        self._next_heartbeat = 0.0
        self._next_maintenance = 0.0
        self._next_cancel_check = 0.0
        self._next_claim = 0.0
        self._retries: dict[str, Retry] = {}
        self._start_retries: dict[AttemptToken, Retry] = {}
        self.started = 0
        self.finished = 0
        self.last_turn = time.monotonic()
        """When the loop last completed a turn (the silent-scheduler alert of `herder up`)."""
        margin = fence_margin(options.runtime.attempt_lease, options.runtime.fence_margin)
        if options.runtime.kill_grace > margin * FENCE_KILL_SHARE:
            log.warning("runtime.kill_grace (%gs) does not fit in %.0f%% of the fence margin "
                        "(%gs, runtime.fence_margin): an attempt cut off from the store gets "
                        "less than kill_grace between SIGTERM and SIGKILL",
                        options.runtime.kill_grace, FENCE_KILL_SHARE * 100, margin)

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
        waker: Waker | None = self._step("waker", self.source.waker, time.monotonic())
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
                    waker = self._step("waker", self.source.waker, mono)
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
                    self._retry("waker").failed(time.monotonic())
        finally:
            if waker is not None:
                waker.close()
            self.source.close()

    def _wait_time(self, mono: float) -> float:
        """Poll children every tick while any run; otherwise sleep until the next retry or
        the fallback poll."""
        if self.running:
            return BUSY_TICK
        due = [retry.due for retry in self._retries.values() if retry.due > mono]
        due += [result.retry.due for result in self.unreported.values()
                if result.retry.due > mono]
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
                self._adopt_predecessors()
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

    def _retry(self, step: str) -> Retry:
        return self._retries.setdefault(step, Retry())

    def _step(self, step: str, call: Callable[[], T], mono: float) -> T | None:
        """One call to the store or server: on failure log it, back this step off and let
        the turn go on (None); the other steps, supervision first, do not wait for it."""
        retry = self._retry(step)
        if not retry.ready(mono):
            return None
        try:
            value = call()
        except Exception as exc:
            delay = retry.failed(mono)
            log.error("runner turn failed in %s (%s: %s); retrying in %.2fs", step,
                      type(exc).__name__, exc, delay)
            return None
        retry.succeeded()
        return value

    def _turn(self) -> bool | None:
        """One pass; None when the runner should exit."""
        mono = time.monotonic()
        self._reap(mono)
        self._report(mono)
        if self._stopping and self.handing_over and self._stopping < 2:
            self._step("drain", self.source.drain, mono)
            if not self.unreported and not self._pending_starts():
                # Nothing appended to their logs: each job writes at its own offset.
                log.warning("handing over: %d attempt(s) left running for the next agent",
                            len(self.running))
                return None
            self._supervise(mono)
            return True
        if self._stopping:
            self._step("drain", self.source.drain, mono)
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
            claimed = self._step("claim", lambda: self._claim(free), mono)
            claimed_none = claimed is not None and not claimed
            self._next_claim = mono + self.options.runtime.poll_interval if claimed_none else 0.0
        if mono >= self._next_maintenance:
            self._next_maintenance = mono + max(self.options.runtime.attempt_lease / 4, 1.0)
            self._step("maintenance", lambda: self.source.maintain(self.clock()), mono)
            self._step("workspace sweep",
                       lambda: sweep(self.options.workspaces.root, time.time(),
                                     self.options.runtime.workspace_keep_failed), mono)
        if (self.options.exit_when_idle and claimed_none and not self.running
                and not self.unreported and self._step("idle check", self.source.idle, mono)):
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
            self._step("cancel check", lambda: self._check_cancels(mono), mono)
        if self.running and mono >= self._next_heartbeat:
            self._heartbeat(mono)
        for token in self.source.fenced_out():
            attempt = self.running.get(token)
            if attempt is not None and not attempt.killed:
                # The server refused its report: the attempt is not live there, and its job
                # may already run elsewhere. Do not wait for the next heartbeat to say so.
                log.warning("job %d attempt %d is no longer live on the server: killing it",
                            token.job_id, token.attempt)
                attempt.fence_out(mono)
        self._fence(time.monotonic())

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
        lease, margin = self._lease()
        if fence_due(asked, time.monotonic(), lease, margin):
            # The runner stalled between asking and starting (frozen, a stuck store call):
            # its own fence already counts this lease as spent, and the server may be
            # running the job elsewhere. Starting it would only be killed again at once.
            log.warning("job %d attempt %d: its lease ran out before it could start; "
                        "handing it back", job.id, job.attempt)
            self.unreported[job.token] = Result(job, Outcome.LOST, None)
            self._report(time.monotonic())
            return
        # The guardian learns the new attempt's backstop before there is a process to
        # fence: a freeze right after the spawn leaves nothing unwatched.
        self._publish_leases({attempt_marker(job.token, self.worker): asked})
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
            self._report(time.monotonic())
            return
        # Supervised from here on, whatever the store answers next.
        attempt.renewed = asked
        self.running[job.token] = attempt
        self.started += 1
        log.info("job %d attempt %d started: pid %d", job.id, job.attempt, attempt.job_pid,
                 extra={"event": "spawn_ok", "job_id": job.id, "attempt": job.attempt,
                        "host": self.options.host, "job_type": job.job_type,
                        "weight": job.weight, "pid": attempt.job_pid})
        self._report_start(attempt, time.monotonic())

    def _report_start(self, attempt: RunningAttempt, mono: float) -> None:
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

    def _reap(self, mono: float) -> None:
        for token, attempt in list(self.running.items()):
            if attempt.poll(mono):
                outcome = attempt.outcome()
                lease, margin = self._lease()
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
                                   self.options.runtime.workspace_keep_failed, time.time())
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

    def _pending_starts(self) -> bool:
        return any(not attempt.start_reported for attempt in self.running.values())

    # -- adoption ----------------------------------------------------------------------------

    def _adopt_predecessors(self) -> None:
        """Supervise again what a dead runner of this host left (an agent restarted): each
        attempt still live on the server whose folder says how to, running or ended while
        no agent was up (then its supervisor's file says how). The others are left to
        `maintain`, which kills them and reports them lost, as before adoption existed."""
        for token, previous in self.source.predecessors():
            if token in self.running or token in self.unreported:
                continue
            attempt = self._adoptable(token, previous)
            if attempt is None:
                continue
            asked = time.monotonic()
            if not self.source.adopt(token, previous, str(attempt.log_path)):
                continue  # not live on the server (any more): `maintain` kills it
            attempt.renewed = asked
            self.running[token] = attempt
            for folder in (attempt.workspace, attempt.run_folder):
                if folder is not None:  # this runner's now: the sweep leaves them alone
                    with contextlib.suppress(OSError):
                        claim(folder, self.worker)
            # For a next agent, should this one die too.
            with contextlib.suppress(OSError, msgspec.MsgspecError):
                cgroup = attempt.memory.cgroup if attempt.memory is not None else None
                write_record(attempt.log_path, msgspec.structs.replace(
                    read_record(attempt.log_path), worker=self.worker,
                    cgroup=cgroup.path.name if cgroup is not None else None))
            ended = attempt.status is not None
            log.warning("job %d attempt %d: adopted from dead agent %s (%s, pid %d)",
                        token.job_id, token.attempt, previous,
                        "ended meanwhile" if ended else "running", attempt.job_pid)
        if self.running:
            self._publish_leases()

    def _adoptable(self, token: AttemptToken, previous: str) -> RunningAttempt | None:
        """The attempt as its folder describes it; None when the folder cannot be read or
        its supervisor died without a word (it is lost)."""
        log_path = log_path_for(self.options.log_dir, token)
        try:
            record = read_record(log_path)
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("attempt %s of dead agent %s cannot be adopted: its folder cannot be "
                        "read (%s)", token, previous, exc)
            return None
        if record.worker != previous or record.job.token != token:
            log.warning("attempt %s of dead agent %s cannot be adopted: its folder names "
                        "another attempt", token, previous)
            return None
        process = Adopted(record.supervisor, record.supervisor_start, log_path,
                          record.job_pid)
        if process.poll() is not None and process.lost:
            log.warning("attempt %s of dead agent %s cannot be adopted: its supervisor died "
                        "without recording how it ended", token, previous)
            return None
        job = record.job
        mono = time.monotonic()
        started = mono - max(0.0, time.time() - record.started_at)
        deadline = started + job.timeout_seconds if job.timeout_seconds else None
        memory = self.memory.adopt(job, self.options.outcome_rules.weights, record.cgroup)
        return RunningAttempt(
            job, record.marker, log_path, process, started, deadline,
            self.options.runtime.kill_grace,
            start_reported=True, memory=memory, adopted=True,
            workspace=Path(record.workspace) if record.workspace else None,
            run_folder=Path(record.run_folder) if record.run_folder else None)

    def _report(self, mono: float) -> None:
        """Pending start reports and results, each on its own backoff."""
        for attempt in list(self.running.values()):
            if not attempt.start_reported:
                self._report_start(attempt, mono)
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
        if status is not None:
            log.info("job %d attempt %d: %s -> %s", job.id, job.attempt, result.outcome,
                     status)
        else:
            log.info("job %d attempt %d: %s reported", job.id, job.attempt, result.outcome)
        return True

    def _check_cancels(self, mono: float) -> None:
        wanted = self.source.cancel_requested([token.job_id for token in self.running])
        for token in wanted:
            attempt = self.running.get(token)
            if attempt is not None:
                log.info("job %d: cancel requested", token.job_id)
                attempt.request_stop(Outcome.CANCELLED, mono)

    def _heartbeat(self, mono: float) -> None:
        self._next_heartbeat = mono + self.options.runtime.heartbeat_interval
        tokens = [attempt.token for attempt in self.running.values()]
        # The lease is renewed from when the request left, not when the reply came back:
        # the server stamps it later than that, so the local deadline errs early.
        sent = time.monotonic()
        reply = self._step("heartbeat", lambda: self.source.heartbeat(tokens, self.clock()),
                           mono)
        if reply is None:
            # Retry well before the next interval: every failed beat brings the fence closer.
            retry = self._retry("heartbeat")
            self._next_heartbeat = min(self._next_heartbeat, max(retry.due, mono + BUSY_TICK))
            return
        for attempt in self.running.values():
            if attempt.token not in reply.live:
                if attempt.stop_outcome is None:
                    log.warning("job %d attempt %d was fenced out: stopping it",
                                attempt.job.id, attempt.job.attempt)
                attempt.request_stop(Outcome.LOST, mono)
                continue
            attempt.renewed = max(attempt.renewed, sent)
            if attempt.token in reply.cancel:
                attempt.request_stop(Outcome.CANCELLED, mono)
        # Deadlines move only here (and at a start): the watchdog hears of each renewal.
        self._publish_leases()

    def _lease(self) -> tuple[float, float]:
        """The lease the attempts are held to and this runner's fence margin."""
        lease = self.source.lease_seconds or self.options.runtime.attempt_lease
        return lease, fence_margin(lease, self.options.runtime.fence_margin)

    def _publish_leases(self, starting: Mapping[str, float] | None = None) -> None:
        """Each running (or `starting`: marker -> renewed) attempt's backstop, for a
        watchdog that outlives a frozen runner (the agent's guardian): half a fence margin
        after this runner's own fence, still half a margin before the lease ends and the
        attempt may run elsewhere."""
        lease, margin = self._lease()
        renewed = {attempt.marker: attempt.renewed for attempt in self.running.values()}
        renewed.update(starting or {})
        self.source.leases({marker: at + lease - margin / 2 for marker, at in renewed.items()})

    def _fence(self, mono: float) -> None:
        """Stop the attempts whose lease this runner could not renew in time, before the
        store or server may declare them lost and run their jobs elsewhere."""
        lease, margin = self._lease()
        for attempt in self.running.values():
            if attempt.fenced or not fence_due(attempt.renewed, mono, lease, margin):
                continue
            attempt.fenced = True
            kill_at = fence_kill_at(mono, attempt.renewed + lease, self.options.runtime.kill_grace)
            log.error("job %d attempt %d: its lease was not renewed for %.1fs (lease %gs): "
                      "stopping it before the lease ends", attempt.job.id, attempt.job.attempt,
                      mono - attempt.renewed, lease)
            attempt.request_stop(Outcome.LOST, mono, grace=kill_at - mono)
            if attempt.kill_at is not None and attempt.kill_at > kill_at:
                attempt.kill_at = kill_at  # an earlier stop (a cancel) had a longer grace
            append_log(attempt.log_path, "lease not renewed (cut off from the store or "
                                         "server): stopped before it ends")

    def _stop_all(self, mono: float, outcome: Outcome) -> None:
        for attempt in self.running.values():
            attempt.request_stop(outcome, mono)
            if self._stopping > 1 and not attempt.killed:
                attempt.kill()
