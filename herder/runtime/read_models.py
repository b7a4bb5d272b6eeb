"""What the server shows rather than changes: hosts as the API, `/metrics`, `/queue`,
`/healthz` and the dashboard read them, and what an agent gates itself by."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from herder.core.fleet import Fleet
from herder.core.model import HostRecord, HostUsage, JobStatus, Outcome, RunnerPresence
from herder.core.scheduling.accounts import state_of
from herder.core.scheduling.breaker import Breaker
from herder.core.scheduling.health import HostHealth, LivenessState, host_health, shown_health
from herder.core.scheduling.placement import Plan, Snapshot, place
from herder.core.scheduling.policy import SPAWN_OUTCOMES
from herder.core.settings.sections import Settings
from herder.runtime.accounts import probe_commands
from herder.runtime.metrics import FleetSample, HostSample
from herder.runtime.scheduler import (
    Scheduler,
    agent_state,
    blocked_job_types,
    capacity_now,
    condition,
    fleet_cap,
    take_snapshot,
    tripped_breakers,
)
from herder.runtime.server_state import ServerState, utcnow
from herder.store import Store
from herder.wire.agents import AccountProbe, HostGate, PreflightCheck
from herder.wire.fleet import FleetCapView
from herder.wire.hosts import HostView, WindowView
from herder.wire.queue import QueueAccount, QueueAlert, QueueJob, QueueView, Resilience

PLACEMENT_REUSE = 2.0
"""Seconds a placement made for the dashboard's `why` texts serves later pages."""
SPAWN_FAILURE_WINDOW = timedelta(hours=1)
"""How far back `/queue` and `/metrics` count each host's spawn failures."""


class ReadModels:
    """The server's views over the store; `preflight` is each job type's preflight as
    agents run it."""

    def __init__(self, state: ServerState, store: Store, settings: Settings, fleet: Fleet,
                 scheduler: Scheduler, preflight: dict[str, PreflightCheck]) -> None:
        self.state = state
        self.store = store
        self.settings = settings
        self.fleet = fleet
        self.scheduler = scheduler
        self.preflight_checks = preflight
        self._placement: tuple[Plan, Snapshot] | None = None

    def health_view(self) -> dict[str, Any]:
        """What `/healthz` answers: ok only while every loop has had a recent successful
        cycle. No secrets: loop names, ages and error types only."""
        reports = self.state.loops.reports()
        return {
            "ok": self.state.fatal is None and all(report.ok for report in reports),
            "leader": self.state.is_leader,
            "fatal": self.state.fatal,
            "loops": {report.name: report.view() for report in reports},
        }

    def measured_ram(self, host: HostRecord, now: datetime) -> float | None:
        """What the host's agent last measured available, while its heartbeat is live."""
        return None if self.fleet.down(host, now) is not None else measured_available_gb(host)

    def host_gate(self, host: HostRecord, now: datetime) -> HostGate:
        """What an agent needs to gate itself before taking work."""
        caps = self.fleet.caps(host, now)
        return HostGate(
            label=host.label, enabled=host.enabled,
            window=self.fleet.policy.schedule.window_at(now),
            max_workers=caps.max_workers, max_weight=caps.max_weight,
            allowed_job_types=_sorted(host.allowed_job_types),
            allowed_weights=_sorted(host.allowed_weights),
            priority_floor=host.priority_floor,
            weights=dict(self.fleet.weights.budgets),
            escalation=list(self.fleet.weights.chain),
            preflight=self.preflight_checks,
            probes={name: AccountProbe(argv=list(probe.argv), timeout=probe.timeout,
                                       interval=probe.interval)
                    for name, probe in probe_commands(self.store.account_list(host.label),
                                                      self.settings).items()})

    def host_views(self) -> list[HostView]:
        return host_views(self.store, self.fleet, utcnow())

    def fleet_sample(self) -> FleetSample:
        """What `/metrics` reads from the store: GROUP BY counts and one row per host."""
        now = utcnow()
        usage = self.store.host_usage(now)
        records = self.store.host_list()
        hosts = tuple(host_sample(self.fleet, host, usage.get(host.label), now)
                      for host in records) + tuple(
            runner_sample(self.fleet, presence, now)
            for presence in runners(self.store, {host.label for host in records}, now))
        return FleetSample(statuses=self.store.job_status_counts(),
                           queue_depth=self.store.job_queue_depth(),
                           failures=self.store.job_failure_counts(), hosts=hosts,
                           leader=self.state.is_leader,
                           capacity_ratio=capacity_now(self.fleet, records, now),
                           spawn_failures={(host, str(outcome)): count for (host, outcome), count
                                           in self.spawn_failures(now).items()},
                           max_workers=fleet_cap(self.store, self.fleet.max_workers).max_workers)

    def spawn_failures(self, now: datetime) -> dict[tuple[str, Outcome], int]:
        """(host, outcome) -> attempts that failed to start there within the last hour."""
        since = now - SPAWN_FAILURE_WINDOW
        return {key: count for key, count in self.store.attempt_outcome_counts(since).items()
                if key[1] in SPAWN_OUTCOMES}

    def queue_view(self, recent: int) -> QueueView:
        """`/queue`: counts, the newest jobs, hosts, what holds work back, open alerts."""
        counts = self.store.job_status_counts()
        hosts = self.host_views()
        now = utcnow()
        ratio = capacity_now(self.fleet, self.store.host_list(), now)
        spawn: dict[str, dict[str, int]] = {}
        for (host, outcome), count in sorted(self.spawn_failures(now).items()):
            spawn.setdefault(host, {})[str(outcome)] = count
        cooldown = self.settings.fleet.auth_revoked_cooldown
        accounts = []
        for record in self.store.account_list():
            state, detail = state_of(record.health, now, cooldown)
            accounts.append(QueueAccount(
                host=record.account.host, name=record.account.name, state=str(state),
                detail=detail, sessions=record.sessions,
                max_sessions=record.account.max_sessions))
        return QueueView(
            counts={str(status): counts.get(status, 0) for status in JobStatus},
            recent=[QueueJob.model_validate(job) for job in self.store.job_list(None, recent)],
            hosts=hosts,
            resilience=Resilience(
                breakers={h.label: h.breakers for h in hosts if h.breakers},
                preflight_failed={h.label: h.preflight_failed for h in hosts
                                  if h.preflight_failed}),
            accounts=accounts,
            alerts=[QueueAlert(key=alert.key, message=alert.message, opened_at=alert.opened_at)
                    for alert in self.store.alert_list(open_only=True)],
            leader=self.state.is_leader, capacity_ratio=ratio,
            shed_max_weight=self.fleet.policy.shedding.max_weight(ratio),
            spawn_failures=spawn,
            fleet_cap=fleet_cap_view(self.store, self.settings.fleet.emergency_max_workers))

    def recent_placement(self, job_ids: set[int]) -> tuple[Plan, Snapshot]:
        """A placement at most PLACEMENT_REUSE seconds old that saw these jobs: the
        scheduler's own latest cycle on the leader, else one made here and reused, so a
        dashboard refreshing its jobs view does not place the whole queue each time."""
        now = utcnow()
        for candidate in (self.scheduler.last_placement if self.state.is_leader else None,
                          self._placement):
            if (candidate is not None
                    and abs((now - candidate[1].now).total_seconds()) <= PLACEMENT_REUSE
                    and job_ids <= {job.id for job in candidate[1].jobs}):
                return candidate
        self._placement = placed(self.store, self.fleet, now)
        return self._placement

    def latest_change(self) -> int:
        """The newest event's id: the dashboard's live view refreshes when it moves."""
        return self.store.event_latest_id()


def placed(store: Store, fleet: Fleet, now: datetime) -> tuple[Plan, Snapshot]:
    """A placement of the queue as it is now, and what it was made from."""
    snapshot = take_snapshot(store, fleet, now)
    return place(snapshot), snapshot


def fleet_cap_view(store: Store, emergency_max_workers: int | None) -> FleetCapView:
    """`[fleet] emergency_max_workers` now, and the jobs running against it."""
    cap = fleet_cap(store, emergency_max_workers)
    counts = store.job_counts()
    return FleetCapView(max_workers=cap.max_workers, at_run_time=cap.at_run_time,
                        updated_at=cap.updated_at, updated_by=cap.updated_by,
                        running=counts.get(JobStatus.CLAIMED, 0)
                        + counts.get(JobStatus.RUNNING, 0))


def _sorted(names: frozenset[str] | None) -> list[str] | None:
    return None if names is None else sorted(names)


def host_views(store: Store, fleet: Fleet, now: datetime) -> list[HostView]:
    """Every registered host as `herder hosts` and `/api/v1/hosts` show it, then each
    machine `herder up` runs on (transport "up": shown, never placed on)."""
    usage = store.host_usage(now)
    breakers = tripped_breakers(store, fleet, now)
    records = store.host_list()
    views = [host_status(fleet, host, usage.get(host.label), now, breakers) for host in records]
    machines = runners(store, {host.label for host in records}, now)
    if machines:
        preflight = runner_preflight_failures(store)
        views += [runner_view(fleet, presence, now, preflight.get(presence.label, {}))
                  for presence in machines]
    return views


UP_TRANSPORT = "up"
"""The transport a `herder up` machine shows with: its runner claims its own work."""


def runners(store: Store, registered: set[str], now: datetime) -> list[RunnerPresence]:
    """The `herder up` runners' presence, but for a label that is a registered host too (the
    host's own row tells more); their last writes on `now`'s clock."""
    return [presence for presence in store.runner_list(now)
            if presence.label not in registered]


def runner_preflight_failures(store: Store) -> dict[str, dict[str, str]]:
    """Label -> job type -> why `herder up` there claims none of it (its open
    `preflight:<label>:<type>` alerts)."""
    found: dict[str, dict[str, str]] = {}
    for alert in store.alert_list(open_only=True, limit=1000):
        kind, _, rest = alert.key.partition(":")
        label, _, job_type = rest.partition(":")
        if kind == "preflight" and job_type:
            found.setdefault(label, {})[job_type] = alert.message
    return found


def runner_view(fleet: Fleet, presence: RunnerPresence, now: datetime,
                preflight_failed: Mapping[str, str]) -> HostView:
    """A `herder up` machine as a host: its concurrency as its slots, the RAM its running
    attempts book of the machine's, and health by its loop's last write."""
    liveness = fleet.runner_liveness(presence, now)
    health = shown_health(host_health(presence.last_turn_at, now, fleet.thresholds), liveness)
    slots = WindowView(max_workers=presence.concurrency, max_weight=None)
    live = liveness.state in (LivenessState.LIVE, LivenessState.LATE)
    return HostView(
        label=presence.label, enabled=True, agent=None, transport=UP_TRANSPORT,
        health=str(health), last_heartbeat=presence.last_turn_at,
        agent_down=fleet.runner_down(presence, now), condition="enabled",
        liveness=str(liveness.state), missed_heartbeats=liveness.missed,
        heartbeat_age_seconds=round(
            max(0.0, (now - presence.last_turn_at).total_seconds()), 1),
        ram_total_gb=presence.ram_total_gb, ram_reserved_gb=0.0,
        bookable_gb=presence.ram_total_gb, booked_gb=presence.ram_booked_gb,
        free_gb=round(presence.ram_total_gb - presence.ram_booked_gb, 3),
        cpus=presence.cpus, workers=presence.running if live else 0,
        window=fleet.policy.schedule.window_at(now),
        max_workers=presence.concurrency, max_weight=None, prime=slots, night=slots,
        allowed_job_types=None, allowed_weights=None, priority_floor=None, labels=[],
        ssh_target=None, measured_available_gb=presence.ram_available_gb if live else None,
        preflight_failed=dict(sorted(preflight_failed.items())))


def host_status(fleet: Fleet, host: HostRecord, usage: HostUsage | None,
                now: datetime, breakers: Mapping[tuple[str, str], Breaker] | None = None
                ) -> HostView:
    bookable = fleet.bookable(host)
    booked = usage.booked_gb if usage else 0.0
    caps = fleet.caps(host, now)
    liveness = fleet.liveness_of(host, now)
    return HostView(
        label=host.label, enabled=host.enabled, agent=agent_state(host),
        transport=str(host.transport),
        health=str(shown_health(fleet.health(host, now), liveness)),
        last_heartbeat=host.last_heartbeat, agent_down=fleet.agent_down(host, now),
        condition=condition(host),
        liveness=str(liveness.state), missed_heartbeats=liveness.missed,
        heartbeat_age_seconds=None if host.last_heartbeat is None
        else round(max(0.0, (now - host.last_heartbeat).total_seconds()), 1),
        ram_total_gb=host.ram_total_gb, ram_reserved_gb=host.ram_reserved_gb,
        bookable_gb=round(bookable, 3), booked_gb=round(booked, 3),
        free_gb=round(bookable - booked, 3), cpus=host.cpus,
        workers=usage.workers if usage else 0,
        window=fleet.policy.schedule.window_at(now),
        max_workers=caps.max_workers, max_weight=caps.max_weight,
        prime=WindowView(max_workers=host.prime_max_workers,
                         max_weight=host.prime_max_weight),
        night=WindowView(max_workers=host.night_max_workers,
                         max_weight=host.night_max_weight),
        allowed_job_types=_sorted(host.allowed_job_types),
        allowed_weights=_sorted(host.allowed_weights),
        priority_floor=host.priority_floor, labels=sorted(host.labels),
        ssh_target=host.ssh_target, measured_available_gb=measured_available_gb(host),
        breakers={job_type: state.describe() for (label, job_type), state
                  in sorted((breakers or {}).items()) if label == host.label},
        preflight_failed={job_type: detail for job_type, (_, detail)
                          in sorted(blocked_job_types(host).items())})


def measured_available_gb(host: HostRecord) -> float | None:
    """The RAM the host's agent last measured available; None when none said."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    measured = info.get("mem_available_gb")
    if isinstance(measured, int | float) and not isinstance(measured, bool):
        return float(measured)
    return None


def host_sample(fleet: Fleet, host: HostRecord, usage: HostUsage | None,
                now: datetime) -> HostSample:
    """A host as `/metrics` shows it: its RAM (bookable, booked, measured by its agent),
    health, drain, slots and whether a live agent heartbeats for it."""
    info = host.agent_info if isinstance(host.agent_info, dict) else {}
    return HostSample(
        label=host.label, bookable_gb=fleet.bookable(host),
        booked_gb=usage.booked_gb if usage else 0.0,
        measured_available_gb=measured_available_gb(host),
        health=fleet.health(host, now), enabled=host.enabled,
        agent_up=host.transport.pulls and "worker" in info
        and agent_state(host) != "stopped" and fleet.agent_down(host, now) is None,
        workers=usage.workers if usage else 0,
        max_workers=fleet.caps(host, now).max_workers)


def runner_sample(fleet: Fleet, presence: RunnerPresence, now: datetime) -> HostSample:
    """A `herder up` machine as `/metrics` shows it: as its view (`runner_view`) says, its
    runner "agent up" while its loop writes."""
    view = runner_view(fleet, presence, now, {})
    return HostSample(
        label=view.label, bookable_gb=view.bookable_gb, booked_gb=view.booked_gb,
        measured_available_gb=view.measured_available_gb, health=HostHealth(view.health),
        enabled=True, agent_up=view.agent_down is None, workers=view.workers,
        max_workers=view.max_workers)
