"""SSH push: the server starts each attempt on a `transport = "ssh"` host with the system
`ssh` client (BatchMode, the user's ssh config). The remote side runs `herder run-attempt`,
which fetches the attempt, runs it under the same supervision as an agent and reports back
over the HTTP API with the host's own token (kept on that host, never sent by the server).

The ssh process lives as long as the attempt. When it ends before the attempt started, its
exit code says why (seed 004): 255 the host is unreachable, 1 bad arguments, 3 RAM
contention; those become spawn failures with a backoff. Once the attempt runs, only its own
reports and heartbeats count: a dropped connection does not requeue a job that may still be
running (the lease decides).
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from herder.hardening import child_environment
from herder.model import (
    LAUNCH_ERROR_CHARS,
    AttemptResult,
    AttemptToken,
    Job,
    JobStatus,
    Outcome,
    Transport,
)
from herder.runtime.sources import Ending, PolicyLimits, bind_jobs, decide_for
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
    ) -> None:
        self.store = store
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
            for job in self.store.attempt_list_assigned(host.label, 100):
                now = utcnow()
                if not self.store.attempt_set_worker(job.token, self.worker, now):
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
