"""Subagent reservations and CI slots: RAM booked on a host outside the job table."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from herder.api.depends import ReservationId, Service, Submitter, call
from herder.wire import (
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
async def reserve(body: ReserveBody, _caller: Submitter, service: Service) -> Reserved:
    created = await call(service.operations.reserve, body.owner, body.host, body.weight,
                         body.count)
    return Reserved(reserved=created, requested=body.count)


@router.post("/reservations/{reservation_id}/complete", response_model=ReservationEnded)
async def complete(reservation_id: ReservationId, body: CompleteBody, _caller: Submitter,
                   service: Service) -> ReservationEnded:
    status = await call(service.operations.complete_reservation, reservation_id, body.status)
    return ReservationEnded(id=reservation_id, status=status)


@router.post("/slots/claim", status_code=201, response_model=SlotClaimed)
async def slot_claim(body: SlotBody, _caller: Submitter, service: Service) -> SlotClaimed:
    if body.host is None or body.weight is None:
        raise HTTPException(422, "host and weight are required to claim a slot")
    slot_id = await call(service.operations.claim_slot, body.run_id, body.host, body.weight)
    return SlotClaimed(id=slot_id, run_id=body.run_id, host=body.host)


@router.post("/slots/release", response_model=SlotReleased)
async def slot_release(body: SlotBody, _caller: Submitter, service: Service) -> SlotReleased:
    return SlotReleased(released=await call(service.operations.release_slot, body.run_id))
