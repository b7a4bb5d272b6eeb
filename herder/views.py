"""Jobs, attempts and events as plain JSON-ready dicts, for `--json` and the HTTP API."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from herder.model import Attempt, Event, Job


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_view(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "status": str(job.status),
        "job_type": job.job_type,
        "priority": job.priority,
        "weight": job.weight,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "failures": job.failures,
        "lost": job.lost,
        "host": job.host,
        "exit_code": job.exit_code,
        "failure_reason": job.failure_reason,
        "dedup_key": job.dedup_key,
        "affinity": job.affinity,
        "command": list(job.command),
        "payload": dict(job.payload),
        "workdir": job.workdir,
        "timeout_seconds": job.timeout_seconds,
        "cancel_requested": job.cancel_requested,
        "available_at": iso(job.available_at),
        "created_at": iso(job.created_at),
        "claimed_at": iso(job.claimed_at),
        "started_at": iso(job.started_at),
        "finished_at": iso(job.finished_at),
        "updated_at": iso(job.updated_at),
    }


def attempt_view(attempt: Attempt) -> dict[str, Any]:
    return {
        "attempt": attempt.attempt,
        "host": attempt.host,
        "worker": attempt.worker,
        "pid": attempt.pid,
        "log_path": attempt.log_path,
        "claimed_at": iso(attempt.claimed_at),
        "started_at": iso(attempt.started_at),
        "heartbeat_at": iso(attempt.heartbeat_at),
        "ended_at": iso(attempt.ended_at),
        "exit_code": attempt.exit_code,
        "outcome": None if attempt.outcome is None else str(attempt.outcome),
    }


def event_view(event: Event) -> dict[str, Any]:
    return {
        "id": event.id,
        "at": iso(event.at),
        "kind": event.kind,
        "from_status": None if event.from_status is None else str(event.from_status),
        "to_status": None if event.to_status is None else str(event.to_status),
        "attempt": event.attempt,
        "detail": dict(event.detail),
    }
