"""What the local and the fleet harness share: one test's folder, database and herder.toml,
the `herder` processes it started, and reading and waiting on the jobs in its store."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from herder.core.model import Attempt, Job, JobStatus
from herder.store import Store
from support.cli import herder_argv, run_herder
from support.environment import clean_environment
from support.processes import Proc, StartedProcesses, kill_leftovers
from support.waits import wait_status


class HarnessBase:
    def __init__(self, folder: Path, db: str, config: Path) -> None:
        self.folder = folder
        self.db = db
        self.config = config
        self.started = StartedProcesses(folder)

    @property
    def store(self) -> Store:
        raise NotImplementedError

    def job_processes(self) -> list[Proc]:
        """This test's live job processes."""
        raise NotImplementedError

    def describe(self) -> str:
        """What a failed wait shows: hosts, jobs with their last attempts, live job
        processes and the tail of every stderr."""
        lines: list[str] = []
        with contextlib.suppress(Exception):
            for host in self.store.host_list():
                lines.append(f"host {host.label}: enabled={host.enabled} "
                             f"heartbeat={host.last_heartbeat}")
            for job in self.store.job_list(None, 60):
                lines.append(f"job {job.id} {job.job_type}/{job.weight}/p{job.priority}: "
                             f"{job.status} on {job.host} attempt={job.attempt} "
                             f"failures={job.failures} lost={job.lost} exit={job.exit_code} "
                             f"reason={job.failure_reason}")
                for a in self.attempts(job.id)[-6:]:
                    lines.append(f"    #{a.attempt} {a.host} worker={a.worker!r} pid={a.pid} "
                                 f"started={a.started_at is not None} outcome={a.outcome} "
                                 f"exit={a.exit_code}")
        with contextlib.suppress(Exception):
            for proc in self.job_processes():
                lines.append(f"process {proc.pid} {proc.token} {' '.join(proc.argv)[:80]}")
        lines += self.started.tails(30)
        return "\n".join(lines)

    def close(self) -> None:
        """Kill every process this test started, then its job processes (which live in
        sessions of their own, so only their marker finds them)."""
        self.started.close()
        kill_leftovers(self.job_processes)

    # -- the herder command ---------------------------------------------------------------------

    def argv(self, *args: str) -> list[str]:
        return herder_argv(*args, db=self.db, config=self.config)

    def cli(self, *args: str, check: bool = True, timeout: float = 60.0
            ) -> subprocess.CompletedProcess[str]:
        return run_herder(*args, cwd=self.folder, db=self.db, config=self.config,
                          timeout=timeout, check=check, detail=self.describe)

    def start(self, name: str, *args: str, env: Mapping[str, str] | None = None,
              stdout: Any = subprocess.DEVNULL) -> subprocess.Popen[Any]:
        """`herder ARGS...` in its own process group; stderr goes to a file."""
        return self.started.start(name, self.argv(*args), self.folder, clean_environment(env),
                                  stdout)

    def stderr_of(self, process: subprocess.Popen[Any]) -> str:
        return self.started.stderr_of(process)

    def wait_exit(self, process: subprocess.Popen[Any], timeout: float, what: str) -> int:
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{what} did not exit within {timeout:.0f}s\n"
                                 f"--- state ---\n{self.describe()}") from None

    # -- jobs -----------------------------------------------------------------------------------

    def job(self, job_id: int) -> Job:
        job = self.store.job_get(job_id)
        assert job is not None, f"no job {job_id}"
        return job

    def attempts(self, job_id: int) -> list[Attempt]:
        return self.store.attempt_list(job_id)

    def wait_status(self, job_id: int, statuses: JobStatus | Iterable[JobStatus],
                    timeout: float = 30.0) -> Job:
        return wait_status(self.job, job_id, statuses, timeout, self.describe)
