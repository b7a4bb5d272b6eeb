"""SSH push: the server starts each attempt on a `transport = "ssh"` host with the system
`ssh` client (BatchMode, the user's ssh config). The remote side runs `herder run-attempt`,
which fetches the attempt, runs it under the same supervision as an agent and reports back
over the HTTP API with the host's own token (kept on that host, never sent by the server).

The ssh process lives as long as the attempt. When it ends before the attempt started, its
exit code says why (the launch wrapper's contract): 255 the host is unreachable, 1 bad
arguments, 3 RAM contention; those become spawn failures with a backoff. Once the attempt
runs, only its own reports and heartbeats count: a dropped connection does not requeue a job
that may still be running (the lease decides).

Preflight runs on the host too (the host is what it checks), through the same ssh:
`herder preflight` there gets the due checks of the job types the host may run on its stdin
(nothing on argv) and prints their verdicts; the failing types are kept on the host
(`preflight_failed`, as an agent reports them), so placement passes the host over for them
and `herder why` says why. An ssh session or remote herder that fails decides nothing
(logged; tried again later).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import msgspec

from herder.core.model import (
    LAUNCH_ERROR_CHARS,
    AttemptResult,
    AttemptToken,
    HostRecord,
    Job,
    JobStatus,
    Outcome,
    Transport,
)
from herder.runtime.endings import Ending, PolicyLimits, bind_jobs, decide_for
from herder.runtime.hardening import child_environment
from herder.runtime.preflight import Check
from herder.store import Store

log = logging.getLogger("herder.ssh")

EXIT_BAD_ARGS = 1
EXIT_RAM_CONTENTION = 3
EXIT_UNREACHABLE = 255


def utcnow() -> datetime:
    return datetime.now(UTC)


def outcome_for_exit(code: int) -> Outcome:
    """What an ssh exit before the attempt started means for the job."""
    if code == EXIT_RAM_CONTENTION:
        return Outcome.RAM_CONTENTION
    if code == EXIT_BAD_ARGS:
        return Outcome.LAUNCH_FAILED
    if code == EXIT_UNREACHABLE:
        return Outcome.UNREACHABLE  # ssh's own failure: refused, denied, no route
    return Outcome.SPAWN_FAILED


def last_line(path: Path, limit: int = 4096) -> str:
    """The last non-empty line of an ssh session's output (its error, when it failed)."""
    try:
        with open(path, "rb") as output:
            output.seek(max(0, output.seek(0, 2) - limit))
            tail = output.read(limit).decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def remote_command(remote_herder: str, server_url: str, label: str,
                   token: AttemptToken, allow_plaintext: bool = False) -> str:
    """What ssh runs on the host; `--allow-plaintext` passes on the server's consent to a
    plain http server URL (run-attempt refuses one off loopback otherwise)."""
    plaintext = " --allow-plaintext" if allow_plaintext else ""
    return (f"{remote_herder} run-attempt --server {shlex.quote(server_url)} "
            f"--host {shlex.quote(label)} --job {token.job_id} --attempt {token.attempt}"
            f"{plaintext}")


PREFLIGHT_SLACK = 30.0
"""What a preflight round over ssh may take beyond its checks' timeouts (the connection)."""
PREFLIGHT_OUTPUT_BYTES = 256 * 1024


class Verdict(msgspec.Struct, frozen=True):
    """One check's answer from `herder preflight` on the host."""

    ok: bool
    detail: str = ""


@dataclass
class _Round:
    """A preflight round in flight on one host."""

    process: subprocess.Popen[bytes]
    checks: dict[str, Check]
    deadline: float
    """Monotonic."""
    output: IO[bytes]
    errors: IO[bytes]
    """ssh's and the remote herder's stderr (warnings never mix with the verdicts)."""


@dataclass
class _HostPreflight:
    """What the launcher knows of one ssh host's preflights."""

    checked: dict[str, tuple[bool, str, float]] = field(default_factory=dict)
    """Job type -> (ok, detail, when it ran: monotonic)."""
    recorded: dict[str, str] | None = None
    """The failures last written to the host (None: not yet)."""
    retry_at: float = 0.0
    """After a round that decided nothing: not before this (monotonic)."""
    undecided: bool = False
    """The last round decided nothing (ssh or the remote herder failed): launches go ahead
    without a verdict (fail-open, as before preflight ran over ssh)."""
    round: _Round | None = None


@dataclass
class _Launch:
    label: str
    job: Job
    process: subprocess.Popen[bytes]
    log_path: Path


class SshLauncher:
    def __init__(
        self,
        store: Store,
        server_url: str,
        ssh_command: Sequence[str],
        remote_herder: str,
        limits: PolicyLimits,
        log_dir: Path,
        worker: str,
        allow_plaintext: bool = False,
        preflight: Mapping[str, Check] | None = None,
    ) -> None:
        self.store = store
        self.preflight = dict(preflight or {})
        """Job type -> its preflight (herder.runtime.preflight.job_type_checks)."""
        self.hosts: dict[str, _HostPreflight] = {}
        self.server_url = server_url
        self.allow_plaintext = allow_plaintext
        self.ssh_command = list(ssh_command)
        self.remote_herder = remote_herder
        self.limits = limits
        self.log_dir = log_dir
        self.worker = worker
        self.running: dict[AttemptToken, _Launch] = {}
        self.wake = threading.Event()

    def run_once(self, scan: bool = True) -> dict[str, int]:
        """Settle ssh processes that ended; with `scan`, launch what was placed on ssh
        hosts (two queries a host, so only when woken by a placement or now and then)."""
        counts = {"launched": 0, "ended": 0}
        self._settle_preflights()
        for token, launch in list(self.running.items()):
            code = launch.process.poll()
            if code is None:
                continue
            del self.running[token]
            counts["ended"] += 1
            self._settle(launch, code)
        if not scan:
            return counts
        for host in self.store.host_list():
            if host.transport is not Transport.SSH or not host.ssh_target:
                continue
            self._start_preflight(host)
            for job in self.store.attempt_list_assigned(host.label, 100):
                if self._preflight_pending(host.label, job.job_type):
                    continue  # taken once its first verdict is in (or the pickup times out)
                now = utcnow()
                if not self.store.attempt_set_worker(job.token, self.worker, now):
                    continue
                failed = self.preflight_failed(host.label).get(job.job_type)
                if failed is not None:  # placed before its preflight was known
                    self._unstarted(job, Outcome.REFUSED, None,
                                    f"preflight for job type {job.job_type} failed on "
                                    f"{host.label}: {failed}")
                    continue
                # An account is bound here, as an agent's take does: a job that cannot have
                # one is ended (nothing spent) instead of launched; the remote side gets the
                # account's env with the attempt (`placed_attempt`).
                if not bind_jobs(self.store, host.label, [job], now, self.limits):
                    continue
                self._launch(host.label, host.ssh_target, job)
                counts["launched"] += 1
        return counts

    def _launch(self, label: str, target: str, job: Job) -> None:
        command = [*self.ssh_command, "-o", "BatchMode=yes", target,
                   remote_command(self.remote_herder, self.server_url, label, job.token,
                                  self.allow_plaintext)]
        path = self.log_dir / str(job.id) / f"{job.attempt}.ssh.log"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(path, "ab") as output:
                # The host's environment (ssh agent, config) without herder's secrets.
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output,
                                           stderr=subprocess.STDOUT, start_new_session=True,
                                           env=child_environment())
        except OSError as exc:  # no ssh client here (`[fleet] ssh_command`): the server's
            log.error("job %d attempt %d: ssh could not start: %s", job.id, job.attempt, exc,
                      extra={"event": "spawn_failed", "job_id": job.id,
                             "attempt": job.attempt, "host": label})
            self._unstarted(job, Outcome.SPAWN_FAILED, None, f"spawn failed: {exc}")
            return
        log.info("job %d attempt %d: ssh %s (pid %d)", job.id, job.attempt, target,
                 process.pid)
        self.running[job.token] = _Launch(label, job, process, path)

    def _settle(self, launch: _Launch, code: int) -> None:
        job = self.store.job_get(launch.job.id)
        if job is None or job.attempt != launch.job.attempt or job.status.terminal:
            return
        if job.status is JobStatus.QUEUED:
            return
        if job.status is JobStatus.RUNNING:
            if code != 0:
                log.warning("job %d: ssh exited %d while the attempt runs; the lease decides",
                            job.id, code)
            else:  # the remote side exited without reporting
                self._record(job, Outcome.LOST, code, None)
            return
        # It never started: what ssh or the remote herder said last is why.
        said = last_line(launch.log_path)
        self._unstarted(job, outcome_for_exit(code), code,
                        f"ssh exited {code}{f': {said}' if said else ''}")

    def _unstarted(self, job: Job, outcome: Outcome, code: int | None, error: str) -> None:
        """An attempt that never started, with why (`herder show`, `herder why`)."""
        self._record(job, outcome, code, Ending(launch_error=error[:LAUNCH_ERROR_CHARS]))

    def _record(self, job: Job, outcome: Outcome, code: int | None,
                ending: Ending | None) -> None:
        now = utcnow()
        result = decide_for(job, outcome, now, self.limits, ending=ending)
        applied = self.store.attempt_finish(
            [AttemptResult(job.token, outcome, code, result.decision, result.report)], now)
        if applied:
            log.warning("job %d attempt %d: ssh exit %s -> %s (%s)", job.id, job.attempt, code,
                        outcome, applied[0][1])

    def stop(self) -> None:
        for launch in self.running.values():
            launch.process.terminate()
        for state in self.hosts.values():
            if state.round is not None:
                state.round.process.kill()

    # -- preflight over ssh ---------------------------------------------------------------

    def _preflight_pending(self, label: str, job_type: str) -> bool:
        """Whether the job type's first verdict on this host is still to come."""
        state = self.hosts.get(label)
        return (job_type in self.preflight and state is not None and not state.undecided
                and job_type not in state.checked)

    def preflight_failed(self, label: str) -> dict[str, str]:
        state = self.hosts.get(label)
        return {} if state is None else {job_type: detail for job_type, (ok, detail, _)
                                         in state.checked.items() if not ok}

    def _start_preflight(self, host: HostRecord) -> None:
        """Start a round of the host's due checks, unless one runs or none is due."""
        state = self.hosts.setdefault(host.label, _HostPreflight())
        mono = time.monotonic()
        if state.round is not None or mono < state.retry_at or not host.ssh_target:
            return
        allowed = host.allowed_job_types
        checks = {job_type: check for job_type, check in self.preflight.items()
                  if allowed is None or job_type in allowed}
        for gone in set(state.checked) - set(checks):
            del state.checked[gone]
        due = {job_type: check for job_type, check in checks.items()
               if job_type not in state.checked
               or mono - state.checked[job_type][2] >= check.cache}
        if not due:
            self._record_preflight(host.label, state)
            return
        command = [*self.ssh_command, "-o", "BatchMode=yes", host.ssh_target,
                   f"{self.remote_herder} preflight"]
        with tempfile.TemporaryFile() as stdin:
            stdin.write(msgspec.json.encode(due))
            stdin.seek(0)
            output = tempfile.TemporaryFile()  # noqa: SIM115 (read when the round ends)
            errors = tempfile.TemporaryFile()  # noqa: SIM115
            try:
                process = subprocess.Popen(command, stdin=stdin, stdout=output, stderr=errors,
                                           start_new_session=True, env=child_environment())
            except OSError as exc:
                output.close()
                errors.close()
                log.error("preflight on %s: ssh could not start: %s", host.label, exc)
                state.retry_at = mono + min(check.cache for check in due.values())
                state.undecided = True
                return
        state.round = _Round(process, due, mono + PREFLIGHT_SLACK + sum(
            check.timeout for check in due.values()), output, errors)

    def _settle_preflights(self) -> None:
        """Read the rounds that ended (kill those past their deadline)."""
        mono = time.monotonic()
        for label, state in self.hosts.items():
            current = state.round
            if current is None:
                continue
            code = current.process.poll()
            if code is None and mono < current.deadline:
                continue
            if code is None:
                with contextlib.suppress(ProcessLookupError):
                    current.process.kill()
                current.process.wait()
            state.round = None
            with current.output, current.errors:
                current.output.seek(0)
                said = current.output.read(PREFLIGHT_OUTPUT_BYTES)
                current.errors.seek(0)
                complained = current.errors.read(PREFLIGHT_OUTPUT_BYTES)
            verdicts = None
            if code == 0:
                with contextlib.suppress(msgspec.DecodeError):
                    verdicts = msgspec.json.decode(said, type=dict[str, Verdict])
            if verdicts is None:
                lines = [line for line in (complained or said).decode(
                    errors="replace").splitlines() if line.strip()]
                log.warning("preflight on %s decided nothing (%s%s); trying again later",
                            label, "no answer in time" if code is None else f"exit {code}",
                            f": {lines[-1].strip()[:200]}" if lines else "")
                state.retry_at = mono + min(check.cache for check in current.checks.values())
                state.undecided = True
                continue
            state.undecided = False
            for job_type in current.checks:
                verdict = verdicts.get(job_type, Verdict(False, "no verdict"))
                state.checked[job_type] = (verdict.ok, verdict.detail[:200], mono)
            self._record_preflight(label, state)

    def _record_preflight(self, label: str, state: _HostPreflight) -> None:
        """Write the host's failures where placement reads them, when they changed."""
        failed = self.preflight_failed(label)
        if failed == state.recorded:
            return
        for job_type, detail in sorted(failed.items()):
            if (state.recorded or {}).get(job_type) is None:
                log.warning("preflight for job type %s failed on %s (%s): placement passes "
                            "it over for that type", job_type, label, detail)
        self.store.host_preflight_record(label, failed)
        state.recorded = failed
