"""The HTTP API. Store calls are synchronous and run in the thread pool; long-polls are
async and cost nothing while they wait, so one process holds thousands of idle agents."""


import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Header, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from herder.api.tokens import token_matches
from herder.errors import HerderError, InputError
from herder.intake import SubmitRequest, resolve
from herder.model import (
    AttemptToken,
    JobStatus,
    Outcome,
    ReservationStatus,
)
from herder.runtime.coordinator import Coordinator
from herder.runtime.maintenance import WorkerId
from herder.views import attempt_view, event_view, job_view

log = logging.getLogger("herder.api")
T = TypeVar("T")
MAX_LOG_CHUNK = 4 * 1024 * 1024


def now() -> datetime:
    return datetime.now(UTC)


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SubmitBody(Body):
    job_type: str | None = None
    command: list[str] | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    priority: int | None = None
    weight: str | None = None
    dedup_key: str | None = None
    force: bool = False
    affinity: str | None = None
    delay_seconds: float | None = Field(default=None, ge=0)
    max_attempts: int | None = Field(default=None, ge=1)
    timeout_seconds: float | None = Field(default=None, gt=0)
    workdir: str | None = None
    env: dict[str, str] = Field(default_factory=dict)


class HeartbeatBody(Body):
    worker: str
    running: list[tuple[int, int]] = Field(default_factory=list)
    info: dict[str, Any] = Field(default_factory=dict)
    with_attempts: bool = False
    """Also list every live attempt of the host (an agent asks once, when it starts)."""


class StartBody(Body):
    pid: int
    log_path: str | None = None


class FinishBody(Body):
    outcome: Outcome
    exit_code: int | None = None
    retry_after: float | None = Field(default=None, ge=0)
    detail: str | None = None


class ReserveBody(Body):
    owner: str = Field(min_length=1, max_length=200)
    host: str
    count: int = Field(ge=1, le=1000)
    weight: str = "subagent"


class CompleteBody(Body):
    status: ReservationStatus


class SlotBody(Body):
    run_id: str = Field(min_length=1, max_length=200)
    host: str | None = None
    weight: str | None = None


def create_app(coordinator: Coordinator) -> FastAPI:
    store = coordinator.store
    config = coordinator.config

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        coordinator.board.bind(asyncio.get_running_loop())
        coordinator.start()
        try:
            yield
        finally:
            await run_in_threadpool(coordinator.stop)

    app = FastAPI(title="herder", version="0.1.0", lifespan=lifespan)

    @app.exception_handler(InputError)
    async def input_error(_request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse({"error": str(exc), "field": exc.field}, status_code=422)

    @app.exception_handler(HerderError)
    async def herder_error(_request: Request, exc: HerderError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=503)

    async def call(function: Callable[..., T], *args: Any) -> T:
        return await run_in_threadpool(function, *args)

    # -- authentication ---------------------------------------------------------------------

    def bearer(authorization: str | None) -> str | None:
        if authorization and authorization.lower().startswith("bearer "):
            return authorization[7:].strip()
        return None

    async def operator(authorization: Annotated[str | None, Header()] = None) -> None:
        expected = os.environ.get(config.settings.server.api_token_env)
        if not expected:
            return
        token = bearer(authorization)
        import hmac

        if token is None or not hmac.compare_digest(token, expected):
            raise HTTPException(401, "operator token required (Authorization: Bearer ...)")

    async def agent_host(label: str,
                         authorization: Annotated[str | None, Header()] = None) -> str:
        """The token must belong to the host named in the path: 403 otherwise."""
        token = bearer(authorization)
        if token is None:
            raise HTTPException(401, "agent token required (Authorization: Bearer ...)")
        if not token_matches(token, await call(store.host_token_hash, label)):
            raise HTTPException(403, f"this token is not valid for host {label!r}")
        return label

    Operator = Annotated[None, Depends(operator)]
    AgentHost = Annotated[str, Depends(agent_host)]

    def check_worker(label: str, worker: str) -> str:
        parsed = WorkerId.parse(worker)
        if parsed is None or parsed.host != label:
            raise HTTPException(422, f"worker {worker!r} is not a worker of host {label!r}")
        return worker

    # -- operators ----------------------------------------------------------------------------

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "leader": coordinator.is_leader}

    @app.post("/api/v1/jobs", status_code=201)
    async def submit(body: SubmitBody, _auth: Operator) -> dict[str, Any]:
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
        result = (await call(store.job_insert, [spec], now(), body.force))[0]
        coordinator.poke()
        return {"id": result.job_id, "created": result.created, "status": str(result.status)}

    @app.get("/api/v1/jobs")
    async def list_jobs(_auth: Operator, status: Annotated[list[JobStatus] | None, Query()] = None,
                        limit: int = 100) -> list[dict[str, Any]]:
        jobs = await call(store.job_list, status, max(1, min(limit, 10_000)))
        return [job_view(job) for job in jobs]

    @app.get("/api/v1/jobs/{job_id}")
    async def get_job(job_id: int, _auth: Operator) -> dict[str, Any]:
        job = await call(store.job_get, job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        view = job_view(job)
        view["attempts"] = [attempt_view(a) for a in await call(store.attempt_list, job_id)]
        view["events"] = [event_view(e) for e in await call(store.event_list, job_id)]
        return view

    @app.get("/api/v1/jobs/{job_id}/why")
    async def why(job_id: int, _auth: Operator) -> dict[str, Any]:
        return {"id": job_id, "why": await call(coordinator.why, job_id)}

    @app.post("/api/v1/jobs/{job_id}/cancel")
    async def cancel(job_id: int, _auth: Operator) -> dict[str, Any]:
        status = await call(store.job_cancel, job_id, now())
        if status is None:
            job = await call(store.job_get, job_id)
            if job is None:
                raise HTTPException(404, f"no job {job_id}")
            status = job.status
        return {"id": job_id, "status": str(status)}

    @app.get("/api/v1/hosts")
    async def hosts(_auth: Operator) -> list[dict[str, Any]]:
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
        }

    @app.post("/api/v1/agent/{label}/gone")
    async def agent_gone(label: AgentHost, worker: str) -> dict[str, Any]:
        """A dead agent's guardian, once it has killed the agent's jobs: their attempts are
        lost now (not after the lease) and the host takes no work until an agent beats."""
        check_worker(label, worker)
        return await call(coordinator.agent_gone, label, worker)

    @app.get("/api/v1/agent/{label}/assignments")
    async def assignments(label: AgentHost, worker: str, request: Request, free: int = 1,
                          wait: float = 0.0) -> dict[str, Any]:
        check_worker(label, worker)
        wait = max(0.0, min(wait, config.settings.server.long_poll))
        deadline = asyncio.get_running_loop().time() + wait
        while True:
            seen = coordinator.board.version(label)
            if await request.is_disconnected():
                # The agent is gone (killed, restarted): taking work for it now would bind
                # the attempts to a dead worker until their lease runs out.
                return {"jobs": []}
            jobs = await call(coordinator.take_assigned, label, worker, max(0, free))
            remaining = deadline - asyncio.get_running_loop().time()
            if jobs or remaining <= 0:
                return {"jobs": [coordinator.assignment_view(job) for job in jobs]}
            await coordinator.board.wait(label, seen, remaining)

    @app.get("/api/v1/agent/{label}/attempts/{job_id}/{attempt}")
    async def attempt_get(label: AgentHost, job_id: int, attempt: int) -> dict[str, Any]:
        job = await call(store.job_get, job_id)
        if (job is None or job.host != label or job.attempt != attempt
                or job.status is not JobStatus.CLAIMED):
            return {"job": None}
        return {"job": coordinator.assignment_view(job)}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/start")
    async def attempt_start(label: AgentHost, job_id: int, attempt: int,
                            body: StartBody) -> dict[str, Any]:
        token = AttemptToken(job_id, attempt)
        ok = await call(coordinator.start_attempt, label, token, body.pid, body.log_path)
        return {"accepted": ok}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/finish")
    async def attempt_finish(label: AgentHost, job_id: int, attempt: int,
                             body: FinishBody) -> dict[str, Any]:
        token = AttemptToken(job_id, attempt)
        status = await call(coordinator.finish_attempt, label, token, body.outcome,
                            body.exit_code, body.retry_after)
        return {"accepted": status is not None, "status": None if status is None else str(status)}

    @app.get("/api/v1/agent/{label}/cancels")
    async def cancels(label: AgentHost, jobs: str = "") -> dict[str, Any]:
        ids = [int(part) for part in jobs.split(",") if part.strip().isdigit()]
        wanted = await call(coordinator.cancels_for, label, ids)
        return {"cancel": sorted([t.job_id, t.attempt] for t in wanted)}

    @app.post("/api/v1/agent/{label}/attempts/{job_id}/{attempt}/log")
    async def log_chunk(label: AgentHost, job_id: int, attempt: int, request: Request,
                        offset: int = 0) -> dict[str, Any]:
        data = await request.body()
        if len(data) > MAX_LOG_CHUNK:
            raise HTTPException(413, f"log chunk over {MAX_LOG_CHUNK} bytes")
        if offset < 0:
            raise HTTPException(422, "offset must be >= 0")
        written = await call(coordinator.write_log, label, AttemptToken(job_id, attempt),
                             offset, data)
        return {"size": written}

    @app.post("/api/v1/hosts/{label}/heartbeat")
    async def push_heartbeat(label: AgentHost) -> dict[str, Any]:
        await call(store.host_heartbeat, label, now(), {"via": "heartbeat"})
        return {"ok": True}

    # -- reservations ---------------------------------------------------------------------------

    @app.post("/api/v1/reservations", status_code=201)
    async def reserve(body: ReserveBody, _auth: Operator) -> dict[str, Any]:
        created = await call(coordinator.reserve, body.owner, body.host, body.weight,
                             body.count)
        return {"reserved": [r.id for r in created], "requested": body.count}

    @app.post("/api/v1/reservations/{reservation_id}/complete")
    async def complete(reservation_id: int, body: CompleteBody,
                       _auth: Operator) -> dict[str, Any]:
        ended = await call(coordinator.complete_reservation, reservation_id, body.status)
        return {"id": reservation_id, "status": str(ended.status)}

    @app.post("/api/v1/slots/claim", status_code=201)
    async def slot_claim(body: SlotBody, _auth: Operator) -> dict[str, Any]:
        if body.host is None or body.weight is None:
            raise HTTPException(422, "host and weight are required to claim a slot")
        slot = await call(coordinator.claim_slot, body.run_id, body.host, body.weight)
        return {"id": slot.id, "run_id": slot.owner, "host": slot.host}

    @app.post("/api/v1/slots/release")
    async def slot_release(body: SlotBody, _auth: Operator) -> dict[str, Any]:
        released = await call(store.reservation_release_ci, body.run_id, now())
        return {"released": released is not None}

    return app
