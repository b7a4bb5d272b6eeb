"""[hooks]: forge webhooks (`POST /hooks/NAME`) that enqueue jobs, and the template syntax
their rules are written in (dotted paths of the event JSON)."""

import re
import string
from typing import Annotated

from msgspec import Meta, Struct, field

from herder.core.settings.fields import NAME, Duration, env_name, names, one_of, rules

_FORMATTER = string.Formatter()
_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


def template_paths(template: str) -> list[str]:
    """The dotted paths a template reads; ValueError naming the fix for bad syntax (checked
    when herder.toml loads)."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template {template!r}: {exc}; escape literal braces as "
                         "{{ and }}") from None
    paths = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not _PATH.match(name) or spec or conversion:
            raise ValueError(f"{{{name}}} in {template!r} is not a dotted path; write e.g. "
                             "{issue.number} or {repository.full_name}")
        paths.append(name)
    return paths


def _hook_template(value: str | None) -> str | None:
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

    kind: Annotated[str, rules(check=one_of(("github", "gitea", "generic")))]
    secret_env: Annotated[str | None, rules(check=env_name)] = None
    secret_file: str | None = None
    secret: Annotated[str | None, rules(check=_no_inline_secret)] = None
    rules: list[HookRuleSection] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.secret_env is None) == (self.secret_file is None):
            raise ValueError("a source needs one secret: set secret_env = "
                             "\"HERDER_HOOK_NAME_SECRET\" or secret_file = \"path\"")


class HooksSection(Struct, frozen=True):
    """[hooks]: forge webhooks (`POST /hooks/NAME`) that enqueue jobs."""

    retention: Annotated[Duration, Meta(gt=0)] = 7 * 86400.0
    """How long a delivery id is remembered (a replay within it enqueues nothing)."""
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1024**3)] = 1024 * 1024
    """Larger deliveries are refused with 413 (server.max_body_bytes caps them too)."""
    sources: Annotated[dict[str, HookSourceSection], rules(
        check=names(NAME, "{name!r} is not a valid source name"))] = field(default_factory=dict)
