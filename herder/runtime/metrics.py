"""`GET /metrics`: Prometheus metrics of the fleet and of this server process.

Two kinds, and docs/monitoring.md says which is which: gauges read from the store at scrape time
(jobs by status, queue depth, each host's RAM and health, failures by reason, agents) are
fleet-wide, the same on every replica; histograms observed in this process (the placement
cycle, which only the leader runs, and the submit-to-start latency of the attempts this
replica started) are per replica and start from zero at each restart.

`families` is pure (a `FleetSample` in, metric families out); the store is read by the
coordinator's `fleet_sample`, once per scrape, with GROUP BY queries only."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from herder.core.model import JobStatus
from herder.core.scheduling.health import HostHealth

CONTENT_TYPE = CONTENT_TYPE_LATEST
PRIORITY_BANDS = (10, 50, 100)
"""Upper bounds (exclusive) of the priority bands queue depth is counted in: lower numbers
run first (a dispatcher's rotation and incident jobs typically go at 1, implementation at
10, reviews at 15, low at 50; herder's default is 100)."""
CYCLE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
LATENCY_BUCKETS = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0,
                   21600.0, 86400.0)


def priority_band(priority: int, bounds: tuple[int, ...] = PRIORITY_BANDS) -> str:
    """The band label of a priority: `<10`, `10-49`, `50-99`, `>=100` for the defaults."""
    lower: int | None = None
    for bound in bounds:
        if priority < bound:
            return f"<{bound}" if lower is None else f"{lower}-{bound - 1}"
        lower = bound
    return "any" if lower is None else f">={lower}"


class HostSample(msgspec.Struct, frozen=True):
    label: str
    bookable_gb: float
    booked_gb: float
    measured_available_gb: float | None
    """What the host's agent last measured as available (MemAvailable); None when unknown."""
    health: HostHealth
    enabled: bool
    agent_up: bool
    """An agent heartbeats for it and is live for placement (for a `herder up` machine: its
    runner's loop writes its presence)."""
    workers: int = 0
    """Jobs claimed or running on it (a `herder up` machine: its running attempts)."""
    max_workers: int = 0
    """Its slots now: its window's max_workers (a `herder up` machine: its concurrency)."""


class FleetSample(msgspec.Struct, frozen=True):
    """What one scrape reads from the store."""

    statuses: Mapping[JobStatus, int]
    queue_depth: Mapping[tuple[str, int], int]
    """(weight, priority) -> queued jobs."""
    failures: Mapping[tuple[str, bool], int]
    """(failure reason, actionable) -> failed jobs."""
    hosts: tuple[HostSample, ...] = msgspec.field(default_factory=tuple)
    leader: bool = False
    capacity_ratio: float = 1.0
    """The share of the enabled slots on hosts accepting work (shedding reads it)."""
    spawn_failures: Mapping[tuple[str, str], int] = msgspec.field(default_factory=dict)
    """(host, outcome) -> attempts that failed to start there in the last hour."""
    max_workers: int | None = None
    """The fleet-wide cap on running jobs (`[fleet] emergency_max_workers`); None: none."""


def families(sample: FleetSample) -> list[Metric]:
    """The fleet-wide gauges of one sample."""
    jobs = GaugeMetricFamily("herder_jobs", "Jobs in the store by status.", labels=["status"])
    for status in JobStatus:
        jobs.add_metric([str(status)], sample.statuses.get(status, 0))
    depth = GaugeMetricFamily("herder_queue_depth", "Queued jobs by weight and priority band.",
                              labels=["weight", "priority_band"])
    banded: dict[tuple[str, str], int] = {}
    for (weight, priority), count in sample.queue_depth.items():
        key = (weight, priority_band(priority))
        banded[key] = banded.get(key, 0) + count
    for (weight, band), count in sorted(banded.items()):
        depth.add_metric([weight, band], count)
    failed = GaugeMetricFamily(
        "herder_job_failures", "Jobs that ended failed, by failure reason; actionable=true "
        "when someone should look (a code fault, a timeout), not weather.",
        labels=["reason", "actionable"])
    for (reason, actionable), count in sorted(sample.failures.items()):
        failed.add_metric([reason, "true" if actionable else "false"], count)
    bookable = GaugeMetricFamily("herder_host_ram_bookable_gb",
                                 "RAM placement may book on the host (GB).", labels=["host"])
    booked = GaugeMetricFamily("herder_host_ram_booked_gb",
                               "RAM booked by live attempts and reservations (GB).",
                               labels=["host"])
    headroom = GaugeMetricFamily("herder_host_ram_headroom_gb",
                                 "Bookable minus booked RAM (GB); negative when overbooked.",
                                 labels=["host"])
    measured = GaugeMetricFamily("herder_host_ram_available_gb",
                                 "RAM the host's agent measured available (GB).",
                                 labels=["host"])
    health = GaugeMetricFamily("herder_host_health",
                               "1 for the host's health from its heartbeats, 0 otherwise.",
                               labels=["host", "health"])
    enabled = GaugeMetricFamily("herder_host_enabled", "1 unless the host is drained.",
                                labels=["host"])
    agent_up = GaugeMetricFamily("herder_host_agent_up",
                                 "1 while an agent heartbeats for the host and is live "
                                 "(`herder up`'s machine: while its loop turns).",
                                 labels=["host"])
    workers = GaugeMetricFamily("herder_host_workers",
                                "Jobs claimed or running on the host (slots in use).",
                                labels=["host"])
    slots = GaugeMetricFamily("herder_host_max_workers",
                              "Jobs the host runs at once now: its window's max_workers "
                              "(`herder up`'s concurrency).", labels=["host"])
    for host in sample.hosts:
        workers.add_metric([host.label], host.workers)
        slots.add_metric([host.label], host.max_workers)
        bookable.add_metric([host.label], host.bookable_gb)
        booked.add_metric([host.label], host.booked_gb)
        headroom.add_metric([host.label], host.bookable_gb - host.booked_gb)
        if host.measured_available_gb is not None:
            measured.add_metric([host.label], host.measured_available_gb)
        for state in HostHealth:
            health.add_metric([host.label, str(state)], 1 if host.health is state else 0)
        enabled.add_metric([host.label], 1 if host.enabled else 0)
        agent_up.add_metric([host.label], 1 if host.agent_up else 0)
    agents = GaugeMetricFamily("herder_agents", "Agents live for placement (and live "
                               "`herder up` runners).",
                               value=sum(1 for host in sample.hosts if host.agent_up))
    leader = GaugeMetricFamily("herder_leader",
                               "1 on the replica whose scheduler holds the lease.",
                               value=1 if sample.leader else 0)
    capacity = GaugeMetricFamily(
        "herder_capacity_ratio", "Share of the enabled hosts' slots on hosts accepting work "
        "(seed 003; below the [fleet] shedding steps heavier weights are shed).",
        value=sample.capacity_ratio)
    spawn = GaugeMetricFamily(
        "herder_host_spawn_failures", "Attempts that failed to start on the host in the last "
        "hour (RAM contention, OOM, workspace, ssh, spawn), by outcome.",
        labels=["host", "outcome"])
    for (label, outcome), count in sorted(sample.spawn_failures.items()):
        spawn.add_metric([label, outcome], count)
    cap = GaugeMetricFamily(
        "herder_fleet_max_workers", "The fleet-wide cap on running jobs "
        "([fleet] emergency_max_workers, `herder fleet cap`); absent while there is none.")
    if sample.max_workers is not None:
        cap.add_metric([], sample.max_workers)
    return [jobs, depth, failed, bookable, booked, headroom, measured, health, enabled,
            agent_up, workers, slots, agents, leader, capacity, spawn, cap]


class FleetCollector(Collector):
    """Reads the store at each scrape (in the scraping thread, off the event loop)."""

    def __init__(self, sample: Callable[[], FleetSample]) -> None:
        self.sample = sample

    def collect(self) -> Iterator[Metric]:
        yield from families(self.sample())

    def describe(self) -> Iterable[Metric]:
        return []  # nothing read at registration: the store may not be ready yet


class Metrics:
    """One server's registry: the fleet collector and this process's histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_seconds = Histogram(
            "herder_placement_cycle_seconds",
            "How long a placement cycle took (this replica, while it leads).",
            buckets=CYCLE_BUCKETS, registry=self.registry)
        self.start_latency = Histogram(
            "herder_job_start_latency_seconds",
            "From submit to the start of a job's first attempt (attempts this replica "
            "started).", buckets=LATENCY_BUCKETS, registry=self.registry)

    def watch(self, sample: Callable[[], FleetSample]) -> None:
        self.registry.register(FleetCollector(sample))

    def started(self, attempt: int, submitted: datetime, started: datetime) -> None:
        """A job's attempt started: its first one counts towards the latency."""
        if attempt == 1:
            self.start_latency.observe(max(0.0, (started - submitted).total_seconds()))

    def render(self) -> bytes:
        return generate_latest(self.registry)
