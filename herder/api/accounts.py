"""Operators' account routes: the accounts as `herder accounts` lists them; add, remove,
clear as `herder account` does them (admin: an account's env may hold secrets)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from herder.api.depends import HOST_LABEL, Admin, HostLabel, Operating, Reader, call
from herder.core.model import Account
from herder.wire.accounts import AccountBody, AccountChanged, AccountView

router = APIRouter(prefix="/api/v1/accounts", tags=["accounts"])
AccountName = Annotated[str, Path(pattern=HOST_LABEL)]


@router.get("", response_model=list[AccountView])
async def accounts(_caller: Reader, operations: Operating,
                   host: Annotated[str | None, Query(pattern=HOST_LABEL)] = None
                   ) -> list[AccountView]:
    return await call(operations.accounts, host)


@router.put("/{label}/{name}", response_model=AccountChanged)
async def add(label: HostLabel, name: AccountName, body: AccountBody, _caller: Admin,
              operations: Operating) -> AccountChanged:
    """Add or update; the env values are stored, never shown again."""
    account = Account(label, name, dict(body.env), body.max_sessions,
                      None if body.job_types is None else frozenset(body.job_types) or None,
                      None if body.probe is None else tuple(body.probe), "cli")
    await call(operations.account_add, account)
    return AccountChanged(host=label, name=name, changed=True)


@router.delete("/{label}/{name}", response_model=AccountChanged)
async def remove(label: HostLabel, name: AccountName, _caller: Admin,
                 operations: Operating) -> AccountChanged:
    await call(operations.account_remove, label, name)
    return AccountChanged(host=label, name=name, changed=True)


@router.post("/{label}/{name}/clear", response_model=AccountChanged)
async def clear(label: HostLabel, name: AccountName, _caller: Admin,
                operations: Operating) -> AccountChanged:
    """Clear `depleted` and `auth_revoked` once a human fixed the account."""
    cleared = await call(operations.account_clear, label, name)
    return AccountChanged(host=label, name=name, changed=cleared)
