"""What keeps a job away from the secrets of the herder process that started it.

Jobs are untrusted code (AI agents fed with other people's text) and, without
`[runtime] run_as`, run as herder's own OS user. So every long-lived herder process that holds
a secret (`up`, `server`, `agent`, `run-attempt` and their guardians) calls `harden_process`
first thing:

* `PR_SET_DUMPABLE` off: a process of the same user (not root) can no longer read its
  `/proc/PID/environ`, `mem`, `fd/` or `maps`, nor ptrace it. The kernel keeps the
  environment a process was started with in its memory, so popping a variable from
  `os.environ` does not remove it from `/proc/PID/environ`; this does. It is inherited by a
  fork (the guardian) and reset by an exec (jobs stay inspectable: herder reads their
  markers from their environment).
* umask 0077: herder's own files (the SQLite database, logs, server-side copies of agents'
  logs) are created 0600 in 0700 folders; jobs are started with `JOB_UMASK` instead.

Then, once it has read them, `withdraw_secrets` takes the secret variables out of the
process's environment, so that no child (a guardian's report, an account probe, a preflight
check, an ssh launch, a workspace's git, a job) can inherit them, whoever starts it and
however it builds its environment; the process keeps reading them through `secret_value`.

Short commands (`submit`, `jobs`, ...) do not call it: they live well under a second, start no
job, and importing ctypes would spend a noticeable share of their start-up budget
(tests/test_cli_imports.py; the figure is in bench/README.md, "Import costs behind the code").
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from herder.core.errors import InputError

if TYPE_CHECKING:
    from herder.core.settings.loading import Config
    from herder.core.settings.sections import Settings

log = logging.getLogger("herder.runtime.hardening")

JOB_UMASK = 0o022
"""The umask a job (and an account probe, a preflight check) starts with: a normal one, not
herder's own 0077, so what a job writes in its workspace is readable as usual."""

PRIVATE_UMASK = 0o077
"""herder's own umask once hardened: its files 0600, its folders 0700."""

PR_SET_DUMPABLE = 4

SECRET_VARIABLES: tuple[str, ...] = ("HERDER_DB", "HERDER_TOKEN", "HERDER_AGENT_TOKEN",
                                     "HERDER_API_TOKEN")
"""Variables that hold a secret whatever herder.toml says (the database URL may carry a
password); herder.toml adds those it names (`secret_variables`)."""

NEVER_INHERITED: tuple[str, ...] = ("PGPASSWORD",)
"""Secrets herder cannot withdraw (libpq reads PGPASSWORD at every new connection) but
no child of herder's gets."""

_withdrawn: dict[str, str] = {}


def disable_dumping() -> bool:
    """Turn off PR_SET_DUMPABLE for this process (Linux); False where it cannot be."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # only here: not free to import, and only the long-lived commands come here

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def dumpable() -> bool | None:
    """Whether this process is dumpable (None where it cannot be asked); for tests and logs."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(3, 0, 0, 0, 0))  # PR_GET_DUMPABLE


def harden_process() -> None:
    """Call first in a long-lived command: not dumpable, and private files from now on."""
    if not disable_dumping() and sys.platform.startswith("linux"):
        log.warning("cannot turn off PR_SET_DUMPABLE: jobs of this user may read this "
                    "process's environment and memory (run jobs as another user: run_as)")
    os.umask(PRIVATE_UMASK)


def secret_variables(settings: Settings) -> list[str]:
    """Every variable that may hold one of herder's secrets under these settings."""
    names = [*SECRET_VARIABLES, settings.server.api_token_env]
    names += [source.secret_env for source in settings.hooks.sources.values()
              if source.secret_env is not None]
    if settings.alerts.urls_env:
        names.append(settings.alerts.urls_env)
    return names


def withdraw_secrets(names: Iterable[str]) -> None:
    """Take these variables out of the environment (children inherit nothing of them);
    `secret_value` still has them for this process."""
    for name in names:
        value = os.environ.pop(name, None)
        if value is not None:
            _withdrawn[name] = value


def secret_value(name: str) -> str | None:
    """A variable of the environment as this process was started with, withdrawn or not."""
    return os.environ.get(name, _withdrawn.get(name))


def environment() -> dict[str, str]:
    """The environment as started: what is left of it plus what was withdrawn."""
    return {**os.environ, **_withdrawn}


def inheritable(name: str) -> bool:
    """Whether a child of herder's may get this variable of herder's environment."""
    return (not name.startswith("HERDER_") and name not in NEVER_INHERITED
            and name not in _withdrawn)


def child_environment(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for a helper that needs the host's (ssh: its agent socket, its
    config, a workspace's git: its credential helpers): without herder's own variables
    and without any of its secrets."""
    source = os.environ if source is None else source
    return {name: value for name, value in source.items() if inheritable(name)}


def open_to_others(path: str | os.PathLike[str]) -> int | None:
    """The mode of a file readable or writable by its group or others, else None."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    return mode if mode & 0o077 else None


def check_secret_file(path: str | os.PathLike[str], field: str) -> None:
    """Refuse a secret file its group or others may read: InputError naming the file and
    `chmod 600`. A missing file is the reader's to report."""
    try:
        mode = open_to_others(path)
    except OSError:
        return
    if mode is not None:
        raise InputError(field, f"{path} is open to group or others (mode {mode:04o})",
                         f"run chmod 600 {path}")


def hook_secrets(config: Config, environ: Mapping[str, str]) -> dict[str, bytes]:
    """Each webhook source's secret, from its variable or file: `herder server` reads
    them at start and refuses to start without one (a source never accepts unsigned)."""
    secrets: dict[str, bytes] = {}
    for name, source in config.settings.hooks.sources.items():
        where = f"hooks.sources.{name}"
        if source.secret_env is not None:
            secret = environ.get(source.secret_env, "").strip().encode()
            if not secret:
                raise InputError(f"{where}.secret_env",
                                 f"{source.secret_env} is not set or empty",
                                 f"export {source.secret_env} with the forge's secret")
        else:
            assert source.secret_file is not None, "checked when the config loaded"
            path = config.resolve_path(source.secret_file)
            check_secret_file(path, f"{where}.secret_file")
            try:
                secret = path.read_bytes().strip()
            except OSError as exc:
                raise InputError(f"{where}.secret_file", f"cannot read {path}: "
                                 f"{exc.strerror}", "fix the path or its permissions"
                                 ) from None
            if not secret:
                raise InputError(f"{where}.secret_file", f"{path} is empty",
                                 "write the forge's secret into it")
        secrets[name] = secret
    return secrets


def tighten(path: str | os.PathLike[str], what: str) -> bool:
    """Take group and others' rights off one of herder's own files or folders (an older
    herder created it 0644/0755), with a log line; True when it changed anything."""
    try:
        mode = open_to_others(path)
        if mode is None:
            return False
        os.chmod(path, mode & 0o700)
    except FileNotFoundError:
        return False
    except OSError as exc:
        log.warning("%s %s is open to group or others and cannot be made private: %s",
                    what, path, exc.strerror or exc)
        return False
    log.warning("%s %s was open to group or others (mode %04o): made it %04o", what, path,
                mode, mode & 0o700)
    return True


def tighten_sqlite(url: str) -> None:
    """A SQLite database (and its -wal, -shm) private to herder's user."""
    if not url.startswith("sqlite:"):
        return
    from herder.store.sqlite import parse_sqlite_url

    path, _ = parse_sqlite_url(url)
    if path == ":memory:":
        return
    for suffix in ("", "-wal", "-shm"):
        tighten(path + suffix, "the database file")


def private_folder(path: Path, field: str = "log_dir") -> None:
    """One of herder's state folders (its logs): made 0700 if missing, tightened if not;
    an InputError naming `field` when it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise InputError(field, f"cannot create {path}: {exc.strerror or exc}",
                         "point it at a folder herder's user may write") from None
    tighten(path, "the folder")
