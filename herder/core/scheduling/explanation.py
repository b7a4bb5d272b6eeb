"""`herder why JOB`: why a job waits, read from a placement plan and the snapshot it was
made from."""

from __future__ import annotations

from collections.abc import Sequence

from herder.core.scheduling.capacity import bookable_gb
from herder.core.scheduling.placement import Plan, Reason, Rejection, Snapshot

_EXPLAIN_ORDER = (
    Reason.FLEET_CAP,
    Reason.RAM,
    Reason.SLOTS_FULL,
    Reason.RESERVED,
    Reason.MAX_WEIGHT,
    Reason.SHED,
    Reason.HEALTH,
    Reason.AGENT_DOWN,
    Reason.WINDOW_CLOSED,
    Reason.PRIORITY_FLOOR,
    Reason.WEIGHT_NOT_ALLOWED,
    Reason.BREAKER_OPEN,
    Reason.NO_HEALTHY_ACCOUNT,
    Reason.PREFLIGHT_FAILED,
    Reason.JOB_TYPE_NOT_ALLOWED,
    Reason.DRAINED,
    Reason.UNKNOWN_WEIGHT,
    Reason.AFFINITY,
    Reason.JOB_TYPE_PINNED,
)
_MORE = {
    Reason.FLEET_CAP: "hosts",
    Reason.RAM: "hosts short of RAM",
    Reason.SLOTS_FULL: "hosts full",
    Reason.RESERVED: "hosts held",
    Reason.MAX_WEIGHT: "hosts with a lower max weight",
    Reason.SHED: "hosts shed",
    Reason.HEALTH: "hosts down or unknown",
    Reason.AGENT_DOWN: "hosts whose agent is down",
    Reason.WINDOW_CLOSED: "hosts closed now",
    Reason.PRIORITY_FLOOR: "hosts with a higher priority floor",
    Reason.WEIGHT_NOT_ALLOWED: "hosts refusing the weight",
    Reason.JOB_TYPE_NOT_ALLOWED: "hosts refusing the job type",
    Reason.PREFLIGHT_FAILED: "hosts whose preflight for the job type failed",
    Reason.BREAKER_OPEN: "hosts whose breaker for the job type is open",
    Reason.NO_HEALTHY_ACCOUNT: "hosts without a healthy account for the job type",
    Reason.DRAINED: "hosts drained",
    Reason.UNKNOWN_WEIGHT: "hosts",
    Reason.AFFINITY: "hosts bound elsewhere",
    Reason.JOB_TYPE_PINNED: "hosts not the job type's",
}
_LIST_ALL_UP_TO = 6


def explain(job_id: int, plan: Plan, snapshot: Snapshot) -> str:
    """One line for `herder why JOB`: where it went, or what every host said, the hosts
    closest to taking it first and crowds of alike refusals folded into a count."""
    for assignment in plan.assignments:
        if assignment.job_id == job_id:
            passed = plan.avoided.get(job_id)
            if passed is not None:
                return f"placed on {assignment.host}, not {passed.host}: {passed.detail}"
            return f"placed on {assignment.host}"
    job = next((job for job in snapshot.jobs if job.id == job_id), None)
    rejections = plan.waiting.get(job_id)
    if job is None or rejections is None:
        return f"job {job_id} is not queued in this snapshot"
    weights = snapshot.weights
    if weights.known(job.weight):
        head = f"needs {weights.budget(job.weight):g} GB ({job.weight})"
    else:
        head = f"unknown weight {job.weight!r}"
    held = [host for host, holder in plan.reservations.items() if holder == job_id]
    if held:
        head = f"held {held[0]} for it (starving); {head}"
    if job.affinity is not None:
        # Only the bound host matters; the rest refused it for being someone else.
        bound = [rejection for rejection in rejections if rejection.host == job.affinity]
        if not bound:
            return f"{head}, bound to {job.affinity}, which is not a registered host"
        return f"{head}, bound to {job.affinity}: {_phrase(bound[0])}"
    if not rejections:
        return f"{head}: no hosts registered"
    return f"{head}: {_fold(rejections, plan, snapshot, held[0] if held else None)}"


def _fold(
    rejections: Sequence[Rejection], plan: Plan, snapshot: Snapshot, held: str | None
) -> str:
    """Group refusals by reason, closest to fitting first; the held host leads."""
    parts: list[str] = []
    groups: dict[Reason, list[Rejection]] = {reason: [] for reason in _EXPLAIN_ORDER}
    for rejection in rejections:
        if rejection.host == held:
            parts.append(_phrase(rejection))
        else:
            groups[rejection.reason].append(rejection)
    capped = groups.pop(Reason.FLEET_CAP)
    if capped:  # one fleet-wide reason, not one per host
        parts.insert(0, _phrase(capped[0]))
    ram = groups[Reason.RAM]
    if len(ram) > 1:
        free = _free_after(plan, snapshot, {rejection.host for rejection in ram})
        ram.sort(key=lambda rejection: (-free.get(rejection.host, 0.0), rejection.host))
    everything = len(rejections) <= _LIST_ALL_UP_TO
    for reason in _EXPLAIN_ORDER:
        group = groups.get(reason)
        if not group:
            continue
        if everything:
            parts.extend(_phrase(rejection) for rejection in group)
        elif len(group) == 1:
            parts.append(_phrase(group[0]))
        else:
            more = len(group) - 1
            noun = _MORE[reason] if more > 1 else _MORE[reason].replace("hosts", "host", 1)
            parts.append(f"{_phrase(group[0])} and {more} more {noun}")
    return ", ".join(parts)


def _phrase(rejection: Rejection) -> str:
    host, reason, detail = rejection.host, rejection.reason, rejection.detail
    if reason is Reason.FLEET_CAP:
        return f"fleet cap reached ({detail}; `herder fleet cap`)"
    if reason is Reason.RAM:
        return f"{host} has {detail.partition(', needs')[0]}"
    if reason is Reason.SLOTS_FULL:
        return f"{host} full ({detail})"
    if reason is Reason.SHED:
        return f"{host} shed ({detail})"
    if reason is Reason.JOB_TYPE_PINNED:
        return f"{host} not used ({detail})"
    return f"{host} {detail}"


def _free_after(plan: Plan, snapshot: Snapshot, labels: set[str]) -> dict[str, float]:
    """Free GB on these hosts once the plan's assignments are booked."""
    placed = {a.job_id: a.host for a in plan.assignments if a.host in labels}
    weights = snapshot.weights
    free: dict[str, float] = {}
    for spec in snapshot.hosts:
        if spec.label in labels:
            load = snapshot.loads.get(spec.label)
            booked = load.booked_gb if load is not None else 0.0
            bookable = bookable_gb(spec.ram_total_gb, spec.ram_reserved_gb,
                                   snapshot.policy.bookable_fraction)
            free[spec.label] = bookable - booked
    if placed:
        for job in snapshot.jobs:
            host = placed.get(job.id)
            if host is not None and weights.known(job.weight):
                free[host] -= weights.budget(job.weight)
    return free
