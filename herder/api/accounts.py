"""Operators' account route: the accounts as `herder accounts` lists them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from herder.api.depends import HOST_LABEL, Reader, Service, call
from herder.wire import AccountView

router = APIRouter(prefix="/api/v1/accounts", tags=["accounts"])


@router.get("", response_model=list[AccountView])
async def accounts(_caller: Reader, service: Service,
                   host: Annotated[str | None, Query(pattern=HOST_LABEL)] = None
                   ) -> list[AccountView]:
    return await call(service.operations.accounts, host)
