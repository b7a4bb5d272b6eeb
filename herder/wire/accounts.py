"""Operators' account bodies (`/api/v1/accounts`): add, clear, and an account's view."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from herder.wire.base import (
    Body,
    Int32,
    Name,
    Reply,
    Timestamp,
)


class AccountBody(Body):
    """`herder account add`'s options; the server validates them as the CLI does."""

    env: dict[Name, Annotated[str, Field(max_length=10_000)]] = Field(default_factory=dict,
                                                                      max_length=1000)
    max_sessions: Int32 = 1
    job_types: list[Name] | None = Field(default=None, max_length=1000)
    probe: list[Annotated[str, Field(max_length=10_000)]] | None = Field(default=None,
                                                                         max_length=1000)


class AccountChanged(Reply):
    host: str
    name: str
    changed: bool
    """add: always; clear: False when it was healthy already."""


class AccountState(Reply):
    """What `herder accounts` and the queue's summary (`QueueAccount`) both show of an
    account: where it is, its state and its sessions."""

    host: str
    name: str
    state: str
    detail: str
    sessions: int
    max_sessions: int


class AccountView(AccountState):
    """An account as `herder accounts` shows it: never its environment's values."""

    job_types: list[str] | None
    source: str
    depleted_until: Timestamp | None
    auth_revoked_at: Timestamp | None
    dead_token: bool | None
    usage_percent: float | None = None
    """The share of its quota used, as its probe last said (None: unknown)."""
    usage_resets_at: Timestamp | None = None

