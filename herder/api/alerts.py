"""Operators' alert route: open alerts (and, with `all`, recently cleared ones)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from herder.api.depends import Operating, Reader, call
from herder.services.views import alert_view
from herder.wire.alerts import AlertView

router = APIRouter(prefix="/api/v1/alerts", tags=["alerts"])


@router.get("", response_model=list[AlertView])
async def alerts(_caller: Reader, operations: Operating,
                 include_cleared: Annotated[bool, Query(alias="all")] = False,
                 limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[AlertView]:
    return [alert_view(alert) for alert in
            await call(operations.alerts, not include_cleared, limit)]
