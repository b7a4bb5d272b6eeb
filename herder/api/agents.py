"""The agent protocol: one host's agent (or its guardian, or cron on a push host) and only
that host's; every route needs the host's agent token."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request

from herder.api.depends import AgentHost, AttemptNumber, Board, JobId, Service, call, check_worker
from herder.core.errors import Refused
from herder.core.model import BIGINT_MAX, LAUNCH_ERROR_CHARS, AttemptToken, Outcome
from herder.core.scheduling.alerting import Trouble
from herder.runtime.endings import Ending
from herder.wire.agents import (
    AdoptBody,
    Adopted,
    Assignment,
    Assignments,
    Cancels,
    FinishBody,
    Finished,
    Gone,
    HeartbeatBody,
    HeartbeatReply,
    HostChecks,
    LogWritten,
    PlacedAttempt,
    PushHeartbeat,
    StartBody,
    Started,
    TroubleBody,
    TroubleRecorded,
    pairs,
    tokens,
)

router = APIRouter(prefix="/api/v1", tags=["agent protocol"])
ATTEMPT = "/agent/{label}/attempts/{job_id}/{attempt}"


@router.post("/agent/{label}/heartbeat", response_model=HeartbeatReply)
async def agent_heartbeat(label: AgentHost, body: HeartbeatBody,
                          service: Service) -> HeartbeatReply:
    check_worker(label, body.worker)
    return await call(service.agents.agent_heartbeat, label, body.worker,
                      list(tokens(body.running)), body.info, body.with_attempts)


@router.post("/agent/{label}/trouble", response_model=TroubleRecorded)
async def agent_trouble(label: AgentHost, body: TroubleBody,
                        service: Service) -> TroubleRecorded:
    """An agent back from trouble with this server (unreachable, its token refused) says
    what it was; raised as the alert `agent:<label>:<kind>`."""
    trouble = Trouble(body.kind, body.since, body.problem)
    key, raised = await call(service.agents.agent_trouble, label, trouble, body.until,
                             body.delivered)
    return TroubleRecorded(key=key, raised=raised)


@router.post("/agent/{label}/gone", response_model=Gone)
async def agent_gone(label: AgentHost, worker: str, service: Service) -> Gone:
    """A dead agent's guardian, once it has killed the agent's jobs: their attempts are
    lost now (not after the lease) and the host takes no work until an agent beats."""
    check_worker(label, worker)
    return Gone(**await call(service.agents.agent_gone, label, worker))


@router.get("/agent/{label}/assignments", response_model=Assignments)
async def assignments(label: AgentHost, worker: Annotated[str, Query(max_length=400)],
                      request: Request, service: Service, board: Board,
                      free: Annotated[int, Query(ge=0, le=10_000)] = 1,
                      wait: Annotated[float, Query(ge=0, le=3600, allow_inf_nan=False)] = 0.0,
                      ) -> Assignments:
    """A long-poll: attempts placed on the host, taken by `worker`, as soon as there are
    some or after `wait` seconds (at most the server's long_poll)."""
    check_worker(label, worker)
    wait = min(wait, service.settings.server.long_poll)
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        seen = board.version(label)
        if await request.is_disconnected():
            # The agent is gone (killed, restarted): taking work for it now would bind
            # the attempts to a dead worker until their lease runs out.
            return Assignments(jobs=[], lease_seconds=service.lease_seconds)
        jobs = await call(service.agents.take_assigned, label, worker, free)
        remaining = deadline - asyncio.get_running_loop().time()
        if jobs or remaining <= 0:
            return Assignments(jobs=[Assignment.model_validate(job) for job in jobs],
                               lease_seconds=service.lease_seconds)
        await board.wait(label, seen, remaining)


@router.get(ATTEMPT, response_model=PlacedAttempt)
async def attempt_get(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                      service: Service) -> PlacedAttempt:
    """The attempt an ssh push placed on this host (`herder run-attempt`). Not quite a pure
    read: an attempt whose bound account was removed meanwhile is ended here as refused."""
    job = await call(service.agents.placed_attempt, label, AttemptToken(job_id, attempt))
    return PlacedAttempt(job=None if job is None else Assignment.model_validate(job),
                         lease_seconds=service.lease_seconds)


@router.post(ATTEMPT + "/start", response_model=Started)
async def attempt_start(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                        body: StartBody, service: Service) -> Started:
    await call(service.agents.start_attempt, label, AttemptToken(job_id, attempt), body.pid,
               body.log_path)
    return Started(accepted=True)


@router.post(ATTEMPT + "/adopt", response_model=Adopted)
async def attempt_adopt(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                        body: AdoptBody, service: Service) -> Adopted:
    """A restarted agent takes over an attempt its dead predecessor started: 409 when the
    attempt is not live on the host under that worker (the agent kills it instead)."""
    check_worker(label, body.worker)
    check_worker(label, body.previous)
    size = await call(service.agents.adopt_attempt, label, AttemptToken(job_id, attempt),
                      body.previous, body.worker)
    return Adopted(log_size=size)


@router.post(ATTEMPT + "/finish", response_model=Finished)
async def attempt_finish(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                         body: FinishBody, service: Service) -> Finished:
    memory = body.memory()
    launch_error = (body.detail[:LAUNCH_ERROR_CHARS] if body.detail
                    and body.outcome is Outcome.LAUNCH_FAILED else None)
    ending = (None if body.log_tail is None and body.result is None and memory is None
              and launch_error is None
              else Ending(body.log_tail or "", body.result, memory, launch_error))
    status = await call(service.agents.finish_attempt, label, AttemptToken(job_id, attempt),
                        body.outcome, body.exit_code, body.retry_after, ending)
    return Finished(accepted=True, status=status)


@router.get("/agent/{label}/checks", response_model=HostChecks)
async def host_checks(label: AgentHost, service: Service) -> HostChecks:
    """What `herder doctor --agent` runs on this host (read only): the job types allowed
    here with their preflights, and its accounts' probes, never their credentials."""
    return await call(service.agents.host_checks, label)


@router.get("/agent/{label}/cancels", response_model=Cancels)
async def cancels(label: AgentHost, service: Service,
                  jobs: Annotated[str, Query(max_length=100_000)] = "") -> Cancels:
    """Of the comma-separated job ids, the attempts on this host asked to stop."""
    ids = [int(part) for part in jobs.split(",")
           if part.strip().isdigit() and int(part) <= BIGINT_MAX]
    wanted = await call(service.agents.cancels_for, label, ids)
    return Cancels(cancel=pairs(wanted))


LOG_BODY = {"requestBody": {"required": False, "content": {"application/octet-stream": {
    "schema": {"type": "string", "format": "binary"}}}}}


@router.post(ATTEMPT + "/log", response_model=LogWritten, openapi_extra=LOG_BODY)
async def log_chunk(label: AgentHost, job_id: JobId, attempt: AttemptNumber,
                    request: Request, service: Service,
                    offset: Annotated[int, Query(ge=0, le=2**40)] = 0) -> LogWritten:
    """Raw log bytes (the body) written at `offset` of the server's copy: 416 for an
    offset past its end, 413 past `server.max_log_bytes`."""
    data = await request.body()
    try:
        size = await call(service.agents.write_log, label, AttemptToken(job_id, attempt), offset,
                          data)
    except Refused as refused:
        raise HTTPException(refused.status, refused.reason) from None
    return LogWritten(size=size)


@router.post("/hosts/{label}/heartbeat", response_model=PushHeartbeat)
async def push_heartbeat(label: AgentHost, service: Service) -> PushHeartbeat:
    """cron's `herder heartbeat` on a push (ssh) host, with that host's token."""
    await call(service.agents.push_heartbeat, label)
    return PushHeartbeat(ok=True)
