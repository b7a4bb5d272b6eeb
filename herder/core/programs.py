"""Where a program is: the one lookup a submitted command (herder.services.intake) and
`herder doctor` (a job type's program) share. It reads the filesystem, as loading
herder.toml does; nothing else here has effects."""

from __future__ import annotations

import os
import shutil


def find_program(program: str, search_path: str, workdir: str | None = None) -> str | None:
    """The executable file `program` names, or None. A name with a slash is a path (relative
    to `workdir` when given, else to the current folder); a bare name is looked up in
    `search_path` (a PATH value), as the job's exec would."""
    if "/" in program:
        path = program if workdir is None or os.path.isabs(program) else os.path.join(
            workdir, program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program, path=search_path)
