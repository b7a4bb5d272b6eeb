"""`/api/v1/fleet/cap`: the fleet-wide cap on running jobs (`[fleet] emergency_max_workers`),
read with a read token, set, lifted or handed back to herder.toml by an admin."""

from __future__ import annotations

from fastapi import APIRouter

from herder.api.depends import Admin, Reader, Service, call
from herder.wire.fleet import FleetCapBody, FleetCapView

router = APIRouter(prefix="/api/v1/fleet", tags=["fleet"])


@router.get("/cap", response_model=FleetCapView)
async def cap(_caller: Reader, service: Service) -> FleetCapView:
    return await call(service.operations.fleet_cap)


@router.put("/cap", response_model=FleetCapView)
async def set_cap(body: FleetCapBody, caller: Admin, service: Service) -> FleetCapView:
    """A number caps new starts at once on every replica (running jobs go on); null lifts
    the cap. It holds over herder.toml, across restarts, until changed or reset."""
    view = await call(service.operations.fleet_cap_set, body.max_workers, caller.name)
    service.poke()  # a lifted cap places the waiting work now, not at the next tick
    return view


@router.delete("/cap", response_model=FleetCapView)
async def reset_cap(_caller: Admin, service: Service) -> FleetCapView:
    """Back to herder.toml's `[fleet] emergency_max_workers`."""
    view = await call(service.operations.fleet_cap_reset)
    service.poke()
    return view
