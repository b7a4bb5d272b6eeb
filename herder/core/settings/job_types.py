"""[job_types.NAME]: a named route to a command, its workspace, outcome rules and what a
restricted submit token may set."""

import os
import re
from typing import Annotated

from msgspec import Meta, Struct, field

from herder.core.env_policy import allow_entry_refusal
from herder.core.model import JOB_OUTCOMES, Action, Budget, Outcome
from herder.core.settings.fields import (
    ENV_NAME,
    NAME,
    Duration,
    env_names,
    names,
    one_of,
    rules,
)
from herder.core.shell_templates import argv_problem, shell_problem
from herder.core.templates import check_command, placeholders
from herder.core.workspace import MODES as WORKSPACE_MODES
from herder.core.workspace import PROMPT_SOURCES, prefix_problem, relative_inside

PREFLIGHT_TIMEOUT = 5.0
"""How long a preflight may take before it counts as failed."""
PREFLIGHT_CACHE = 45.0
"""How long a preflight's result stands."""


def _submit_env(value: list[str]) -> list[str]:
    for entry in value:
        refusal = allow_entry_refusal(entry)
        if refusal is not None:
            raise ValueError(refusal)
    return value


def _command(value: list[str | list[str]] | str) -> list[str | list[str]] | str:
    if isinstance(value, list) and not value:
        raise ValueError("the command is empty; give an argv list like [\"aider\", \"--yes\"]")
    if isinstance(value, str) and not value.strip():
        raise ValueError("the command is empty")
    if isinstance(value, list):
        check_command(value)
    return value


def _template(value: str) -> str:
    placeholders(value)
    return value


ACTIONS = tuple(action.value for action in Action)
BUDGETS = tuple(budget.value for budget in Budget)
OUTCOMES = tuple(outcome.value for outcome in Outcome)


def _regex(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
    return value


class RuleSection(Struct, frozen=True):
    """[job_types.NAME.policy.OUTCOME]: this job type's rule for one outcome (the table in
    herder.core.scheduling.policy); a key left out keeps the default rule's."""

    action: Annotated[str | None, rules(check=one_of(ACTIONS))] = None
    spends: Annotated[str | None, rules(check=one_of(BUDGETS))] = None
    failure_reason: str | None = None
    delay: Duration | None = None
    delay_max: Duration | None = None
    avoid_host: bool | None = None
    actionable: bool | None = None
    human_action: bool | None = None
    escalations: Annotated[int | None, Meta(ge=0)] = None


class PatternSection(Struct, frozen=True):
    """One of [[job_types.NAME.patterns]]: a log line that means `outcome`."""

    outcome: Annotated[str, rules(check=one_of(
        tuple(sorted(outcome.value for outcome in JOB_OUTCOMES))))]
    regex: Annotated[str, rules(check=_regex)]


def _exit_codes(value: dict[str, str] | None) -> dict[str, str] | None:
    for code, outcome in (value or {}).items():
        if not (code.isdigit() and 1 <= int(code) <= 255):
            raise ValueError(f"{code!r} is not an exit code; use 1 to 255, e.g. {{4 = "
                             "\"needs_heavier\"}")
        if outcome not in JOB_OUTCOMES:
            raise ValueError(f"exit {code}: {outcome!r} is not an outcome a job can end in; "
                             f"use one of {', '.join(sorted(JOB_OUTCOMES))}")
    return value


def _pinned_hosts(value: list[str] | None) -> list[str] | None:
    if value is None:
        return value
    if not value:
        raise ValueError("names no host, so the type could never run; name at least one "
                         "host label, or leave hosts out for any host")
    for label in value:
        if not NAME.match(label):
            raise ValueError(f"{label!r} is not a valid host label")
    if len(set(value)) != len(value):
        raise ValueError("names a host twice; name each once")
    return value


def _preflight(value: list[str] | bool) -> list[str] | bool:
    if isinstance(value, list) and not value:
        raise ValueError("the preflight command is empty; give an argv list like "
                         "[\"claude\", \"--version\"], or false for none")
    return value


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _dispatch_check(value: list[str] | None) -> list[str] | None:
    if value is not None and not value:
        raise ValueError("the command is empty; give an argv list like [\"./merged-pr\"], or "
                         "leave it out for none")
    for item in value or []:
        found = _PLACEHOLDER.search(item)
        if found:
            name = found.group(1)
            variable = ("HERDER_DEDUP_KEY" if name in ("dedup_key", "key")
                        else f"HERDER_PAYLOAD_{name.upper()}")
            raise ValueError(f"{item!r}: the check's argv is not a template (a value is never "
                             f"pasted into a command); read ${variable} from its environment "
                             "instead")
    return value


class WorkspaceSection(Struct, frozen=True):
    """[job_types.NAME.workspace]: a fresh checkout per attempt, its folder the workdir;
    `repository` and `ref` are templates filled from the payload."""

    repository: Annotated[str, rules(check=_template)]
    ref: Annotated[str, rules(check=_template)]
    mode: Annotated[str, rules(check=one_of(WORKSPACE_MODES))] = "worktree"
    """worktree: from a mirror cached on the host, refreshed with `git fetch`; clone: a
    shallow fetch of the ref alone."""


class JobTypeSection(Struct, frozen=True):
    """[job_types.NAME]: a named route to a command (`herder submit NAME -p key=value`)."""

    command: Annotated[list[str | list[str]] | str, rules(check=_command)]
    """An argv list (a nested list is an optional group, kept only when every field it
    names is set) or, with shell = true, a script."""
    shell: bool = False
    prompt_file: str | None = None
    prompt_from: Annotated[str, rules(check=one_of(PROMPT_SOURCES))] = "submit"
    """submit: prompt_file is next to herder.toml, read at submit; workspace: it is a path
    in the job's checkout, read on the host that runs the attempt."""
    workspace: WorkspaceSection | None = None
    env: Annotated[dict[str, str], rules(check=env_names)] = field(default_factory=dict)
    export: Annotated[list[str], rules(check=names(
        ENV_NAME, "payload field {name!r} cannot become HERDER_PAYLOAD_{upper}; use letters, "
        "digits and _"))] = field(default_factory=list)
    weight: str | None = None
    priority: int | None = None
    timeout: Duration | None = None
    max_attempts: Annotated[int | None, Meta(ge=1)] = None
    backoff_base: Duration | None = None
    backoff_max: Duration | None = None
    workdir: str | None = None
    description: str | None = None
    preflight: Annotated[list[str] | bool, rules(check=_preflight)] = True
    """Run by an agent before it takes this type: true is `<program> --version` (the program
    must exist and answer), a list is a command that must exit 0, false is none."""
    preflight_timeout: Annotated[Duration, Meta(gt=0)] = PREFLIGHT_TIMEOUT
    preflight_cache: Annotated[Duration, Meta(gt=0)] = PREFLIGHT_CACHE
    """How long a preflight's result stands before it runs again."""
    max_transient_attempts: Annotated[int | None, Meta(ge=1)] = None
    """Transient outcomes (429, overloaded) a job of this type may meet before it fails;
    left out: [defaults] max_transient_attempts."""
    dispatch_check: Annotated[list[str] | None, rules(check=_dispatch_check)] = None
    """`herder should-dispatch KEY --type NAME` runs it once the key is free (an argv; the
    key and payload come as HERDER_DEDUP_KEY and HERDER_PAYLOAD_<FIELD>): exit 0 dispatch,
    10 skip (its first stdout line the reason), anything else an error (herder.dispatch_check)."""
    dispatch_check_timeout: Annotated[Duration, Meta(gt=0)] = 30.0
    silence_timeout: Annotated[Duration | None, Meta(gt=0)] = None
    """No new log output for this long: the attempt is stopped as `stuck`."""
    exit_codes: Annotated[dict[str, str] | None, rules(check=_exit_codes)] = None
    log_on_success: bool = False
    """Read the log of an attempt that exited 0 too, for a program that ends 0 after an API
    error (aider): a usage limit or a revoked login found there stands; nothing else does."""
    accounts: list[str] | bool = False
    """Runs under one of its host's accounts (herder.core.scheduling.accounts): true is any that
    serves the type, a list names those it may use, false (the default) is none."""
    policy: Annotated[dict[str, RuleSection], rules(
        check=names(re.compile("^(" + "|".join(OUTCOMES) + ")$"),
                     "{name!r} is not an outcome; use one of " + ", ".join(OUTCOMES)))] = field(
        default_factory=dict)
    """Outcome -> this type's rule, over the default table."""
    patterns: list[PatternSection] = field(default_factory=list)
    """Log lines that mean an outcome, tried before the default patterns."""
    replace_patterns: bool = False
    """True: `patterns` instead of the default patterns, not before them."""
    # What a submit token restricted to job types (`--job-types`) may set besides the
    # payload, a dedup key, a priority within its floor and a delay: nothing else unless
    # listed here (herder.api.tokens.authorize_submit). Admin and unrestricted submit
    # tokens are not bound by these; the env deny-list (herder.core.env_policy) binds everyone.
    submit_env: Annotated[list[str], rules(check=_submit_env)] = field(default_factory=list)
    """Variables such a token may set: names or PREFIX* patterns."""
    allow_workdir: bool = False
    """Such a token may choose the job's workdir."""
    allow_host: bool = False
    """Such a token may pin the job to a host (`affinity`)."""
    hosts: Annotated[list[str] | None, rules(check=_pinned_hosts)] = None
    """The only hosts that run this type (a hard affinity per type); left out:
    any host. A submit's `affinity` must be one of them."""
    submit_max_weight: str | None = None
    """Such a token may choose a weight up to this one (by RAM budget); left out: none."""
    submit_max_timeout: Annotated[Duration | None, Meta(gt=0)] = None
    """Such a token may choose a timeout up to this; left out: none."""
    submit_max_attempts: Annotated[int | None, Meta(ge=1)] = None
    """Such a token may choose max_attempts up to this; left out: none."""
    """Exit code -> outcome, e.g. {4 = "needs_heavier"}; left out: the default contract
    (`herder.core.scheduling.classification.SEED_EXIT_CODES`); {} for none."""
    # -- what a payload value may become (issue 23: payload values stay values) --
    option_fields: Annotated[list[str], rules(check=names(
        ENV_NAME, "{name!r} is not a payload field name"))] = field(default_factory=list)
    """Payload fields whose value may start with '-' where it opens an argv item or a word
    of a shell script (`{x}`, `"{x}"`, `{x}{y}`): fields meant to carry options."""
    workdir_base: str | None = None
    """The folder a templated `workdir` must stay inside (required when workdir names a
    field); a relative workdir is taken under it."""
    repositories: list[str] | None = None
    """URL prefixes a workspace's rendered repository must start with (compared as URLs:
    scheme, host, port, user and whole path segments)."""
    allow_local_repositories: bool = False
    """Whether a repository filled from the payload may be a local path or file:// URL."""

    def __post_init__(self) -> None:
        """What a payload value may become: never shell code, never an escape out of the
        workdir's base (herder.core.shell_templates, herder.core.workspace)."""
        if self.shell and isinstance(self.command, str):
            problem = shell_problem(self.command)
            if problem is not None:
                raise ValueError(f"command: {problem}")
        if isinstance(self.command, list):
            problem = argv_problem(self.command)
            if problem is not None:
                raise ValueError(problem)
        self._check_targets()
        if self.prompt_from == "workspace":
            if self.workspace is None or self.prompt_file is None:
                raise ValueError("prompt_from = \"workspace\" reads prompt_file from the "
                                 "job's checkout: set workspace and prompt_file")
            if not relative_inside(self.prompt_file):
                raise ValueError(f"prompt_file {self.prompt_file!r} must be a path inside "
                                 "the checkout (relative, without ..)")
            for key, template in [*self.env.items(), ("workdir", self.workdir or "")]:
                if {"prompt", "prompt_file"} & set(placeholders(template)):
                    raise ValueError(f"{key}: the prompt is read on the host after the "
                                     "checkout, so only the command may use {prompt}")
        if self.workspace is not None and self.workdir is not None:
            raise ValueError("workdir and workspace both say where the job runs; the "
                             "workspace's checkout is the workdir, drop workdir")

    def _check_targets(self) -> None:
        """A templated workdir names its base; the repository prefixes parse."""
        if self.workdir_base is not None and (not os.path.isabs(self.workdir_base)
                                              or placeholders(self.workdir_base)):
            raise ValueError(f"workdir_base: {self.workdir_base!r} must be an absolute path "
                             "without placeholders, e.g. \"/srv/checkouts\"")
        if self.workdir is not None and placeholders(self.workdir) and self.workdir_base is None:
            raise ValueError(f"workdir: {self.workdir!r} is filled from the payload, so it "
                             "could name any folder; set workdir_base = \"/srv/checkouts\" "
                             "(the folder it must stay inside)")
        if self.repositories is not None:
            if self.workspace is None:
                raise ValueError("repositories: limits a workspace's repository; set "
                                 "workspace or drop repositories")
            for index, prefix in enumerate(self.repositories):
                problem = prefix_problem(prefix)
                if problem is not None:
                    raise ValueError(f"repositories.{index}: {problem}")
