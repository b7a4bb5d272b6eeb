"""herder run as an unprivileged user, as the jobs of a host without `run_as` would see it.

Tests run as root, and a root job reads every process's /proc files and every file. The
case the hostile-job suite (tests/test_hostile_jobs.py) checks without `run_as` is herder
itself run by an ordinary user, its jobs then running as that same user: `as_user` wraps an
argv in `setpriv` for that, and `owned_folder` makes the folder it works in.
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

UNPRIVILEGED = "nobody"


def unprivileged_ids() -> tuple[int, int]:
    """uid and gid of the unprivileged user; skips the test where it cannot be used."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run herder as an unprivileged user")
    entry = pwd.getpwnam(UNPRIVILEGED)
    return entry.pw_uid, entry.pw_gid


def as_user(argv: Sequence[str], uid: int, gid: int) -> list[str]:
    """argv run as uid:gid with no supplementary groups (and so no capabilities)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


@contextmanager
def owned_folder(uid: int, gid: int) -> Iterator[Path]:
    """A fresh folder under /tmp owned by uid:gid, mode 0700 (pytest's tmp_path is root's
    and closed to others); removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="herder-hostile-", dir="/tmp"))
    try:
        os.chown(folder, uid, gid)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def give(path: Path, uid: int, gid: int, mode: int) -> Path:
    """Make `path` (a file or folder the test wrote) the user's, with `mode`."""
    os.chown(path, uid, gid)
    path.chmod(mode)
    return path
