"""One bounded reader of request bodies: the server-wide limit (`BodyLimit`) and a webhook
source's own both read through it, so nothing past a limit is ever buffered."""

from __future__ import annotations

from collections.abc import AsyncIterable


def declared_over(declared: str | bytes | None, limit: int) -> bool:
    """Whether a Content-Length header declares more than `limit` bytes."""
    return declared is not None and declared.isdigit() and int(declared) > limit


async def read_within(chunks: AsyncIterable[bytes], limit: int) -> bytes | None:
    """The chunks joined; None as soon as they pass `limit` (the rest is never read)."""
    kept: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            return None
        kept.append(chunk)
    return b"".join(kept)
