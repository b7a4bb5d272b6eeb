"""Maintenance services: each is a `run_once(now)` returning counts, looped by the runner.

The rescuer finds attempts whose runner is gone and hands their jobs back to the queue.
An attempt is *orphaned* when its runner was on this host and that process no longer
exists (`herder up` restarted after kill -9 finds these at once; `herder server`, whose
replicas share the local hosts, once their lease has passed); it is *stale* when its
heartbeat is older than the lease, wherever it ran. The surviving processes of an attempt
of a host run here are killed before its job is requeued, so no two attempts of a job ever
run at the same time.

The pickup watch hands back placements that no runner took within the pickup timeout
(the host's agent died or is not asking for work), so they run elsewhere in seconds
instead of waiting out the lease on a host that will never start them. Untaken placements
are the watch's alone: the lease is a runner's, and with a lease shorter than the pickup
timeout the rescuer would otherwise hand back a placement whose agent is still starting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

import msgspec

from herder.core.model import AttemptResult, Decision, HostRecord, JobStatus, Outcome, WorkerId
from herder.core.scheduling.alerting import ram_spike
from herder.core.scheduling.policy import RetryState, decide
from herder.runtime.attempt_files import attempt_marker
from herder.runtime.process import kill_tree, process_alive
from herder.store import LiveAttempt, Store

log = logging.getLogger("herder.maintenance")


class Rescue(msgspec.Struct, frozen=True):
    live: LiveAttempt
    reason: str  # "orphaned" or "stale"
    kill: bool = False  # its processes may be on this machine: kill them before the requeue


def rescue_plan(
    live: Iterable[LiveAttempt],
    now: datetime,
    lease_seconds: float,
    host: str | frozenset[str],
    worker_alive: Callable[[WorkerId], bool],
    shared: bool = False,
) -> list[Rescue]:
    """Which live attempts to declare lost, and why. Pure but for the liveness probe.

    `host` names the host label(s) whose processes run on this machine: their attempts are
    judged by whether their runner process lives, never by the lease alone, because only
    here can survivors be killed before the job is requeued. `shared`: other machines may
    run these hosts' attempts too (`herder server` replicas each serve the local hosts), and
    a pid says nothing about another machine's process, so the lease decides; a runner dead
    here only has its survivors killed first.
    """
    local = frozenset({host}) if isinstance(host, str) else host
    plan: list[Rescue] = []
    cutoff = now - timedelta(seconds=lease_seconds)
    for item in live:
        attempt = item.attempt
        if attempt.worker == "":
            # No runner has taken this placement, so none can be silent: the pickup watch
            # judges it (its timeout may be the longer one), and fences before it requeues.
            continue
        worker = WorkerId.parse(attempt.worker)
        if attempt.host in local and worker is not None and worker.host == attempt.host:
            alive = worker_alive(worker)
            if shared:
                if attempt.heartbeat_at < cutoff:
                    plan.append(Rescue(item, "stale" if alive else "orphaned", kill=True))
            elif not alive:
                plan.append(Rescue(item, "orphaned", kill=True))
            continue  # a live local runner speaks for its own attempts
        if attempt.heartbeat_at < cutoff:
            plan.append(Rescue(item, "stale"))
    return plan


def local_worker_alive(worker: WorkerId) -> bool:
    return process_alive(worker.pid, worker.start_time)


def lost_result(live: LiveAttempt, now: datetime, max_lost: int) -> AttemptResult:
    """The result that declares a live attempt lost. A placement no runner took spends
    nothing (the job never ran: its host failed to take it, which placement remembers as the
    host to avoid). One a runner took spends the job's lost budget even if its start was
    never heard of: the start report may have been lost with the runner (a job that kills
    its own agent, say by eating its memory, must not loop for free)."""
    attempt = live.attempt
    if attempt.started_at is None and attempt.worker in ("", PICKUP_FENCE):
        decision = Decision(JobStatus.QUEUED, available_at=now)
    else:
        state = RetryState(live.failures, live.lost, live.max_attempts,
                           live.backoff_base_seconds, live.backoff_max_seconds)
        decision = decide(Outcome.LOST, state, now, max_lost)
    return AttemptResult(attempt.token, Outcome.LOST, None, decision)


PICKUP_FENCE = "pickup-timeout"
"""The worker a timed-out placement is handed to, so that no runner can take it any more
(`attempt_set_worker` only hands out untaken placements); the attempt history shows it."""


def pickup_overdue(live: Iterable[LiveAttempt], now: datetime,
                   timeout_seconds: float) -> list[LiveAttempt]:
    """Placements no runner has taken within the timeout. Pure."""
    cutoff = now - timedelta(seconds=timeout_seconds)
    return [item for item in live
            if item.attempt.worker == "" and item.attempt.started_at is None
            and item.job_status is JobStatus.CLAIMED and item.attempt.claimed_at <= cutoff]


class PickupWatch:
    """Hands placements nobody picked up back to the queue, without spending attempts.
    Leader only, like the server's rescuer."""

    def __init__(self, store: Store, timeout_seconds: float) -> None:
        self.store = store
        self.timeout_seconds = timeout_seconds

    def run_once(self, now: datetime, host: str | None = None) -> dict[str, int]:
        """Hand back the overdue placements (of one host, or of all)."""
        overdue = pickup_overdue(self.store.attempt_list_live(host), now, self.timeout_seconds)
        results: list[AttemptResult] = []
        for item in overdue:
            # Fence first: a runner taking it at this very moment either got it (and this
            # fails) or can no longer get it. The requeue below cannot race a start.
            if self.store.attempt_set_worker(item.attempt.token, PICKUP_FENCE, now):
                results.append(lost_result(item, now, max_lost=0))
                log.warning("attempt %s: %s did not pick it up within %.1fs; placing it "
                            "again", item.attempt.token, item.attempt.host,
                            self.timeout_seconds)
        counts = {"timed_out": len(results), "requeued": 0}
        for _token, status in self.store.attempt_finish(results, now):
            if status is JobStatus.QUEUED:
                counts["requeued"] += 1
        return counts


class DeliverySweep:
    """Forgets webhook deliveries older than the retention (`hooks.retention`): a replay
    after that counts as new, but its jobs' dedup keys still hold."""

    def __init__(self, store: Store, retention_seconds: float) -> None:
        from herder.core.webhooks import REPLAY_WINDOW

        self.store = store
        # A generic delivery's id is remembered for as long as its timestamp is accepted:
        # a replay within the window is a duplicate, never new.
        self.retention_seconds = max(retention_seconds, 2 * REPLAY_WINDOW)

    def run_once(self, now: datetime) -> dict[str, int]:
        before = now - timedelta(seconds=self.retention_seconds)
        return {"forgotten": self.store.delivery_expire(before)}


class Rescuer:
    def __init__(
        self,
        store: Store,
        host: str | frozenset[str],
        lease_seconds: float,
        kill_grace: float,
        max_lost: int,
        shared: bool = False,
    ) -> None:
        self.store = store
        self.host = host
        self.lease_seconds = lease_seconds
        self.kill_grace = kill_grace
        self.max_lost = max_lost
        self.shared = shared
        """Other machines may run these hosts' attempts (see `rescue_plan`)."""

    def run_once(self, now: datetime) -> dict[str, int]:
        plan = rescue_plan(
            self.store.attempt_list_live(), now, self.lease_seconds, self.host,
            local_worker_alive, self.shared,
        )
        counts = {"orphaned": 0, "stale": 0, "requeued": 0, "failed": 0}
        results: list[AttemptResult] = []
        for rescue in plan:
            attempt = rescue.live.attempt
            # Survivors here die first: the job may only run again once they are gone.
            if rescue.kill and not kill_tree(
                None, attempt_marker(attempt.token, attempt.worker), self.kill_grace
            ):
                log.error("attempt %s: survivors would not die; not requeued", attempt.token)
                continue
            counts[rescue.reason] += 1
            results.append(lost_result(rescue.live, now, self.max_lost))
            log.warning("attempt %s on %s is %s; declared lost", attempt.token, attempt.host,
                        rescue.reason)
        for _token, status in self.store.attempt_finish(results, now):
            counts["requeued" if status.active else "failed"] += 1
        return counts


RAM_ALERT_PREFIX = "ram:"


class RamSpikeWatch:
    """Opens `ram:<host>` while a host's measured available RAM stays below `[alerts]
    ram_low_gb` for `ram_low_for`, and clears it when it recovers (`ram_spike` decides).
    Leader only. How long a host has been low is kept here: a new leader starts the clock
    afresh, so an alert is at most one `ram_low_for` late after a takeover."""

    def __init__(self, store: Store, threshold_gb: float, hold_seconds: float,
                 measure: Callable[[HostRecord, datetime], float | None]) -> None:
        self.store = store
        self.threshold_gb = threshold_gb
        self.hold_seconds = hold_seconds
        self.measure = measure
        """A host's measured available RAM in GB now; None when unknown or stale."""
        self.below_since: dict[str, datetime] = {}

    def run_once(self, now: datetime) -> dict[str, int]:
        counts = {"low": 0, "opened": 0, "cleared": 0}
        open_keys = {alert.key for alert in self.store.alert_list(open_only=True,
                                                                   limit=1_000_000)
                     if alert.key.startswith(RAM_ALERT_PREFIX)}
        hosts = self.store.host_list()
        below: dict[str, datetime] = {}
        for host in hosts:
            key = f"{RAM_ALERT_PREFIX}{host.label}"
            measured = self.measure(host, now)
            verdict = ram_spike(measured, self.below_since.get(host.label), now,
                                self.threshold_gb, self.hold_seconds)
            if verdict.below_since is not None:
                below[host.label] = verdict.below_since
                counts["low"] += 1
            if verdict.alert is True and key not in open_keys:
                message = (f"host {host.label}: {measured:.1f} GB RAM available, below "
                           f"{self.threshold_gb:g} GB since "
                           f"{verdict.below_since:%H:%M:%S} UTC")
                if self.store.alert_open(key, message, now):
                    counts["opened"] += 1
                    log.error("ALERT: %s", message, extra={"event": "ram_spike",
                                                           "host": host.label})
            elif (verdict.alert is False and key in open_keys
                  and self.store.alert_clear(key, now)):
                counts["cleared"] += 1
                log.warning("alert cleared: host %s: RAM available again", host.label)
        labels = {f"{RAM_ALERT_PREFIX}{host.label}" for host in hosts}
        for key in open_keys - labels:  # the host was removed
            if self.store.alert_clear(key, now):
                counts["cleared"] += 1
        self.below_since = below
        return counts


class AgentTroubleSweep:
    """Clears the `agent:` alerts agents raise once back from trouble (they are over when
    raised): once their opening was sent, which sends the "resolved" notice, or after the
    alert window when nothing sends them (no alert URLs), so `herder alerts` shows them
    meanwhile."""

    def __init__(self, store: Store, window_seconds: float) -> None:
        self.store = store
        self.window_seconds = window_seconds

    def run_once(self, now: datetime) -> dict[str, int]:
        cutoff = now - timedelta(seconds=self.window_seconds)
        cleared = 0
        for alert in self.store.alert_list(open_only=True, limit=1_000_000):
            if (alert.key.startswith(AGENT_TROUBLE_PREFIX)
                    and (alert.sent_at is not None or alert.opened_at <= cutoff)
                    and self.store.alert_clear(alert.key, now)):
                cleared += 1
        return {"cleared": cleared}


AGENT_TROUBLE_PREFIX = "agent:"
