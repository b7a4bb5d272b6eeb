"""What a webhook delivery (`/hooks/…`) did."""

from __future__ import annotations

from pydantic import Field

from herder.wire.base import (
    Reply,
)


class HookReply(Reply):
    """What a webhook delivery did: `enqueued` (202; `created` are the new jobs, the rest
    were held by their dedup keys), `duplicate` (200: seen before, nothing changed;
    `jobs` are what it enqueued then), `ignored` (202: no rule matched) or `pong`."""

    outcome: str
    delivery: str | None = None
    jobs: list[int] = Field(default=[])
    created: list[int] = Field(default=[])

