"""Adoption: an agent that starts where a dead one of its host left supervises that one's
attempts again (their supervisors outlive it), so a restart loses no running job."""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

import msgspec

from herder.core.model import AttemptToken
from herder.runtime.attempt_files import log_path_for, read_record, write_record
from herder.runtime.executor import Adopted, RunningAttempt
from herder.runtime.leases import Leases
from herder.runtime.memory import MemoryControl
from herder.runtime.pending_results import Result
from herder.runtime.runner_options import RunnerOptions
from herder.runtime.sources import WorkSource
from herder.runtime.workspace import claim

log = logging.getLogger("herder.runner")


class Adoption:
    """Takes a dead predecessor's attempts into the runner's `running` (its own dict)."""

    def __init__(self, source: WorkSource, options: RunnerOptions, worker: str,
                 memory: MemoryControl, running: dict[AttemptToken, RunningAttempt],
                 unreported: dict[AttemptToken, Result], leases: Leases) -> None:
        self.source = source
        self.options = options
        self.worker = worker
        self.memory = memory
        self.running = running
        self.unreported = unreported
        self.leases = leases

    def adopt_predecessors(self) -> None:
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
            self.leases.publish()

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
