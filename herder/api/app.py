"""The HTTP API. Store calls are synchronous and run in the thread pool; long-polls are
async and cost nothing while they wait, so one process holds thousands of idle agents."""


import asyncio
import json
import logging
import math
import sqlite3
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

import psycopg
import psycopg_pool
from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Send
from starlette.types import Scope as AsgiScope

from herder.api.tokens import (
    ANONYMOUS_ADMIN,
    LEGACY_ADMIN,
    Caller,
    Denied,
    authorize,
    authorize_job_type,
    authorize_submit,
    identify,
    plausible_token,
    same_secret,
    token_hash,
)
from herder.config import MAX_DURATION
from herder.errors import Conflict, HerderError, InputError, NotFound
from herder.intake import INT_MAX, INT_MIN, SubmitRequest, resolve
from herder.model import (
    AttemptToken,
    JobStatus,
    Outcome,
    ReservationStatus,
    Scope,
)
from herder.runtime.coordinator import Coordinator
from herder.runtime.maintenance import WorkerId
from herder.views import attempt_view, event_view, job_view

log = logging.getLogger("herder.api")
T = TypeVar("T")
BIGINT_MAX = 2**63 - 1
RETRY_AFTER_SECONDS = 5
MAX_JSON_DEPTH = 32

JobId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
AttemptNumber = Annotated[int, Path(ge=1, le=INT_MAX)]
ReservationId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION, allow_inf_nan=False)]
Int32 = Annotated[int, Field(ge=INT_MIN, le=INT_MAX)]


def now() -> datetime:
    return datetime.now(UTC)


def storable(value: Any, depth: int = 0) -> str | None:
    """Why a decoded JSON value cannot be stored (NUL in text, NaN, nesting), or None.

    PostgreSQL's text and jsonb hold no NUL character and JSON has no NaN; both would
    otherwise fail deep in the store as a server error instead of a 422 here."""
    if depth > MAX_JSON_DEPTH:
        return f"nested deeper than {MAX_JSON_DEPTH} levels"
    if isinstance(value, str):
        return "contains a NUL character" if "\x00" in value else None
    if isinstance(value, float):
        return None if math.isfinite(value) else "is not a finite number"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = storable(key, depth + 1) or storable(item, depth + 1)
            if problem:
                return problem
    if isinstance(value, list | tuple):
        for item in value:
            problem = storable(item, depth + 1)
            if problem:
                return problem
    return None


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = storable(data)
        if problem:
            raise ValueError(f"the body {problem}")
        return data


class SubmitBody(Body):
    job_type: str | None = Field(default=None, max_length=200)
    command: list[str] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: Int32 | None = None
    weight: str | None = Field(default=None, max_length=200)
    dedup_key: str | None = Field(default=None, max_length=1000)
    force: bool = False
    affinity: str | None = Field(default=None, max_length=200)
    delay_seconds: Seconds | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=INT_MAX)
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_DURATION,
                                            allow_inf_nan=False)] | None = None
    workdir: str | None = Field(default=None, max_length=4096)
    env: dict[str, str] = Field(default_factory=dict)


class HeartbeatBody(Body):
    worker: str = Field(max_length=400)
    running: list[tuple[Annotated[int, Field(ge=1, le=BIGINT_MAX)],
                        Annotated[int, Field(ge=1, le=INT_MAX)]]] = Field(
        default_factory=list, max_length=100_000)
    info: dict[str, Any] = Field(default_factory=dict)
    with_attempts: bool = False
    """Also list every live attempt of the host (an agent asks once, when it starts)."""


class StartBody(Body):
    pid: int = Field(ge=0, le=INT_MAX)
    log_path: str | None = Field(default=None, max_length=4096)


class FinishBody(Body):
    outcome: Outcome
    exit_code: Int32 | None = None
    retry_after: Seconds | None = None
    detail: str | None = Field(default=None, max_length=10_000)


class ReserveBody(Body):
    owner: str = Field(min_length=1, max_length=200)
    host: str = Field(max_length=200)
    count: int = Field(ge=1, le=1000)
    weight: str = Field(default="subagent", max_length=200)


class CompleteBody(Body):
    status: ReservationStatus


class SlotBody(Body):
    run_id: str = Field(min_length=1, max_length=200)
    host: str | None = Field(default=None, max_length=200)
    weight: str | None = Field(default=None, max_length=200)


@dataclass(frozen=True)
class Access:
    """How the server authenticates callers."""

    open_access: bool = False
    """--insecure-no-auth (loopback only): a request without a token acts as admin."""
    legacy_admin_token: str | None = None
    """HERDER_API_TOKEN, kept working as an admin token (deprecated)."""
    max_body_bytes: int = 1024 * 1024


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
            if int(declared) > self.max_bytes:
                await _plain(send, 413, f"request body over {self.max_bytes} bytes")
                return
            await self.app(scope, receive, send)
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await _plain(send, 413, f"request body over {self.max_bytes} bytes")
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)


async def _plain(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def route_scope(route: APIRoute) -> tuple[bool, Scope | None]:
    """(declared, scope) of a route: every route must declare one, None meaning public."""
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        call = dependency.call
        if call is not None and hasattr(call, "herder_scope"):
            return True, call.herder_scope
        pending.extend(dependency.dependencies)
    return False, None


DATABASE_ERRORS: tuple[type[Exception], ...] = (
    psycopg.OperationalError, psycopg_pool.PoolTimeout, sqlite3.OperationalError)


def create_app(coordinator: Coordinator, access: Access | None = None) -> FastAPI:
    store = coordinator.store
    config = coordinator.config
    access = access or Access()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        coordinator.board.bind(asyncio.get_running_loop())
        coordinator.start()
        try:
            yield
        finally:
            await run_in_threadpool(coordinator.stop)

    app = FastAPI(title="herder", version="0.1.0", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=access.max_body_bytes)

    @app.exception_handler(InputError)
    async def input_error(_request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=422)

    @app.exception_handler(NotFound)
    async def not_found(_request: Request, exc: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(Conflict)
    async def conflict(_request: Request, exc: Conflict) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(Denied)
    async def denied(request: Request, exc: Denied) -> JSONResponse:
        log.info("%s %s refused (%d): %s", request.method, request.url.path, exc.status,
                 exc.reason)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse({"detail": exc.reason}, status_code=exc.status, headers=headers)

    def unavailable(exc: Exception) -> JSONResponse:
        # The message of a driver error may name the database's address; say only what
        # the caller can act on.
        log.warning("database unavailable: %s", type(exc).__name__)
        return JSONResponse({"detail": "the database is unavailable; retry later"},
                            status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_SECONDS)})

    @app.exception_handler(HerderError)
    async def herder_error(_request: Request, exc: HerderError) -> JSONResponse:
        return unavailable(exc)

    for error in DATABASE_ERRORS:
        app.add_exception_handler(error, lambda _request, exc: unavailable(exc))

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input, which may hold a token or a secret env value.
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "invalid")}
                   for e in exc.errors()]
        return JSONResponse({"detail": details}, status_code=422)

    async def call(function: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(function, *args)

    # -- authentication ---------------------------------------------------------------------

    async def caller_of(authorization: str | None) -> Caller | None:
        """The caller a bearer token stands for; None when no token was sent."""
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise Denied(401, "use 'Authorization: Bearer <token>'")
        if not plausible_token(token):
            raise Denied(401, "unknown token")
        if access.legacy_admin_token and same_secret(token, access.legacy_admin_token):
            return LEGACY_ADMIN
        return identify(await call(store.token_get, token_hash(token)))

    def operator(scope: Scope) -> Any:
        async def dependency(
                authorization: Annotated[str | None, Header()] = None) -> Caller:
            caller = await caller_of(authorization)
            if caller is None:
                if not access.open_access:
                    raise Denied(401, f"a {scope} token is required "
                                      "(Authorization: Bearer <token>)")
                caller = ANONYMOUS_ADMIN
            authorize(caller, scope)
            return caller

        dependency.herder_scope = scope  # type: ignore[attr-defined]
        return Depends(dependency)

    async def agent_host(label: Annotated[str, Path(max_length=200)],
                         authorization: Annotated[str | None, Header()] = None) -> str:
        """The token must be an agent token of the host named in the path: 403 otherwise."""
        caller = await caller_of(authorization)
        if caller is None:
            raise Denied(401, "an agent token is required (Authorization: Bearer <token>)")
        authorize(caller, Scope.AGENT, label)
        return label

    agent_host.herder_scope = Scope.AGENT  # type: ignore[attr-defined]

    async def public() -> None:
        """No token needed (liveness probes)."""

    public.herder_scope = None  # type: ignore[attr-defined]

    Reader = Annotated[Caller, operator(Scope.READ)]
    Submitter = Annotated[Caller, operator(Scope.SUBMIT)]
    AgentHost = Annotated[str, Depends(agent_host)]

    def check_worker(label: str, worker: str) -> str:
        parsed = WorkerId.parse(worker)
        if parsed is None or parsed.host != label:
            raise HTTPException(422, f"worker {worker!r} is not a worker of host {label!r}")
        return worker

    # -- operators ----------------------------------------------------------------------------

    @app.get("/healthz", dependencies=[Depends(public)])
    async def healthz() -> JSONResponse:
        """Unauthenticated, no secrets: 503 while any loop of the server is stale or dead."""
        view = coordinator.health_view()
        return JSONResponse(view, status_code=200 if view["ok"] else 503)

    @app.post("/api/v1/jobs", status_code=201)
    async def submit(body: SubmitBody, caller: Submitter) -> dict[str, Any]:
        available_at = (now() + timedelta(seconds=body.delay_seconds)
                        if body.delay_seconds else None)
        request = SubmitRequest(
            job_type=body.job_type, command=body.command, payload=body.payload,
            priority=body.priority, weight=body.weight, dedup_key=body.dedup_key,
            affinity=body.affinity, available_at=available_at, max_attempts=body.max_attempts,
            timeout_seconds=body.timeout_seconds, workdir=body.workdir, env=body.env,
            check_command=False, local=False,
        )
        spec = resolve(config, request)
        authorize_submit(caller, spec.job_type, spec.priority)
        result = (await call(store.job_insert, [spec], now(), body.force))[0]
        coordinator.poke()
        return {"id": result.job_id, "created": result.created, "status": str(result.status)}

    @app.get("/api/v1/jobs")
    async def list_jobs(_caller: Reader,
                        status: Annotated[list[JobStatus] | None, Query()] = None,
                        limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
                        ) -> list[dict[str, Any]]:
        jobs = await call(store.job_list, status, limit)
        return [job_view(job) for job in jobs]

    @app.get("/api/v1/jobs/{job_id}")
    async def get_job(job_id: JobId, _caller: Reader) -> dict[str, Any]:
        job = await call(store.job_get, job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        view = job_view(job)
        view["attempts"] = [attempt_view(a) for a in await call(store.attempt_list, job_id)]
        view["events"] = [event_view(e) for e in await call(store.event_list, job_id)]
        return view

    @app.get("/api/v1/jobs/{job_id}/why")
    async def why(job_id: JobId, _caller: Reader) -> dict[str, Any]:
        return {"id": job_id, "why": await call(coordinator.why, job_id)}

    @app.post("/api/v1/jobs/{job_id}/cancel")
    async def cancel(job_id: JobId, caller: Submitter) -> dict[str, Any]:
        if caller.job_types is not None:
            target = await call(store.job_get, job_id)
            if target is None:
                raise HTTPException(404, f"no job {job_id}")
            authorize_job_type(caller, target.job_type)
        status = await call(store.job_cancel, job_id, now())
        if status is None:
            job = await call(store.job_get, job_id)
            if job is None:
                raise HTTPException(404, f"no job {job_id}")
            status = job.status
        return {"id": job_id, "status": str(status)}

    @app.get("/api/v1/hosts")
    async def hosts(_caller: Reader) -> list[dict[str, Any]]:
        return await call(coordinator.host_views)

    # -- agents -------------------------------------------------------------------------------

    @app.post("/api/v1/agent/{label}/heartbeat")
    async def agent_heartbeat(label: AgentHost, body: HeartbeatBody) -> dict[str, Any]:
        check_worker(label, body.worker)
        stamp = now()
        await call(store.host_heartbeat, label, stamp, {**body.info, "worker": body.worker})
        tokens = [AttemptToken(job_id, attempt) for job_id, attempt in body.running]
        reply = await call(store.attempt_heartbeat, tokens, stamp)
        host = await call(store.host_get, label)
        attempts = await call(store.attempt_list_live, label) if body.with_attempts else []
        return {
            "live": sorted([t.job_id, t.attempt] for t in reply.live),
            "cancel": sorted([t.job_id, t.attempt] for t in reply.cancel),
            "host": coordinator.host_gate(host, stamp) if host else None,
            # Every live attempt on this host and its runner, so a restarted agent can
            # report what its dead predecessor was running.
            "attempts": [[a.attempt.job_id, a.attempt.attempt, a.attempt.worker]
                         for a in attempts],
            # The lease the server enforces: the agent fences itself before it runs out.
            "lease_seconds": coordinator.lease_seconds,
        }

    @app.post("/api/v1/agent/{label}/gone")
    async def agent_gone(label: AgentHost, worker: str) -> dict[str, Any]:
        """A dead agent's guardian, once it has killed the agent's jobs: their attempts are
        lost now (not after the lease) and the host takes no work until an agent beats."""
        check_worker(label, worker)
        return await call(coordinator.agent_gone, label, worker)

    @app.get("/api/v1/agent/{label}/assignments")
    async def assignments(label: AgentHost, worker: Annotated[str, Query(max_length=400)],
                          request: Request,
                          free: Annotated[int, Query(ge=0, le=10_000)] = 1,
                          wait: Annotated[float, Query(ge=0, le=3600,
                                                       allow_inf_nan=False)] = 0.0,
                          ) -> dict[str, Any]:
        check_worker(label, worker)
        wait = min(wait, config.settings.server.long_poll)
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            seen = coordinator.board.version(label)
            if await request.is_disconnected():
                # The agent is gone (killed, restarted): taking work for it now would bind
                # the attempts to a dead worker until their lease runs out.
                return {"jobs": []}
            jobs = await call(coordinator.take_assigned, label, worker, free)
            remaining = deadline - asyncio.get_running_loop().time()
            if jobs or remaining <= 0:
                return {"jobs": [coordinator.assignment_view(job) for job in jobs]}
            await coordinator.board.wait(label, seen, remaining)

    @app.get("/api/v1/agent/{label}/attempts/{job_id}/{attempt}")
    async def attempt_get(label: AgentHost, job_id: JobId,
                          attempt: AttemptNumber) -> dict[str, Any]:
        job = await call(store.job_get, job_id)
        if (job is None or job.host != label or job.attempt != attempt
                or job.status is not JobStatus.CLAIMED):
            return {"job": None}
        return {"job": coordinator.assignment_view(job)}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/start")
    async def attempt_start(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                            body: StartBody) -> dict[str, Any]:
        token = AttemptToken(job_id, attempt)
        await call(coordinator.start_attempt, label, token, body.pid, body.log_path)
        return {"accepted": True}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/finish")
    async def attempt_finish(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                             body: FinishBody) -> dict[str, Any]:
        token = AttemptToken(job_id, attempt)
        status = await call(coordinator.finish_attempt, label, token, body.outcome,
                            body.exit_code, body.retry_after)
        return {"accepted": True, "status": str(status)}

    @app.get("/api/v1/agent/{label}/cancels")
    async def cancels(label: AgentHost,
                      jobs: Annotated[str, Query(max_length=100_000)] = "") -> dict[str, Any]:
        ids = [int(part) for part in jobs.split(",")
               if part.strip().isdigit() and int(part) <= BIGINT_MAX]
        wanted = await call(coordinator.cancels_for, label, ids)
        return {"cancel": sorted([t.job_id, t.attempt] for t in wanted)}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/log")
    async def log_chunk(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                        request: Request,
                        offset: Annotated[int, Query(ge=0, le=2**40)] = 0) -> dict[str, Any]:
        data = await request.body()
        written = await call(coordinator.write_log, label, AttemptToken(job_id, attempt),
                             offset, data)
        return {"size": written}

    @app.post("/api/v1/hosts/{label}/heartbeat")
    async def push_heartbeat(label: AgentHost) -> dict[str, Any]:
        await call(store.host_heartbeat, label, now(), {"via": "heartbeat"})
        return {"ok": True}

    # -- reservations ---------------------------------------------------------------------------

    @app.post("/api/v1/reservations", status_code=201)
    async def reserve(body: ReserveBody, _caller: Submitter) -> dict[str, Any]:
        created = await call(coordinator.reserve, body.owner, body.host, body.weight,
                             body.count)
        return {"reserved": [r.id for r in created], "requested": body.count}

    @app.post("/api/v1/reservations/{reservation_id}/complete")
    async def complete(reservation_id: ReservationId, body: CompleteBody,
                       _caller: Submitter) -> dict[str, Any]:
        ended = await call(coordinator.complete_reservation, reservation_id, body.status)
        return {"id": reservation_id, "status": str(ended.status)}

    @app.post("/api/v1/slots/claim", status_code=201)
    async def slot_claim(body: SlotBody, _caller: Submitter) -> dict[str, Any]:
        if body.host is None or body.weight is None:
            raise HTTPException(422, "host and weight are required to claim a slot")
        slot = await call(coordinator.claim_slot, body.run_id, body.host, body.weight)
        return {"id": slot.id, "run_id": slot.owner, "host": slot.host}

    @app.post("/api/v1/slots/release")
    async def slot_release(body: SlotBody, _caller: Submitter) -> dict[str, Any]:
        released = await call(store.reservation_release_ci, body.run_id, now())
        return {"released": released is not None}

    for route in app.routes:
        if isinstance(route, APIRoute) and not route_scope(route)[0]:
            raise RuntimeError(f"route {route.path} declares no scope")
    return app
