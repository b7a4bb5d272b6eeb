"""TOML data -> the settings Structs: a walk over a section's fields that converts each
value the file sets the way pydantic's lax mode took it (numbers from numeric strings,
integral floats as ints), applies its bounds (`msgspec.Meta`) and its `Rules`, and runs the
section's own `__post_init__`; then the checks of keys against each other. Every error names
its key, so that the loader can name its line. msgspec's `convert` is not used for the walk:
its errors and its lax conversions are not the ones herder's users have been told."""

import math
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Union

from msgspec import Meta, Struct

from herder.core.errors import ConfigError
from herder.core.settings.fields import DURATION, Invalid, Rules, parse_duration, pass_env_refusal
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.sections import Settings

Where = Callable[[list[str]], str]
"""`file:line: key` for a key of the file being checked."""


_NO_RULES = Rules()
_NO_BOUNDS = Meta()
_FIELD_TYPES: dict[tuple[type[Struct], str], tuple[Any, Rules, Meta]] = {}


def _field_type(cls: type[Struct], name: str) -> tuple[Any, Rules, Meta]:
    """A field's type, its Rules and its bounds, read from its annotation (the sections
    keep theirs evaluated, so nothing is parsed here); only the keys a file sets are read."""
    key = (cls, name)
    if key not in _FIELD_TYPES:
        hint: Any = cls.__annotations__[name]
        marks = typing.get_args(hint)[1:] if typing.get_origin(hint) is Annotated else ()
        found = [mark for mark in marks if isinstance(mark, Rules)]
        bounds = [mark for mark in marks if isinstance(mark, Meta)]
        _FIELD_TYPES[key] = (hint, found[0] if found else _NO_RULES,
                             bounds[0] if bounds else _NO_BOUNDS)
    return _FIELD_TYPES[key]


def build(cls: type[Struct], data: Any, loc: list[str]) -> Any:
    """An instance of the settings Struct `cls` from a TOML table: unknown keys, missing
    required keys, wrong types and failed checks (the field's, then the section's
    `__post_init__`) raise Invalid naming the key."""
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
        hint, checks, bounds = _field_type(cls, name)
        values[name] = _field_value(checks, bounds, hint, data[name], [*loc, name])
    try:
        return cls(**values)
    except Invalid:
        raise
    except ValueError as exc:
        raise Invalid(loc, str(exc)) from exc


def _field_value(checks: Rules, bounds: Meta, hint: Any, raw: Any, loc: list[str]) -> Any:
    if checks.before is not None:
        raw = checks.before(raw)
    value = convert(hint, raw, loc)
    if value is not None:
        ge, gt, le = bounds.ge, bounds.gt, bounds.le
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


# -- keys against each other -----------------------------------------------------------------


def cross_check(settings: Settings, data: dict[str, Any], where: Where,
                resolve: Callable[[str], Path]) -> None:
    """What one key cannot check alone: keys against each other, weights against
    [weights], files next to herder.toml. [weights] merges over the defaults, so the
    default chain and shedding name existing weights unless one was removed with `false`."""
    runtime = settings.runtime
    if runtime.fence_margin is not None and runtime.fence_margin >= runtime.attempt_lease:
        raise ConfigError(
            where(["runtime", "fence_margin"]),
            f"fence_margin ({runtime.fence_margin:g}s) must be shorter than attempt_lease "
            f"({runtime.attempt_lease:g}s)",
            "lower runtime.fence_margin or raise runtime.attempt_lease")
    for index, entry in enumerate(runtime.pass_env):
        refusal = pass_env_refusal(entry, settings.server.api_token_env)
        if refusal is not None:
            raise ConfigError(where(["runtime", "pass_env", str(index)]),
                              refusal)
    if settings.defaults.weight not in settings.weights:
        raise ConfigError(
            where(["defaults", "weight"]),
            f"unknown weight {settings.defaults.weight!r}",
            f"define it under [weights] or use one of {sorted(settings.weights)}",
        )
    known = set(settings.weights)
    for name in runtime.nice:
        if name not in known:
            raise ConfigError(where(["runtime", "nice", name]),
                              f"unknown weight {name!r}", f"use one of {sorted(known)}")
    written = data.get("fleet", {})
    for name in settings.fleet.escalation:
        if name not in known:
            raise ConfigError(where(["fleet", "escalation"]),
                              _unknown_in(name, "escalation" in written, "escalation chain"),
                              f"use weights from [weights]: {sorted(known)}")
    for _ratio, weight in settings.fleet.shedding:
        if weight is not None and weight not in known:
            raise ConfigError(where(["fleet", "shedding"]),
                              _unknown_in(weight, "shedding" in written, "shedding steps"),
                              f"use \"any\" or one of {sorted(known)}")
    for name in settings.fleet.max_subagents_for_weight:
        if name not in known:
            raise ConfigError(where(["fleet", "max_subagents_for_weight", name]),
                              f"unknown weight {name!r}", f"use one of {sorted(known)}")
    for label, host in settings.hosts.items():
        for window in ("prime", "night"):
            weight = getattr(host, window).max_weight
            if weight is not None and weight not in known:
                raise ConfigError(where(["hosts", label, window, "max_weight"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        for weight in host.weights or ():
            if weight not in known:
                raise ConfigError(where(["hosts", label, "weights"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        if host.transport == "ssh" and not host.ssh_target:
            raise ConfigError(where(["hosts", label, "ssh_target"]),
                              "an ssh host needs ssh_target", "set ssh_target = \"user@host\"")
    _check_accounts(settings, where)
    _check_hooks(settings, where)
    capped = settings.server.max_reservation_weight
    if capped is not None and capped not in known:
        raise ConfigError(where(["server", "max_reservation_weight"]),
                          f"unknown weight {capped!r}", f"use one of {sorted(known)}")
    for name, job_type in settings.job_types.items():
        for key in ("weight", "submit_max_weight"):
            weight = getattr(job_type, key)
            if weight is not None and weight not in settings.weights:
                raise ConfigError(
                    where(["job_types", name, key]),
                    f"unknown weight {weight!r}",
                    f"define it under [weights] or use one of {sorted(settings.weights)}",
                )
        _check_pinned(settings, where, name, job_type)
        if job_type.shell != isinstance(job_type.command, str):
            raise ConfigError(
                where(["job_types", name, "command"]),
                "shell = true needs a command string; otherwise the command is an argv list",
                "write command = [\"prog\", \"arg\"], or set shell = true with a string",
            )
        if job_type.prompt_file is not None and job_type.prompt_from == "submit":
            prompt = resolve(job_type.prompt_file)
            if not prompt.is_file():
                raise ConfigError(
                    where(["job_types", name, "prompt_file"]),
                    f"{prompt} does not exist",
                    "create the file or fix the path (relative to herder.toml)",
                )


def _unknown_in(weight: str, written: bool, what: str) -> str:
    """A default chain or shedding step that names a weight removed with `= false` is
    refused like a written one, saying where the name came from."""
    if written:
        return f"unknown weight {weight!r}"
    return (f"unknown weight {weight!r} in the default {what} (removed under [weights]); "
            "write this key without it")


def _check_hooks(settings: Settings, where: Where) -> None:
    """A rule's job type and weight must exist; a secret's variable must not reach jobs."""
    for name, source in settings.hooks.sources.items():
        table = ["hooks", "sources", name]
        if source.secret_env is not None:
            for entry in settings.runtime.pass_env:
                refusal = pass_env_refusal(entry, source.secret_env)
                if refusal is not None:
                    raise ConfigError(where([*table, "secret_env"]),
                                      f"runtime.pass_env {refusal}")
        for index, rule in enumerate(source.rules):
            if rule.job_type not in settings.job_types:
                raise ConfigError(where([*table, "rules", str(index)]),
                                  f"job_type: unknown job type {rule.job_type!r}",
                                  f"define [job_types.{rule.job_type}] or use one of "
                                  f"{sorted(settings.job_types)}")
            if rule.weight is not None and rule.weight not in settings.weights:
                raise ConfigError(where([*table, "rules", str(index)]),
                                  f"weight: unknown weight {rule.weight!r}",
                                  f"use one of {sorted(settings.weights)}")


def _check_pinned(settings: Settings, where: Where, name: str,
                  job_type: JobTypeSection) -> None:
    """A type pinned to a host herder.toml declares must be one that host admits. A label
    the file does not declare may be a host added with `herder host add`, so it is not
    refused here (`herder server` warns at start when the store has no such host either)."""
    for label in job_type.hosts or ():
        host = settings.hosts.get(label)
        if host is not None and host.job_types is not None and name not in host.job_types:
            raise ConfigError(
                where(["job_types", name, "hosts"]),
                f"host {label!r} refuses job type {name!r} (hosts.{label}.job_types)",
                f"add {name!r} to hosts.{label}.job_types, or pin the type to another host")


def _check_accounts(settings: Settings, where: Where) -> None:
    """An account a job type names must exist on some host, or the type could never run."""
    declared = {name for host in settings.hosts.values() for name in host.accounts}
    for name, job_type in settings.job_types.items():
        if isinstance(job_type.accounts, list):
            for account in job_type.accounts:
                if account not in declared:
                    raise ConfigError(
                        where(["job_types", name, "accounts"]),
                        f"no host has an account {account!r}",
                        "declare it under [hosts.LABEL.accounts." + account + "] or use one "
                        f"of {sorted(declared)}")
