"""`/api/v1/fleet/cap`: the fleet-wide cap on running jobs (`[fleet] emergency_max_workers`),
read with a read token, set, lifted or handed back to herder.toml by an admin."""

from __future__ import annotations

from fastapi import APIRouter

from herder.api.depends import Admin, Operating, Reader, call
from herder.wire.fleet import FleetCapBody, FleetCapView

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])


@router.get("/cap", response_model=FleetCapView)
async def cap(_caller: Reader, operations: Operating) -> FleetCapView:
    return await call(operations.fleet_cap)


@router.put("/cap", response_model=FleetCapView)
async def set_cap(body: FleetCapBody, caller: Admin, operations: Operating) -> FleetCapView:
    """A number caps new starts at once on every replica (running jobs go on); null lifts
    the cap. It holds over herder.toml, across restarts, until changed or reset."""
    return await call(operations.fleet_cap_set, body.max_workers, caller.name)


@router.delete("/cap", response_model=FleetCapView)
async def reset_cap(_caller: Admin, operations: Operating) -> FleetCapView:
    """Back to herder.toml's `[fleet] emergency_max_workers`."""
    return await call(operations.fleet_cap_reset)
