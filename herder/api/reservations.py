"""Subagent reservations and CI slots: RAM booked on a host outside the job table.

A non-admin token holds at most `server.max_reservations_per_token` of them at once, none
heavier than `server.max_reservation_weight`, and ends only those it made."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, HTTPException

from herder.api.depends import Operating, ReservationId, Submitter, call
from herder.core.access import (
    authorize_job_type,
    authorize_owner,
    authorize_reservation,
    held_by,
)
from herder.core.errors import NotFound
from herder.wire.reservations import (
    CompleteBody,
    ReservationEnded,
    ReserveBody,
    Reserved,
    SlotBody,
    SlotClaimed,
    SlotReleased,
)

router = APIRouter(prefix="/api/v1", tags=["reservations"])


@router.post("/reservations", status_code=201, response_model=Reserved)
async def reserve(body: ReserveBody, caller: Submitter, operations: Operating) -> Reserved:
    server = operations.config.settings.server
    authorize_reservation(caller, body.weight, operations.config.settings.weights,
                          server.max_reservation_weight)
    if body.job is not None and caller.job_types is not None:
        # as cancel and retry: a token limited to job types names only jobs of them (their
        # state is in the refusals below)
        authorize_job_type(caller, (await call(operations.get, body.job)).job_type)
    created_by, max_held = held_by(caller, server.max_reservations_per_token)
    created = await call(partial(operations.reserve, created_by=created_by, max_held=max_held),
                         body.owner, body.host, body.weight, body.count, body.job)
    return Reserved(reserved=created, requested=body.count)


@router.post("/reservations/{reservation_id}/complete", response_model=ReservationEnded)
async def complete(reservation_id: ReservationId, body: CompleteBody, caller: Submitter,
                   operations: Operating) -> ReservationEnded:
    existing = await call(operations.reservation, reservation_id)
    if existing is None:
        raise NotFound(f"no reservation {reservation_id}")
    authorize_owner(caller, existing)
    status = await call(partial(operations.complete_reservation, by=existing.created_by),
                        reservation_id, body.status)
    return ReservationEnded(id=reservation_id, status=status)


@router.post("/slots/claim", status_code=201, response_model=SlotClaimed)
async def slot_claim(body: SlotBody, caller: Submitter, operations: Operating) -> SlotClaimed:
    if body.host is None or body.weight is None:
        raise HTTPException(422, "host and weight are required to claim a slot")
    server = operations.config.settings.server
    authorize_reservation(caller, body.weight, operations.config.settings.weights,
                          server.max_reservation_weight)
    created_by, max_held = held_by(caller, server.max_reservations_per_token)
    slot_id = await call(partial(operations.claim_slot, created_by=created_by,
                                 max_held=max_held), body.run_id, body.host, body.weight)
    if max_held is not None:  # a run id another token holds is not handed over
        slot = await call(operations.reservation, slot_id)
        if slot is not None:
            authorize_owner(caller, slot)
    return SlotClaimed(id=slot_id, run_id=body.run_id, host=body.host)


@router.post("/slots/release", response_model=SlotReleased)
async def slot_release(body: SlotBody, caller: Submitter, operations: Operating) -> SlotReleased:
    held = await call(operations.ci_slot, body.run_id)
    if held is None:
        return SlotReleased(released=False)
    authorize_owner(caller, held)
    return SlotReleased(released=await call(partial(operations.release_slot,
                                                    by=held.created_by), body.run_id))
