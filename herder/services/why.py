"""`herder why`: one line saying why a job is (not) running, for one job or a page of them
(the dashboard's jobs view), from the job itself or the placement it waits on."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from datetime import datetime

from herder.core.errors import NotFound
from herder.core.fleet import Fleet
from herder.core.model import Job, JobStatus, RunnerPresence, launch_failure
from herder.core.scheduling.explanation import explain
from herder.core.scheduling.placement import Plan, Snapshot
from herder.runtime.accounts import accounts_why
from herder.runtime.read_models import (
    fleet_cap_view,
    placed,
    runner_preflight_failures,
    runners,
)
from herder.services.views import iso
from herder.store import Store

QUOTA_WAITS = {
    "usage_blocked": "a usage limit's reset",
    "no_healthy_account": "an account that can serve it to turn usable",
}
"""Failure reasons whose wait is an account's, not the job's backoff."""


def why(store: Store, fleet: Fleet, job_id: int, now: datetime) -> str:
    """One line: why this job is (not) running."""
    job = store.job_get(job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    text = why_of(store, fleet, [job], now)[job.id]
    if job.status in (JobStatus.RUNNING, JobStatus.CLAIMED, JobStatus.DONE) or not job.attempt:
        return text
    # A job that waits or failed because its last attempt could not start says why.
    launch = launch_failure(store.attempt_list(job_id), store.event_list(job_id))
    text += f"; {launch}" if launch else ""
    if job.status is JobStatus.QUEUED and job.available_at > now:
        accounts = accounts_why(store, fleet.accounts, job.job_type, now)  # its reset, say
        text += f"; {accounts}" if accounts else ""
    return text


def why_of(store: Store, fleet: Fleet, jobs: Sequence[Job], now: datetime,
           placement: Callable[[set[int]], tuple[Plan, Snapshot]] | None = None
           ) -> dict[int, str]:
    """`why` for several jobs (a page of the dashboard): the placement the due ones wait on
    is computed once (or taken from `placement`, given their ids), and only if one is due."""
    found = {job.id: text for job in jobs if (text := _settled_why(job, now)) is not None}
    due = [job for job in jobs if job.id not in found]
    if not due:
        return found
    if not store.host_list():
        order = sorted((other.priority, other.id) for other in store.job_list_due(now, 100_000))
        blocked = up_preflight_failures(store)
        machines = [presence for presence in runners(store, set(), now)
                    if fleet.runner_down(presence, now) is None]
        capped = up_cap_reached(store, fleet)
        for job in due:
            ahead = bisect.bisect_left(order, (job.priority, job.id))
            pinned = fleet.policy.pinned.get(job.job_type)
            found[job.id] = "queued; " + up_slots_why(
                [presence for presence in machines if pinned is None or presence.label in pinned],
                ahead)
            if job.job_type in blocked:
                found[job.id] += f", but not now: {blocked[job.job_type]}"
            if capped:
                found[job.id] += f", but not now: {capped}"
            if pinned is not None:
                found[job.id] += (f", but only one whose --host is one of its type's hosts "
                                  f"({', '.join(sorted(pinned))})")
        return found
    plan, snapshot = (placement({job.id for job in due}) if placement is not None
                      else placed(store, fleet, now))
    found.update((job.id, explain(job.id, plan, snapshot)) for job in due)
    return found


def up_slots_why(machines: Sequence[RunnerPresence], ahead: int) -> str:
    """Where a queued job waits under `herder up`: a free slot of a live runner takes it on
    the runner's next turn, unless the jobs ahead of it fill the free ones first; then it
    waits for a busy one. With no live runner, for one to start."""
    if not machines:
        return f"no hosts are registered, so `herder up` runs it ({ahead} job(s) ahead of it)"
    free = sum(max(0, presence.concurrency - presence.running) for presence in machines)
    if ahead < free:
        labels = ", ".join(presence.label for presence in machines
                           if presence.running < presence.concurrency)
        return (f"a free slot on {labels} takes it on the runner's next turn "
                f"({ahead} job(s) ahead of it)")
    slots = sum(presence.concurrency for presence in machines)
    where = machines[0].label if len(machines) == 1 else ", ".join(
        f"{presence.label} ({presence.concurrency})" for presence in machines)
    return f"waits for one of {slots} busy slots on {where} ({ahead} job(s) ahead of it)"


def up_cap_reached(store: Store, fleet: Fleet) -> str | None:
    """Why `herder up` claims nothing while the fleet-wide cap is full; None when it is not."""
    cap = fleet_cap_view(store, fleet.max_workers)
    if cap.max_workers is None or cap.running < cap.max_workers:
        return None
    return (f"fleet cap reached ({cap.running} running, fleet cap {cap.max_workers}; "
            "`herder fleet cap`)")


def up_preflight_failures(store: Store) -> dict[str, str]:
    """Job type -> why `herder up` claims none of it (its open `preflight:` alerts)."""
    failures: dict[str, str] = {}
    for by_type in runner_preflight_failures(store).values():
        for job_type, message in by_type.items():
            failures.setdefault(job_type, message)
    return failures


def _settled_why(job: Job, now: datetime) -> str | None:
    """Why, for a job whose answer needs no placement (running, ended, backing off)."""
    if job.status is JobStatus.RUNNING:
        return f"running on {job.host} (attempt {job.attempt})"
    if job.status is JobStatus.CLAIMED:
        return f"placed on {job.host}, waiting for it to start (attempt {job.attempt})"
    if job.status.terminal:
        reason = f" ({job.failure_reason})" if job.failure_reason else ""
        return f"{job.status}{reason}; exit code {job.exit_code}"
    if job.available_at > now:
        wait = (job.available_at - now).total_seconds()
        after = f" after {job.failure_reason}" if job.failure_reason else ""
        until = job.available_at.replace(microsecond=0)
        if job.attempt == 0:  # submitted with a delay (`--delay`, `delay_seconds`)
            return f"not before {iso(until)}: submitted with a delay ({wait:.0f}s to go)"
        if job.failure_reason in QUOTA_WAITS:  # not a backoff: an account's limit resets
            return (f"waiting {wait:.0f}s for {QUOTA_WAITS[job.failure_reason]}{after} "
                    f"(until {iso(until)})")
        return f"waiting {wait:.0f}s for its retry backoff{after} (until {iso(until)})"
    return None
