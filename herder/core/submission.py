"""What a submit carries, whoever sends it: the one list of submit fields with their defaults
and limits, and what the store can hold. No pydantic here: `herder submit` runs in scripts'
loops and builds a SubmitRequest; the API's `herder.wire.jobs.SubmitBody` declares the same
fields with these limits (a test keeps the two in step), and `herder.services.intake.resolve`
takes either."""

from __future__ import annotations

import math
from typing import Any

import msgspec

MAX_JSON_DEPTH = 32
NAME_LENGTH = 200
"""Longest job type, weight and host name in a submit."""
DEDUP_KEY_LENGTH = 1000
WORKDIR_LENGTH = 4096


def storable(value: Any, depth: int = 0) -> str | None:
    """Why a decoded JSON value cannot be stored (NUL in text, a lone surrogate, NaN,
    nesting), or None.

    PostgreSQL's text and jsonb hold no NUL character and only UTF-8 (JSON's "\\ud800"
    escape decodes to a surrogate that UTF-8 cannot encode), and JSON has no NaN: each would
    otherwise fail deep in the store as a server error instead of a 422 at the edge."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        if "\x00" in value:
            return "contains a NUL character"
        return None if value.isascii() or _encodes(value) else (
            "contains a lone surrogate (\\ud800-\\udfff): send UTF-8 text")
    if isinstance(value, float):
        return None if math.isfinite(value) else "is not a finite number"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = storable(key, depth + 1) or storable(item, depth + 1)
            if problem:
                return problem
    if isinstance(value, list | tuple):
        for item in value:
            problem = storable(item, depth + 1)
            if problem:
                return problem
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class SubmitRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A job to submit from Python or the command line; None means "the job type's or the
    config's default". Unvalidated: `herder.services.intake.resolve` checks every field and names
    the fix."""

    job_type: str | None = None
    command: list[str] | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    priority: int | None = None
    weight: str | None = None
    dedup_key: str | None = None
    force: bool = False
    affinity: str | None = None
    delay_seconds: float | None = None
    max_attempts: int | None = None
    timeout_seconds: float | None = None
    workdir: str | None = None
    env: dict[str, str] = msgspec.field(default_factory=dict)
