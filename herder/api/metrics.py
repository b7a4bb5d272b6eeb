"""`GET /metrics`: Prometheus text format (herder.runtime.metrics). A read token by default,
as a scraper can send (`authorization.credentials_file` in Prometheus); `[server]
metrics_public = true` serves it without one, on purpose."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response

from herder.api.depends import Service, call, operator
from herder.core.model import Scope
from herder.runtime.metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"])
_read = operator(Scope.READ).dependency


async def scraper(request: Request,
                  authorization: Annotated[str | None, Header()] = None) -> None:
    """A read token, unless `[server] metrics_public` opens the route."""
    if not request.app.state.coordinator.settings.server.metrics_public:
        await _read(request, authorization)


scraper.herder_scope = Scope.READ  # type: ignore[attr-defined]


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {CONTENT_TYPE: {}},
                             "description": "Prometheus text exposition format"}})
async def metrics(_caller: Annotated[None, Depends(scraper)], service: Service) -> Response:
    return Response(await call(service.metrics.render), media_type=CONTENT_TYPE)
