"""Reservations and CI slots (`/api/v1/reservations`, `/api/v1/slots`)."""

from __future__ import annotations

from pydantic import Field

from herder.core.model import (
    BIGINT_MAX,
    ReservationStatus,
)
from herder.wire.base import (
    Body,
    Reply,
)


class ReserveBody(Body):
    owner: str = Field(min_length=1, max_length=200)
    host: str = Field(max_length=200)
    count: int = Field(ge=1, le=1000)
    weight: str = Field(default="subagent", max_length=200)
    job: int | None = Field(default=None, ge=1, le=BIGINT_MAX)
    """The running job that books them: its weight caps them (max_subagents_for_weight)."""


class Reserved(Reply):
    reserved: list[int]
    """The ids of the slots that fit (maybe fewer than requested)."""
    requested: int


class CompleteBody(Body):
    status: ReservationStatus


class ReservationEnded(Reply):
    id: int
    status: ReservationStatus


class SlotBody(Body):
    run_id: str = Field(min_length=1, max_length=200)
    host: str | None = Field(default=None, max_length=200)
    weight: str | None = Field(default=None, max_length=200)


class SlotClaimed(Reply):
    id: int
    run_id: str
    host: str


class SlotReleased(Reply):
    released: bool

