"""What a simulation found, and its text summary (one run, or two side by side)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import msgspec

PERCENTILES = (50, 95, 99)


class Waits(msgspec.Struct, frozen=True):
    """Seconds from arrival to first start: how many jobs, and nearest-rank percentiles."""

    jobs: int
    p50: float
    p95: float
    p99: float


def percentiles(values: Sequence[float]) -> Waits:
    ordered = sorted(values)
    if not ordered:
        return Waits(0, 0.0, 0.0, 0.0)

    def rank(percent: int) -> float:
        return ordered[max(0, math.ceil(percent / 100 * len(ordered)) - 1)]

    return Waits(len(ordered), rank(50), rank(95), rank(99))


class HostFigures(msgspec.Struct, frozen=True):
    """One host over the makespan: bookable GB, mean and peak GB booked and really used,
    and (when kept) its timeline of (seconds, booked, used) at each change."""

    label: str
    bookable_gb: float
    mean_booked_gb: float
    mean_used_gb: float
    peak_booked_gb: float
    peak_used_gb: float
    timeline: tuple[tuple[float, float, float], ...] = ()


class Unplaced(msgspec.Struct, frozen=True):
    job_id: int
    job_type: str
    weight: str
    priority: int


class JobLog(msgspec.Struct, frozen=True):
    """How one job ended (kept with the attempts, when asked for): what a replay against
    the real server compares job by job."""

    job_id: int
    status: str
    failure_reason: str | None
    weight: str
    """The weight it ended at (after any escalation)."""
    outcomes: tuple[str, ...]
    """Each attempt's outcome, in order (attempts that ran, as `Report.attempt_log`)."""


class Report(msgspec.Struct, frozen=True):
    """The run's figures. RAM figures are GB-seconds; `lower_bound` is the work's
    GB-seconds (each job's first weight's budget × its duration) over the GB-seconds the
    fleet could book in the makespan (bookable GB × time up): no schedule of this makespan
    books less, so `utilization - lower_bound` is the gap."""

    jobs: int
    done: int
    failed: int
    makespan: float
    escalated: int
    shed: int
    rotated: int
    rotations: int
    usage_limits: int
    lost_attempts: int
    spawn_failures: int
    breaker_trips: int
    attempts: int
    placement_passes: int
    work_gb_seconds: float
    booked_gb_seconds: float
    used_gb_seconds: float
    capacity_gb_seconds: float
    wait_by_weight: Mapping[str, Waits]
    wait_by_priority: Mapping[str, Waits]
    hosts: tuple[HostFigures, ...] = ()
    fleet_timeline: tuple[tuple[float, float, float], ...] = ()
    """(seconds, GB booked, GB used) fleet-wide at each change."""
    attempt_log: tuple[tuple[int, str, float, float, float], ...] = ()
    """(job id, host, start, end, GB booked) of every attempt, when asked for."""
    job_log: tuple[JobLog, ...] = ()
    """How each job ended, by job id, when the attempts are asked for."""

    @property
    def utilization(self) -> float:
        return _ratio(self.booked_gb_seconds, self.capacity_gb_seconds)

    @property
    def used_utilization(self) -> float:
        return _ratio(self.used_gb_seconds, self.capacity_gb_seconds)

    @property
    def lower_bound(self) -> float:
        return _ratio(self.work_gb_seconds, self.capacity_gb_seconds)

    @property
    def gap(self) -> float:
        return self.utilization - self.lower_bound

    def summary(self) -> dict[str, object]:
        """The figures as plain data (`--json`): the fleet's RAM over time, and each
        host's where it was kept (fleets of up to 200 hosts)."""
        data = msgspec.to_builtins(self)
        data.pop("attempt_log")
        data.pop("job_log")
        for host in data["hosts"]:
            if not host["timeline"]:
                host.pop("timeline")
        data.update(utilization=self.utilization, used_utilization=self.used_utilization,
                    lower_bound=self.lower_bound, gap=self.gap)
        return dict(data)


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def duration_text(seconds: float) -> str:
    """3725 -> "1h02m05s"; under a minute in seconds."""
    if seconds < 60:
        return f"{round(seconds, 1):g}s"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


HOSTS_SHOWN = 12
"""Hosts listed one by one in the text summary; a bigger fleet shows the busiest."""


def _lines(report: Report) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = [
        ("jobs", f"{report.jobs} ({report.done} done, {report.failed} failed)"),
        ("attempts", str(report.attempts)),
        ("makespan", duration_text(report.makespan)),
        ("utilization (booked)", f"{report.utilization:.1%}"),
        ("utilization (used)", f"{report.used_utilization:.1%}"),
        ("lower bound", f"{report.lower_bound:.1%}"),
        ("gap", f"{report.gap:.1%}"),
        ("escalated", str(report.escalated)),
        ("shed", str(report.shed)),
        ("rotated", f"{report.rotated} ({report.usage_limits} usage limits)"),
        ("lost attempts", str(report.lost_attempts)),
        ("spawn failures", str(report.spawn_failures)),
        ("breaker trips", str(report.breaker_trips)),
        ("placement passes", str(report.placement_passes)),
    ]
    for title, table in (("weight", report.wait_by_weight),
                         ("priority", report.wait_by_priority)):
        for key, waits in table.items():
            rows.append((f"wait {title} {key}",
                         f"p50 {duration_text(waits.p50)} p95 {duration_text(waits.p95)} "
                         f"p99 {duration_text(waits.p99)} ({waits.jobs})"))
    busiest = sorted(report.hosts, key=lambda host: (-host.mean_booked_gb, host.label))
    for host in sorted(busiest[:HOSTS_SHOWN], key=lambda host: host.label):
        rows.append((f"host {host.label}",
                     f"booked {host.mean_booked_gb:.1f}/{host.bookable_gb:g} GB mean, "
                     f"{host.peak_booked_gb:.1f} peak; used {host.mean_used_gb:.1f} mean, "
                     f"{host.peak_used_gb:.1f} peak"))
    if len(report.hosts) > HOSTS_SHOWN:
        rows.append(("hosts", f"{len(report.hosts) - HOSTS_SHOWN} more not shown "
                              "(see --json)"))
    return rows


def summary_text(report: Report, other: Report | None = None,
                 names: tuple[str, str] = ("", "")) -> str:
    """The report as aligned lines; with `other`, the two runs side by side."""
    mine = _lines(report)
    if other is None:
        width = max(len(key) for key, _ in mine)
        return "\n".join(f"{key:<{width}}  {value}" for key, value in mine) + "\n"
    theirs = dict(_lines(other))
    keys = [key for key, _ in mine] + [key for key in theirs if key not in dict(mine)]
    left = dict(mine)
    rows = [("", names[0], names[1])] + [(key, left.get(key, "-"), theirs.get(key, "-"))
                                         for key in keys]
    widths = [max(len(row[column]) for row in rows) for column in range(2)]
    return "\n".join(f"{key:<{widths[0]}}  {first:<{widths[1]}}  {second}".rstrip()
                     for key, first, second in rows) + "\n"
