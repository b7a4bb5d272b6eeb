"""`GET /queue`: the fleet at a glance (counts and recent jobs, with hosts,
breakers, preflight, accounts and open alerts), for a read token."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from herder.api.depends import Reader, Service, call
from herder.wire.queue import QueueView

router = APIRouter(tags=["queue"])


@router.get("/queue", response_model=QueueView)
async def queue(_caller: Reader, service: Service,
                recent: Annotated[int | None, Query(ge=0, le=1000)] = None) -> QueueView:
    """Counts by GROUP BY (only the counts come back) and the newest `recent` jobs
    ([server] queue_recent) by LIMIT: no job rows read into the server but those."""
    limit = service.settings.server.queue_recent if recent is None else recent
    return await call(service.reads.queue_view, limit)
