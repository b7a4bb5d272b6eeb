"""Start and stop one attempt's process tree: own session, own log file, job environment."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import msgspec

from herder.core.model import AttemptToken, Job, MemoryUse, Outcome, WorkerId
from herder.runtime.attempt_files import (
    HANDOVER_FOLDER,
    RESULT_NAME,
    AttemptRecord,
    Status,
    append_log,
    attempt_marker,
    collect_result,
    log_path_for,
    note_launch,
    private_opener,
    read_status,
    status_path_for,
    write_record,
)
from herder.runtime.cgroup import SUPERVISOR_FILE
from herder.runtime.hardening import JOB_UMASK
from herder.runtime.job_environment import job_environment
from herder.runtime.job_user import JobUser, foreign_folders
from herder.runtime.memory import AttemptMemory
from herder.runtime.process import (
    TOKEN_VARIABLE,
    process_alive,
    process_start_time,
    signal_tree,
    tree_alive,
)
from herder.runtime.workspace import Launch, Workspaces, claim, launch, open_to, spec_of


class AttemptProcess(Protocol):
    """What the runner asks of an attempt's process: a Popen, or one of the wrappers below."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...


class Supervised:
    """The supervisor this runner started (a child: Popen reaps it); the job's own exit
    status comes from the supervisor's file."""

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, job_pid: int) -> None:
        self.popen = popen
        self.stdin = popen.stdin
        self.log_path = log_path
        self.job_pid = job_pid
        self.lost = False
        self.status: Status | None = None
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        if self.returncode is None and self.popen.poll() is not None:
            self.status = read_status(self.log_path)
            # Without its file the supervisor itself was killed (the group's SIGKILL, or
            # the job): its own end stands for the job's.
            code = self.status.returncode if self.status is not None else None
            self.returncode = self.popen.returncode if code is None else code
        return self.returncode


class Adopted:
    """A supervisor a dead agent started: not this runner's child, so it is watched by pid
    and start time. Gone without a status file: it died too, and the attempt is lost."""

    def __init__(self, pid: int, start_time: int, log_path: Path, job_pid: int) -> None:
        self.pid = pid
        self.start_time = start_time
        self.log_path = log_path
        self.job_pid = job_pid
        self.lost = False
        self.status: Status | None = None
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and not process_alive(self.pid, self.start_time):
            self.status = read_status(self.log_path)
            code = None if self.status is None else self.status.returncode
            if code is None:
                self.lost = True
                code = -signal.SIGKILL
            self.returncode = code
        return self.returncode


class LaunchError(Exception):
    """The process could not be started (missing program, bad workdir, permissions)."""


@dataclass
class RunningAttempt:
    """An attempt this runner supervises. Mutable: it moves through stop stages."""

    job: Job
    marker: str
    log_path: Path
    process: AttemptProcess
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
    run_folder: Path | None = None
    """The folder a run_as job owns for its $HERDER_RESULT; collected when it ends."""
    adopted: bool = False
    """Started by a dead agent of this host and adopted by this one."""

    @property
    def token(self) -> AttemptToken:
        return self.job.token

    @property
    def job_pid(self) -> int:
        """The job's own process (its supervisor's child, where it has one)."""
        return int(getattr(self.process, "job_pid", self.process.pid))

    @property
    def lost(self) -> bool:
        """Its supervisor died without a word: how the job ended is unknown."""
        return bool(getattr(self.process, "lost", False))

    @property
    def status(self) -> Status | None:
        status = getattr(self.process, "status", None)
        return status if isinstance(status, Status) else None

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
                and self.memory.sample(self.job_pid, now) and self.stop_outcome is None):
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
        if self.memory is None:
            return None
        use = self.memory.use()
        status = self.status
        if self.adopted and status is not None and status.peak_rss:
            # Sampled only since the adoption: the supervisor saw the job's own peak.
            use = msgspec.structs.replace(use, peak_rss_bytes=max(use.peak_rss_bytes or 0,
                                                              status.peak_rss))
        return use

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
        if self.lost:
            return Outcome.LOST
        if self.returncode != 0 and self.memory is not None and self.memory.oom_killed():
            return Outcome.OOM  # the kernel stopped a member at the cgroup's limit
        return Outcome.OK if self.returncode == 0 else Outcome.FAILED


def spawn(
    job: Job, host: str, worker: str, log_dir: Path, kill_grace: float,
    pass_env: Sequence[str] = (), workspaces: Workspaces | None = None,
    memory: AttemptMemory | None = None, user: JobUser | None = None,
    supervised: bool = False,
) -> RunningAttempt:
    """Start the job's command in a new session with its log file; raise LaunchError.
    A job with a workspace starts as the process that prepares it (runtime/workspace.py).
    Under run_as (`user`) the job runs as that user, with a folder of its own for its
    $HERDER_RESULT; a workspace is prepared by herder and handed over before the job's
    command starts. `supervised` (an agent's attempts) starts it under a supervisor that
    records its end (herder.runtime.supervisor) and notes how to adopt it
    (`AttemptRecord`)."""
    token = job.token
    marker = attempt_marker(token, worker)
    log_path = log_path_for(log_dir, token)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if supervised:
        parsed = WorkerId.parse(worker)
        if parsed is not None:
            # Before anything starts: a next agent must not run it again, even if this
            # agent dies before the log holds a byte (herder.runtime.agent `_take_over`).
            try:
                note_launch(log_dir / HANDOVER_FOLDER, token, parsed)
            except OSError as exc:
                if memory is not None:
                    memory.close()
                raise LaunchError(f"cannot note the launch for a next agent: {exc}") from exc
    run_folder = None
    try:
        run_folder = _run_folder(token, marker, worker, workspaces, user)
        env = job_environment(job, host, marker, log_path, pass_env, user=user,
                              result_path=run_folder / RESULT_NAME if run_folder else None)
        prepared = _workspace_launch(job, env, worker, marker, workspaces, user)
    except LaunchError as exc:
        append_log(log_path, f"launch failed: {exc}")
        if memory is not None:
            memory.close()
        if run_folder is not None:
            collect_result(run_folder, log_path)
        raise
    # "wb": an attempt runs once, so a leftover file (another database sharing this log
    # folder) is replaced rather than interleaved.
    with open(log_path, "wb", opener=private_opener) as log:
        workdir = prepared.folder if prepared else job.workdir
        header = (f"# herder: job {job.id} attempt {job.attempt} on {host} "
                  f"at {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
                  f"# herder: argv {json.dumps(list(job.command))} in {workdir}\n")
        if user is not None:
            header += "".join(
                f"# herder: {name} names a folder run_as user {user.name} does not own: "
                f"the job may not write it (chown it to {user.name})\n"
                for name in foreign_folders(user, job.env))
        log.write(header.encode())
        log.flush()
        preexec = memory.preexec() if memory is not None else None
        argv = prepared.argv if prepared else list(job.command)
        job_env = prepared.env if prepared else env
        # Run as the run_as user from the start; a workspace's preparing process switches
        # itself once the checkout is handed over (runtime/workspace.py).
        switch = _switch(user, prepared is None)
        try:
            if supervised:
                process: AttemptProcess = _start_supervisor(
                    argv, job_env, switch, log, log_path,
                    cwd=prepared.folder.parent if prepared else job.workdir or run_folder,
                    stdin=subprocess.PIPE if prepared else subprocess.DEVNULL,
                    preexec=preexec)
            else:
                process = subprocess.Popen(
                    argv,
                    cwd=prepared.folder.parent if prepared else job.workdir or run_folder,
                    env=job_env,
                    stdin=subprocess.PIPE if prepared else subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    umask=JOB_UMASK,  # herder's own is 0077 (herder.runtime.hardening)
                    **switch,
                    # Joins the attempt's cgroup before exec, so nothing escapes it: two
                    # system calls on a descriptor opened beforehand, under the GIL the
                    # child holds, and glibc's malloc is fork-safe; only set where a cgroup
                    # or nice applies. It runs after the switch to run_as: Linux checks the
                    # rights of whoever opened the descriptor (herder), so the job still
                    # joins its cgroup.
                    preexec_fn=preexec,  # noqa: PLW1509
                )
        except (OSError, subprocess.SubprocessError, LaunchError) as exc:
            log.write(f"# herder: launch failed: {exc}\n".encode())
            if memory is not None:
                memory.close()
            if run_folder is not None:
                collect_result(run_folder, log_path)
            raise LaunchError(str(exc)) from exc
        finally:
            if memory is not None:
                memory.launched()
    stdin = getattr(process, "stdin", None)
    if prepared is not None and stdin is not None:
        with contextlib.suppress(OSError):  # it died first: its exit says why
            stdin.write(prepared.stdin)
        with contextlib.suppress(OSError):
            stdin.close()
    now = time.monotonic()
    deadline = now + job.timeout_seconds if job.timeout_seconds else None
    attempt = RunningAttempt(job, marker, log_path, process, now, deadline, kill_grace,
                             workspace=prepared.folder if prepared else None, memory=memory,
                             run_folder=run_folder)
    if isinstance(process, Supervised):
        try:
            write_record(log_path, AttemptRecord(
                marker, worker, process.pid, process_start_time(process.pid) or 0,
                process.job_pid, msgspec.structs.replace(job, env={}), time.time(),
                workspace=str(attempt.workspace) if attempt.workspace else None,
                run_folder=str(run_folder) if run_folder else None,
                cgroup=memory.cgroup.path.name if memory is not None
                and memory.cgroup is not None else None))
        except OSError as exc:  # supervised all the same; only not adoptable
            append_log(log_path, f"cannot note the attempt for a next agent: {exc}")
    return attempt


SUPERVISOR: tuple[str, ...] = (
    "/proc/self/exe" if os.path.exists("/proc/self/exe") else sys.executable, "-I",
    SUPERVISOR_FILE)
"""The supervisor's argv: this very interpreter binary (/proc/self/exe: a virtualenv's
link may lead through a folder a run_as or other user cannot pass) running the file, not
the package (it needs only the standard library, which the interpreter finds by itself);
`-I`: no variable, user site or working folder of anyone's reaches it."""

SUPERVISOR_START = 30.0
"""How long a supervisor may take to start its job (an interpreter's start, a busy host)."""


def _start_supervisor(argv: Sequence[str], env: Mapping[str, str], switch: Mapping[str, Any],
                      log: Any, log_path: Path, cwd: Path | str | None,
                      stdin: int, preexec: Any) -> Supervised:
    """The supervisor in the attempt's new session (and cgroup, with the job's umask), with
    an empty environment; the launch goes through a socket, and its answer says whether the
    job started (else LaunchError, as a Popen of the job would). It carries no marker: it
    is no job process, never outlives the job's leader, and is in the attempt's group."""
    status_path_for(log_path).unlink(missing_ok=True)
    ours, theirs = socket.socketpair()
    try:
        popen = subprocess.Popen(
            [*SUPERVISOR, str(status_path_for(log_path)), str(theirs.fileno())],
            cwd=cwd, env={}, stdin=stdin, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            pass_fds=(theirs.fileno(),), umask=JOB_UMASK,
            preexec_fn=preexec)  # noqa: PLW1509 (see spawn)
        theirs.close()
        launch = {"argv": list(argv), "env": dict(env), "user": switch.get("user"),
                  "group": switch.get("group"), "groups": switch.get("extra_groups")}
        ours.settimeout(SUPERVISOR_START)
        try:
            ours.sendall(json.dumps(launch).encode())
            ours.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := ours.recv(65536):
                answer += chunk
        except OSError as exc:
            answer = f"error the supervisor did not answer ({exc})".encode()
        word, _, rest = answer.decode(errors="replace").partition(" ")
        if word == "ok" and rest.strip().isdigit():
            return Supervised(popen, log_path, int(rest))
        if popen.stdin is not None:
            popen.stdin.close()
        with contextlib.suppress(OSError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()
        status_path_for(log_path).unlink(missing_ok=True)
        raise LaunchError(rest.strip() if word == "error" else
                          f"the supervisor exited {popen.returncode} before the job started")
    finally:
        theirs.close()
        ours.close()


def _switch(user: JobUser | None, now: bool) -> dict[str, Any]:
    """Popen's arguments that start a job as `user` (none when `now` is false: the
    preparing process switches itself)."""
    if user is None or not now:
        return {}
    return {"user": user.uid, "group": user.gid, "extra_groups": list(user.groups)}


def _run_folder(token: AttemptToken, marker: str, worker: str, workspaces: Workspaces | None,
                user: JobUser | None) -> Path | None:
    """A run_as job's own folder (0700, the user's), in a folder of herder's that it can
    pass through but not list; None for a job of herder's own user."""
    if user is None:
        return None
    if workspaces is None:
        raise LaunchError("run_as needs a workspace root for the job's own folder")
    try:
        open_to(workspaces.root)
        folder = workspaces.run_folder(token, marker)
        claim(folder, worker)
        shutil.rmtree(folder, ignore_errors=True)  # another database's leftover
        folder.mkdir(mode=0o700)
        os.chown(folder, user.uid, user.gid)
    except OSError as exc:
        raise LaunchError(f"cannot make the job's folder for run_as {user.name}: "
                          f"{exc}") from exc
    return folder


def _workspace_launch(job: Job, env: Mapping[str, str], worker: str, marker: str,
                      workspaces: Workspaces | None,
                      user: JobUser | None = None) -> Launch | None:
    try:
        spec = spec_of(job)
    except ValueError as exc:
        raise LaunchError(str(exc)) from exc
    if spec is None:
        return None
    if workspaces is None:
        raise LaunchError("this runner has no workspace root for the job's workspace")
    claim(workspaces.folder(job.token, marker), worker)
    return launch(job, spec, env, TOKEN_VARIABLE, marker, workspaces, user=user)
