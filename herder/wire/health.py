"""`/healthz`: the server's loops and whether each had a recent good cycle."""

from __future__ import annotations

from herder.wire.base import (
    Reply,
)


class LoopView(Reply):
    ok: bool
    age_seconds: float
    stale_after_seconds: float
    failures: int
    last_error: str | None
    ended: bool


class Health(Reply):
    """`/healthz`: ok only while every loop of the server has had a recent good cycle."""

    ok: bool
    leader: bool
    fatal: str | None
    loops: dict[str, LoopView]

