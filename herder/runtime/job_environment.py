"""A job's environment: an allow-list of the runner's variables, then the job's own, then
herder's identity variables."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from herder.core.model import Job
from herder.runtime.attempt_files import result_path_for
from herder.runtime.hardening import NEVER_INHERITED
from herder.runtime.job_user import JobUser
from herder.runtime.process import TOKEN_VARIABLE

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
                    runner_environment: Mapping[str, str] | None = None,
                    user: JobUser | None = None,
                    result_path: Path | None = None) -> dict[str, str]:
    """An allow-list of the runner's variables, then the run_as user's HOME, USER, LOGNAME
    and SHELL, then the job's own env (the submitter's or its account's choice, a HOME
    included), then herder's identity variables, which nothing overrides. Nothing else of
    the runner's passes: it may hold herder's database URL or tokens, and jobs are AI
    agents."""
    source = os.environ if runner_environment is None else runner_environment
    patterns = (*BASE_ENVIRONMENT, *pass_env)
    env = {name: value for name, value in source.items() if passes(name, patterns)}
    if user is not None:
        env.update(user.environment())
    env.update(job.env)
    env.update(
        {
            "HERDER_JOB_ID": str(job.id),
            "HERDER_ATTEMPT": str(job.attempt),
            "HERDER_JOB_TYPE": job.job_type,
            "HERDER_WEIGHT": job.weight,
            "HERDER_HOST": host,
            "HERDER_LOG": str(log_path),
            "HERDER_RESULT": str(result_path or result_path_for(log_path)),
            "HERDER_PAYLOAD": json.dumps(dict(job.payload)),
            TOKEN_VARIABLE: marker,
        }
    )
    return env
