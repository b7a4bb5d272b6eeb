"""The scheduler: snapshot the store, run the pure placement, commit the plan.

Placement is a pure function of the snapshot; this module only reads and writes. A plan is
committed host by host with `job_assign`, which re-checks capacity in SQL under a host lock,
so a stale snapshot or a second scheduler can delay a job but never overbook a host.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from msgspec.structs import replace

from herder.core.fleet import Fleet, FleetCap
from herder.core.model import HostRecord
from herder.core.scheduling.alerting import in_start_grace
from herder.core.scheduling.breaker import (
    Breaker,
    BreakerState,
    Ended,
    breaker,
)
from herder.core.scheduling.health import (
    accepts_work,
    liveness_changes,
)
from herder.core.scheduling.placement import (
    HostLoad,
    HostSpec,
    PendingJob,
    Plan,
    Reason,
    Snapshot,
    fleet_capacity,
    place,
    stopped,
)
from herder.core.settings.sections import Settings
from herder.runtime.accounts import FLEET_STOPPED, sync_account_alerts
from herder.store import Store

log = logging.getLogger("herder.scheduler")

BREAKER_HISTORY = timedelta(days=1)
CYCLE_HEARTBEAT = timedelta(minutes=1)
"""An idle scheduler still logs `dispatch_cycle` at INFO this often: the heartbeat a
"dispatcher silent" alert on the logs can watch, so silence means a dead scheduler."""
"""How far back a run of transient outcomes counts towards opening a breaker."""
NO_HEALTHY_HOST = "fleet:no_healthy_host"


def tripped_breakers(store: Store, fleet: Fleet,
                     now: datetime) -> dict[tuple[str, str], Breaker]:
    """Every (host, job type) whose circuit breaker is not closed now."""
    history = store.attempt_list_recent_outcomes(now - BREAKER_HISTORY,
                                                 fleet.settings.breaker_threshold)
    running = store.job_list_running_types()
    found = {}
    for key, ended in history.items():
        state = breaker([Ended(outcome, at) for outcome, at in ended], running.get(key),
                        now, fleet.settings.breaker_threshold,
                        fleet.settings.breaker_pause)
        if state.state is not BreakerState.CLOSED:
            found[key] = state
    return found


def _narrow(server: frozenset[str] | None, agent: Any) -> frozenset[str] | None:
    if not isinstance(agent, list):
        return server
    local = frozenset(str(name) for name in agent)
    return local if server is None else server & local


def agent_state(host: HostRecord) -> str | None:
    """"stopped" or "draining" as the host's agent last reported it; None when it takes work."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    return "stopped" if info.get("stopped") else "draining" if info.get("draining") else None


def blocked_job_types(host: HostRecord) -> dict[str, tuple[Reason, str]]:
    """The job types the host's agent said it cannot run now (its preflight failed)."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    failed = info.get("preflight_failed")
    if not isinstance(failed, dict):
        return {}
    return {str(job_type): (Reason.PREFLIGHT_FAILED, f"preflight failed: {detail}"[:240])
            for job_type, detail in failed.items()}


def host_spec(host: HostRecord) -> HostSpec:
    """The host as placement sees it: its record, narrowed by the allow-lists its agent
    advertises, so the agent's fail-closed check rarely has to refuse anything."""
    gate = host.agent_info.get("gate") if isinstance(host.agent_info, dict) else None
    gate = gate if isinstance(gate, dict) else {}
    floors = [f for f in (host.priority_floor, gate.get("priority_floor"))
              if isinstance(f, int)]
    # An agent that is draining or has stopped takes no work, whatever its heartbeat's age;
    # a stopped agent's host is refused by liveness, which names it (agent_down).
    state = agent_state(host)
    available = state is None or (state == "stopped" and host.transport.pulls)
    return replace(
        HostSpec.configured(host),
        enabled=host.enabled and available,
        allowed_job_types=_narrow(host.allowed_job_types, gate.get("job_types")),
        allowed_weights=_narrow(host.allowed_weights, gate.get("weights")),
        priority_floor=max(floors) if floors else None,
        drained=condition(host),
    )


def condition(host: HostRecord) -> str:
    """One word for what `herder why`, `herder hosts` and `/queue` say of a host's drain:
    "drained" (the operator's `herder host drain`), "agent draining", "agent stopped", or
    "enabled"."""
    if not host.enabled:
        return "drained"
    state = agent_state(host)
    return f"agent {state}" if state else "enabled"


EMERGENCY_MAX_WORKERS = "emergency_max_workers"


def fleet_cap(store: Store, start: int | None) -> FleetCap:
    setting = store.fleet_setting_get(EMERGENCY_MAX_WORKERS)
    if setting is None:
        return FleetCap(start)
    return FleetCap(setting.value, True, setting.updated_at, setting.updated_by)


def capacity_now(fleet: Fleet, hosts: Sequence[HostRecord], now: datetime) -> float:
    """The capacity ratio placement would shed by now (`fleet_capacity`), read without the
    queue: for `/queue` and `/metrics`."""
    loads = {host.label: HostLoad(host.label, fleet.health(host, now), 0, 0.0,
                                  fleet.agent_down(host, now)) for host in hosts}
    return fleet_capacity([host_spec(host) for host in hosts], loads,
                          fleet.policy.schedule.window_at(now))


def take_snapshot(store: Store, fleet: Fleet, now: datetime,
                  breakers: Mapping[tuple[str, str], Breaker] | None = None) -> Snapshot:
    """Everything placement needs, read from the store at `now`."""
    hosts = store.host_list()
    usage = store.host_usage(now)
    open_breakers: dict[str, dict[str, tuple[Reason, str]]] = {}
    for (label, job_type), state in (breakers if breakers is not None
                                     else tripped_breakers(store, fleet, now)).items():
        if state.blocks:
            open_breakers.setdefault(label, {})[job_type] = (Reason.BREAKER_OPEN,
                                                             state.describe())
    if fleet.accounts.needs:  # hosts whose accounts cannot serve a type are closed to it
        for label, types in fleet.accounts.blocked(store.account_list(), [
                h.label for h in hosts], now).items():
            open_breakers.setdefault(label, {}).update(types)
    loads = {}
    for host in hosts:
        used = usage.get(host.label)
        loads[host.label] = HostLoad(
            host.label, fleet.health(host, now),
            used.workers if used else 0, used.booked_gb if used else 0.0,
            fleet.agent_down(host, now),
            {**open_breakers.get(host.label, {}), **blocked_job_types(host)},
        )
    jobs = [
        PendingJob(job.id, job.priority, job.weight, job.job_type, job.affinity, None,
                   job.available_at, job.avoid_host)
        for job in store.job_list_due(now, fleet.max_due)
    ]
    return Snapshot(now, jobs, [host_spec(h) for h in hosts], loads, fleet.weights,
                    fleet.policy, fleet_cap(store, fleet.max_workers).max_workers)


@dataclass
class Scheduler:
    """One placement cycle per `run_once(now)`; the service loop decides when."""

    store: Store
    fleet: Fleet
    on_assigned: Callable[[set[str]], None] = lambda hosts: None
    last_plan: Plan | None = field(default=None, init=False)
    last_placement: tuple[Plan, Snapshot] | None = field(default=None, init=False)
    """The latest cycle's plan with the snapshot it was made from (one reference, set at
    once: other threads read it), for `why` on the dashboard's pages."""
    last_heartbeat: datetime | None = field(default=None, init=False)
    first_cycle: datetime | None = field(default=None, init=False)
    """When this scheduler first ran (as leader): the no-healthy-host and fleet-stopped
    alerts wait `alert_grace` after it for agents to check in."""
    down: dict[str, str | None] = field(default_factory=dict, init=False)
    """Each host's reason to be down at the last cycle (None: live), to log changes."""

    def run_once(self, now: datetime) -> dict[str, int]:
        records = {host.label: host for host in self.store.host_list()}
        self._log_liveness(records, now)
        breakers = tripped_breakers(self.store, self.fleet, now)
        self._alert_breakers(breakers, now)
        snapshot = take_snapshot(self.store, self.fleet, now, breakers)
        plan = place(snapshot)
        self.last_plan = plan
        self.last_placement = (plan, snapshot)
        by_host: dict[str, list[tuple[int, float]]] = defaultdict(list)
        weights = {job.id: job.weight for job in snapshot.jobs}
        for assignment in plan.assignments:
            budget = self.fleet.weights.budget(weights[assignment.job_id])
            by_host[assignment.host].append((assignment.job_id, budget))
        placed = 0
        hosts_with_work: set[str] = set()
        for label, items in by_host.items():
            host = records.get(label)
            if host is None:
                continue
            tokens = self.store.job_assign(label, items, self.fleet.caps(host, now).max_workers,
                                           self.fleet.bookable(host), now)
            if tokens:
                placed += len(tokens)
                hosts_with_work.add(label)
                for token in tokens:
                    log.info("job %d attempt %d placed on %s", token.job_id, token.attempt,
                             label, extra={"event": "dispatch_scheduled", "job_id": token.job_id,
                                           "attempt": token.attempt, "host": label,
                                           "weight": weights[token.job_id]})
        if hosts_with_work:
            self.on_assigned(hosts_with_work)
        healthy = self._alert(snapshot, now)
        self._alert_stopped(plan, now, healthy > 0)
        if self.fleet.accounts.needs:  # each unhealthy account's alert, cleared with it
            sync_account_alerts(self.store, now, self.fleet.accounts.cooldown)
        summary = {"placed": placed, "waiting": len(plan.waiting), "due": len(snapshot.jobs),
                   "healthy_hosts": healthy}
        # The dispatcher's heartbeat for log alerts: INFO when it placed work or a minute passed.
        beat = placed > 0 or self.last_heartbeat is None or (
            now - self.last_heartbeat >= CYCLE_HEARTBEAT)
        if beat:
            self.last_heartbeat = now
        log.log(logging.INFO if beat else logging.DEBUG, "placement cycle: %s", summary,
                extra={"event": "dispatch_cycle", **summary})
        return summary

    def _log_liveness(self, records: Mapping[str, HostRecord], now: datetime) -> None:
        """Log each host that went down or came back since the last cycle."""
        current = {label: self.fleet.down(host, now) for label, host in records.items()}
        for change in liveness_changes(self.down, current):
            if change.down is not None:
                log.warning("host %s down: %s", change.host, change.down,
                            extra={"event": "host_down", "host": change.host,
                                   "reason": change.down})
            else:
                log.info("host %s back", change.host,
                         extra={"event": "host_back", "host": change.host})
        self.down = current

    def _alert(self, snapshot: Snapshot, now: datetime) -> int:
        """Raise one deduplicated alert while no enabled host can take work, once a new leader
        has given agents `alert_grace` to check in."""
        enabled = [h for h in snapshot.hosts if h.enabled]
        loads = snapshot.loads
        healthy = [h for h in enabled if accepts_work(loads[h.label].health)
                   and loads[h.label].agent_down is None]
        if self.first_cycle is None:
            self.first_cycle = now
        waiting = in_start_grace(self.first_cycle, now, self.fleet.settings.alert_grace)
        stopped = bool(enabled) and not healthy
        if stopped and not waiting:
            stale = ", ".join(
                f"{h.label} ({loads[h.label].agent_down or loads[h.label].health})"
                for h in enabled)
            if self.store.alert_open(NO_HEALTHY_HOST,
                                     f"no healthy host can take work: {stale}", now):
                log.error("ALERT: no healthy host can take work: %s", stale)
        elif not stopped and self.store.alert_clear(NO_HEALTHY_HOST, now):
            log.warning("alert cleared: %d healthy host(s)", len(healthy))
        return len(healthy)


    def _alert_breakers(self, breakers: Mapping[tuple[str, str], Breaker],
                        now: datetime) -> None:
        """One alert per open breaker (a host and job type meeting a wall of rate limits),
        cleared once it is no longer open."""
        opened = {f"breaker:{label}:{job_type}": f"{job_type} on {label}: {state.describe()}"
                  for (label, job_type), state in breakers.items()
                  if state.state is BreakerState.OPEN}
        for key, message in opened.items():
            if self.store.alert_open(key, message, now):
                log.error("ALERT: %s", message)
        for alert in self.store.alert_list():
            if alert.key.startswith("breaker:") and alert.key not in opened:
                self.store.alert_clear(alert.key, now)

    def _alert_stopped(self, plan: Plan, now: datetime, any_healthy: bool) -> None:
        """One deduplicated alert while work is queued and no host is able to run any of it
        (the no-healthy-host alert already says so when every host is down); not in a new
        leader's `alert_grace`, while agents check in."""
        hosts = stopped(plan) if any_healthy else None
        if hosts and in_start_grace(self.first_cycle, now, self.fleet.settings.alert_grace):
            return
        if hosts:
            text = "; ".join(f"{host}: {why}" for host, why in hosts.items())
            if self.store.alert_open(FLEET_STOPPED, f"work is queued and no host can run "
                                     f"any of it: {text}", now):
                log.error("ALERT: work is queued and no host can run any of it: %s", text)
        elif self.store.alert_clear(FLEET_STOPPED, now):
            log.warning("alert cleared: a host can run queued work again")


def lease_seconds(settings: Settings, heartbeat_interval: float) -> float:
    """How long an attempt may stay silent before it is declared lost."""
    return max(settings.runtime.attempt_lease,
               settings.fleet.missed_heartbeats * heartbeat_interval)


PICKUP_SLACK_SECONDS = 5.0
"""Room for a poll that queues behind other requests on a loaded server."""


def pickup_timeout_seconds(settings: Settings) -> float:
    """How long a placement may wait for its host's runner to take it.

    A live agent asks for work at least once per heartbeat interval (its long-poll never
    outlasts the time to its next heartbeat; a gated agent looks again every second), and
    an open long-poll takes a placement within milliseconds. Two intervals forgive one lost
    poll; the slack covers a slow request. Past that the host is not taking the job.
    """
    configured = settings.fleet.pickup_timeout
    if configured is not None:
        return configured
    return 2 * settings.runtime.heartbeat_interval + PICKUP_SLACK_SECONDS


def expires(now: datetime, seconds: float) -> datetime:
    return now + timedelta(seconds=seconds)
