"""Operators' host routes: list, drain, enable."""

from __future__ import annotations

from fastapi import APIRouter

from herder.api.depends import Admin, HostLabel, Reader, Service, call
from herder.wire import HostSwitched, HostView

router = APIRouter(prefix="/api/v1/hosts", tags=["hosts"])


@router.get("", response_model=list[HostView])
async def hosts(_caller: Reader, service: Service) -> list[HostView]:
    return await call(service.host_views)


@router.post("/{label}/drain", response_model=HostSwitched)
async def drain(label: HostLabel, _caller: Admin, service: Service) -> HostSwitched:
    """Running jobs finish; nothing new is placed."""
    await call(service.operations.host_enable, label, False)
    return HostSwitched(label=label, enabled=False)


@router.post("/{label}/enable", response_model=HostSwitched)
async def enable(label: HostLabel, _caller: Admin, service: Service) -> HostSwitched:
    await call(service.operations.host_enable, label, True)
    return HostSwitched(label=label, enabled=True)
