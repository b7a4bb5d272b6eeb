"""Records to statement parameters, and the checks both dialects run before a write."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from herder.core.model import (
    RAM_TOLERANCE_GB,
    AttemptResult,
    AttemptToken,
    Decision,
    HostRecord,
    JobSpec,
    JobStatus,
    MemoryUse,
    Outcome,
)
from herder.store.driver import Json, Transaction

DEDUP_RELEASED_DETAIL = {"reason": "forced rerun"}
"""The `dedup_released` event's detail: a forced submit is the only release."""


def spec_params(spec: JobSpec, now: datetime) -> dict[str, Any]:
    """A submitted job's column values, as job_insert takes them (each driver adapts the
    times and JSON to its dialect)."""
    return {
        "job_type": spec.job_type,
        "command": Json(list(spec.command)),
        "shell": spec.shell,
        "payload": Json(dict(spec.payload)),
        "priority": spec.priority,
        "weight": spec.weight,
        "dedup_key": spec.dedup_key,
        "affinity": spec.affinity,
        "available_at": now if spec.available_at is None else spec.available_at,
        "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds,
        "silence_timeout_seconds": spec.silence_timeout_seconds,
        "env": Json(dict(spec.env)),
        "workdir": spec.workdir,
        "backoff_base_seconds": spec.backoff_base_seconds,
        "backoff_max_seconds": spec.backoff_max_seconds,
        "now": now,
    }


def dedup_keys(specs: Sequence[JobSpec]) -> set[str]:
    """The dedup keys a forced submit releases from `done` jobs before inserting."""
    return {spec.dedup_key for spec in specs if spec.dedup_key is not None}


FinishKey = tuple[Outcome, int | None, Decision, str | None, MemoryUse | None]
"""What a finish group shares: outcome, exit code, decision, report and memory."""
FinishGroup = tuple[FinishKey, dict[int, int], dict[int, AttemptToken]]
_Shelf = tuple[dict[int, int], dict[int, AttemptToken]]


def finish_groups(results: Sequence[AttemptResult]) -> list[FinishGroup]:
    """Results that share outcome, exit code and decision, each group's tokens as
    {job_id: attempt}: both stores finish a group with one statement, its decision passed
    once (a batch is usually one group), and find each job's attempt by key. Each group also
    keeps the callers' token objects by job, so a store reports the applied ones without
    building new tokens. Two tokens of one job go to separate groups (only the live one can
    apply); a repeated token keeps its first result."""
    groups: dict[FinishKey, list[_Shelf]] = {}
    seen: set[tuple[int, int]] = set()  # plain tuples: they hash in C
    last: FinishKey | None = None
    shelves: list[_Shelf] = []
    for result in results:
        token = result.token
        job_id, attempt = token.job_id, token.attempt
        if (job_id, attempt) in seen:
            continue
        seen.add((job_id, attempt))
        # A batch's results usually share one outcome and decision object: only a change
        # pays for hashing the decision (a dataclass hashes in Python).
        if (last is None or result.decision is not last[2] or result.outcome is not last[0]
                or result.exit_code != last[1] or result.report is not last[3]
                or result.memory is not last[4]):
            last = (result.outcome, result.exit_code, result.decision, result.report,
                    result.memory)
            shelves = groups.setdefault(last, [])
        for shelf in shelves:
            if job_id not in shelf[0]:
                break
        else:
            shelf = ({}, {})
            shelves.append(shelf)
        tokens, held = shelf
        tokens[job_id] = attempt
        held[job_id] = token
    return [(key, tokens, held) for key, shelves in groups.items() for tokens, held in shelves]


def finish_params(outcome: Outcome, exit_code: int | None, decision: Decision,
                  memory: MemoryUse | None = None) -> dict[str, Any]:
    """A finish group's shared parameters, named as both dialects' attempt_finish statements
    read them; each store adds the tokens, `now` and `available_at` in its own time form."""
    return {"outcome": outcome.value, "exit_code": exit_code,
            "next_status": decision.status.value, "failure_reason": decision.failure_reason,
            "spend_failure": int(decision.spend_failure), "spend_lost": int(decision.spend_lost),
            "spend_spawn_failure": int(decision.spend_spawn_failure),
            "spend_transient": int(decision.spend_transient), "weight": decision.weight,
            "avoid_host": int(decision.avoid_host),
            "actionable": int(decision.actionable),
            "human_action": int(decision.human_action),
            "peak_rss_bytes": memory.peak_rss_bytes if memory else None,
            "memory_budget_bytes": memory.budget_bytes if memory else None,
            "memory_enforcement": memory.enforcement.value if memory else None}


def finish_detail(outcome: Outcome, exit_code: int | None, report: str | None
                  ) -> dict[str, Any]:
    """The `finished` event's detail: the outcome and exit code, and what the attempt's
    report adds (it cannot override those two)."""
    extra = json.loads(report) if report else {}
    return {**(extra if isinstance(extra, dict) else {}), "outcome": outcome.value,
            "exit_code": exit_code}


def insert_event(
    transaction: Transaction,
    job_id: int,
    now: datetime,
    kind: str,
    from_status: JobStatus | None,
    to_status: JobStatus | None,
    attempt: int | None,
    detail: Mapping[str, Any],
) -> None:
    transaction.fetch("event_insert", {
        "job_id": job_id, "now": now, "kind": kind,
        "from_status": None if from_status is None else from_status.value,
        "to_status": None if to_status is None else to_status.value,
        "attempt": attempt, "detail": Json(dict(detail))})


def host_params(host: HostRecord, now: datetime) -> dict[str, Any]:
    """Column values of a host, as host_insert and host_update take them."""
    return {
        "now": now,
        "label": host.label,
        "ram_total_gb": host.ram_total_gb,
        "ram_reserved_gb": host.ram_reserved_gb,
        "cpus": host.cpus,
        "enabled": host.enabled,
        "transport": str(host.transport),
        "ssh_target": host.ssh_target,
        "prime_max_workers": host.prime_max_workers,
        "prime_max_weight": host.prime_max_weight,
        "night_max_workers": host.night_max_workers,
        "night_max_weight": host.night_max_weight,
        "allowed_job_types": None if host.allowed_job_types is None
        else Json(sorted(host.allowed_job_types)),
        "allowed_weights": None if host.allowed_weights is None
        else Json(sorted(host.allowed_weights)),
        "priority_floor": host.priority_floor,
        "labels": Json(sorted(host.labels)),
    }


def ram_fits(booked_gb: float, ram_gb: float, bookable_gb: float) -> bool:
    """The capacity re-check both stores run under the host lock before placing a job."""
    return booked_gb + ram_gb <= bookable_gb + RAM_TOLERANCE_GB


def slots_that_fit(count: int, ram_gb: float, booked_gb: float,
                   bookable_gb: float | None) -> int:
    """How many of `count` reservations of `ram_gb` fit; all when unbounded or free."""
    if bookable_gb is None or ram_gb <= 0:
        return count
    free = bookable_gb - booked_gb + RAM_TOLERANCE_GB
    return max(0, min(count, math.floor(free / ram_gb)))
