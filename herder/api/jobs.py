"""Operators' job routes: submit, list, show, why, log, cancel, retry."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Annotated

from fastapi import APIRouter, Query, Response

from herder.api.depends import JobId, Operating, Reader, Submitter, call
from herder.core.access import authorize_job_type, authorize_submit
from herder.core.errors import NotFound
from herder.core.model import BIGINT_MAX, INT_MAX, JobStatus
from herder.core.submission import DEDUP_KEY_LENGTH
from herder.wire.jobs import (
    Cancelled,
    DedupHolder,
    DispatchCheckBody,
    DispatchChecked,
    JobDetail,
    JobView,
    Retried,
    SubmitBody,
    Submitted,
    Why,
)

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=Submitted)
async def submit(body: SubmitBody, caller: Submitter, operations: Operating) -> Submitted:
    spec = operations.resolve_submit(body)
    settings = operations.config.settings
    authorize_submit(caller, body, spec, settings.job_types.get(spec.job_type), settings.weights)
    result = await call(operations.enqueue, spec, body.force)
    return Submitted(id=result.job_id, created=result.created, status=result.status)


@router.get("", response_model=list[JobView])
async def list_jobs(_caller: Reader, operations: Operating,
                    status: Annotated[list[JobStatus] | None, Query()] = None,
                    limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[JobView]:
    return [JobView.model_validate(job) for job in await call(operations.list, status, limit)]


@router.get("/dedup-holder", response_model=DedupHolder)
async def dedup_holder(_caller: Reader, operations: Operating,
                       key: Annotated[str, Query(min_length=1, max_length=DEDUP_KEY_LENGTH,
                                                  pattern=r"^[^\x00]*$")]
                       ) -> DedupHolder:
    """`herder should-dispatch`: which live or done job holds the key, if any."""
    holder = await call(operations.should_dispatch, key)
    if holder is None:
        return DedupHolder(key=key)
    return DedupHolder(key=key, job_id=holder[0], status=holder[1])


DISPATCH_CHECKS = 4
"""Dispatch checks the server runs at once."""
_dispatch_checks = threading.BoundedSemaphore(DISPATCH_CHECKS)


@router.post("/dispatch-check", response_model=DispatchChecked)
async def dispatch_check(body: DispatchCheckBody, caller: Submitter,
                         operations: Operating) -> DispatchChecked:
    """`herder should-dispatch KEY --type T` over HTTP: the server runs T's dispatch_check
    from its own herder.toml (the caller gives values only, passed as environment
    variables), for a token that may submit T."""
    from herder.services.dispatch_check import DispatchCheckFailed

    authorize_job_type(caller, body.job_type)
    try:
        reason = await call(_bounded, operations.dispatch_check,
                            body.job_type, body.dedup_key, body.payload)
    except DispatchCheckFailed as exc:
        return DispatchChecked(error=str(exc))
    return DispatchChecked(skip=reason is not None, reason=reason)


def _bounded(check: Callable[[str, str, Mapping[str, str]], str | None],
             job_type: str, dedup_key: str, payload: Mapping[str, str]) -> str | None:
    """At most DISPATCH_CHECKS checks at once; one more is refused at once rather than
    holding one of the server's worker threads while it waits."""
    from herder.services.dispatch_check import DispatchCheckFailed

    if not _dispatch_checks.acquire(blocking=False):
        raise DispatchCheckFailed(f"job_types.{job_type}.dispatch_check: the server runs "
                                  f"{DISPATCH_CHECKS} dispatch checks already; try again "
                                  "shortly")
    try:
        return check(job_type, dedup_key, payload)
    finally:
        _dispatch_checks.release()


@router.get("/{job_id}", response_model=JobDetail)
async def get_job(job_id: JobId, _caller: Reader, operations: Operating) -> JobDetail:
    job, attempts, events = await call(operations.history, job_id)
    return JobDetail.of_history(job, attempts, events)


@router.get("/{job_id}/why", response_model=Why)
async def why(job_id: JobId, _caller: Reader, operations: Operating) -> Why:
    return Why(id=job_id, why=await call(operations.why, job_id))


@router.post("/{job_id}/cancel", response_model=Cancelled)
async def cancel(job_id: JobId, caller: Submitter, operations: Operating) -> Cancelled:
    if caller.job_types is not None:
        authorize_job_type(caller, (await call(operations.get, job_id)).job_type)
    return Cancelled(id=job_id, status=await call(operations.cancel, job_id))


@router.get("/{job_id}/log", response_class=Response, responses={200: {"content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def log(job_id: JobId, _caller: Reader, operations: Operating,
              attempt: Annotated[int | None, Query(ge=1, le=INT_MAX)] = None,
              offset: Annotated[int, Query(ge=0, le=BIGINT_MAX)] = 0) -> Response:
    """The attempt's log (default: the latest) from `offset`, up to a chunk; 404 while it
    has none. `X-Herder-Attempt` names the attempt, so a follower asks for it again."""
    job = await call(operations.get, job_id)
    number = attempt or job.attempt
    if number < 1:
        raise NotFound(f"job {job_id} has not started yet; nothing logged")
    chunk = await call(operations.log, job_id, number, offset)
    if chunk is None:
        raise NotFound(f"the log of job {job_id} attempt {number} does not exist (yet)")
    return Response(chunk, media_type="application/octet-stream",
                    headers={"X-Herder-Attempt": str(number)})


@router.post("/{job_id}/retry", response_model=Retried)
async def retry(job_id: JobId, caller: Submitter, operations: Operating) -> Retried:
    if caller.job_types is not None:
        authorize_job_type(caller, (await call(operations.get, job_id)).job_type)
    retried = await call(operations.retry, job_id)
    return Retried(id=job_id, retried=retried, status=(await call(operations.get, job_id)).status)
