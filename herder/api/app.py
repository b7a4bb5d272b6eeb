"""The HTTP API, assembled: the routers by resource, the body-size limit, how errors map to
statuses, and the check that every route declares a scope. Store calls are synchronous and
run in the thread pool; long-polls are async and cost nothing while they wait, so one
process holds thousands of idle agents."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from herder.api import (
    accounts,
    agents,
    alerts,
    dashboard,
    fleet,
    health,
    hooks,
    hosts,
    jobs,
    metrics,
    queue,
    reservations,
)
from herder.api.board import AssignmentBoard
from herder.api.body import declared_over, read_within
from herder.api.depends import Access, Reader, Throttled, route_scope
from herder.api.guard import FailureLimiter, rebinding_refusal
from herder.core.errors import Conflict, HerderError, InputError, NotFound, Refused
from herder.runtime.coordinator import Coordinator
from herder.runtime.sessions import SessionBook
from herder.services.operations import Operations
from herder.store import lost_session_errors

__all__ = ["DOCUMENTS", "PAGES", "ROUTERS", "Access", "api_routes", "create_app",
           "document_routes", "page_routes", "route_scope"]

log = logging.getLogger("herder.api")
RETRY_AFTER_SECONDS = 5
ROUTERS: tuple[APIRouter, ...] = (health.router, jobs.router, hosts.router, agents.router,
                                  reservations.router, hooks.router, accounts.router,
                                  alerts.router, queue.router, metrics.router,
                                  dashboard.router, fleet.router)
document = APIRouter(include_in_schema=False)


@document.get("/openapi.json")
async def openapi(_caller: Reader, request: Request) -> JSONResponse:
    """The API's OpenAPI document, to read tokens only (no page renders it here)."""
    return JSONResponse(request.app.openapi())


PAGES: tuple[APIRouter, ...] = (dashboard.pages,)
"""The dashboard's pages: HTML, outside the OpenAPI document, each declaring its scope too."""
DOCUMENTS: tuple[APIRouter, ...] = (document,)
"""The OpenAPI document itself: outside the document, for readers."""
# What `herder.store.as_unavailable` counts as the database failing (psycopg_pool's
# PoolTimeout is a psycopg.OperationalError too).
DATABASE_ERRORS: tuple[type[Exception], ...] = (*lost_session_errors(psycopg),
                                                sqlite3.OperationalError)


class BodyLimit:
    """Refuse request bodies over a size with 413 before any route reads them.

    A declared Content-Length is judged at once; a chunked body is read up to the limit
    and replayed to the route, so nothing past the limit is ever buffered."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _plain(send, 400, "Content-Length is not a number")
                return
            if declared_over(declared, self.max_bytes):
                await _plain(send, 413, f"request body over {self.max_bytes} bytes")
                return
            await self.app(scope, receive, send)
            return
        buffered: list[Message] = []

        async def bodies() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                buffered.append(message)
                if message["type"] != "http.request":
                    return
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        if await read_within(bodies(), self.max_bytes) is None:
            await _plain(send, 413, f"request body over {self.max_bytes} bytes")
            return

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)


class HostGuard:
    """On a loopback server, refuse (403) a request whose `Host` is not a loopback name (or
    a proxy's, from [server] public_url) or whose `Origin` is another site's: DNS rebinding
    and cross-site requests from a browser on the same machine (herder.api.guard)."""

    def __init__(self, app: ASGIApp, names: tuple[str, ...]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: AsgiScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            host = headers.get(b"host")
            origin = headers.get(b"origin")
            refusal = rebinding_refusal(
                None if host is None else host.decode("latin-1"),
                None if origin is None else origin.decode("latin-1"), self.names)
            if refusal is not None:
                log.info("%s %s refused (403): %s", scope.get("method"), scope.get("path"),
                         refusal)
                await _plain(send, 403, refusal)
                return
        await self.app(scope, receive, send)


async def _plain(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _unavailable(exc: Exception) -> JSONResponse:
    # The message of a driver error may name the database's address; say only what the
    # caller can act on.
    log.warning("database unavailable: %s", type(exc).__name__)
    return JSONResponse({"detail": "the database is unavailable; retry later"},
                        status_code=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def _map_errors(app: FastAPI) -> None:
    @app.exception_handler(InputError)
    async def input_error(_request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=422)

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Conflict)
    async def conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(Refused)
    async def denied(request: Request, exc: Refused) -> JSONResponse:
        log.info("%s %s refused (%d): %s", request.method, request.url.path, exc.status,
                 exc.reason)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.reason}, status_code=exc.status, headers=headers)

    @app.exception_handler(Throttled)
    async def throttled(request: Request, exc: Throttled) -> JSONResponse:
        log.info("%s %s refused (429): %s", request.method, request.url.path, exc)
        return JSONResponse({"detail": str(exc)}, status_code=429,
                            headers={"Retry-After": str(exc.seconds)})

    @app.exception_handler(HerderError)
    async def herder_error(_request: Request, exc: HerderError) -> JSONResponse:
        return _unavailable(exc)

    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, lambda _request, exc: _unavailable(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input, which may hold a token or a secret env value.
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "invalid")}
                   for e in exc.errors()]
        return JSONResponse({"detail": details}, status_code=422)


def create_app(coordinator: Coordinator, access: Access | None = None,
               run_coordinator: bool = True) -> FastAPI:
    """The API over `coordinator`, which the app starts and stops with itself unless
    `run_coordinator` is False (`herder up --ui`: the dashboard beside a runner that does
    the scheduling). The operator's routes call the operations over the same store and
    config, which wake its scheduler and borrow its placements."""
    board = AssignmentBoard()
    # The scheduler tells the board which hosts got work; their agents' long-polls wake.
    coordinator.assignment_listeners.append(board.notify)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        board.bind(asyncio.get_running_loop())
        if not run_coordinator:
            yield
            return
        coordinator.start()
        try:
            yield
        finally:
            await run_in_threadpool(coordinator.stop)

    # No /docs, /redoc or public /openapi.json: the pages load scripts from a CDN on the
    # dashboard's origin, and the document is served to readers only (`openapi` below).
    # strict_content_type: a JSON body needs a JSON Content-Type, so a cross-site "simple"
    # request (text/plain, no preflight) never reaches a route.
    app = FastAPI(title="herder", version="0.1.0", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None, strict_content_type=True)
    app.state.coordinator = coordinator
    app.state.operations = Operations.over(coordinator.store, coordinator.config,
                                           on_change=coordinator.poke,
                                           placement=coordinator.reads.recent_placement)
    app.state.board = board
    app.state.access = access = access or Access()
    app.state.sessions = SessionBook(coordinator.store)
    app.state.failures = FailureLimiter(limit=access.failure_limit)
    coordinator.local_hosts.on_local_token = app.state.failures.verified  # its own agents' tokens
    app.add_middleware(BodyLimit, max_bytes=access.max_body_bytes)
    guard = access.host_guard()
    if guard is not None:
        app.add_middleware(HostGuard, names=guard)
    _map_errors(app)
    for route in [*api_routes(), *page_routes(), *document_routes()]:
        if not route_scope(route)[0]:
            raise RuntimeError(f"route {route.path} declares no scope")
    for router in (*ROUTERS, *PAGES, *DOCUMENTS):
        app.include_router(router)
    return app


def api_routes() -> list[APIRoute]:
    """Every route of the API (the app's own list holds the routers, not their routes)."""
    return routes_of(ROUTERS)


def page_routes() -> list[APIRoute]:
    """Every page of the dashboard (not in the OpenAPI document)."""
    return routes_of(PAGES)


def document_routes() -> list[APIRoute]:
    """The route of the OpenAPI document (not in the document either)."""
    return routes_of(DOCUMENTS)


def routes_of(routers: tuple[APIRouter, ...]) -> list[APIRoute]:
    return [route for router in routers for route in router.routes
            if isinstance(route, APIRoute)]
