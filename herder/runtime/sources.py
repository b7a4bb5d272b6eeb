"""Where a runner gets attempts from and where it reports them.

The runner loop (process trees, timeouts, cancels, heartbeats) is the same everywhere; only
the source differs: `herder up` claims straight from the store, a `local` host under
`herder server` takes what the scheduler placed on it, and `herder agent` talks HTTP.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from herder.core.model import (
    INT_MAX,
    AttemptToken,
    HeartbeatReply,
    Job,
    JobStatus,
    Outcome,
    RunnerPresence,
)
from herder.runtime.accounts import sync_account_alerts
from herder.runtime.endings import Ending, PolicyLimits, bind_jobs, record_ending
from herder.runtime.guardian import GuardianLink
from herder.runtime.maintenance import Rescuer
from herder.store import Store, Waker

if TYPE_CHECKING:
    from herder.runtime.preflight import Refresher

log = logging.getLogger("herder.sources")


class WorkSource(abc.ABC):
    worker: str = ""
    guardian: GuardianLink | None = None
    """This process's guardian (`herder.runtime.guardian`), when it has one."""
    lease_seconds: float | None = None
    """The lease the other side enforces, when it says (the server's); else the runner's
    own `attempt_lease`."""

    def attach(self, worker: str) -> None:
        """The runner's identity (host/pid/start time), recorded on every attempt."""
        self.worker = worker

    @abc.abstractmethod
    def take(self, free: int, now: datetime) -> list[Job]:
        """Up to `free` attempts to start now (already claimed for this runner)."""

    @abc.abstractmethod
    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        """False when the attempt was fenced out before it started; an exception means
        "not recorded yet" (the runner retries it, the process stays supervised)."""

    @abc.abstractmethod
    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        """Renew the attempts' leases; raise when they could not be renewed (the runner
        stops them before their lease ends if that lasts)."""

    @abc.abstractmethod
    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None, ending: Ending | None = None,
    ) -> JobStatus | None:
        """Report an ended attempt; None when its result was rejected (fenced out)."""

    @abc.abstractmethod
    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]: ...

    @abc.abstractmethod
    def idle(self) -> bool:
        """True when nothing is queued, claimed or running anywhere this source serves."""

    @abc.abstractmethod
    def waker(self) -> Waker: ...

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def asked_at(self, token: AttemptToken) -> float | None:
        """When (monotonic) the request that brought this attempt left, if it came in
        ahead of `take` (a long-poll); None means "when `take` was called"."""
        return None

    def fenced_out(self) -> set[AttemptToken]:
        """Attempts the other side has said are no longer live since the last call."""
        return set()

    def leases(self, deadlines: Mapping[str, float]) -> None:
        """The running attempts' backstop deadlines (attempt marker -> monotonic seconds),
        after each change, for the guardian that outlives a frozen runner."""
        if self.guardian is not None:
            self.guardian.publish(self.worker, deadlines)

    def maintain(self, now: datetime) -> None:
        """Periodic upkeep (rescuing orphans); nothing by default."""

    announces: bool = False
    """The runner writes its presence here (`present`): `herder up`'s, whose machine is no
    registered host but shows like one."""

    def present(self, presence: RunnerPresence) -> None:
        """Write the runner's presence (herder.runtime.presence); only where `announces`."""

    supervised: bool = False
    """Its attempts run under a supervisor and may be adopted by a next runner (an
    agent's: herder.runtime.supervisor)."""

    def predecessors(self) -> list[tuple[AttemptToken, str]]:
        """Live attempts of this host whose runner (the worker named) is gone, that this
        one may adopt; none but an agent's."""
        return []

    def adopt(self, token: AttemptToken, previous: str, log_path: str) -> bool:
        """Take the attempt over from the dead `previous`: False when the other side no
        longer holds it live (kill it); raise when it could not be asked."""
        return False

    def close(self) -> None:
        """Release what the source holds."""


class StoreSource(WorkSource):
    """Shared by the store-backed sources: reports go straight to the store."""

    def __init__(self, store: Store, host: str, limits: PolicyLimits, rescuer: Rescuer) -> None:
        self.store = store
        self.host = host
        self.limits = limits
        self.rescuer = rescuer

    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        return self.store.attempt_start(token, pid, log_path, now)

    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        return self.store.attempt_heartbeat(self.host, tokens, now)

    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None, ending: Ending | None = None,
    ) -> JobStatus | None:
        return record_ending(self.store, job, outcome, now, self.limits, retry_after, ending,
                             exit_code)

    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        return self.store.job_cancel_requested(job_ids)

    def bind(self, jobs: list[Job], now: datetime) -> list[Job]:
        """The jobs that may launch, each under its account if its type needs one."""
        return bind_jobs(self.store, self.host, jobs, now, self.limits)

    def waker(self) -> Waker:
        return self.store.listen()

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def maintain(self, now: datetime) -> None:
        self.rescuer.run_once(now)
        self.store.statistics_refresh()


RUNNER_FORGET = timedelta(days=1)
"""A `herder up` presence not written for this long (by the database's clock) is
forgotten (until then it shows down)."""


class ClaimSource(StoreSource):
    """`herder up`: claim due jobs in priority order with SKIP LOCKED / BEGIN IMMEDIATE,
    none of a job type whose preflight fails here (the job stays queued, nothing
    spent; an alert `preflight:<host>:<type>` says so until it passes). Its presence
    (`herder_runners`) shows the machine like a host; it is never placed on."""

    announces = True

    def __init__(self, store: Store, host: str, limits: PolicyLimits, rescuer: Rescuer,
                 max_workers: int | None = None, preflight: Refresher | None = None) -> None:
        super().__init__(store, host, limits, rescuer)
        self.max_workers = max_workers
        """`[fleet] emergency_max_workers` as herder.toml starts it (`herder fleet cap`
        changes it at run time)."""
        self.preflight = preflight
        self.pinned_elsewhere = frozenset(
            job_type for job_type, hosts in limits.rules.pinned.items() if host not in hosts)
        """Job types pinned to other hosts (`hosts = [...]`): never claimed here."""
        self.alerted: dict[str, str] | None = None
        """The failed job types with an open alert, with why (None: not read yet; a
        former runner of this host may have left some open)."""

    def attach(self, worker: str) -> None:
        super().attach(worker)
        if self.preflight is not None:
            self.preflight.start()

    def maintain(self, now: datetime) -> None:
        super().maintain(now)
        self.store.runner_prune(RUNNER_FORGET)
        if self.limits.rules.accounts.needs:  # no scheduler here to clear them
            sync_account_alerts(self.store, now, self.limits.rules.accounts.cooldown)

    def take(self, free: int, now: datetime) -> list[Job]:
        free = min(free, self.fleet_room())
        if free <= 0:
            return []
        blocked = self.blocked(now)
        if blocked is None:
            return []  # the first preflights have not ended yet
        blocked |= self.sessions_full(now) | self.pinned_elsewhere
        return self.bind(self.store.job_claim(self.host, self.worker, free, now, blocked), now)

    def sessions_full(self, now: datetime) -> frozenset[str]:
        """The job types whose every usable account here is at its session cap: claiming
        one would only end it `refused` (an attempt, a second's wait, again and again until
        a session ends), as the server's placement passes such a host over (`slots_full`).
        A type with no usable account at all is still claimed: it waits for the first reset."""
        rules = self.limits.rules.accounts
        if not rules.needs:
            return frozenset()
        records = self.store.account_list(self.host)
        return frozenset(job_type for job_type in rules.needs
                         if rules.choose(records, self.host, job_type, now).full)

    def blocked(self, now: datetime) -> frozenset[str] | None:
        """The job types not to claim; an alert opened or cleared for each change."""
        if self.preflight is None:
            return frozenset()
        failed = self.preflight.failed()
        if failed is None:
            return None
        if self.alerted is None:
            prefix = preflight_alert(self.host, "")
            self.alerted = {alert.key.removeprefix(prefix): alert.message
                            for alert in self.store.alert_list(open_only=True, limit=1000)
                            if alert.key.startswith(prefix)}
        for job_type, detail in sorted(failed.items()):
            if job_type not in self.alerted:
                log.warning("preflight for job type %s failed (%s): not claiming it for now",
                            job_type, detail)
                self.store.alert_open(preflight_alert(self.host, job_type),
                                      f"preflight for job type {job_type} failed on "
                                      f"{self.host}: {detail}", now)
        for job_type in sorted(set(self.alerted) - set(failed)):
            log.info("preflight for job type %s passes again", job_type)
            self.store.alert_clear(preflight_alert(self.host, job_type), now)
        self.alerted = dict(failed)
        return frozenset(failed)

    def fleet_room(self) -> int:
        """How many more jobs the fleet-wide cap lets start (every process on this store
        counts; two claiming at the same instant may pass it by one each)."""
        from herder.runtime.scheduler import fleet_cap

        cap = fleet_cap(self.store, self.max_workers).max_workers
        if cap is None:
            return INT_MAX
        counts = self.store.job_counts()
        return cap - counts.get(JobStatus.CLAIMED, 0) - counts.get(JobStatus.RUNNING, 0)

    def idle(self) -> bool:
        """Nothing queued, claimed or running; or only jobs this runner never claims: their
        type's preflight fails here, or their type is pinned to other hosts
        (`--exit-when-idle` would wait forever for them: they stay queued, said)."""
        counts = self.store.job_counts()
        if not any(counts.values()):
            return True
        failed = self.preflight.failed() if self.preflight is not None else None
        unclaimed = set(failed or ()) | self.pinned_elsewhere
        if not unclaimed or counts.get(JobStatus.CLAIMED) or counts.get(JobStatus.RUNNING):
            return False
        queued = self.store.job_list([JobStatus.QUEUED], counts.get(JobStatus.QUEUED, 0) + 1)
        if any(job.job_type not in unclaimed for job in queued):
            return False
        log.warning("%d queued job(s) left: their job types' preflight fails here or they "
                    "are pinned to other hosts (%s)", len(queued),
                    ", ".join(sorted({job.job_type for job in queued})))
        return True

    def present(self, presence: RunnerPresence) -> None:
        self.store.runner_publish(presence)

    def close(self) -> None:
        if self.preflight is not None:
            self.preflight.stop()
        if self.worker:
            try:  # a clean exit: the machine leaves the fleet view rather than turn down
                self.store.runner_remove(self.host, self.worker)
            except Exception as exc:
                log.warning("could not remove this runner's presence (%s: %s): it shows "
                            "down until a runner of %s starts", type(exc).__name__, exc,
                            self.host)


def preflight_alert(host: str, job_type: str) -> str:
    """The alert a failing preflight raises under `herder up` (`herder why` reads it)."""
    return f"preflight:{host}:{job_type}"


class AssignmentSource(StoreSource):
    """A `local` host under `herder server`: run what the scheduler placed on this host."""

    def take(self, free: int, now: datetime) -> list[Job]:
        jobs = self.store.attempt_list_assigned(self.host, free)
        return self.bind([job for job in jobs
                          if self.store.attempt_set_worker(job.token, self.worker, now)], now)

    def idle(self) -> bool:
        return not any(self.store.job_counts().values())
