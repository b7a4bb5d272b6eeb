"""Start and stop one attempt's process tree: own session, own log file, job environment."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from herder.hardening import JOB_UMASK, NEVER_INHERITED
from herder.model import AttemptToken, Job, MemoryUse, Outcome
from herder.runtime.memory import AttemptMemory
from herder.runtime.process import TOKEN_VARIABLE, signal_tree, tree_alive
from herder.runtime.workspace import Launch, Workspaces, claim, launch, spec_of
from herder.scheduling.classification import RESULT_BYTES, TAIL_BYTES


def attempt_marker(token: AttemptToken, worker: str) -> str:
    """Globally unique per attempt: the worker id (host/pid/start time) makes it so even
    when several herder databases on one machine reuse job ids."""
    return f"{token}@{worker}"


def log_path_for(log_dir: Path, token: AttemptToken) -> Path:
    return log_dir / str(token.job_id) / f"{token.attempt}.log"


def result_path_for(log_path: Path) -> Path:
    """Where the attempt may write its $HERDER_RESULT: beside its log."""
    return log_path.with_suffix(".result.json")


def read_ending(log_path: Path) -> tuple[str, str | None]:
    """The last 16 KB of the attempt's log and its $HERDER_RESULT (None when it wrote none;
    one byte over the limit, so an oversized result is known as such)."""
    tail = b""
    with contextlib.suppress(OSError), open(log_path, "rb") as handle:
        handle.seek(max(0, handle.seek(0, os.SEEK_END) - TAIL_BYTES))
        tail = handle.read(TAIL_BYTES)
    try:
        with open(result_path_for(log_path), "rb") as handle:
            result: str | None = handle.read(RESULT_BYTES + 1).decode(errors="replace")
    except OSError:
        result = None
    return tail.decode(errors="replace"), result


BASE_ENVIRONMENT: tuple[str, ...] = ("PATH", "HOME", "USER", "LANG", "LC_*", "TZ", "TERM",
                                      "SHELL")
"""The runner's variables every job gets; `[runtime] pass_env` adds to them."""

HERDER_PREFIX = "HERDER_"
"""herder's own namespace (its credentials, its configuration, job identity): nothing of the
runner's under it reaches a job, whatever pass_env says."""


def passes(name: str, patterns: Sequence[str]) -> bool:
    """Whether a variable of the runner's environment may reach a job: named exactly or by
    a `PREFIX*` pattern, and never one of herder's own."""
    if name.startswith(HERDER_PREFIX) or name in NEVER_INHERITED:
        return False
    return any(name.startswith(pattern[:-1]) if pattern.endswith("*") else name == pattern
               for pattern in patterns)


def job_environment(job: Job, host: str, marker: str, log_path: Path,
                    pass_env: Sequence[str] = (),
                    runner_environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """An allow-list of the runner's variables, then the job's own env (the submitter's
    choice), then herder's identity variables, which nothing overrides. Nothing else of the
    runner's passes: it may hold herder's database URL or tokens, and jobs are AI agents."""
    source = os.environ if runner_environment is None else runner_environment
    patterns = (*BASE_ENVIRONMENT, *pass_env)
    env = {name: value for name, value in source.items() if passes(name, patterns)}
    env.update(job.env)
    env.update(
        {
            "HERDER_JOB_ID": str(job.id),
            "HERDER_ATTEMPT": str(job.attempt),
            "HERDER_JOB_TYPE": job.job_type,
            "HERDER_WEIGHT": job.weight,
            "HERDER_HOST": host,
            "HERDER_LOG": str(log_path),
            "HERDER_RESULT": str(result_path_for(log_path)),
            "HERDER_PAYLOAD": json.dumps(dict(job.payload)),
            TOKEN_VARIABLE: marker,
        }
    )
    return env


class LaunchError(Exception):
    """The process could not be started (missing program, bad workdir, permissions)."""


@dataclass
class RunningAttempt:
    """An attempt this runner supervises. Mutable: it moves through stop stages."""

    job: Job
    marker: str
    log_path: Path
    process: subprocess.Popen[bytes]
    started: float
    deadline: float | None
    grace: float
    stop_outcome: Outcome | None = None
    kill_at: float | None = None
    killed: bool = False
    returncode: int | None = None
    logged_exit: bool = False
    renewed: float = 0.0
    """Monotonic time of the last renewal of this attempt's lease: when the heartbeat
    request that renewed it was sent (or, before any, when its claim was asked for)."""
    start_reported: bool = False
    fenced: bool = False
    log_size: int = 0
    quiet_since: float = 0.0
    """Monotonic time since which the log has not grown (for the job's silence_timeout)."""
    workspace: Path | None = None
    """The attempt's fresh checkout, removed or kept when it ends (runtime/workspace.py)."""
    memory: AttemptMemory | None = None
    """Its samples and cgroup (herder.runtime.memory); None only in tests that build one."""

    @property
    def token(self) -> AttemptToken:
        return self.job.token

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session makes the child its group's leader

    def request_stop(self, outcome: Outcome, now: float, grace: float | None = None) -> None:
        """SIGTERM the tree now; `poll` escalates to SIGKILL after the grace period."""
        if self.stop_outcome is None:
            self.stop_outcome = outcome
        if self.kill_at is None:
            self.kill_at = now + (self.grace if grace is None else grace)
            self.signal(signal.SIGTERM)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        self.killed = True

    def signal(self, sig: int) -> None:
        """The group, the marked processes and the cgroup's members (setsid escapes)."""
        signal_tree(self.pgid, self.marker, sig)
        if self.memory is not None:
            self.memory.signal(sig)

    def alive(self) -> bool:
        return tree_alive(self.pgid, self.marker) or (
            self.memory is not None and self.memory.alive())

    def fence_out(self, now: float) -> None:
        """Kill at once, recorded as lost: the job may already run elsewhere (a newer
        attempt, a server that no longer counts this one live), so there is no grace."""
        self.request_stop(Outcome.LOST, now, grace=0.0)
        self.kill()

    def poll(self, now: float) -> bool:
        """Advance timeouts and kills; True once the whole tree is gone."""
        if self.returncode is None:
            self.returncode = self.process.poll()
        if (self.deadline is not None and now >= self.deadline and self.stop_outcome is None
                and self.returncode is None):
            self.request_stop(Outcome.TIMEOUT, now)
        if self.silent(now) and self.stop_outcome is None and self.returncode is None:
            append_log(self.log_path, f"no output for {self.job.silence_timeout_seconds:g}s: "
                                      "stopped as stuck")
            self.request_stop(Outcome.STUCK, now)
        if (self.memory is not None and self.returncode is None
                and self.memory.sample(self.process.pid, now) and self.stop_outcome is None):
            append_log(self.log_path, f"memory over its limit: {self.memory.use().describe()}; "
                                      "stopped (oom)")
            self.request_stop(Outcome.OOM, now)
        if self.kill_at is not None and now >= self.kill_at and not self.killed:
            self.kill()
        if self.returncode is None:
            return False
        # The leader has exited. Stragglers in the group (or carrying the marker) must not
        # outlive the attempt: after a stop request they get the rest of the grace period,
        # otherwise they are killed at once.
        if self.stop_outcome is None or self.killed or (
            self.kill_at is not None and now >= self.kill_at
        ):
            if self.alive():
                self.kill()
                return self.ended()
            return self.ended()
        return not self.alive() and self.ended()

    def ended(self) -> bool:
        """True once the tree is gone: its cgroup is removed, so call it only then."""
        if self.alive():
            return False
        if self.memory is not None:
            self.memory.close()
        return True

    def memory_use(self) -> MemoryUse | None:
        return None if self.memory is None else self.memory.use()

    def silent(self, now: float) -> bool:
        """True once the log has not grown for the job's silence_timeout (a hung agent)."""
        silence = self.job.silence_timeout_seconds
        if not silence:
            return False
        try:
            size = os.stat(self.log_path).st_size
        except OSError:
            size = self.log_size
        if size != self.log_size or not self.quiet_since:
            self.log_size, self.quiet_since = size, now
            return False
        return now - self.quiet_since >= silence

    def outcome(self) -> Outcome:
        if self.stop_outcome is not None:
            return self.stop_outcome
        if self.returncode != 0 and self.memory is not None and self.memory.oom_killed():
            return Outcome.OOM  # the kernel stopped a member at the cgroup's limit
        return Outcome.OK if self.returncode == 0 else Outcome.FAILED


def spawn(
    job: Job, host: str, worker: str, log_dir: Path, kill_grace: float,
    pass_env: Sequence[str] = (), workspaces: Workspaces | None = None,
    memory: AttemptMemory | None = None,
) -> RunningAttempt:
    """Start the job's command in a new session with its log file; raise LaunchError.
    A job with a workspace starts as the process that prepares it (runtime/workspace.py)."""
    token = job.token
    marker = attempt_marker(token, worker)
    log_path = log_path_for(log_dir, token)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = job_environment(job, host, marker, log_path, pass_env)
    try:
        prepared = _workspace_launch(job, env, worker, marker, workspaces)
    except LaunchError as exc:
        append_log(log_path, f"launch failed: {exc}")
        if memory is not None:
            memory.close()
        raise
    # "wb": an attempt runs once, so a leftover file (another database sharing this log
    # folder) is replaced rather than interleaved.
    with open(log_path, "wb", opener=private_opener) as log:
        workdir = prepared.folder if prepared else job.workdir
        header = (f"# herder: job {job.id} attempt {job.attempt} on {host} "
                  f"at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
                  f"# herder: argv {json.dumps(list(job.command))} in {workdir}\n")
        log.write(header.encode())
        log.flush()
        preexec = memory.preexec() if memory is not None else None
        try:
            process = subprocess.Popen(
                prepared.argv if prepared else list(job.command),
                cwd=prepared.folder.parent if prepared else job.workdir or None,
                env=prepared.env if prepared else env,
                stdin=subprocess.PIPE if prepared else subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
                umask=JOB_UMASK,  # herder's own is 0077 (herder.hardening)
                # Joins the attempt's cgroup before exec, so nothing escapes it: two system
                # calls on a descriptor opened beforehand, under the GIL the child holds,
                # and glibc's malloc is fork-safe; only set where a cgroup or nice applies.
                preexec_fn=preexec,  # noqa: PLW1509
            )
        except (OSError, subprocess.SubprocessError) as exc:
            log.write(f"# herder: launch failed: {exc}\n".encode())
            if memory is not None:
                memory.close()
            raise LaunchError(str(exc)) from exc
        finally:
            if memory is not None:
                memory.launched()
    if prepared is not None and process.stdin is not None:
        with contextlib.suppress(OSError):  # it died first: its exit says why
            process.stdin.write(prepared.stdin)
        with contextlib.suppress(OSError):
            process.stdin.close()
    now = time.monotonic()
    deadline = now + job.timeout_seconds if job.timeout_seconds else None
    return RunningAttempt(job, marker, log_path, process, now, deadline, kill_grace,
                          workspace=prepared.folder if prepared else None, memory=memory)


def _workspace_launch(job: Job, env: Mapping[str, str], worker: str, marker: str,
                      workspaces: Workspaces | None) -> Launch | None:
    try:
        spec = spec_of(job)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    if spec is None:
        return None
    if workspaces is None:
        raise LaunchError("this runner has no workspace root for the job's workspace")
    claim(workspaces.folder(job.token, marker), worker)
    return launch(job, spec, env, TOKEN_VARIABLE, marker, workspaces)


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=)` creating the file 0600: logs may hold what a job printed."""
    return os.open(path, flags, 0o600)


def append_log(path: Path, line: str) -> None:
    with contextlib.suppress(OSError), open(path, "ab") as log:
        log.write(f"# herder: {line}\n".encode())
