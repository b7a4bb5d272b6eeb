"""Rows to records: each mapper reads a row whose JSON and times are already Python values."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from msgspec.structs import fields

from herder.core.model import (
    Account,
    AccountHealth,
    AccountRecord,
    Attempt,
    Enforcement,
    Event,
    HostRecord,
    Job,
    JobStatus,
    MemoryUse,
    Outcome,
    Reservation,
    ReservationKind,
    ReservationStatus,
    Scope,
    TokenRecord,
    Transport,
    Usage,
)
from herder.store.records import Alert, DueJob, LiveAttempt


def object_from_json(value: str | bytes | None) -> Any:
    """A JSON column's value, from SQLite's text or psycopg's bytes. `{}`, the usual payload
    and env, skips the parser: a claim decodes both for every job (a new dict each time, as
    the caller may keep it)."""
    if value is None:
        return None
    if value in ("{}", b"{}"):
        return {}
    return json.loads(value)


# A status's stored text -> the member; `JobStatus(text)` costs a microsecond a job in a claim.
STATUSES: dict[str, JobStatus] = {status.value: status for status in JobStatus}


_JOB_FIELDS = tuple(field.name for field in fields(Job))
_FLAGS = ("shell", "cancel_requested", "actionable", "human_action")
"""Job fields SQLite stores as integers."""


def claimed_jobs(columns: dict[str, Sequence[Any]], host: str, now: datetime) -> list[Job]:
    """The Jobs a claim took, from its values column by column (`columns`: each column's
    values in claim order, JSON and times decoded). What the claim set (status, host, its
    times) is filled in from what it wrote, not read back. A job is one constructor call
    and no dict: at batch 100 dicts per row and `job_from_row` were a fifth of a claim's
    client time."""
    count = len(columns["id"])
    columns = {**columns, "status": [JobStatus.CLAIMED] * count, "host": [host] * count,
               "claimed_at": [now] * count, "started_at": [None] * count,
               "updated_at": [now] * count,
               "command": [tuple(command) for command in columns["command"]]}
    for flag in _FLAGS:
        columns[flag] = [bool(value) for value in columns[flag]]
    return [Job(*values) for values in zip(*(columns[name] for name in _JOB_FIELDS),
                                            strict=True)]


def job_from_row(row: Mapping[str, Any]) -> Job:
    """Build a Job from a row whose values are already Python types (JSON decoded, times
    as datetimes; SQLite's flags still integers); rows written before the fleet columns
    existed lack `ram_gb` and `spawn_failures`."""
    return Job(
        row["id"], row["job_type"], tuple(row["command"]), bool(row["shell"]), row["payload"],
        row["priority"], row["weight"], row["dedup_key"], row["affinity"], row["available_at"],
        row["max_attempts"], row["timeout_seconds"], row["env"], row["workdir"],
        row["backoff_base_seconds"], row["backoff_max_seconds"], STATUSES[row["status"]],
        row["attempt"], row["failures"], row["lost"], row["host"], row["exit_code"],
        row["failure_reason"], bool(row["cancel_requested"]), row["created_at"],
        row["claimed_at"], row["started_at"], row["finished_at"], row["updated_at"],
        row.get("ram_gb", 0.0), row.get("spawn_failures", 0), row.get("transient_attempts", 0),
        row.get("escalations", 0), bool(row.get("actionable", False)),
        bool(row.get("human_action", False)), row.get("silence_timeout_seconds"))


def attempt_from_row(row: Mapping[str, Any]) -> Attempt:
    return Attempt(
        job_id=int(row["job_id"]),
        attempt=int(row["attempt"]),
        host=row["host"],
        worker=row["worker"],
        pid=row["pid"],
        log_path=row["log_path"],
        claimed_at=row["claimed_at"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        ended_at=row["ended_at"],
        exit_code=row["exit_code"],
        outcome=Outcome(row["outcome"]) if row["outcome"] else None,
        memory=memory_from_row(row),
    )


def memory_from_row(row: Mapping[str, Any]) -> MemoryUse | None:
    """None for an attempt not measured (live, never ran, or from before schema v9)."""
    enforcement = row.get("memory_enforcement")
    if not enforcement:
        return None
    peak, budget = row.get("peak_rss_bytes"), row.get("memory_budget_bytes")
    return MemoryUse(None if peak is None else int(peak),
                     None if budget is None else int(budget), Enforcement(enforcement))


def live_attempt_from_row(row: Mapping[str, Any]) -> LiveAttempt:
    return LiveAttempt(
        attempt=attempt_from_row(row),
        job_status=JobStatus(row["job_status"]),
        failures=int(row["failures"]),
        lost=int(row["lost"]),
        max_attempts=int(row["max_attempts"]),
        backoff_base_seconds=float(row["backoff_base_seconds"]),
        backoff_max_seconds=float(row["backoff_max_seconds"]),
    )


def event_from_row(row: Mapping[str, Any]) -> Event:
    return Event(
        id=int(row["id"]),
        job_id=int(row["job_id"]),
        at=row["at"],
        kind=row["kind"],
        from_status=JobStatus(row["from_status"]) if row["from_status"] else None,
        to_status=JobStatus(row["to_status"]) if row["to_status"] else None,
        attempt=row["attempt"],
        detail=row["detail"] or {},
    )


def host_from_row(row: Mapping[str, Any]) -> HostRecord:
    def names(value: Any) -> frozenset[str] | None:
        return None if value is None else frozenset(value)

    return HostRecord(
        label=row["label"],
        ram_total_gb=float(row["ram_total_gb"]),
        ram_reserved_gb=float(row["ram_reserved_gb"]),
        cpus=int(row["cpus"]),
        enabled=bool(row["enabled"]),
        transport=Transport(row["transport"]),
        ssh_target=row["ssh_target"],
        prime_max_workers=int(row["prime_max_workers"]),
        prime_max_weight=row["prime_max_weight"],
        night_max_workers=int(row["night_max_workers"]),
        night_max_weight=row["night_max_weight"],
        allowed_job_types=names(row["allowed_job_types"]),
        allowed_weights=names(row["allowed_weights"]),
        priority_floor=row["priority_floor"],
        labels=frozenset(row["labels"] or ()),
        last_heartbeat=row["last_heartbeat"],
        agent_info=row["agent_info"] or {},
        has_token=bool(row["has_token"]),
    )


def token_from_row(row: Mapping[str, Any]) -> TokenRecord:
    job_types = row["job_types"]
    return TokenRecord(
        id=int(row["id"]), name=row["name"], scope=Scope(row["scope"]),
        created_at=row["created_at"], host=row["host"],
        job_types=None if job_types is None else frozenset(job_types),
        priority_floor=row["priority_floor"], revoked_at=row["revoked_at"],
        allow_adhoc=bool(row["allow_adhoc"]),
    )


def reservation_from_row(row: Mapping[str, Any]) -> Reservation:
    return Reservation(
        id=int(row["id"]),
        kind=ReservationKind(row["kind"]),
        owner=row["owner"],
        host=row["host"],
        weight=row["weight"],
        ram_gb=float(row["ram_gb"]),
        status=ReservationStatus(row["status"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        ended_at=row["ended_at"],
        created_by=None if row["created_by"] is None else int(row["created_by"]),
        job_id=None if row.get("job_id") is None else int(row["job_id"]),
    )


def account_from_row(row: Mapping[str, Any]) -> AccountRecord:
    job_types, probe = row["job_types"], row["probe"]
    account = Account(row["host"], row["name"], {}, int(row["max_sessions"]),
                      None if job_types is None else frozenset(job_types),
                      None if probe is None else tuple(probe), row["source"])
    dead = row["dead_token"]
    percent = row["usage_percent"]
    health = AccountHealth(row["depleted_until"], row["auth_revoked_at"],
                           None if dead is None else bool(dead), row["probed_at"],
                           Usage(None if percent is None else float(percent),
                                 row["usage_resets_at"]))
    return AccountRecord(account, health, int(row["sessions"]))


def alert_from_row(row: Mapping[str, Any]) -> Alert:
    return Alert(int(row["id"]), row["key"], row["message"], row["opened_at"],
                 row["cleared_at"], row.get("sent_at"), row.get("resolved_sent_at"),
                 int(row.get("sent_count") or 0))


def due_job_from_row(row: Mapping[str, Any]) -> DueJob:
    return DueJob(int(row["id"]), int(row["priority"]), row["weight"], row["job_type"],
                  row["affinity"], row["created_at"], row["available_at"], row["avoid_host"])
