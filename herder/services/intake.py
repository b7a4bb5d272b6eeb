"""Turn a submit request (job type or ad-hoc argv, payload, overrides) into a JobSpec.

All validation of a new job happens here, before the store is touched, so a bad submit
changes nothing.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herder.core.env_policy import check_submitted_env
from herder.core.errors import InputError
from herder.core.model import ADHOC, INT_MAX, INT_MIN, JobSpec
from herder.core.programs import find_program
from herder.core.settings.fields import MAX_DURATION
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config
from herder.core.shell_templates import VARIABLE_PREFIX as SHELL_VARIABLE_PREFIX
from herder.core.shell_templates import render_shell
from herder.core.submission import SubmitRequest, storable
from herder.core.templates import fill_prompt, placeholders, render, render_argv, text
from herder.core.workspace import VARIABLE as WORKSPACE_VARIABLE
from herder.core.workspace import (
    WORKDIR_BASE,
    WorkspaceSpec,
    checked,
    repository_refusal,
    resolved_inside,
    workdir_inside,
)

if TYPE_CHECKING:
    from herder.wire.jobs import SubmitBody

MAX_PAYLOAD_BYTES = 1_000_000


def parse_payload(text: str) -> dict[str, Any]:
    """A JSON object from --payload."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise InputError(
            "payload", f"not valid JSON ({exc.msg} at column {exc.colno})",
            "pass a JSON object, e.g. --payload '{\"issue\": 42}'",
        ) from exc
    if not isinstance(value, dict):
        raise InputError("payload", "must be a JSON object", "wrap values in {...}")
    return value


def parse_assignments(items: Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs from -p; a value that parses as JSON keeps its type (42, true)."""
    payload: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise InputError("-p", f"{item!r} is not key=value", "write -p issue=42")
        try:
            value: Any = json.loads(raw, parse_constant=_no_constant)
            if isinstance(value, dict | list):
                value = raw if raw.strip()[:1] not in "[{" else value
        except ValueError:  # not JSON (NaN and Infinity are not JSON either): a string
            value = raw
        payload[key.strip()] = value
    return payload


def _no_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not valid JSON", name, 0)


def resolve(config: Config, request: SubmitRequest | SubmitBody, now: datetime | None = None, *,
            local: bool = True, check_command: bool = True) -> JobSpec:
    """Validate a request against the config and render its command, env and workdir.

    `local`: submitted on the machine that runs it, so the workdir defaults to the current
    one; `check_command`: the command must exist there. The request's own checks are
    repeated here, so a request built without validation cannot get past them."""
    settings = config.settings
    defaults = settings.defaults
    payload = dict(request.payload)
    _check_payload(payload)
    for name, value in (("job_type", request.job_type), ("command", request.command),
                        ("env", request.env), ("workdir", request.workdir),
                        ("dedup_key", request.dedup_key), ("affinity", request.affinity)):
        problem = storable(value)
        if problem:
            raise InputError(name, problem, "remove it")
    job_type: JobTypeSection | None = None
    if request.job_type is not None and request.job_type != ADHOC:
        job_type = settings.job_types.get(request.job_type)
        if job_type is None:
            known = ", ".join(sorted(settings.job_types)) or "none defined in herder.toml"
            raise InputError(
                "job_type", f"unknown job type {request.job_type!r}",
                f"use one of: {known}; or submit an ad-hoc command after --",
            )
        if request.command:
            raise InputError(
                "command", "a job type already names its command",
                "drop the arguments after --, or drop the job type",
            )
        if job_type.hosts is not None and request.affinity is not None and (
                request.affinity not in job_type.hosts):
            raise InputError(
                "affinity", f"--host {request.affinity}: job type {request.job_type} runs "
                f"only on {', '.join(job_type.hosts)} (job_types.{request.job_type}.hosts)",
                "pass one of those with --host, or leave --host out")
    elif not request.command:
        raise InputError(
            "command", "nothing to run", "name a job type, or give a command after --"
        )

    context: dict[str, Any] = dict(payload)
    context["job_type"] = request.job_type or ADHOC
    shell = False
    workspace: WorkspaceSpec | None = None
    herder_env: dict[str, str] = {}  # set by herder, over the submitter's env
    if job_type is not None:
        where = f"job_types.{request.job_type}"
        deferred: tuple[str, ...] = ()
        if job_type.prompt_file is not None and job_type.prompt_from == "workspace":
            deferred = ("prompt", "prompt_file")
        elif job_type.prompt_file is not None:
            prompt_path = config.resolve_path(job_type.prompt_file)
            try:
                prompt_text = prompt_path.read_text()
            except OSError as exc:
                raise InputError(
                    f"{where}.prompt_file", f"cannot read {prompt_path}",
                    "fix the path in herder.toml",
                ) from exc
            context["prompt"] = fill_prompt(prompt_text, context, f"{where}.prompt_file")
            context["prompt_file"] = str(prompt_path)
        shell = job_type.shell
        # Values herder made (the prompt from its file, the job type's name) may start
        # with '-'; a payload value forming a whole argument may not, unless opted out.
        options = {*job_type.option_fields, "job_type",
                   *(("prompt", "prompt_file") if job_type.prompt_file is not None else ())}
        prompt_parts: tuple[int, ...] = ()
        if isinstance(job_type.command, str):
            script, herder_env = render_shell(job_type.command, context, f"{where}.command",
                                              deferred, options)
            command: tuple[str, ...] = ("/bin/sh", "-c", script)
        else:
            command, prompt_parts = render_argv(job_type.command, context,
                                                f"{where}.command", deferred, options)
        env = {name: render(value, context, f"{where}.env.{name}")
               for name, value in job_type.env.items()}
        for key in job_type.export:
            if key not in payload:
                raise InputError(
                    f"payload.{key}", f"job type {request.job_type!r} exports payload field "
                    f"{key!r}, which is missing", f"pass -p {key}=...",
                )
            env[f"HERDER_PAYLOAD_{key.upper()}"] = text(payload[key])
        if job_type.workspace is not None:
            workspace = checked(WorkspaceSpec(
                render(job_type.workspace.repository, context, f"{where}.workspace.repository"),
                render(job_type.workspace.ref, context, f"{where}.workspace.ref"),
                job_type.workspace.mode,
                job_type.prompt_file if deferred else None, prompt_parts,
            ), f"{where}.workspace")
            refusal = repository_refusal(
                workspace.repository, job_type.repositories, job_type.allow_local_repositories,
                bool(placeholders(job_type.workspace.repository)))
            if refusal is not None:
                raise InputError(f"{where}.workspace.repository", refusal,
                                 "pass a repository under the job type's repositories")
        workdir_template = job_type.workdir
    else:
        command = tuple(request.command or ())
        env = {}
        workdir_template = None
    for name in request.env:
        if name in (WORKSPACE_VARIABLE, WORKDIR_BASE) or name.startswith(SHELL_VARIABLE_PREFIX):
            raise InputError(f"env.{name}", "is set by herder from the job type (its "
                             "workspace, workdir base or shell values)",
                             "declare it in the job type instead")
    check_submitted_env(request.env)
    env.update(request.env)
    env.update(herder_env)
    if workspace is not None:
        if request.workdir is not None:
            raise InputError("workdir", "this job type runs in a fresh checkout of its "
                             "workspace", "drop --workdir")
        env[WORKSPACE_VARIABLE] = workspace.encode()

    weight = request.weight or (job_type.weight if job_type else None) or defaults.weight
    config.check_weight(weight)
    priority = _first(request.priority, job_type.priority if job_type else None,
                      defaults.priority)
    max_attempts = _first(request.max_attempts, job_type.max_attempts if job_type else None,
                          defaults.max_attempts)
    if max_attempts < 1:
        raise InputError("max_attempts", "must be at least 1", "pass --max-attempts 1 or more")
    if max_attempts > INT_MAX:
        raise InputError("max_attempts", f"must be at most {INT_MAX}")
    if not INT_MIN <= priority <= INT_MAX:
        raise InputError("priority", f"must be between {INT_MIN} and {INT_MAX}")
    timeout = _first_optional(request.timeout_seconds, job_type.timeout if job_type else None,
                              defaults.timeout)
    if timeout is not None and timeout <= 0:
        raise InputError("timeout", "must be greater than zero", "pass e.g. --timeout 30m")
    for name, seconds in (("timeout", timeout), ("delay", request.delay_seconds)):
        if seconds is not None and not 0 <= seconds <= MAX_DURATION:  # NaN fails this too
            raise InputError(name, f"must be a number of seconds up to {MAX_DURATION:.0f}")
    backoff_base = _first(job_type.backoff_base if job_type else None, defaults.backoff_base)
    backoff_max = _first(job_type.backoff_max if job_type else None, defaults.backoff_max)

    based = False
    if workspace is not None:
        workdir = None  # the host's fresh checkout
    elif request.workdir is not None:
        workdir = request.workdir
    elif workdir_template is not None:
        workdir = render(workdir_template, context, f"job_types.{request.job_type}.workdir")
        if job_type is not None and job_type.workdir_base is not None \
                and placeholders(workdir_template):
            workdir = _inside_base(workdir, job_type.workdir_base, request.job_type or "")
            env[WORKDIR_BASE] = job_type.workdir_base
            based = True  # absolute and normal already; the host resolves its symlinks
    elif local:
        workdir = os.getcwd()
    else:
        workdir = None
    if workdir is not None and local and not based:
        workdir = str(Path(os.path.expanduser(workdir)).resolve())
    if based and local and workdir is not None and job_type and job_type.workdir_base:
        try:
            resolved_inside(job_type.workdir_base, workdir)
        except ValueError as exc:
            raise InputError("workdir", str(exc), "pass a folder inside the base") from exc
    if check_command and workdir is not None:
        if not os.path.isdir(workdir):
            raise InputError("workdir", f"{workdir} is not a directory",
                             "create it or pass --workdir")
        _check_executable(command[0], workdir, env)
    if request.dedup_key is not None and not request.dedup_key.strip():
        raise InputError("dedup_key", "is empty", "pass a non-empty key or leave it out")

    return JobSpec(
        command=command,
        job_type=request.job_type or ADHOC,
        shell=shell,
        payload=payload,
        priority=priority,
        weight=weight,
        dedup_key=request.dedup_key,
        affinity=request.affinity,
        available_at=((now or datetime.now(UTC)) + timedelta(seconds=request.delay_seconds)
                      if request.delay_seconds else None),
        max_attempts=max_attempts,
        timeout_seconds=timeout,
        env=env,
        workdir=workdir,
        backoff_base_seconds=backoff_base,
        backoff_max_seconds=backoff_max,
        silence_timeout_seconds=job_type.silence_timeout if job_type else None,
    )


def _inside_base(workdir: str, base: str, job_type: str) -> str:
    try:
        return workdir_inside(base, workdir)
    except ValueError as exc:
        raise InputError(
            "workdir", f"must stay inside the workdir_base of job type {job_type!r}: {exc}",
            "pass a payload value that names a folder inside it, without '..'",
        ) from exc


def _first(*values: Any) -> Any:
    for value in values:
        if value is not None:
            return value
    raise AssertionError("a default is always present")


def _first_optional(*values: float | None) -> float | None:
    for value in values:
        if value is not None:
            return value
    return None


def _check_payload(payload: Mapping[str, Any]) -> None:
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InputError("payload", f"not JSON-serialisable: {exc}") from exc
    problem = storable(payload)
    if problem:
        raise InputError("payload", problem, "remove it")
    if len(encoded) > MAX_PAYLOAD_BYTES:
        raise InputError("payload", f"is {len(encoded)} bytes", "keep it under 1 MB")


def _check_executable(program: str, workdir: str, env: Mapping[str, str]) -> None:
    search = env.get("PATH", os.environ.get("PATH", os.defpath))
    if find_program(program, search, workdir) is not None:
        return
    if "/" in program:
        raise InputError("command", f"{program!r} is not an executable file",
                         "check the path, or chmod +x it")
    raise InputError("command", f"{program!r} was not found on PATH",
                     "install it or give its full path")
