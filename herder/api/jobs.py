"""Operators' job routes: submit, list, show, why, cancel."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from herder.api.depends import JobId, Reader, Service, Submitter, call
from herder.api.tokens import authorize_job_type, authorize_submit
from herder.model import JobStatus
from herder.wire import (
    Cancelled,
    JobDetail,
    JobView,
    SubmitBody,
    Submitted,
    Why,
)

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=Submitted)
async def submit(body: SubmitBody, caller: Submitter, service: Service) -> Submitted:
    spec = service.resolve_submit(body)
    authorize_submit(caller, spec.job_type, spec.priority)
    result = await call(service.submit, spec, body.force)
    return Submitted(id=result.job_id, created=result.created, status=result.status)


@router.get("", response_model=list[JobView])
async def list_jobs(_caller: Reader, service: Service,
                    status: Annotated[list[JobStatus] | None, Query()] = None,
                    limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> list[JobView]:
    return [JobView.of(job) for job in await call(service.jobs, status, limit)]


@router.get("/{job_id}", response_model=JobDetail)
async def get_job(job_id: JobId, _caller: Reader, service: Service) -> JobDetail:
    job, attempts, events = await call(service.job_history, job_id)
    return JobDetail.of_history(job, attempts, events)


@router.get("/{job_id}/why", response_model=Why)
async def why(job_id: JobId, _caller: Reader, service: Service) -> Why:
    return Why(id=job_id, why=await call(service.why, job_id))


@router.post("/{job_id}/cancel", response_model=Cancelled)
async def cancel(job_id: JobId, caller: Submitter, service: Service) -> Cancelled:
    if caller.job_types is not None:
        authorize_job_type(caller, (await call(service.job, job_id)).job_type)
    return Cancelled(id=job_id, status=await call(service.cancel, job_id))
