"""`[runtime] run_as`: the unprivileged user a root runner starts its jobs as.

herder's database, logs, token files and its own processes are out of a job's reach only
when the job runs as another user: a job under herder's own uid can read all of them. So a
runner that is root switches every job to `run_as` (its uid, primary group and the user
database's supplementary groups; HOME, USER, LOGNAME and SHELL its own), and hands it what
it must write: its checkout and a folder for its `$HERDER_RESULT`. Its log stays herder's:
the job writes to a descriptor it inherits.

Checked at the start of every process that runs jobs: a user that does not exist, root, or
another user while herder is not root stops it with one line; a root runner without
`run_as` warns loudly and runs its jobs as root.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec

from herder.core.errors import InputError

log = logging.getLogger("herder.runner")

KEY = "[runtime] run_as"
ROOT_WARNING = ("jobs run as root: set [runtime] run_as to an unprivileged user "
                "(e.g. useradd --system --create-home herder-job) so they cannot reach "
                "herder's database, logs and tokens")


class JobUser(msgspec.Struct, frozen=True):
    """Who a job runs as, read once from the user database."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str

    def environment(self) -> dict[str, str]:
        """The identity variables of a login as this user (the job's env may still set
        HOME: an account's own folder, for one)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name,
                "SHELL": self.shell or "/bin/sh"}


def resolve(name: str | None, euid: int,
            lookup: Callable[[str], pwd.struct_passwd] = pwd.getpwnam,
            groups: Callable[[str, int], list[int]] = os.getgrouplist) -> JobUser | None:
    """The user jobs switch to, or None when they run as the runner itself (no run_as, or
    run_as names the runner's own user); InputError naming the key when it cannot be."""
    if name is None:
        return None
    try:
        entry = lookup(name)
    except KeyError:
        raise InputError(KEY, f"no user {name!r} on this host",
                         f"create it with useradd --system --create-home {name}, "
                         "or remove the key") from None
    if entry.pw_uid == 0:
        raise InputError(KEY, f"{name!r} is root: jobs would hold every right herder has",
                         "name an unprivileged user, e.g. herder-job")
    if entry.pw_uid == euid:
        return None
    if euid != 0:
        raise InputError(KEY, f"switching jobs to {name!r} needs herder to run as root "
                         f"(it runs as uid {euid})",
                         "run herder as root, or remove the key to run jobs as herder's user")
    return JobUser(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid,
                   groups=tuple(sorted(set(groups(entry.pw_name, entry.pw_gid)))),
                   home=entry.pw_dir, shell=entry.pw_shell)


def job_user_at_start(name: str | None, euid: int | None = None, *,
                      warn: bool = True) -> JobUser | None:
    """`resolve` for a process about to run jobs, warning when a root runner has no
    run_as (its jobs run as root: allowed, never quiet). `warn` false leaves the warning to
    `warn_root`, once a setup that cannot work has said so in its one line."""
    euid = os.geteuid() if euid is None else euid
    user = resolve(name, euid)
    if warn:
        warn_root(name, euid)
    return user


def warn_root(name: str | None, euid: int | None = None) -> None:
    if name is None and (os.geteuid() if euid is None else euid) == 0:
        log.warning(ROOT_WARNING)


def passable(user: JobUser, folder: Path) -> Path | None:
    """The first existing folder on the way to `folder` (itself excluded: herder opens
    it) that `user` may not pass through; None when the way is open."""
    for step in reversed(folder.parents):
        try:
            status = step.stat()
        except FileNotFoundError:
            return None  # herder makes the rest (0711 where a job passes)
        if status.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif status.st_gid == user.gid or status.st_gid in user.groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not status.st_mode & bit:
            return step
    return None


def check_workspace_root(user: JobUser | None, root: Path) -> None:
    """A run_as job reaches its checkout and its own folder under the workspace root:
    InputError at start when a folder on the way shuts it out."""
    if user is None:
        return
    blocked = passable(user, root)
    if blocked is not None:
        raise InputError("[runtime] workspace_root", f"run_as user {user.name} cannot reach "
                         f"{root}: {blocked} is mode {blocked.stat().st_mode & 0o777:04o}",
                         "put workspace_root where other users may pass, e.g. "
                         "/var/lib/herder-jobs, or chmod o+x that folder")


FOLDER_VARIABLE = re.compile(r"^(?:HOME|[A-Z0-9_]*_(?:DIR|HOME))$")
"""Variables that name a folder a job writes (an account's CLAUDE_CONFIG_DIR, CODEX_HOME)."""


def foreign_folders(user: JobUser, env: Mapping[str, str]) -> list[str]:
    """The names (never the values: an account's may be secret) of the job's folder
    variables whose folder exists and is not the run_as user's, so the log says why a job
    cannot write its account's config: herder never chowns what a variable names."""
    names = []
    for name, value in sorted(env.items()):
        if not FOLDER_VARIABLE.match(name) or not os.path.isabs(value):
            continue
        try:
            owner = os.stat(value).st_uid
        except OSError:
            continue
        if owner != user.uid:
            names.append(name)
    return names
