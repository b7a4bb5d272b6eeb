"""An attempt's files beside its log: the log itself, its $HERDER_RESULT, its supervisor's
exit status, and the record a successor agent adopts it from."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from pathlib import Path

import msgspec

from herder.core.model import AttemptToken, Job, WorkerId
from herder.core.scheduling.classification import RESULT_BYTES, TAIL_BYTES
from herder.runtime.workspace import OWNER_SUFFIX


def attempt_marker(token: AttemptToken, worker: str) -> str:
    """Globally unique per attempt: the worker id (host/pid/start time) makes it so even
    when several herder databases on one machine reuse job ids."""
    return f"{token}@{worker}"


def log_path_for(log_dir: Path, token: AttemptToken) -> Path:
    return log_dir / str(token.job_id) / f"{token.attempt}.log"


HANDOVER_FOLDER = "handover"
"""In an agent's log folder: where agents of one host meet (herder.runtime.guardian's
handover files, `launch_path_for`'s launch notes)."""


def launch_path_for(handover: Path, token: AttemptToken, worker: WorkerId) -> Path:
    """The note an agent (`worker`) writes before it starts anything of the attempt: a
    next agent takes over a placement only while it is absent (never launched)."""
    return handover / f"{token}-{worker.pid}-{worker.start_time}.launching"


def agent_path_for(handover: Path, worker: WorkerId) -> Path:
    """The note an agent writes when it starts: a next agent finding it knows the two
    share this log folder, so the first one's launch notes would be here."""
    return handover / f"{worker.pid}-{worker.start_time}.agent"


def note_launch(handover: Path, token: AttemptToken, worker: WorkerId) -> None:
    """Write `launch_path_for` durably: a crash right after must still leave it, or a next
    agent would run the job again. Where the agent may die: before the note, nothing of
    the attempt ran (a next agent runs it, same number); after it and before the spawn,
    nothing ran either, but no one can tell (reported lost); after the spawn, its process
    is found and killed, or it ended (reported lost, or adopted from its record).
    Raises OSError."""
    write_durably(launch_path_for(handover, token, worker))


def forget_launch(handover: Path, token: AttemptToken) -> None:
    """Drop the launch notes of an attempt whose result the server recorded (its own agent's,
    and a dead one's it adopted): no next agent can take the placement over any more, and
    a note an attempt would pile up."""
    with contextlib.suppress(OSError):
        for note in handover.glob(f"{token}-*.launching"):
            note.unlink(missing_ok=True)


def note_agent(handover: Path, worker: WorkerId) -> None:
    """Write `agent_path_for` durably, before the agent takes any work. Raises OSError."""
    write_durably(agent_path_for(handover, worker))


def write_durably(path: Path) -> None:
    """An empty file that survives a crash of the machine once this returns: a temporary
    file synced and renamed, then its folder synced."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    with open(temporary, "wb", opener=private_opener) as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def result_path_for(log_path: Path) -> Path:
    """Where the attempt's $HERDER_RESULT is read from: beside its log (written there by a
    job of herder's own user, copied there from its own folder under run_as)."""
    return log_path.with_suffix(".result.json")


def status_path_for(log_path: Path) -> Path:
    """Where an attempt's supervisor writes how its job ended (herder.runtime.supervisor)."""
    return log_path.with_suffix(".exit.json")


def record_path_for(log_path: Path) -> Path:
    """Where an agent notes what a successor needs to adopt the attempt (`AttemptRecord`)."""
    return log_path.with_suffix(".attempt.json")


class AttemptRecord(msgspec.Struct, frozen=True):
    """What a new agent of the host needs to supervise an attempt its predecessor started:
    written once, beside the log, when the attempt starts. The job is kept without its
    environment (an account's key may be in it; the process has it already)."""

    marker: str
    worker: str
    supervisor: int
    supervisor_start: int
    job_pid: int
    job: Job
    started_at: float
    """Wall-clock seconds: the new agent's timeout counts from here."""
    workspace: str | None = None
    run_folder: str | None = None
    cgroup: str | None = None


class Status(msgspec.Struct, frozen=True):
    """How a supervised job ended, as its supervisor wrote it."""

    ended_at: float
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    peak_rss: int | None = None
    launch_error: str | None = None

    @property
    def returncode(self) -> int | None:
        """Popen's convention: the exit code, or minus the signal."""
        if self.signal is not None:
            return -self.signal
        return self.exit_code


def read_status(log_path: Path) -> Status | None:
    """The supervisor's word on the attempt's end; None when it wrote none (it runs, or it
    died too) or what it wrote cannot be read."""
    try:
        return msgspec.json.decode(status_path_for(log_path).read_bytes(), type=Status)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_record(log_path: Path, record: AttemptRecord) -> None:
    """Atomically (a temporary file renamed), private to herder's user."""
    path = record_path_for(log_path)
    temporary = path.with_suffix(".tmp")
    with open(temporary, "wb", opener=private_opener) as handle:
        handle.write(msgspec.json.encode(record))
    os.replace(temporary, path)


def read_record(log_path: Path) -> AttemptRecord:
    """Raises OSError or msgspec.DecodeError/ValidationError when it cannot be read."""
    return msgspec.json.decode(record_path_for(log_path).read_bytes(), type=AttemptRecord)


RESULT_NAME = "result.json"
"""The $HERDER_RESULT of a job under run_as, in the attempt's folder that it owns."""


def collect_result(run_folder: Path, log_path: Path) -> str | None:
    """Copy a run_as job's $HERDER_RESULT beside its log and remove the folder it owned;
    what to log when its result was not a plain file. The job controls that folder, so
    the file is opened without following a link or blocking on a pipe, and a hard link
    (someone else's file) is not read."""
    note = None
    data = None
    try:
        handle = os.open(run_folder / RESULT_NAME,
                         os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            note = f"$HERDER_RESULT ignored: {exc.strerror}"
    else:
        with os.fdopen(handle, "rb") as result:
            status = os.fstat(handle)
            if stat.S_ISREG(status.st_mode) and status.st_nlink == 1:
                data = result.read(RESULT_BYTES + 1)
            else:
                note = "$HERDER_RESULT ignored: not a plain file"
    if data is not None:
        with contextlib.suppress(OSError):
            result_path_for(log_path).write_bytes(data)
    shutil.rmtree(run_folder, ignore_errors=True)
    run_folder.with_name(run_folder.name + OWNER_SUFFIX).unlink(missing_ok=True)
    return note


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


def private_opener(path: str, flags: int) -> int:
    """`open(..., opener=)` creating the file 0600: logs may hold what a job printed."""
    return os.open(path, flags, 0o600)


def append_log(path: Path, line: str) -> None:
    with contextlib.suppress(OSError), open(path, "ab") as log:
        log.write(f"# herder: {line}\n".encode())
