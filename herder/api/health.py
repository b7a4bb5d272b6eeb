"""`/healthz`: no token, no secrets."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from herder.api.depends import Service, public
from herder.wire.health import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", dependencies=[Depends(public)], response_model=Health,
            responses={503: {"model": Health, "description": "a loop is stale or dead"}})
async def healthz(service: Service) -> JSONResponse:
    """503 while any loop of the server is stale or dead."""
    health = Health.model_validate(service.reads.health_view())
    return JSONResponse(health.model_dump(mode="json"),
                        status_code=200 if health.ok else 503)
