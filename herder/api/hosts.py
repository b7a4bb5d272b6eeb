"""Operators' host routes."""

from __future__ import annotations

from fastapi import APIRouter

from herder.api.depends import Reader, Service, call
from herder.wire import HostView

router = APIRouter(prefix="/api/v1/hosts", tags=["hosts"])


@router.get("", response_model=list[HostView])
async def hosts(_caller: Reader, service: Service) -> list[HostView]:
    return await call(service.host_views)
