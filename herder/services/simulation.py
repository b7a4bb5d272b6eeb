"""`herder simulate`'s shell: build herder's rules from herder.toml the way the server does,
run the pure engine (herder.core.simulation) on a fleet file (services.fleet_file) and a
trace (services.workload), and write its figures as JSON and charts."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from datetime import time
from pathlib import Path
from typing import Any

import msgspec

from herder.core.errors import InputError
from herder.core.fleet import Fleet
from herder.core.scheduling.capacity import WindowSchedule
from herder.core.settings.sections import Settings
from herder.core.simulation.engine import StuckError, simulate
from herder.core.simulation.report import Report, Unplaced
from herder.core.simulation.scenario import (
    Rules,
    Scenario,
    TraceJob,
)
from herder.runtime.endings import PolicyLimits
from herder.runtime.scheduler import BREAKER_HISTORY
from herder.services.fleet_file import Fleetfile

# --- rules ------------------------------------------------------------------------


def rules_from(settings: Settings, schedule: Mapping[str, str] | None = None) -> Rules:
    """herder's rules as the server builds them from herder.toml (Fleet.from_settings for
    placement, PolicyLimits.from_settings for the endings), with the fleet file's window
    schedule where it gives one."""
    fleet = Fleet.from_settings(settings)
    limits = PolicyLimits.from_settings(settings)
    policy = fleet.policy
    if schedule:
        current = policy.schedule
        policy = msgspec.structs.replace(policy, schedule=WindowSchedule(
            schedule.get("timezone", current.timezone),
            time.fromisoformat(schedule["night_start"]) if "night_start" in schedule
            else current.night_start,
            time.fromisoformat(schedule["night_end"]) if "night_end" in schedule
            else current.night_end))
    defaults = settings.defaults
    types = settings.job_types
    return Rules(
        weights=fleet.weights, policy=policy, accounts=fleet.accounts,
        outcome_rules=dict(limits.rules.policies),
        max_attempts={name: t.max_attempts for name, t in types.items()
                      if t.max_attempts is not None},
        max_transient=dict(limits.rules.max_transient),
        backoff={name: (t.backoff_base if t.backoff_base is not None else defaults.backoff_base,
                        t.backoff_max if t.backoff_max is not None else defaults.backoff_max)
                 for name, t in types.items()},
        default_max_attempts=defaults.max_attempts,
        default_max_transient=limits.rules.default_max_transient,
        default_backoff=(defaults.backoff_base, defaults.backoff_max),
        max_lost=limits.max_lost, max_spawn_failures=limits.max_spawn_failures,
        spawn_backoff=limits.spawn_backoff_seconds,
        breaker_threshold=settings.fleet.breaker_threshold,
        breaker_pause=settings.fleet.breaker_pause,
        breaker_history=BREAKER_HISTORY.total_seconds(),
        max_workers=fleet.max_workers, cycle=settings.fleet.scheduler_interval,
        job_types=frozenset(types))


# --- running ---------------------------------------------------------------------------


class Unplaceable(InputError):
    """Work that fits no host, or that the run cannot finish: the run stops and names it."""

    def __init__(self, unplaced: Sequence[Unplaced], problem: str = "fit no host") -> None:
        shown = ", ".join(f"{item.job_id} ({item.job_type}, {item.weight}, priority "
                          f"{item.priority})" for item in unplaced[:20])
        more = f" and {len(unplaced) - 20} more" if len(unplaced) > 20 else ""
        super().__init__("trace", f"{len(unplaced)} job(s) {problem}: {shown}{more}",
                         "give the fleet a host that takes them (RAM, workers, allow-lists,"
                         " window max weight, accounts)")
        self.unplaced = list(unplaced)


def run(fleet: Fleetfile, settings: Settings, jobs: Sequence[TraceJob],
        keep_timelines: bool = False, cycle: float | None = None, seed: int = 1,
        keep_attempts: bool = False) -> Report:
    """Simulate `jobs` on `fleet` under `settings` (placing every `cycle` seconds; None:
    `[fleet] scheduler_interval`; `seed` draws the spawn failures; `keep_attempts`: every
    attempt and how each job ended, as a replay compares them); Unplaceable when work
    fits no host."""
    rules = rules_from(settings, fleet.schedule)
    if cycle is not None:
        check_cycle(cycle, "--cycle")
        rules = msgspec.structs.replace(rules, cycle=cycle)
    else:
        check_cycle(rules.cycle, "[fleet] scheduler_interval")
    scenario = Scenario(fleet.start, fleet.hosts, tuple(jobs), rules, fleet.outages,
                        fleet.accounts, fleet.spawn_failure, seed)
    try:
        return simulate(scenario, keep_timelines, keep_attempts)
    except StuckError as exc:
        raise Unplaceable(exc.unplaced, exc.problem) from None


MIN_CYCLE = 0.001
MAX_CYCLE = 86400.0
"""The cycle the simulator takes: 0 (a pass at each change, as events come) or a finite
number of seconds from MIN_CYCLE to a day."""


def check_cycle(cycle: float, field: str) -> None:
    if cycle == 0 or (math.isfinite(cycle) and MIN_CYCLE <= cycle <= MAX_CYCLE):
        return
    raise InputError(field, f"{cycle!r} is not a cycle the simulator takes",
                     f"use 0 (a pass at each change) or {MIN_CYCLE:g} to {MAX_CYCLE:g} seconds")


def _write_failed(option: str, path: Path, exc: OSError) -> InputError:
    return InputError(option, f"cannot write {path}: {exc.strerror or exc}",
                      "give a path in a directory you can write")


def check_trace(jobs: Sequence[TraceJob], settings: Settings, label: str) -> None:
    """A trace made for one herder.toml may name what another lacks (--compare)."""
    for job in jobs:
        if job.job_type not in settings.job_types:
            raise InputError(f"{label}: job_types", f"has no job type {job.job_type!r} "
                             f"(job {job.id})")
        if job.weight not in settings.weights:
            raise InputError(f"{label}: weights", f"has no weight {job.weight!r} "
                             f"(job {job.id})")


def write_json(path: Path, reports: Mapping[str, Report]) -> None:
    """The figures as JSON (--json); InputError naming --json when the path is unwritable."""
    text = json.dumps({name: report.summary() for name, report in reports.items()},
                      indent=2, sort_keys=True) + "\n"
    try:
        path.write_text(text)
    except OSError as exc:
        raise _write_failed("--json", path, exc) from None


TIMELINE_HOSTS = 200
"""Fleets up to this size keep each host's RAM over time for --json and --charts."""
CHARTS_MISSING = ("--charts needs matplotlib: pip install 'herder[charts]'")


def write_charts(directory: Path, reports: Mapping[str, Report]) -> list[Path]:
    """PNG charts: fleet RAM booked and used over time, waits by weight and priority, the
    busiest hosts' RAM over time (fleets of up to TIMELINE_HOSTS), and each host's mean
    use. ImportError when matplotlib is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    try:
        directory.mkdir(parents=True, exist_ok=True)
        return _charts(directory, reports, plt)
    except OSError as exc:
        raise _write_failed("--charts", directory, exc) from None


def _charts(directory: Path, reports: Mapping[str, Report], plt: Any) -> list[Path]:
    written = []

    figure, axes = plt.subplots(figsize=(10, 4))
    for name, report in reports.items():
        times = [point[0] / 3600 for point in report.fleet_timeline]
        axes.step(times, [point[1] for point in report.fleet_timeline], where="post",
                  label=f"{name} booked".strip())
        axes.step(times, [point[2] for point in report.fleet_timeline], where="post",
                  label=f"{name} used".strip(), alpha=0.6)
    axes.set_xlabel("hours")
    axes.set_ylabel("GB")
    axes.set_title("fleet RAM booked and used")
    axes.legend()
    written.append(_save(figure, directory / "ram.png", plt))

    for table in ("weight", "priority"):
        figure, axes = plt.subplots(figsize=(8, 4))
        width = 0.8 / max(1, len(reports) * 3)
        for run_index, (name, report) in enumerate(reports.items()):
            waits = report.wait_by_weight if table == "weight" else report.wait_by_priority
            keys = list(waits)
            for rank_index, rank in enumerate(("p50", "p95", "p99")):
                offset = (run_index * 3 + rank_index) * width
                axes.bar([index + offset for index in range(len(keys))],
                         [getattr(waits[key], rank) / 60 for key in keys], width,
                         label=f"{name} {rank}".strip())
            axes.set_xticks([index + width * (len(reports) * 3 - 1) / 2
                             for index in range(len(keys))], keys)
        axes.set_ylabel("minutes to first start")
        axes.set_title(f"wait by {table}")
        axes.legend()
        written.append(_save(figure, directory / f"wait_by_{table}.png", plt))

    for run_index, (name, report) in enumerate(reports.items()):
        busiest = sorted(report.hosts, key=lambda host: -host.mean_booked_gb)[:8]
        if not any(host.timeline for host in busiest):
            continue
        figure, axes = plt.subplots(figsize=(10, 4))
        for host in busiest:
            axes.step([point[0] / 3600 for point in host.timeline],
                      [point[1] for point in host.timeline], where="post", label=host.label)
        axes.set_xlabel("hours")
        axes.set_ylabel("GB booked")
        axes.set_title(f"RAM booked on the busiest hosts {name}".strip())
        axes.legend()
        written.append(_save(figure, directory / f"hosts_over_time_{run_index + 1}.png", plt))

    figure, axes = plt.subplots(figsize=(10, 4))
    for name, report in reports.items():
        hosts = sorted(report.hosts, key=lambda host: -host.mean_booked_gb)[:40]
        axes.bar([f"{host.label}" for host in hosts],
                 [host.mean_booked_gb / host.bookable_gb if host.bookable_gb else 0.0
                  for host in hosts], alpha=0.6, label=f"{name} booked share".strip())
    axes.set_ylabel("mean share of bookable RAM")
    axes.set_title("hosts (busiest 40)")
    axes.tick_params(axis="x", rotation=90)
    axes.legend()
    written.append(_save(figure, directory / "hosts.png", plt))
    return written


def _save(figure: Any, path: Path, plt: Any) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
