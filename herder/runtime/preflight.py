"""Preflight: a cheap check, per job type, that this host can run it at all, before taking
one (the CLI exists and `--version` answers; no prompt, no tokens spent), so a broken host
turns work away before it burns an attempt.

A failing check makes the host refuse that job type for now: the agent reports it with its
heartbeat, placement skips the host for the type (`preflight_failed`), and the job stays
queued for other hosts with nothing spent. Results are cached for `ttl` seconds.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import msgspec

from herder.core.settings.job_types import PREFLIGHT_CACHE, PREFLIGHT_TIMEOUT
from herder.runtime.hardening import JOB_UMASK
from herder.runtime.job_environment import BASE_ENVIRONMENT, passes
from herder.runtime.short_process import run_within

if TYPE_CHECKING:
    from herder.core.settings.job_types import JobTypeSection

log = logging.getLogger("herder.preflight")

DETAIL_CHARS = 200


class Check(msgspec.Struct, frozen=True):
    """What to run for one job type. `strict`: a non-zero exit fails it (a check the
    operator wrote); otherwise any exit means the program answered (the default
    `<program> --version`, which some programs do not know)."""

    argv: tuple[str, ...]
    strict: bool = False
    timeout: float = PREFLIGHT_TIMEOUT
    cache: float = PREFLIGHT_CACHE
    """How long its result stands (the job type's `preflight_cache`)."""


class Result(msgspec.Struct, frozen=True):
    ok: bool
    detail: str
    checked_at: float
    """Monotonic seconds."""


def default_check(command: Sequence[str | Sequence[str]] | str, shell: bool) -> Check | None:
    """`<program> --version` for a job type's command; None when there is no program to
    name (a shell string's first word is a guess herder does not make) or it can only be
    found where the job runs (a path relative to its workdir or checkout, a placeholder)."""
    if shell or isinstance(command, str) or not command or not isinstance(command[0], str):
        return None
    program = command[0]
    if "{" in program or ("/" in program and not program.startswith("/")):
        return None
    return Check((program, "--version"))


def job_type_checks(job_types: Mapping[str, JobTypeSection]) -> dict[str, Check]:
    """Each job type's preflight as runners run it (none for `preflight = false`, or for a
    shell command, whose program herder does not guess)."""
    checks = {}
    for name, job_type in job_types.items():
        if job_type.preflight is False:
            continue
        if job_type.preflight is True:
            check = default_check(job_type.command, job_type.shell)
            if check is None:
                continue
            argv, strict = check.argv, False
        else:
            argv, strict = tuple(job_type.preflight), True
        checks[name] = Check(argv, strict, job_type.preflight_timeout, job_type.preflight_cache)
    return checks


def run(check: Check, pass_env: Sequence[str] = ()) -> Result:
    """Run the check in a session of its own, with a job's environment allow-list; kill
    its group at the timeout."""
    patterns = (*BASE_ENVIRONMENT, *pass_env)
    env = {name: value for name, value in os.environ.items() if passes(name, patterns)}
    started = time.monotonic()
    try:
        ended = run_within(check.argv, check.timeout, env, JOB_UMASK, stdout=False)
    except OSError as exc:
        return Result(False, f"{check.argv[0]}: {exc.strerror or exc}", started)
    if ended is None:
        return Result(False, f"{' '.join(check.argv)}: no answer within {check.timeout:g}s",
                      started)
    stderr = ended.stderr
    code = ended.returncode
    if code < 0:
        return Result(False, f"{' '.join(check.argv)}: killed by signal {-code}", started)
    if code != 0 and check.strict:
        last = stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
        return Result(False, f"{' '.join(check.argv)}: exit {code} {last[0]}".strip()
                      [:DETAIL_CHARS], started)
    return Result(True, "", started)


class Preflight:
    """A runner's results per job type, each refreshed when older than its check's
    `cache` (or `ttl`, when given: tests)."""

    def __init__(self, ttl: float | None = None, pass_env: Sequence[str] = (),
                 runner: Callable[[Check, Sequence[str]], Result] = run,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.pass_env = tuple(pass_env)
        self.runner = runner
        self.clock = clock
        # Refreshed on the agent's poll thread, read on its runner thread.
        self._lock = threading.Lock()
        self.results: dict[str, Result] = {}

    def refresh(self, checks: Mapping[str, Check]) -> bool:
        """Run the checks that are due; True when a type's verdict changed."""
        changed = False
        with self._lock:
            for job_type in [t for t in self.results if t not in checks]:
                del self.results[job_type]  # no longer checked: no longer held against it
                changed = True
            now = self.clock()
            due = {job_type: check for job_type, check in checks.items()
                   if job_type not in self.results
                   or now - self.results[job_type].checked_at >= (
                       check.cache if self.ttl is None else self.ttl)}
        for job_type, check in sorted(due.items()):
            result = self.runner(check, self.pass_env)
            with self._lock:
                previous = self.results.get(job_type)
                self.results[job_type] = result
            changed = changed or previous is None or previous.ok != result.ok
        return changed

    def failed(self) -> dict[str, str]:
        """The job types this host cannot run now, with why."""
        with self._lock:
            return {job_type: result.detail for job_type, result in self.results.items()
                    if not result.ok}


REFRESH_INTERVAL = 1.0
"""How often `Refresher` looks for checks whose result has aged past its cache."""


class Refresher:
    """`herder up`'s preflights, run on a thread of their own: a hanging check holds up only
    the next verdict, never the runner's supervision of what runs."""

    def __init__(self, checks: Mapping[str, Check], pass_env: Sequence[str] = (),
                 runner: Callable[[Check, Sequence[str]], Result] = run) -> None:
        self.checks = dict(checks)
        self.preflight = Preflight(pass_env=pass_env, runner=runner)
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="herder-preflight",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.preflight.refresh(self.checks)
            except Exception:  # a bug: keep the last verdicts, try again
                log.exception("preflight round failed")
            self._ready.set()
            if self._stop.wait(REFRESH_INTERVAL):
                return

    def failed(self) -> dict[str, str] | None:
        """The job types that cannot run here now, with why; None until the first round
        of checks has ended (nothing is known yet)."""
        return self.preflight.failed() if self._ready.is_set() else None

    def stop(self) -> None:
        self._stop.set()
