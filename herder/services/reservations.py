"""Reservations: a CI run's slot (`herder slots`), subagent slots (`herder reserve`) and
their end (`herder complete`), on the store and the fleet's weights."""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from herder.core.errors import Conflict, InputError, NotFound
from herder.core.model import JobStatus, Reservation, ReservationKind, ReservationStatus
from herder.core.settings.loading import Config
from herder.core.settings.sections import subagent_caps
from herder.services.base import OperationsBase
from herder.store import Store
from herder.store.records import JobCapReached

if TYPE_CHECKING:
    from herder.core.fleet import Fleet

def complete_reservation(store: Store, reservation_id: int, status: ReservationStatus,
                         now: datetime, by: int | None = None) -> Reservation:
    """End an active reservation (with `by`: only one that token made) or say how it
    ended."""
    if status not in (ReservationStatus.DONE, ReservationStatus.FAILED,
                      ReservationStatus.CANCELLED):
        raise InputError("status", f"{status!r} cannot complete a reservation",
                         "use done, failed or cancelled")
    ended = store.reservation_end(reservation_id, status, now, by)
    if ended is not None:
        return ended
    existing = store.reservation_get(reservation_id)
    if existing is None:
        raise NotFound(f"no reservation {reservation_id}")
    return existing


def reserve(store: Store, config: Config, fleet: Fleet, owner: str, label: str, weight: str,
            count: int, now: datetime, created_by: int | None = None,
            max_held: int | None = None, job_id: int | None = None) -> list[Reservation]:
    """Up to `count` subagent slots for `owner` on a host, as many as fit its bookable RAM
    (and, with `max_held`, as keep token `created_by` within that many active ones). Booked
    for job `job_id`, all or none within its weight's `max_subagents_for_weight` there."""
    from herder.runtime.scheduler import expires  # placement: not for every command

    host = store.host_get(label)
    if host is None:
        raise InputError("host", f"unknown host {label!r}", "see `herder hosts`")
    config.check_weight(weight)
    cap = job_weight = None
    if job_id is not None:
        job = store.job_get(job_id)
        if job is None:
            raise InputError("job", f"no job {job_id}", "name the job that books the slots")
        if job.status not in (JobStatus.CLAIMED, JobStatus.RUNNING):
            raise InputError("job", f"job {job_id} is {job.status}: only a running job books "
                             "subagent slots", "name the running job that books them")
        job_weight = job.weight
        cap = subagent_caps(config.settings).get(job_weight)
    try:
        return store.reservation_create(
            ReservationKind.SUBAGENT, owner, label, weight, fleet.weights.budget(weight), count,
            expires(now, config.settings.fleet.reservation_ttl), fleet.bookable(host), now,
            created_by, max_held, job_id, cap)
    except JobCapReached as reached:
        raise Conflict(
            f"job {job_id} ({job_weight}) holds {reached.held} subagent slot(s) on {label}; "
            f"{count} more would pass [fleet] max_subagents_for_weight.{job_weight} = {cap}: "
            "complete some first (`herder complete`), or raise the cap") from None


def claim_slot(store: Store, config: Config, fleet: Fleet, run_id: str, label: str,
               weight: str, now: datetime, created_by: int | None = None,
               max_held: int | None = None) -> Reservation:
    """A CI run's slot (the live one when the run holds one); Conflict when token
    `created_by` already holds `max_held` reservations and slots."""
    from herder.runtime.scheduler import expires

    if store.host_get(label) is None:
        raise InputError("host", f"unknown host {label!r}", "see `herder hosts`")
    config.check_weight(weight)
    created = store.reservation_create(
        ReservationKind.CI, run_id, label, weight, fleet.weights.budget(weight), 1,
        expires(now, config.settings.fleet.ci_slot_ttl), None, now, created_by, max_held)
    if not created:
        raise Conflict(f"this token holds {max_held} active reservations and slots "
                       "(server.max_reservations_per_token): release some first")
    return created[0]


class ReservationOperations(OperationsBase):
    """The reservation operations of `herder.services.operations.Operations`. The server
    passes `created_by`, `max_held` and `by`: the API's token and its cap
    (herder.api.reservations)."""


    def claim_slot(self, run_id: str, label: str, weight: str, *,
                   created_by: int | None = None, max_held: int | None = None) -> int:
        """A CI run's slot id; claiming again returns the same slot."""
        return claim_slot(self.store, self.config, self._fleet(), run_id, label, weight,
                          datetime.now(UTC), created_by, max_held).id

    def release_slot(self, run_id: str, *, by: int | None = None) -> bool:
        """Release a run's slot; with `by`, only one that token made."""
        return self.store.reservation_release_ci(run_id, datetime.now(UTC), by) is not None

    def reserve(self, owner: str, label: str, weight: str, count: int, job: int | None = None,
                *, created_by: int | None = None, max_held: int | None = None
                ) -> builtins.list[int]:
        """Subagent slots for `owner`: the ids of those that fit (maybe fewer than count);
        booked for `job`, none past its weight's cap (Conflict)."""
        return [r.id for r in reserve(self.store, self.config, self._fleet(), owner, label,
                                      weight, count, datetime.now(UTC), created_by, max_held,
                                      job)]

    def complete_reservation(self, reservation_id: int, status: ReservationStatus, *,
                             by: int | None = None) -> ReservationStatus:
        return complete_reservation(self.store, reservation_id, status,
                                    datetime.now(UTC), by).status

    def reservation(self, reservation_id: int) -> Reservation | None:
        return self.store.reservation_get(reservation_id)

    def ci_slot(self, run_id: str) -> Reservation | None:
        """The run's live CI slot, if it holds one."""
        return self.store.reservation_active_ci(run_id)
