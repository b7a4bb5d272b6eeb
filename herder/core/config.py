"""herder.toml → validated settings. Every error names the file, the key and its line.

The settings are frozen msgspec Structs and this module owns every default: the runtime and
the pure core take theirs from here (`RuntimeSection().max_lost`: a default section's value, as
a Struct's class attribute is its field's slot, not the default), never from a number of their
own. Validation is a small walk over the Struct fields instead of pydantic, because every
command loads the config and `herder submit` runs in scripts' loops: building pydantic models
cost ~110 ms per call, and a frozen dataclass ~1 ms to define (its methods are compiled from
source) where a Struct costs ~0.03 ms (see bench/README.md).
"""

from __future__ import annotations

import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Union

from msgspec import Struct, field

from herder.core.errors import ConfigError, InputError
from herder.core.model import JOB_OUTCOMES, MAX_DURATION, Action, Budget, Outcome
from herder.core.shell_templates import argv_problem, shell_problem
from herder.core.templates import check_command, placeholders
from herder.core.urls import DEFAULT_DB
from herder.core.workspace import MODES as WORKSPACE_MODES
from herder.core.workspace import PROMPT_SOURCES, prefix_problem, relative_inside

CONFIG_FILE = "herder.toml"
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?!s))?"
                       r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*(?:(\d+(?:\.\d+)?)\s*ms)?\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like `90s`, `10m`, `2h`, `1h30m`, `250ms`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 90s, 10m or 2h")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 10m, 2h or 1h30m")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        if value > MAX_DURATION:
            raise ValueError(f"{value!r}s is longer than a year; use at most 365d worth")
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match and any(match.groups()):
            hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
            return parse_duration(hours * 3600 + minutes * 60 + seconds + millis / 1000)
        try:
            return parse_duration(float(value))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 10m, 2h or 1h30m")


DURATION = "duration"
Duration = Annotated[float, DURATION]
"""Seconds, written in the file as a number or as `90s`, `10m`, `2h`, `1h30m`, `250ms`."""


class Rules(Struct, frozen=True):
    """A field's checks beyond its type, written into its annotation
    (`Annotated[int, rules(ge=1)]`): a Struct field has no metadata of its own."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    check: Callable[[Any], Any] | None = None
    each: Callable[[Any], Any] | None = None
    before: Callable[[Any], Any] | None = None


def rules(*, ge: float | None = None, gt: float | None = None, le: float | None = None,
          check: Callable[[Any], Any] | None = None, each: Callable[[Any], Any] | None = None,
          before: Callable[[Any], Any] | None = None) -> Rules:
    """A field's checks beyond its type: bounds, then `check` of the value and `each` of its
    items (raise ValueError with the fix; an item's error names its index); `before`
    rewrites the raw value first."""
    return Rules(ge, gt, le, check, each, before)


def positive(what: str = "") -> Rules:
    """Greater than zero; `what` says what leaving the key out means, when that is allowed."""
    def check(value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"must be greater than zero{what}")
        return value
    return rules(check=check)


class HerderSection(Struct, frozen=True):
    """[herder]: where the database and the logs are, and this machine's label."""

    db: str | None = None
    log_dir: str = "herder-logs"
    host: str | None = None


def pass_env_refusal(entry: str, secret: str = "HERDER_") -> str | None:
    """Why a `pass_env` entry is not allowed, or None. An entry is a variable name or a
    `PREFIX*` pattern; none may name or match herder's own variables (`secret` is a name or
    a prefix ending in `_`), which hold its credentials."""
    prefix = entry[:-1] if entry.endswith("*") else None
    name = entry if prefix is None else prefix
    if not (_ENV_NAME.match(name) or (prefix == "")):
        return (f"{entry!r} is not a variable name or a PREFIX* pattern; use e.g. "
                "\"OPENAI_API_KEY\" or \"AWS_*\"")
    if prefix is None:
        clash = entry == secret or (secret.endswith("_") and entry.startswith(secret))
    else:
        clash = secret.startswith(prefix) or (secret.endswith("_") and prefix.startswith(secret))
    if clash:
        return (f"{entry!r} would pass herder's own variables ({secret}...: database URL, "
                "tokens) to jobs; remove it from pass_env")
    return None


def _pass_env_entry(entry: str) -> str:
    refusal = pass_env_refusal(entry)
    if refusal is not None:
        raise ValueError(refusal)
    return entry


def _names(pattern: re.Pattern[str], message: str) -> Callable[[Any], Any]:
    """A check that every key (or item) of a table (or list) matches `pattern`."""
    def check(value: Any) -> Any:
        for name in value:
            if not pattern.match(name):
                raise ValueError(message.format(name=name, upper=name.upper()))
        return value
    return check


_env_names = _names(_ENV_NAME, "{name!r} is not a valid environment variable name")


def _submit_env(value: list[str]) -> list[str]:
    from herder.core.env_policy import allow_entry_refusal

    for entry in value:
        refusal = allow_entry_refusal(entry)
        if refusal is not None:
            raise ValueError(refusal)
    return value


def _one_of(choices: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"{value!r}: use one of {', '.join(choices)}")
        return value
    return check


def _nice(value: dict[str, int]) -> dict[str, int]:
    for weight, level in value.items():
        if not 0 <= level <= 19:
            raise ValueError(f"nice for {weight!r} is {level}; use 0 (normal) to 19 (lowest)")
    return value


class RuntimeSection(Struct, frozen=True):
    """[runtime]: how a runner runs attempts (`herder up`, agents, the server's local hosts)."""

    concurrency: Annotated[int, rules(ge=1, le=1024)] = 4
    heartbeat_interval: Annotated[Duration, positive()] = 10.0
    attempt_lease: Duration = 60.0
    kill_grace: Duration = 10.0
    poll_interval: Annotated[Duration, positive()] = 1.0
    max_lost: Annotated[int, rules(ge=1)] = 5
    """Lost attempts (runner crashes) before a job fails as lost."""
    pass_env: Annotated[list[str], rules(each=_pass_env_entry)] = field(default_factory=list)
    """Variables of the runner's environment a job gets besides the base allow-list."""
    fence_margin: Annotated[Duration | None, positive(
        " (or left out for a quarter of attempt_lease)")] = None
    """A runner whose heartbeats fail stops its attempts this long before their lease ends;
    None is a quarter of the lease."""
    workspace_root: str = "herder-workspaces"
    """Where attempts' workspaces and the worktree mirrors live; a relative path is beside
    the log folder."""
    workspace_keep_failed: Duration = 86400.0
    """A failed attempt's workspace is kept this long for inspection, then swept."""
    workspace_min_free_gb: Annotated[float, rules(ge=0)] = 1.0
    """A workspace is not prepared when less than this is free on its disk."""
    memory_enforcement: Annotated[str, rules(check=_one_of(
        ("auto", "cgroup", "watchdog", "off")))] = "auto"
    """auto: a cgroup per attempt where the host allows one, else the watchdog; cgroup:
    the same, warning when none can be made; watchdog: sampled RSS only; off: measured."""
    memory_margin: Annotated[float, rules(ge=0, le=10)] = 0.10
    """An attempt is stopped past its weight's budget times (1 + margin)."""
    memory_sample_interval: Annotated[Duration, positive()] = 2.0
    """How often each attempt's process tree RSS is sampled."""
    cgroup_root: str | None = None
    """A writable cgroup directory for the attempts' cgroups (e.g. a delegated subtree);
    left out: found from this process's own cgroup."""
    nice: Annotated[dict[str, int], rules(check=_nice)] = field(default_factory=dict)
    """Weight -> the niceness its attempts run at, e.g. {light = 10}."""
    run_as: str | None = None
    """The unprivileged user a root runner starts jobs as (herder.runtime.job_user); left
    out, a root runner's jobs run as root (with a warning at start)."""
    adopt_grace: Duration = 10.0
    """How long a dead agent's guardian waits for the host's next agent to adopt its
    running attempts before it kills them and reports them lost; 0 kills at once."""


class DefaultsSection(Struct, frozen=True):
    """[defaults]: what a submitted job gets when neither it nor its job type says."""

    priority: int = 100
    weight: str = "light"
    max_attempts: Annotated[int, rules(ge=1)] = 3
    max_transient_attempts: Annotated[int, rules(ge=1)] = 5
    """Seed 002's transient budget (`transient_max_attempts`): its own, never the job's
    attempts."""
    timeout: Duration | None = None
    backoff_base: Duration = 10.0
    backoff_max: Duration = 600.0


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

    action: Annotated[str | None, rules(check=_one_of(ACTIONS))] = None
    spends: Annotated[str | None, rules(check=_one_of(BUDGETS))] = None
    failure_reason: str | None = None
    delay: Duration | None = None
    delay_max: Duration | None = None
    avoid_host: bool | None = None
    actionable: bool | None = None
    human_action: bool | None = None
    escalations: Annotated[int | None, rules(ge=0)] = None


class PatternSection(Struct, frozen=True):
    """One of [[job_types.NAME.patterns]]: a log line that means `outcome`."""

    outcome: Annotated[str, rules(check=_one_of(
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
        if not _NAME.match(label):
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
    mode: Annotated[str, rules(check=_one_of(WORKSPACE_MODES))] = "worktree"
    """worktree: from a mirror cached on the host, refreshed with `git fetch`; clone: a
    shallow fetch of the ref alone."""


class JobTypeSection(Struct, frozen=True):
    """[job_types.NAME]: a named route to a command (`herder submit NAME -p key=value`)."""

    command: Annotated[list[str | list[str]] | str, rules(check=_command)]
    """An argv list (a nested list is an optional group, kept only when every field it
    names is set) or, with shell = true, a script."""
    shell: bool = False
    prompt_file: str | None = None
    prompt_from: Annotated[str, rules(check=_one_of(PROMPT_SOURCES))] = "submit"
    """submit: prompt_file is next to herder.toml, read at submit; workspace: it is a path
    in the job's checkout, read on the host that runs the attempt."""
    workspace: WorkspaceSection | None = None
    env: Annotated[dict[str, str], rules(check=_env_names)] = field(default_factory=dict)
    export: Annotated[list[str], rules(check=_names(
        _ENV_NAME, "payload field {name!r} cannot become HERDER_PAYLOAD_{upper}; use letters, "
        "digits and _"))] = field(default_factory=list)
    weight: str | None = None
    priority: int | None = None
    timeout: Duration | None = None
    max_attempts: Annotated[int | None, rules(ge=1)] = None
    backoff_base: Duration | None = None
    backoff_max: Duration | None = None
    workdir: str | None = None
    description: str | None = None
    preflight: Annotated[list[str] | bool, rules(check=_preflight)] = True
    """Run by an agent before it takes this type: true is `<program> --version` (the program
    must exist and answer), a list is a command that must exit 0, false is none."""
    preflight_timeout: Annotated[Duration, rules(gt=0)] = 5.0
    preflight_cache: Annotated[Duration, rules(gt=0)] = 45.0
    """How long a preflight's result stands before it runs again (seed 002's
    `preflight_cache_ttl`)."""
    max_transient_attempts: Annotated[int | None, rules(ge=1)] = None
    """Transient outcomes (429, overloaded) a job of this type may meet before it fails;
    left out: [defaults] max_transient_attempts."""
    dispatch_check: Annotated[list[str] | None, rules(check=_dispatch_check)] = None
    """`herder should-dispatch KEY --type NAME` runs it once the key is free (an argv; the
    key and payload come as HERDER_DEDUP_KEY and HERDER_PAYLOAD_<FIELD>): exit 0 dispatch,
    10 skip (its first stdout line the reason), anything else an error
    (herder.services.dispatch_check)."""
    dispatch_check_timeout: Annotated[Duration, rules(gt=0)] = 30.0
    silence_timeout: Annotated[Duration | None, rules(gt=0)] = None
    """No new log output for this long: the attempt is stopped as `stuck`."""
    exit_codes: Annotated[dict[str, str] | None, rules(check=_exit_codes)] = None
    log_on_success: bool = False
    """Read the log of an attempt that exited 0 too, for a program that ends 0 after an API
    error (aider): a usage limit or a revoked login found there stands; nothing else does."""
    accounts: list[str] | bool = False
    """Runs under one of its host's accounts (herder.core.scheduling.accounts): true is any that
    serves the type, a list names those it may use, false (the default) is none."""
    policy: Annotated[dict[str, RuleSection], rules(
        check=_names(re.compile("^(" + "|".join(OUTCOMES) + ")$"),
                     "{name!r} is not an outcome; use one of " + ", ".join(OUTCOMES)))] = field(
        default_factory=dict)
    """Outcome -> this type's rule, over the default table."""
    patterns: list[PatternSection] = field(default_factory=list)
    """Log lines that mean an outcome, tried before the default patterns."""
    replace_patterns: bool = False
    """True: `patterns` instead of the default patterns, not before them."""
    # What a submit token restricted to job types (`--job-types`) may set besides the
    # payload, a dedup key, a priority within its floor and a delay: nothing else unless
    # listed here (herder.core.access.authorize_submit). Admin and unrestricted submit
    # tokens are not bound by these; the env deny-list (herder.core.env_policy) binds everyone.
    submit_env: Annotated[list[str], rules(check=_submit_env)] = field(default_factory=list)
    """Variables such a token may set: names or PREFIX* patterns."""
    allow_workdir: bool = False
    """Such a token may choose the job's workdir."""
    allow_host: bool = False
    """Such a token may pin the job to a host (`affinity`)."""
    hosts: Annotated[list[str] | None, rules(check=_pinned_hosts)] = None
    """The only hosts that run this type (seed 000's hard affinity per type); left out:
    any host. A submit's `affinity` must be one of them."""
    submit_max_weight: str | None = None
    """Such a token may choose a weight up to this one (by RAM budget); left out: none."""
    submit_max_timeout: Annotated[Duration | None, rules(gt=0)] = None
    """Such a token may choose a timeout up to this; left out: none."""
    submit_max_attempts: Annotated[int | None, rules(ge=1)] = None
    """Such a token may choose max_attempts up to this; left out: none."""
    """Exit code -> outcome, e.g. {4 = "needs_heavier"}; left out: seed 004's contract
    (`herder.core.scheduling.classification.SEED_EXIT_CODES`); {} for none."""
    # -- what a payload value may become (issue 23: payload values stay values) --
    option_fields: Annotated[list[str], rules(check=_names(
        _ENV_NAME, "{name!r} is not a payload field name"))] = field(default_factory=list)
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

    def check(self) -> None:
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


class WindowCapsSection(Struct, frozen=True):
    """[hosts.LABEL.prime] and [hosts.LABEL.night]: what the host takes in that window."""

    max_workers: Annotated[int, rules(ge=0)] = 1
    max_weight: str | None = None


def _transport(value: str) -> str:
    if value not in ("local", "agent", "ssh"):
        raise ValueError("transport must be local, agent or ssh")
    return value


def _argv(value: list[str] | None) -> list[str] | None:
    if value is not None and not value:
        raise ValueError("the command is empty; give an argv list like [\"probe-claude\"]")
    return value


class AccountSection(Struct, frozen=True):
    """[hosts.LABEL.accounts.NAME]: a credential identity on the host that jobs run under
    (`herder accounts`). `env` is what it gives a job; its values may be secrets and are
    never shown or logged, only their names."""

    env: Annotated[dict[str, str], rules(check=_env_names)] = field(default_factory=dict)
    max_sessions: Annotated[int, rules(ge=1, le=10_000)] = 1
    job_types: list[str] | None = None
    """The job types it serves; left out: every type that asks for an account."""
    probe: Annotated[list[str] | None, rules(check=_argv)] = None
    """A command run on the host that prints {"credentials_present": .., "has_refresh_token":
    .., "access_expired": ..} (booleans only); anything else is ignored (fail-open)."""
    probe_timeout: Annotated[Duration, rules(gt=0)] = 10.0
    probe_interval: Annotated[Duration, rules(gt=0)] = 300.0
    """How long a probe's answer is kept before the probe runs again."""


class HostSection(Struct, frozen=True):
    """A host declared in herder.toml; `herder server` creates or updates it at start."""

    ram_total_gb: Annotated[float, rules(ge=0)]
    ram_reserved_gb: Annotated[float, rules(ge=0)] = 0.0
    cpus: Annotated[int, rules(ge=1)] = 1
    transport: Annotated[str, rules(check=_transport)] = "agent"
    ssh_target: str | None = None
    prime: WindowCapsSection = WindowCapsSection()
    night: WindowCapsSection = WindowCapsSection()
    job_types: list[str] | None = None
    weights: list[str] | None = None
    priority_floor: int | None = None
    labels: list[str] = field(default_factory=list)
    enabled: bool = True
    accounts: Annotated[dict[str, AccountSection], rules(
        check=_names(_NAME, "{name!r} is not a valid account name"))] = field(default_factory=dict)


def _shedding(value: Any) -> Any:
    """TOML has no null: "any" (or "") stands for "every weight" in a step."""
    if isinstance(value, list):
        return [[step[0], None if step[1] in ("", "any") else step[1]]
                if isinstance(step, list | tuple) and len(step) == 2 else step
                for step in value]
    return value


def _clock(value: str) -> str:
    if not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", value):
        raise ValueError(f"{value!r} is not a time of day like 20:00")
    return value


def _timezone(value: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {value!r}") from exc
    return value


def _strategy(value: str) -> str:
    if value not in ("best_fit", "spread"):
        raise ValueError("strategy must be best_fit or spread")
    return value


ESCALATION_CHAIN = ("light", "heavy", "playwright", "orchestrator")
"""The default weights from lightest to heaviest (windows and shedding cap along it)."""

SHEDDING_STEPS: tuple[tuple[float, str | None], ...] = (
    (0.75, None), (0.5, "heavy"), (0.25, "heavy"), (0.0, "light"))
"""Fleet capacity ratio → the heaviest weight still placed (seed 003 §2.3)."""

DEFAULT_WEIGHTS: Mapping[str, float] = types.MappingProxyType({
    "light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0,
})
"""GB of RAM one attempt of each weight books on its host."""


SEED_SUBAGENT_CAPS: Mapping[str, int] = types.MappingProxyType({
    "light": 0, "heavy": 16, "playwright": 16, "orchestrator": 10,
})
"""Subagent slots one job of each weight may hold on a host: seed 004's
max_subagents_for_weight on its 32 GB host (1 GB slots in the 80 % cap beside the job's own
RAM; light: none)."""


def _subagent_caps(value: dict[str, int | bool]) -> dict[str, int | bool]:
    for name, cap in value.items():
        if cap is True or (cap is not False and cap < 0):
            raise ValueError(f"{name} = {str(cap).lower()}: give a number of slots (0 or "
                             "more), or false for no cap")
    return value


class FleetSection(Struct, frozen=True):
    """[fleet]: placement, health and retry rules of `herder server`'s scheduler."""

    bookable_fraction: Annotated[float, rules(gt=0, le=1)] = 0.8
    """Bookable RAM is this fraction of what the OS reservation leaves (seed 004)."""
    strategy: Annotated[str, rules(check=_strategy)] = "best_fit"
    starvation_wait: Duration = 600.0
    healthy_within: Duration = 300.0
    degraded_within: Duration = 900.0
    night_start: Annotated[str, rules(check=_clock)] = "20:00"
    night_end: Annotated[str, rules(check=_clock)] = "03:00"
    timezone: Annotated[str, rules(check=_timezone)] = "UTC"
    escalation: list[str] = field(default_factory=lambda: list(ESCALATION_CHAIN))
    shedding: Annotated[list[tuple[float, str | None]], rules(before=_shedding)] = field(
        default_factory=lambda: list(SHEDDING_STEPS))
    max_spawn_failures: Annotated[int, rules(ge=1)] = 5
    """Attempts in a row that fail to start before a job fails."""
    spawn_backoff: Duration = 300.0
    """The wait before a job that failed to start is tried again."""
    breaker_threshold: Annotated[int, rules(ge=1)] = 3
    """Transient outcomes in a row of one job type on one host that open its breaker."""
    breaker_pause: Annotated[Duration, rules(gt=0)] = 300.0
    """How long an open breaker launches nothing of that type there."""
    scheduler_interval: Duration = 1.0
    alert_grace: Annotated[Duration, rules(ge=0)] = 60.0
    """A new leader waits this long for agents to check in before it alerts that no host
    is healthy: a server that just started has heard from nobody yet."""
    auth_revoked_cooldown: Duration = 1800.0
    """An account whose login was revoked is skipped this long (seed 004 #7667)."""
    missed_heartbeats: Annotated[int, rules(ge=1)] = 3
    pickup_timeout: Annotated[Duration | None, positive(
        " (or left out for the default)")] = None
    """A placement no runner has taken by then goes back to the queue (None: 2 heartbeat
    intervals + 5 s, see herder.runtime.scheduler.pickup_timeout_seconds)."""
    reservation_ttl: Duration = 10800.0
    ci_slot_ttl: Duration = 28800.0
    max_subagents_for_weight: Annotated[dict[str, int | bool], rules(
        check=_subagent_caps)] = field(default_factory=dict)
    """Weight -> the subagent slots a job of it may hold on a host, over SEED_SUBAGENT_CAPS
    (`subagent_caps`); false: no cap."""
    ssh_command: list[str] = field(default_factory=lambda: ["ssh"])
    remote_herder: str = "herder"
    emergency_max_workers: Annotated[int | None, rules(ge=0)] = None
    """A fleet-wide cap on running jobs (seed 004); left out: none. The start value:
    `herder fleet cap N` / `--lift` change it at run time for every replica."""


class ServerSection(Struct, frozen=True):
    """[server]: how `herder server` listens and authenticates."""

    listen: str = "127.0.0.1:8470"
    api_token_env: str = "HERDER_API_TOKEN"
    long_poll: Duration = 25.0
    tls_cert: str | None = None
    tls_key: str | None = None
    public_url: str | None = None
    """How remote hosts and browsers reach this server (ssh push; behind a proxy, the name a
    loopback server answers besides its own, and https makes the session cookie Secure);
    default http(s)://listen."""
    allow_plaintext: bool = False
    """Serve plain http off loopback, and let ssh push hosts call a plain http public_url
    (--allow-plaintext): only on a network you trust."""
    max_body_bytes: Annotated[int, rules(ge=1024, le=1024**3)] = 1024 * 1024
    """Larger request bodies are refused with 413 (agents ship logs in 512 KiB chunks)."""
    metrics_public: bool = False
    """`GET /metrics` without a token (a scraper on a trusted network); by default it
    needs a read token, as every operator read does."""
    queue_recent: Annotated[int, rules(ge=0, le=1000)] = 20
    """How many of the newest jobs `GET /queue` lists."""
    max_log_bytes: Annotated[int, rules(ge=1024 * 1024, le=2**40)] = 1024**3
    """The most log bytes an agent may write for one attempt (413 beyond)."""
    max_reservations_per_token: Annotated[int, rules(ge=0, le=100_000)] = 32
    """Active reservations and CI slots one non-admin token may hold at once."""
    max_reservation_weight: str | None = None
    """The heaviest weight (by RAM budget) a non-admin token may reserve or claim a slot
    with; left out: any."""


def _hook_template(value: str | None) -> str | None:
    from herder.core.webhooks import template_paths

    if value is not None:
        template_paths(value)
    return value


def _templates(value: dict[str, str]) -> dict[str, str]:
    for template in value.values():
        _hook_template(template)
    return value


def _paths(value: dict[str, str]) -> dict[str, str]:
    for path in value:
        _hook_template("{" + path + "}")
    return value


def _env_name(value: str | None) -> str | None:
    if value is not None and not _ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


def _no_inline_secret(value: str | None) -> str | None:
    if value is not None:
        raise ValueError("a secret does not belong in herder.toml (it may be committed); "
                         "set secret_env = \"HERDER_HOOK_NAME_SECRET\" or secret_file")
    return value


class HookRuleSection(Struct, frozen=True):
    """One of [[hooks.sources.NAME.rules]]: an event that becomes a job. Templates read
    dotted paths of the event JSON (`{repository.full_name}#{issue.number}`)."""

    event: str
    """The event header's value: `issues`, `pull_request`, ..."""
    job_type: str
    action: str | None = None
    """The event's `action` must be this (`labeled`, `opened`, ...)."""
    label: str | None = None
    """The label added (GitHub) or carried (Gitea) must be this."""
    when: Annotated[dict[str, str], rules(check=_paths)] = field(default_factory=dict)
    """Dotted path -> the value it must have, e.g. {"repository.full_name" = "org/app"}."""
    dedup_key: Annotated[str | None, rules(check=_hook_template)] = None
    payload: Annotated[dict[str, str], rules(check=_templates)] = field(default_factory=dict)
    priority: int | None = None
    weight: str | None = None


class HookSourceSection(Struct, frozen=True):
    """[hooks.sources.NAME]: a forge that posts to /hooks/NAME, signed with its secret.
    The secret comes from a variable or a file, never from herder.toml itself."""

    kind: Annotated[str, rules(check=_one_of(("github", "gitea", "generic")))]
    secret_env: Annotated[str | None, rules(check=_env_name)] = None
    secret_file: str | None = None
    secret: Annotated[str | None, rules(check=_no_inline_secret)] = None
    rules: list[HookRuleSection] = field(default_factory=list)

    def check(self) -> None:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("a source needs one secret: set secret_env = "
                             "\"HERDER_HOOK_NAME_SECRET\" or secret_file = \"path\"")


class HooksSection(Struct, frozen=True):
    """[hooks]: forge webhooks (`POST /hooks/NAME`) that enqueue jobs."""

    retention: Annotated[Duration, rules(gt=0)] = 7 * 86400.0
    """How long a delivery id is remembered (a replay within it enqueues nothing)."""
    max_body_bytes: Annotated[int, rules(ge=1024, le=1024**3)] = 1024 * 1024
    """Larger deliveries are refused with 413 (server.max_body_bytes caps them too)."""
    sources: Annotated[dict[str, HookSourceSection], rules(
        check=_names(_NAME, "{name!r} is not a valid source name"))] = field(default_factory=dict)


_ALERT_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://\S")


def _alert_url(value: str) -> str:
    """A URL's shape only: Apprise knows its schemes, and importing it (~150 ms) at every
    command's config load would slow scripts' `herder submit` loops, so the scheme is checked
    where alerts are sent (`herder.runtime.delivery.check_urls`). The error never echoes the
    URL: it may hold a token."""
    if not _ALERT_URL.match(value):
        raise ValueError("expected an Apprise URL like json://host/path or "
                         "discord://webhook_id/webhook_token")
    return value


class AlertsSection(Struct, frozen=True):
    """[alerts]: where alerts are sent (Apprise URLs) and how often."""

    urls: Annotated[list[str], rules(each=_alert_url)] = field(default_factory=list)
    """Apprise URLs (Discord, Slack, Telegram, mailto, json:// ...); they may hold secrets."""
    urls_env: Annotated[str | None, rules(check=_env_name)] = None
    """An environment variable holding more URLs, separated by spaces or commas (keeps
    tokens out of herder.toml)."""
    window: Annotated[Duration, rules(gt=0)] = 900.0
    """One message per alert key per window: a flapping cause sends one, and one when it
    clears."""
    max_per_hour: Annotated[int, rules(ge=1)] = 30
    """Messages past this in an hour wait (across keys): a storm cannot flood a channel."""
    queue_size: Annotated[int, rules(ge=1)] = 200
    """Messages waiting for delivery, per URL; past it the URL's oldest is dropped (logged
    and counted)."""
    retries: Annotated[int, rules(ge=0)] = 3
    """Tries after the first for a URL that fails (a 5xx, a timeout)."""
    retry_backoff: Annotated[Duration, rules(gt=0)] = 2.0
    """The first wait before a retry; doubled each time, up to a minute."""
    timeout: Annotated[Duration, rules(gt=0)] = 10.0
    """A URL's connect and read timeout (a slow endpoint only delays its own sender thread)."""
    interval: Annotated[Duration, rules(gt=0)] = 2.0
    """How often the leader looks for alerts to send."""
    scheduler_silence: Annotated[Duration, rules(gt=0)] = 300.0
    """Alert when the scheduler has completed no cycle for this long."""
    oom_loop_count: Annotated[int, rules(ge=2)] = 3
    oom_loop_window: Annotated[Duration, rules(gt=0)] = 300.0
    """An OOM loop: this many needs_heavier/oom endings of one job within this window."""
    ram_low_gb: Annotated[float, rules(ge=0)] = 4.0
    ram_low_for: Annotated[Duration, rules(ge=0)] = 300.0
    """A RAM spike: a host's measured available RAM below `ram_low_gb` for `ram_low_for`
    (seed 004: below 4 GB for 5 minutes); 0 GB turns it off."""
    agent_unreachable: Annotated[Duration, rules(gt=0)] = 300.0
    """An agent that cannot reach its server (or whose token is refused) this long raises
    an alert: through its own [alerts] urls at once, and to the server once it is back."""

    def __repr__(self) -> str:
        """Every field but `urls`: they may hold tokens, and a repr can end up in a log."""
        shown = ", ".join(f"{name}={getattr(self, name)!r}"
                          for name in self.__struct_fields__ if name != "urls")
        return f"AlertsSection({shown})"


def _merge_weights(value: Any) -> Any:
    """[weights] adds to and overrides the defaults, so one entry cannot silently drop the
    others (and shrink the escalation chain); `name = false` removes a weight."""
    if not isinstance(value, dict):
        return value
    merged: dict[str, Any] = dict(DEFAULT_WEIGHTS)
    for name, budget in value.items():
        if budget is False:
            if name not in merged:
                raise Invalid(["weights", name], f"{name!r} is not a default weight, so "
                              "there is nothing to remove; delete this line")
            del merged[name]
        elif budget is True:
            raise Invalid(["weights", name], "a weight is a RAM budget in GB; use a number, "
                          "or false to remove a default weight")
        else:
            merged[name] = budget
    return merged


def _weights(value: dict[str, float]) -> dict[str, float]:
    if not value:
        raise ValueError("at least one weight is needed")
    for name, budget in value.items():
        if not _NAME.match(name):
            raise ValueError(f"{name!r} is not a valid weight name")
        if budget < 0:
            raise ValueError(f"weight {name!r} has a negative RAM budget")
    return value


class Settings(Struct, frozen=True):
    """All of herder.toml, each section a Struct of its own."""

    herder: HerderSection = HerderSection()
    runtime: RuntimeSection = RuntimeSection()
    defaults: DefaultsSection = DefaultsSection()
    weights: Annotated[dict[str, float], rules(before=_merge_weights, check=_weights)] = field(
        default_factory=lambda: dict(DEFAULT_WEIGHTS))
    job_types: Annotated[dict[str, JobTypeSection], rules(
        check=_names(_NAME, "{name!r} is not a valid job type name"))] = field(default_factory=dict)
    fleet: FleetSection = FleetSection()
    server: ServerSection = ServerSection()
    alerts: AlertsSection = AlertsSection()
    hosts: Annotated[dict[str, HostSection], rules(
        check=_names(_NAME, "{name!r} is not a valid host label"))] = field(default_factory=dict)
    hooks: HooksSection = HooksSection()


# -- validation: TOML data → the Structs above ---------------------------------------------


class Invalid(ValueError):
    """A value in the file that does not fit; `loc` is its path of keys."""

    def __init__(self, loc: list[str], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


_NO_RULES = Rules()
_FIELD_TYPES: dict[str, tuple[Any, Rules]] = {}


def _field_type(annotation: str) -> tuple[Any, Rules]:
    """The type a field's annotation names and its Rules. Only the keys a file sets are
    resolved, each spelling once: resolving every section's annotations up front
    (`typing.get_type_hints`, `msgspec.structs.fields`) cost ~5 ms of every start."""
    if annotation not in _FIELD_TYPES:
        hint = eval(annotation, globals())  # our own annotations, not input
        marks = typing.get_args(hint)[1:] if typing.get_origin(hint) is Annotated else ()
        found = [mark for mark in marks if isinstance(mark, Rules)]
        _FIELD_TYPES[annotation] = (hint, found[0] if found else _NO_RULES)
    return _FIELD_TYPES[annotation]


def build(cls: type[Struct], data: Any, loc: list[str]) -> Any:
    """An instance of the settings Struct `cls` from a TOML table: unknown keys, missing
    required keys, wrong types and failed checks raise Invalid naming the key."""
    if not isinstance(data, dict):
        raise Invalid(loc, "expected a table")
    names = cls.__struct_fields__
    for key in data:
        if key not in names:
            raise Invalid([*loc, key], "unknown key; check the spelling against "
                                       "`herder init`'s sample")
    required = len(names) - len(cls.__struct_defaults__)  # the defaults are the last fields'
    values: dict[str, Any] = {}
    for index, name in enumerate(names):
        if name not in data:
            if index < required:
                raise Invalid([*loc, name], "required key is missing")
            continue
        hint, checks = _field_type(cls.__annotations__[name])
        values[name] = _field_value(checks, hint, data[name], [*loc, name])
    instance = cls(**values)
    check: Callable[[], None] | None = getattr(instance, "check", None)
    if check is not None:
        try:
            check()
        except ValueError as exc:
            raise Invalid(loc, str(exc)) from exc
    return instance


def _field_value(checks: Rules, hint: Any, raw: Any, loc: list[str]) -> Any:
    if checks.before is not None:
        raw = checks.before(raw)
    value = convert(hint, raw, loc)
    if value is not None:
        ge, gt, le = checks.ge, checks.gt, checks.le
        if ge is not None and value < ge:
            raise Invalid(loc, f"must be at least {ge:g}")
        if gt is not None and value <= gt:
            raise Invalid(loc, f"must be greater than {gt:g}")
        if le is not None and value > le:
            raise Invalid(loc, f"must be at most {le:g}")
    if checks.check is not None:
        try:
            value = checks.check(value)
        except ValueError as exc:
            raise Invalid(loc, str(exc)) from exc
    if checks.each is not None:
        for index, entry in enumerate(value):
            try:
                checks.each(entry)
            except ValueError as exc:
                raise Invalid([*loc, str(index)], str(exc)) from exc
    return value


_TRUE = frozenset({"true", "yes", "on", "1", "t", "y"})
_FALSE = frozenset({"false", "no", "off", "0", "f", "n"})


def convert(hint: Any, raw: Any, loc: list[str]) -> Any:
    """`raw` as the type `hint`, the way pydantic's lax mode took it before: numbers from
    numeric strings, integral floats as ints; a wrong type raises Invalid saying what fits."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *marks = typing.get_args(hint)
        if DURATION in marks:
            try:
                return parse_duration(raw)
            except ValueError as exc:
                raise Invalid(loc, str(exc)) from exc
        return convert(base, raw, loc)
    if origin in (Union, types.UnionType):
        members = [member for member in typing.get_args(hint) if member is not type(None)]
        if raw is None and len(members) < len(typing.get_args(hint)):
            return None
        failures: list[Invalid] = []
        for member in members:
            try:
                return convert(member, raw, loc)
            except Invalid as exc:
                if exc.loc != loc:  # it fit the shape, an item did not: that is the error
                    raise
                failures.append(exc)
        if len(failures) == 1:
            raise failures[0]
        raise Invalid(loc, "expected " + " or ".join(_describe(member) for member in members))
    if origin is list:
        if not isinstance(raw, list):
            raise Invalid(loc, f"expected {_describe(hint)}")
        (item,) = typing.get_args(hint)
        return [convert(item, value, [*loc, str(index)]) for index, value in enumerate(raw)]
    if origin is tuple:
        items = typing.get_args(hint)
        if not isinstance(raw, list | tuple) or len(raw) != len(items):
            raise Invalid(loc, f"expected {_describe(hint)}")
        return tuple(convert(item, value, [*loc, str(index)])
                     for index, (item, value) in enumerate(zip(items, raw, strict=True)))
    if origin is dict:
        if not isinstance(raw, dict):
            raise Invalid(loc, "expected a table")
        _key, item = typing.get_args(hint)
        return {key: convert(item, value, [*loc, key]) for key, value in raw.items()}
    if isinstance(hint, type) and issubclass(hint, Struct):
        return build(hint, raw, loc)
    return _scalar(hint, raw, loc)


def _scalar(hint: Any, raw: Any, loc: list[str]) -> Any:
    if hint is str:
        if isinstance(raw, str):
            return raw
    elif hint is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        if isinstance(raw, int) and raw in (0, 1):
            return bool(raw)
    elif hint is int:
        number = _number(raw)
        if number is not None and number == int(number):
            return int(number)
    elif hint is float:
        number = _number(raw)
        if number is not None:
            return number
    else:  # pragma: no cover - a settings field of a type this walk does not know
        raise TypeError(f"no conversion to {hint!r}")
    raise Invalid(loc, f"expected {_describe(hint)}, not {raw!r}")


def _number(raw: Any) -> int | float | None:
    """A finite number from a TOML number or a numeric string; None when it is neither."""
    if isinstance(raw, str):
        text = raw.strip()
        try:
            raw = int(text) if text.lstrip("+-").isdigit() else float(text)
        except ValueError:
            return None
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return raw if isinstance(raw, int) or math.isfinite(raw) else None


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin is Annotated:
        base, *marks = typing.get_args(hint)
        return "a duration like 90s, 10m or 2h" if DURATION in marks else _describe(base)
    if origin is list:
        (item,) = typing.get_args(hint)
        return f"a list of {_plural(item)}"
    if origin is tuple:
        return "a pair like [0.5, \"heavy\"]"
    if origin is dict:
        return "a table"
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        hint, "a table")


def _plural(hint: Any) -> str:
    noun = _describe(hint)
    return {"a string": "strings", "an integer": "integers", "a number": "numbers"}.get(
        noun, noun)


class Config(Struct, frozen=True):
    """Validated settings plus where they came from (relative paths resolve against it)."""

    settings: Settings
    path: Path | None

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def resolve_path(self, value: str) -> Path:
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else (self.base_dir / path)

    @property
    def log_dir(self) -> Path:
        return self.resolve_path(self.settings.herder.log_dir)

    def where(self, loc: list[str]) -> str:
        """`file:line: key` for a key of this file, for a check made after loading (one
        that needs more than the settings module imports)."""
        try:
            text = self.path.read_text() if self.path is not None else ""
        except OSError:
            text = ""
        return _where(self, text, loc)

    def db_url(self, override: str | None = None) -> str:
        """--db, then HERDER_DB, then the config's [herder] db, then ./herder.db."""
        url = override or os.environ.get("HERDER_DB") or self.settings.herder.db
        if url is None:
            return DEFAULT_DB
        if not override and not os.environ.get("HERDER_DB") and url.startswith("sqlite:///"):
            rest = url[len("sqlite:///"):]
            if not rest.startswith("/"):
                return "sqlite:///" + str(self.resolve_path(rest))
        return url

    def hook_secrets(self, environ: Mapping[str, str]) -> dict[str, bytes]:
        """Each webhook source's secret, from its variable or file: `herder server` reads
        them at start and refuses to start without one (a source never accepts unsigned)."""
        from herder.runtime.hardening import check_secret_file

        secrets: dict[str, bytes] = {}
        for name, source in self.settings.hooks.sources.items():
            where = f"hooks.sources.{name}"
            if source.secret_env is not None:
                secret = environ.get(source.secret_env, "").strip().encode()
                if not secret:
                    raise InputError(f"{where}.secret_env",
                                     f"{source.secret_env} is not set or empty",
                                     f"export {source.secret_env} with the forge's secret")
            else:
                assert source.secret_file is not None, "checked when the config loaded"
                path = self.resolve_path(source.secret_file)
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

    def check_weight(self, weight: str, field: str = "weight") -> None:
        if weight not in self.settings.weights:
            known = ", ".join(sorted(self.settings.weights))
            raise InputError(field, f"unknown weight {weight!r}", f"use one of: {known}")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load herder.toml from `path`, HERDER_CONFIG or ./herder.toml; defaults if absent."""
    explicit = path is not None or bool(os.environ.get("HERDER_CONFIG"))
    candidate = Path(path or os.environ.get("HERDER_CONFIG") or CONFIG_FILE)
    if not candidate.exists():
        if explicit:
            raise ConfigError(str(candidate), "file not found", "run `herder init` to write one")
        return Config(Settings(), None)
    import tomllib  # only with a file to read: the parser is a few ms of every start

    text = candidate.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"{candidate}:{at.group(1)}" if at else str(candidate)
        raise ConfigError(where, f"invalid TOML: {exc}") from exc
    try:
        settings: Settings = build(Settings, data, [])
    except Invalid as exc:
        line = _line_of(text, exc.loc)
        where = f"{candidate}:{line}" if line else str(candidate)
        raise ConfigError(f"{where}: {'.'.join(exc.loc)}", exc.message) from exc
    config = Config(settings, candidate.resolve())
    _cross_check(config, text, data)
    return config


def _where(config: Config, text: str, loc: list[str]) -> str:
    line = _line_of(text, loc)
    prefix = f"{config.path}:{line}" if line else str(config.path)
    return f"{prefix}: {'.'.join(loc)}"


def _cross_check(config: Config, text: str, data: dict[str, Any]) -> None:
    """What one key cannot check alone: keys against each other, weights against
    [weights], files next to herder.toml. [weights] merges over the defaults, so the
    default chain and shedding name existing weights unless one was removed with `false`."""
    settings = config.settings
    runtime = settings.runtime
    if runtime.fence_margin is not None and runtime.fence_margin >= runtime.attempt_lease:
        raise ConfigError(
            _where(config, text, ["runtime", "fence_margin"]),
            f"fence_margin ({runtime.fence_margin:g}s) must be shorter than attempt_lease "
            f"({runtime.attempt_lease:g}s)",
            "lower runtime.fence_margin or raise runtime.attempt_lease")
    for index, entry in enumerate(runtime.pass_env):
        refusal = pass_env_refusal(entry, settings.server.api_token_env)
        if refusal is not None:
            raise ConfigError(_where(config, text, ["runtime", "pass_env", str(index)]),
                              refusal)
    if settings.defaults.weight not in settings.weights:
        raise ConfigError(
            _where(config, text, ["defaults", "weight"]),
            f"unknown weight {settings.defaults.weight!r}",
            f"define it under [weights] or use one of {sorted(settings.weights)}",
        )
    known = set(settings.weights)
    for name in runtime.nice:
        if name not in known:
            raise ConfigError(_where(config, text, ["runtime", "nice", name]),
                              f"unknown weight {name!r}", f"use one of {sorted(known)}")
    written = data.get("fleet", {})
    for name in settings.fleet.escalation:
        if name not in known:
            raise ConfigError(_where(config, text, ["fleet", "escalation"]),
                              _unknown_in(name, "escalation" in written, "escalation chain"),
                              f"use weights from [weights]: {sorted(known)}")
    for _ratio, weight in settings.fleet.shedding:
        if weight is not None and weight not in known:
            raise ConfigError(_where(config, text, ["fleet", "shedding"]),
                              _unknown_in(weight, "shedding" in written, "shedding steps"),
                              f"use \"any\" or one of {sorted(known)}")
    for name in settings.fleet.max_subagents_for_weight:
        if name not in known:
            raise ConfigError(_where(config, text, ["fleet", "max_subagents_for_weight", name]),
                              f"unknown weight {name!r}", f"use one of {sorted(known)}")
    for label, host in settings.hosts.items():
        for window in ("prime", "night"):
            weight = getattr(host, window).max_weight
            if weight is not None and weight not in known:
                raise ConfigError(_where(config, text, ["hosts", label, window, "max_weight"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        for weight in host.weights or ():
            if weight not in known:
                raise ConfigError(_where(config, text, ["hosts", label, "weights"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        if host.transport == "ssh" and not host.ssh_target:
            raise ConfigError(_where(config, text, ["hosts", label, "ssh_target"]),
                              "an ssh host needs ssh_target", "set ssh_target = \"user@host\"")
    _check_accounts(config, text)
    _check_hooks(config, text)
    capped = settings.server.max_reservation_weight
    if capped is not None and capped not in known:
        raise ConfigError(_where(config, text, ["server", "max_reservation_weight"]),
                          f"unknown weight {capped!r}", f"use one of {sorted(known)}")
    for name, job_type in settings.job_types.items():
        for key in ("weight", "submit_max_weight"):
            weight = getattr(job_type, key)
            if weight is not None and weight not in settings.weights:
                raise ConfigError(
                    _where(config, text, ["job_types", name, key]),
                    f"unknown weight {weight!r}",
                    f"define it under [weights] or use one of {sorted(settings.weights)}",
                )
        _check_pinned(config, text, name, job_type)
        if job_type.shell != isinstance(job_type.command, str):
            raise ConfigError(
                _where(config, text, ["job_types", name, "command"]),
                "shell = true needs a command string; otherwise the command is an argv list",
                "write command = [\"prog\", \"arg\"], or set shell = true with a string",
            )
        if job_type.prompt_file is not None and job_type.prompt_from == "submit":
            prompt = config.resolve_path(job_type.prompt_file)
            if not prompt.is_file():
                raise ConfigError(
                    _where(config, text, ["job_types", name, "prompt_file"]),
                    f"{prompt} does not exist",
                    "create the file or fix the path (relative to herder.toml)",
                )


def subagent_caps(settings: Settings) -> dict[str, int]:
    """Weight -> the subagent slots one job of it may hold on a host: the seed's, for the
    weights these settings define, with [fleet] max_subagents_for_weight over them; a
    weight without an entry (or with false) has no cap."""
    caps: dict[str, int | bool] = {name: cap for name, cap in SEED_SUBAGENT_CAPS.items()
                                   if name in settings.weights}
    caps.update(settings.fleet.max_subagents_for_weight)
    return {name: int(cap) for name, cap in caps.items() if cap is not False}


def _unknown_in(weight: str, written: bool, what: str) -> str:
    """A default chain or shedding step that names a weight removed with `= false` is
    refused like a written one, saying where the name came from."""
    if written:
        return f"unknown weight {weight!r}"
    return (f"unknown weight {weight!r} in the default {what} (removed under [weights]); "
            "write this key without it")


def _check_hooks(config: Config, text: str) -> None:
    """A rule's job type and weight must exist; a secret's variable must not reach jobs."""
    settings = config.settings
    for name, source in settings.hooks.sources.items():
        where = ["hooks", "sources", name]
        if source.secret_env is not None:
            for entry in settings.runtime.pass_env:
                refusal = pass_env_refusal(entry, source.secret_env)
                if refusal is not None:
                    raise ConfigError(_where(config, text, [*where, "secret_env"]),
                                      f"runtime.pass_env {refusal}")
        for index, rule in enumerate(source.rules):
            if rule.job_type not in settings.job_types:
                raise ConfigError(_where(config, text, [*where, "rules", str(index)]),
                                  f"job_type: unknown job type {rule.job_type!r}",
                                  f"define [job_types.{rule.job_type}] or use one of "
                                  f"{sorted(settings.job_types)}")
            if rule.weight is not None and rule.weight not in settings.weights:
                raise ConfigError(_where(config, text, [*where, "rules", str(index)]),
                                  f"weight: unknown weight {rule.weight!r}",
                                  f"use one of {sorted(settings.weights)}")


def _check_pinned(config: Config, text: str, name: str, job_type: JobTypeSection) -> None:
    """A type pinned to a host herder.toml declares must be one that host admits. A label
    the file does not declare may be a host added with `herder host add`, so it is not
    refused here (`herder server` warns at start when the store has no such host either)."""
    for label in job_type.hosts or ():
        host = config.settings.hosts.get(label)
        if host is not None and host.job_types is not None and name not in host.job_types:
            raise ConfigError(
                _where(config, text, ["job_types", name, "hosts"]),
                f"host {label!r} refuses job type {name!r} (hosts.{label}.job_types)",
                f"add {name!r} to hosts.{label}.job_types, or pin the type to another host")


def _check_accounts(config: Config, text: str) -> None:
    """An account a job type names must exist on some host, or the type could never run."""
    declared = {name for host in config.settings.hosts.values() for name in host.accounts}
    for name, job_type in config.settings.job_types.items():
        if isinstance(job_type.accounts, list):
            for account in job_type.accounts:
                if account not in declared:
                    raise ConfigError(
                        _where(config, text, ["job_types", name, "accounts"]),
                        f"no host has an account {account!r}",
                        "declare it under [hosts.LABEL.accounts." + account + "] or use one "
                        f"of {sorted(declared)}")


def _line_of(text: str, loc: list[str]) -> int | None:
    """Best-effort line number of a dotted key: find its table header, then the key."""
    lines = text.splitlines()
    for split in range(len(loc), -1, -1):
        table, keys = loc[:split], loc[split:]
        header = _find_header(lines, table) if table else -1
        if header is None:
            continue
        if not keys:
            return header + 1
        found = _find_key(lines, header + 1, keys)
        if found is not None:
            return found + 1
        if table:
            return header + 1
    if loc:  # a table that only appears through its sub-tables, like [job_types.x]
        header = _find_header(lines, loc, prefix=True)
        if header is not None:
            return header + 1
    return None


def _find_key(lines: list[str], start: int, keys: list[str]) -> int | None:
    """The line (0-based) from `start` to the next header that assigns `keys`, written
    plainly (`a = `), dotted (`a.b = `) or as an inline table (`a = { b = ... }`)."""
    for count in range(len(keys), 0, -1):
        dotted = r"\s*\.\s*".join(
            rf"(?:\"{re.escape(k)}\"|'{re.escape(k)}'|{re.escape(k)})" for k in keys[:count]
        )
        pattern = re.compile(rf"^\s*{dotted}\s*[=.]")
        for index in range(start, len(lines)):
            if _HEADER.match(lines[index]):
                break
            if pattern.match(lines[index]):
                return index
    return None


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]\s*(?:#.*)?$")


def _find_header(lines: list[str], table: list[str], prefix: bool = False) -> int | None:
    wanted = ".".join(table)
    for index, line in enumerate(lines):
        match = _HEADER.match(line)
        if match:
            name = ".".join(part.strip().strip("\"'") for part in match.group(1).split("."))
            if name == wanted or (prefix and name.startswith(wanted + ".")):
                return index
    return None


def sample_config() -> str:
    """The commented herder.toml that `herder init` writes."""
    from importlib import resources  # only `herder init` reads it; the import costs ~4 ms

    return resources.files("herder").joinpath("sample.toml").read_text()
