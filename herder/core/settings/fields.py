"""What a settings field's annotation may say beyond its type: a duration, bounds
(`msgspec.Meta`) and `Rules` (a check of the value, of each item, a rewrite before), and the
checks several sections share."""

import math
import re
from collections.abc import Callable
from typing import Annotated, Any

from msgspec import Struct

_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?!s))?"
                       r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*(?:(\d+(?:\.\d+)?)\s*ms)?\s*$")
MAX_DURATION = 366 * 86400.0
"""The longest duration anything takes (a year and a day): longer is a typo."""
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A host label, job type, weight, account or source name."""
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


class Invalid(ValueError):
    """A value in the file that does not fit; `loc` is its path of keys."""

    def __init__(self, loc: list[str], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message


class Rules(Struct, frozen=True):
    """A field's checks beyond its type and bounds, written into its annotation
    (`Annotated[str, rules(check=...)]`): a Struct field has no metadata of its own."""

    check: Callable[[Any], Any] | None = None
    each: Callable[[Any], Any] | None = None
    before: Callable[[Any], Any] | None = None


def rules(*, check: Callable[[Any], Any] | None = None, each: Callable[[Any], Any] | None = None,
          before: Callable[[Any], Any] | None = None) -> Rules:
    """`check` of the value and `each` of its items (raise ValueError with the fix; an item's
    error names its index); `before` rewrites the raw value first."""
    return Rules(check, each, before)


def positive(what: str = "") -> Rules:
    """Greater than zero; `what` says what leaving the key out means, when that is allowed."""
    def check(value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"must be greater than zero{what}")
        return value
    return rules(check=check)


def names(pattern: re.Pattern[str], message: str) -> Callable[[Any], Any]:
    """A check that every key (or item) of a table (or list) matches `pattern`."""
    def check(value: Any) -> Any:
        for name in value:
            if not pattern.match(name):
                raise ValueError(message.format(name=name, upper=name.upper()))
        return value
    return check


env_names = names(ENV_NAME, "{name!r} is not a valid environment variable name")


def one_of(choices: tuple[str, ...]) -> Callable[[Any], Any]:
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise ValueError(f"{value!r}: use one of {', '.join(choices)}")
        return value
    return check


def env_name(value: str | None) -> str | None:
    if value is not None and not ENV_NAME.match(value):
        raise ValueError(f"{value!r} is not a valid environment variable name")
    return value


def pass_env_refusal(entry: str, secret: str = "HERDER_") -> str | None:
    """Why a `pass_env` entry is not allowed, or None. An entry is a variable name or a
    `PREFIX*` pattern; none may name or match herder's own variables (`secret` is a name or
    a prefix ending in `_`), which hold its credentials."""
    prefix = entry[:-1] if entry.endswith("*") else None
    name = entry if prefix is None else prefix
    if not (ENV_NAME.match(name) or (prefix == "")):
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
