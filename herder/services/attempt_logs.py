"""An attempt's log on the machine that keeps it: where it is, and its bytes from an offset.

The CLI reads it straight from disk against a database and the server reads it for
`GET /api/v1/jobs/{id}/log`, so both find the same file the same way."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from herder.core.errors import NotFound
from herder.core.model import Attempt

CHUNK_BYTES = 1024 * 1024
"""The most one read returns: a follower asks again from where it stopped."""


def log_file(log_dir: Path, job_id: int, number: int, attempts: Iterable[Attempt]) -> Path:
    """The attempt's recorded log path, else where the runner writes it by default;
    NotFound naming the job when it has no such attempt."""
    record = next((a for a in attempts if a.attempt == number), None)
    if record is None:
        raise NotFound(f"job {job_id} has no attempt {number}")
    return Path(record.log_path) if record.log_path else (
        log_dir / str(job_id) / f"{number}.log")


def read_from(path: Path, offset: int, limit: int = CHUNK_BYTES) -> bytes | None:
    """Up to `limit` bytes from `offset`; None when the file does not exist (yet)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            return handle.read(limit)
    except FileNotFoundError:
        return None
