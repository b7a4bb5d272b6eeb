"""Operators' host routes: list, add, set, remove, a new agent token, drain, enable."""

from __future__ import annotations

from fastapi import APIRouter

from herder.api.depends import Admin, HostLabel, Operating, Reader, call
from herder.wire.hosts import (
    HostAddBody,
    HostChanged,
    HostSettingsBody,
    HostSwitched,
    HostToken,
    HostView,
)

router = APIRouter(prefix="/api/v1/hosts", tags=["hosts"])


@router.get("", response_model=list[HostView])
async def hosts(_caller: Reader, operations: Operating) -> list[HostView]:
    return await call(operations.hosts)


@router.post("", status_code=201, response_model=HostToken)
async def add(body: HostAddBody, _caller: Admin, operations: Operating) -> HostToken:
    """The answer holds the host's agent token, once (only its hash is kept)."""
    token = await call(operations.host_add, body.label, body.settings(), body.enabled)
    return HostToken(label=body.label, token=token)


@router.patch("/{label}", response_model=HostChanged)
async def change(label: HostLabel, body: HostSettingsBody, _caller: Admin,
                 operations: Operating) -> HostChanged:
    await call(operations.host_set, label, body.settings())
    return HostChanged(label=label)


@router.delete("/{label}", response_model=HostChanged)
async def remove(label: HostLabel, _caller: Admin, operations: Operating) -> HostChanged:
    """409 while jobs are claimed or running on it; its agent tokens are revoked."""
    await call(operations.host_remove, label)
    return HostChanged(label=label)


@router.post("/{label}/token", response_model=HostToken)
async def new_agent_token(label: HostLabel, _caller: Admin, operations: Operating) -> HostToken:
    """A new agent token, once; the host's old ones stop working."""
    return HostToken(label=label, token=await call(operations.host_token, label))


@router.post("/{label}/drain", response_model=HostSwitched)
async def drain(label: HostLabel, _caller: Admin, operations: Operating) -> HostSwitched:
    """Running jobs finish; nothing new is placed."""
    await call(operations.host_enable, label, False)
    return HostSwitched(label=label, enabled=False)


@router.post("/{label}/enable", response_model=HostSwitched)
async def enable(label: HostLabel, _caller: Admin, operations: Operating) -> HostSwitched:
    await call(operations.host_enable, label, True)
    return HostSwitched(label=label, enabled=True)
