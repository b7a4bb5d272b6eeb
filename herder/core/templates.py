"""Job type templates filled from a job's payload: `{field}` placeholders, argv parts that
appear only when their fields are set, and prompt text.

Pure functions: the submit path (herder.services.intake) and the host that prepares a workspace
(herder.runtime.workspace) fill the same templates the same way.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from herder.core.errors import InputError

_FORMATTER = string.Formatter()
_PROMPT_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")

CommandPart = str | Sequence[str]
"""An argv item, or an optional group: a list of items kept only when every field its
placeholders name is set (e.g. ["--model", "{model}"])."""


def placeholders(template: str) -> list[str]:
    """The field names a template fills; ValueError names the first bad placeholder."""
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise ValueError(f"bad template {template!r}: {exc}; escape literal braces as {{{{ "
                         "and }}") from None
    names: list[str] = []
    for _literal, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(f"placeholder {{{name}}} in {template!r} is not a plain name; "
                             "use {field} with a payload field name")
        names.append(name)
    return names


def render(template: str, context: Mapping[str, Any], where: str,
           keep: Collection[str] = ()) -> str:
    """Fill {name} placeholders; only plain names, so a payload cannot reach attributes.

    Names in `keep` stay placeholders, filled later (a prompt read on the host that runs
    the job): the result is then itself a template, every other brace escaped."""
    out: list[str] = []
    try:
        parsed = list(_FORMATTER.parse(template))
    except ValueError as exc:
        raise InputError(where, f"bad template {template!r}: {exc}",
                         "escape literal braces as {{ and }}") from exc

    def literal_text(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}") if keep else text

    for literal, name, spec, conversion in parsed:
        out.append(literal_text(literal))
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise InputError(where, f"placeholder {{{name}}} is not a plain name",
                             "use {field} with a payload field name")
        if name in keep:
            out.append(f"{{{name}}}")
            continue
        if name not in context:
            raise InputError(
                f"payload.{name}", f"{where} needs payload field {name!r}",
                f"pass -p {name}=... or --payload '{{\"{name}\": ...}}'",
            )
        out.append(literal_text(text(context[name])))
    return "".join(out)


def text(value: Any) -> str:
    """A payload value as it appears in a command: strings as they are, the rest as JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def is_set(context: Mapping[str, Any], name: str) -> bool:
    """A field counts as set when present, not null and not empty (the shell's `${X:+...}`)."""
    return context.get(name) not in (None, "")


def leading_fields(template: str) -> list[str]:
    """The fields whose placeholders open the item, before any literal text (`{a}{b}-x`:
    a and b): what decides whether the rendered item starts with '-'."""
    names: list[str] = []
    for literal, name, _spec, _conversion in _FORMATTER.parse(template):
        if literal or name is None:
            break
        names.append(name)
    return names


def leading_dash_refusal(names: Sequence[str], rendered: str, where: str,
                         options: Collection[str]) -> None:
    """An argument that starts with payload text is read by the program as an option when
    it starts with '-' (`--basetemp=/home`), whether the value is the whole argument, the
    first of several joined (`{a}{b}` with a empty) or quoted (`"{path}"`); refused unless
    every field that opens it is one of `options`."""
    if not names or not rendered.startswith("-") or all(name in options for name in names):
        return
    name = next(name for name in names if name not in options)
    raise InputError(
        f"payload.{name}", f"{rendered[:40]!r} starts with '-' and {where} passes it at the "
        "start of an argument, where the program would read it as an option",
        f"pass a value that does not start with '-', or list {name!r} in the job type's "
        "option_fields if it is meant to carry options")


def render_argv(parts: Sequence[CommandPart], context: Mapping[str, Any], where: str,
                keep: Collection[str] = (), options: Collection[str] | None = None,
                ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """A job type's argv list filled from `context`, and the indexes of the items that
    still hold a `keep` placeholder. An optional group (a nested list) is left out unless
    every field it names is set; a plain item's missing field is an input error. An item
    that starts with a placeholder may not render to text that starts with '-' unless its
    opening fields are all in `options` (None: no check, for text herder itself filled)."""
    argv: list[str] = []
    deferred: list[int] = []
    for part in parts:
        items = [part] if isinstance(part, str) else list(part)
        if not isinstance(part, str):
            wanted = {name for item in items for name in _names(item, where)}
            if not all(name in keep or is_set(context, name) for name in wanted):
                continue
        for item in items:
            holds = bool(set(_names(item, where)) & set(keep))
            if holds:
                deferred.append(len(argv))
            rendered = render(item, context, where, keep if holds else ())
            if options is not None and not holds:
                leading_dash_refusal(leading_fields(item), rendered, where, options)
            argv.append(rendered)
    return tuple(argv), tuple(deferred)


def _names(template: str, where: str) -> list[str]:
    try:
        return placeholders(template)
    except ValueError as exc:
        raise InputError(where, str(exc), "fix the job type in herder.toml") from exc


def check_command(parts: Sequence[CommandPart]) -> None:
    """What herder.toml's argv list must be: a program first, then items and optional
    groups, each group naming at least one field; ValueError names the item."""
    for index, part in enumerate(parts):
        if isinstance(part, str):
            placeholders(part)
            continue
        if index == 0:
            raise ValueError("command.0: the program comes first and cannot be optional")
        if not part:
            raise ValueError(f"command.{index}: an optional group is empty; remove it")
        names = [name for item in part for name in placeholders(item)]
        if not names:
            raise ValueError(f"command.{index}: an optional group names no {{field}}, so "
                             "nothing decides whether it appears; make its items plain")


def fill_prompt(template: str, context: Mapping[str, Any], where: str) -> str:
    """A prompt's text with its `{field}` placeholders filled from the payload. Looser
    than a command: a brace that does not wrap a plain name stays as written (code and
    JSON in a prompt need no escaping); `{{` and `}}` give a literal brace around a name."""
    def fill(match: re.Match[str]) -> str:
        whole, name = match.group(0), match.group(1)
        if name is None:
            return whole[0]
        if name not in context:
            raise InputError(
                f"payload.{name}", f"{where} needs payload field {name!r}",
                f"pass -p {name}=... or --payload '{{\"{name}\": ...}}'",
            )
        return text(context[name])

    return _PROMPT_PLACEHOLDER.sub(fill, template)
