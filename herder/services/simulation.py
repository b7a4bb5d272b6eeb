"""`herder simulate`'s shell: read the fleet file and the workload trace (or generate one),
build herder's rules from herder.toml the way the server does, run the pure engine
(herder.core.simulation), and write its figures as JSON and charts.

Bad input is refused with the file, line and field (InputError: the CLI exits 2).
"""

from __future__ import annotations

import csv
import json
import math
import random
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, time
from pathlib import Path
from typing import Any

import msgspec

from herder.core.errors import InputError
from herder.core.fleet import Fleet
from herder.core.scheduling.capacity import WindowCaps, WindowSchedule
from herder.core.scheduling.placement import HostSpec
from herder.core.settings.fields import NAME, parse_duration
from herder.core.settings.sections import Settings
from herder.core.simulation.engine import StuckError, simulate
from herder.core.simulation.report import Report, Unplaced
from herder.core.simulation.scenario import (
    Outage,
    Rules,
    Scenario,
    SimAccount,
    TraceJob,
    TraceOutcome,
)
from herder.runtime.endings import PolicyLimits
from herder.runtime.scheduler import BREAKER_HISTORY

DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
"""A Monday, 00:00 UTC: where a fleet file that names no `start` begins."""
TRACE_FIELDS = ("arrival", "job_type", "weight", "priority", "duration", "peak_gb",
                "outcome")
OPTIONAL_FIELDS = ("id", "affinity")


class Fleetfile(msgspec.Struct, frozen=True):
    """A fleet file read: its start, hosts, outages and accounts."""

    start: datetime
    hosts: tuple[HostSpec, ...]
    outages: tuple[Outage, ...]
    accounts: tuple[SimAccount, ...]
    schedule: Mapping[str, str]
    """[windows] overrides of herder.toml's [fleet] timezone, night_start, night_end."""
    spawn_failure: Mapping[str, float] = msgspec.field(default_factory=dict)
    """Host -> the chance an attempt fails to start there."""


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


# --- the fleet file -----------------------------------------------------------------

HOST_KEYS = {"label", "count", "ram_gb", "reserved_gb", "cpus", "prime_workers",
             "night_workers", "prime_max_weight", "night_max_weight", "job_types", "weights",
             "priority_floor", "enabled", "spawn_failure_rate"}
OUTAGE_KEYS = {"host", "start", "end"}
ACCOUNT_KEYS = {"host", "name", "max_sessions", "job_types", "quota_jobs", "reset_every",
                "first_reset"}
WINDOW_KEYS = {"timezone", "night_start", "night_end"}


class _Located:
    """Where a key of an array-of-tables entry is in the file, for errors."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def error(self, table: str, index: int | None, key: str | None, problem: str,
              fix: str | None = None) -> InputError:
        line = self.line(table, index, key)
        where = f"{self.path}:{line}" if line else str(self.path)
        field = table if index is None else f"{table}[{index + 1}]"
        if key:
            field += f".{key}"
        return InputError(f"{where}: {field}", problem, fix)

    def line(self, table: str, index: int | None, key: str | None) -> int | None:
        header = f"[[{table}]]" if index is not None else f"[{table}]"
        seen = -1
        start: int | None = None
        for number, raw in enumerate(self.lines):
            if raw.strip().startswith(header):
                seen += 1
                if index is None or seen == index:
                    start = number
                    break
        if start is None:
            return None
        if key is None:
            return start + 1
        for number in range(start + 1, len(self.lines)):
            stripped = self.lines[number].strip()
            if stripped.startswith("["):
                break
            if stripped.split("=", 1)[0].strip() == key:
                return number + 1
        return start + 1


def load_fleet(path: Path, settings: Settings) -> Fleetfile:
    """Read a fleet file (docs/simulate.md); InputError names the line and field."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(str(path), f"cannot read the fleet file: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(str(path), f"invalid TOML: {exc}") from None
    where = _Located(path, text)
    unknown = set(data) - {"start", "hosts", "outages", "accounts", "windows"}
    if unknown:
        raise InputError(f"{path}: {sorted(unknown)[0]}", "unknown key",
                         "use start, windows, hosts, outages, accounts")
    start = DEFAULT_START
    if "start" in data:
        value = data["start"]
        if isinstance(value, str):
            try:
                value = datetime.fromisoformat(value)
            except ValueError:
                value = None
        if not isinstance(value, datetime) or value.tzinfo is None:
            raise InputError(f"{path}:{where.line('start', None, None) or 1}: start",
                             "not a time with its offset", "e.g. 2026-01-05T00:00:00Z")
        start = value.astimezone(UTC)
    schedule = _windows(data.get("windows", {}), where)
    hosts: list[HostSpec] = []
    spawn_failure: dict[str, float] = {}
    for index, entry in enumerate(_entries(data, "hosts", where)):
        specs = _hosts(entry, index, where, settings)
        hosts.extend(specs)
        rate = _number(entry, "spawn_failure_rate", "hosts", index, where, 0.0)
        if rate >= 1:
            raise where.error("hosts", index, "spawn_failure_rate",
                              "must be below 1 (a share of attempts, e.g. 0.05)")
        if rate:
            spawn_failure.update((spec.label, rate) for spec in specs)
    if not hosts:
        raise InputError(f"{path}: hosts", "the fleet has no host", "add a [[hosts]] table")
    labels = [host.label for host in hosts]
    if len(set(labels)) != len(labels):
        duplicate = next(label for label in labels if labels.count(label) > 1)
        raise InputError(f"{path}: hosts", f"host {duplicate!r} is declared twice")
    known = set(labels)
    outages = []
    for index, entry in enumerate(_entries(data, "outages", where)):
        _only(entry, OUTAGE_KEYS, "outages", index, where)
        host = _host_of(entry, "outages", index, where, known)
        begin = _duration(entry, "start", "outages", index, where, None)
        end = _duration(entry, "end", "outages", index, where, None)
        if end <= begin:
            raise where.error("outages", index, "end", "must be after start")
        outages.append(Outage(host, begin, end))
    accounts = []
    for index, entry in enumerate(_entries(data, "accounts", where)):
        _only(entry, ACCOUNT_KEYS, "accounts", index, where)
        host = _host_of(entry, "accounts", index, where, known)
        name = entry.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise where.error("accounts", index, "name", "needs a name (letters, digits, "
                              "-_.)")
        job_types = _names(entry, "job_types", "accounts", index, where,
                           set(settings.job_types), "job type")
        quota = entry.get("quota_jobs")
        if quota is not None and (not isinstance(quota, int) or quota < 0):
            raise where.error("accounts", index, "quota_jobs", "must be a whole number >= 0")
        sessions = entry.get("max_sessions", 1)
        if not isinstance(sessions, int) or sessions < 1:
            raise where.error("accounts", index, "max_sessions", "must be a whole number >= 1")
        every = _duration(entry, "reset_every", "accounts", index, where, 5 * 3600.0)
        if every <= 0:
            raise where.error("accounts", index, "reset_every", "must be above zero")
        accounts.append(SimAccount(host, name, sessions, job_types, quota, every, _duration(
            entry, "first_reset", "accounts", index, where, every)))
    return Fleetfile(start, tuple(hosts), tuple(outages), tuple(accounts), schedule,
                     spawn_failure)


def _windows(section: Any, where: _Located) -> dict[str, str]:
    if not isinstance(section, dict):
        raise where.error("windows", None, None, "must be a table")
    for key, value in section.items():
        if key not in WINDOW_KEYS:
            raise where.error("windows", None, key, "unknown key",
                              f"use {', '.join(sorted(WINDOW_KEYS))}")
        if not isinstance(value, str):
            raise where.error("windows", None, key, "must be a string")
        try:
            if key == "timezone":
                WindowSchedule(value).window_at(DEFAULT_START)
            else:
                time.fromisoformat(value)
        except (ValueError, KeyError, OSError):
            raise where.error("windows", None, key, f"{value!r} is not valid",
                              "a clock like 20:00, a zone like Europe/Berlin") from None
    return dict(section)


def _entries(data: Mapping[str, Any], table: str, where: _Located) -> list[dict[str, Any]]:
    entries = data.get(table, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise where.error(table, None, None, "must be an array of tables", f"use [[{table}]]")
    return entries


def _only(entry: Mapping[str, Any], keys: set[str], table: str, index: int,
          where: _Located) -> None:
    for key in entry:
        if key not in keys:
            raise where.error(table, index, key, "unknown key",
                              f"use {', '.join(sorted(keys))}")


def _host_of(entry: Mapping[str, Any], table: str, index: int, where: _Located,
             known: set[str]) -> str:
    host = entry.get("host")
    if host not in known:
        raise where.error(table, index, "host", f"no host {host!r} in the fleet")
    return str(host)


def _duration(entry: Mapping[str, Any], key: str, table: str, index: int, where: _Located,
              default: float | None) -> float:
    if key not in entry:
        if default is None:
            raise where.error(table, index, key, "is required")
        return default
    try:
        return parse_duration(entry[key])
    except ValueError as exc:
        raise where.error(table, index, key, str(exc)) from None


def _number(entry: Mapping[str, Any], key: str, table: str, index: int, where: _Located,
            default: float | None, minimum: float = 0.0) -> float:
    value = entry.get(key, default)
    if value is None:
        raise where.error(table, index, key, "is required")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value) or value < minimum:
        raise where.error(table, index, key, f"must be a number >= {minimum:g}")
    return float(value)


def _names(entry: Mapping[str, Any], key: str, table: str, index: int, where: _Located,
           known: set[str], what: str) -> frozenset[str] | None:
    value = entry.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise where.error(table, index, key, f"must be a list of {what} names")
    for item in value:
        if item not in known:
            raise where.error(table, index, key, f"unknown {what} {item!r}",
                              f"use one of: {', '.join(sorted(known))}")
    return frozenset(value)


def _hosts(entry: Mapping[str, Any], index: int, where: _Located,
           settings: Settings) -> list[HostSpec]:
    _only(entry, HOST_KEYS, "hosts", index, where)
    label = entry.get("label")
    if not isinstance(label, str) or not NAME.match(label):
        raise where.error("hosts", index, "label", "needs a label (letters, digits, -_.)")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise where.error("hosts", index, "count", "must be a whole number >= 1")
    weights = set(settings.weights)
    caps = {}
    for window in ("prime", "night"):
        workers = entry.get(f"{window}_workers", 1)
        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 0:
            raise where.error("hosts", index, f"{window}_workers", "must be a whole number >= 0")
        max_weight = entry.get(f"{window}_max_weight")
        if max_weight is not None and max_weight not in weights:
            raise where.error("hosts", index, f"{window}_max_weight",
                              f"unknown weight {max_weight!r}",
                              f"use one of: {', '.join(sorted(weights))}")
        caps[window] = WindowCaps(workers, max_weight)
    floor = entry.get("priority_floor")
    if floor is not None and (not isinstance(floor, int) or isinstance(floor, bool)):
        raise where.error("hosts", index, "priority_floor", "must be a whole number")
    spec = HostSpec(
        label=label, ram_total_gb=_number(entry, "ram_gb", "hosts", index, where, None),
        ram_reserved_gb=_number(entry, "reserved_gb", "hosts", index, where, 0.0),
        cpus=int(_number(entry, "cpus", "hosts", index, where, 1, 1)),
        enabled=bool(entry.get("enabled", True)), prime=caps["prime"], night=caps["night"],
        allowed_job_types=_names(entry, "job_types", "hosts", index, where,
                                 set(settings.job_types), "job type"),
        allowed_weights=_names(entry, "weights", "hosts", index, where, weights, "weight"),
        priority_floor=floor)
    if count == 1:
        return [spec]
    return [msgspec.structs.replace(spec, label=f"{label}-{number}")
            for number in range(1, count + 1)]


# --- the trace ------------------------------------------------------------------------


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a CSV (a header line first) or JSON lines file."""
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise InputError(str(path), f"cannot read the trace: {exc.strerror}") from None
    with handle:
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise InputError(f"{path}:{number}", f"not JSON: {exc}") from None
                if not isinstance(row, dict):
                    raise InputError(f"{path}:{number}", "each line must be a JSON object")
                yield number, row
            return
        reader = csv.DictReader(handle)
        missing = [name for name in TRACE_FIELDS if name not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"{path}:1: {missing[0]}", "missing column",
                             f"the header needs {', '.join(TRACE_FIELDS)}")
        for row in reader:
            yield reader.line_num, {key: value for key, value in row.items()
                                    if value not in (None, "")}


def load_trace(path: Path, settings: Settings) -> tuple[TraceJob, ...]:
    """Read a workload trace (docs/simulate.md); InputError names the line and field."""
    jobs: list[TraceJob] = []
    previous = 0.0
    ids: set[int] = set()
    for number, row in _rows(path):
        job = _trace_job(row, len(jobs) + 1, settings, f"{path}:{number}")
        if job.arrival < previous:
            raise InputError(f"{path}:{number}: arrival", f"{job.arrival:g} is before the "
                             f"line above ({previous:g})", "sort the trace by arrival")
        if job.id in ids:
            raise InputError(f"{path}:{number}: id", f"job id {job.id} is used twice")
        ids.add(job.id)
        previous = job.arrival
        jobs.append(job)
    if not jobs:
        raise InputError(str(path), "the trace has no job")
    return tuple(jobs)


def _trace_job(row: Mapping[str, Any], serial: int, settings: Settings,
               where: str) -> TraceJob:
    def error(field: str, problem: str, fix: str | None = None) -> InputError:
        return InputError(f"{where}: {field}", problem, fix)

    for field in row:
        if field not in TRACE_FIELDS and field not in OPTIONAL_FIELDS:
            raise error(field, "unknown field", f"use {', '.join(TRACE_FIELDS)}, id, affinity")
    job_type = row.get("job_type")
    if job_type not in settings.job_types:
        known = ", ".join(sorted(settings.job_types)) or "none: add [job_types] to herder.toml"
        raise error("job_type", f"unknown job type {job_type!r}", f"use one of: {known}")
    declared = settings.job_types[str(job_type)]
    weight = row.get("weight", declared.weight or settings.defaults.weight)
    if weight not in settings.weights:
        raise error("weight", f"unknown weight {weight!r}",
                    f"use one of: {', '.join(sorted(settings.weights))}")

    def number(field: str, default: float | None = None) -> float:
        value = row.get(field, default)
        if value is None:
            raise error(field, "is required")
        try:
            found = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            found = math.nan
        if not math.isfinite(found):
            raise error(field, f"{value!r} is not a number")
        if found < 0:
            raise error(field, f"{found:g} is negative", "use 0 or more")
        return found

    priority_value = row.get("priority", declared.priority if declared.priority is not None
                             else settings.defaults.priority)
    try:
        priority = int(priority_value)
    except (TypeError, ValueError):
        raise error("priority", f"{priority_value!r} is not a whole number") from None
    outcome_value = row.get("outcome", TraceOutcome.DONE.value)
    try:
        outcome = TraceOutcome(outcome_value)
    except ValueError:
        raise error("outcome", f"unknown outcome {outcome_value!r}",
                    f"use one of: {', '.join(o.value for o in TraceOutcome)}") from None
    budget = settings.weights[str(weight)]
    job_id = int(number("id", serial))
    affinity = row.get("affinity")
    return TraceJob(job_id, number("arrival"), str(job_type), str(weight), priority,
                    number("duration"), number("peak_gb", budget), outcome,
                    str(affinity) if affinity is not None else None)


# --- generated traces --------------------------------------------------------------


class Mix(msgspec.Struct, frozen=True):
    job_type: str
    weight: str
    priority: int
    share: float


def parse_mix(text: str, settings: Settings) -> list[Mix]:
    """`TYPE:WEIGHT[:PRIORITY]=SHARE,...` (--mix)."""
    found = []
    for part in text.split(","):
        shape, _, share = part.strip().partition("=")
        pieces = shape.split(":")
        if len(pieces) not in (2, 3) or not share:
            raise InputError("--mix", f"{part!r} is not TYPE:WEIGHT[:PRIORITY]=SHARE",
                             "e.g. --mix agent:heavy=3,agent:light:50=1")
        job_type, weight = pieces[0], pieces[1]
        if job_type not in settings.job_types:
            raise InputError("--mix", f"unknown job type {job_type!r}",
                             f"use one of: {', '.join(sorted(settings.job_types)) or 'none'}")
        if weight not in settings.weights:
            raise InputError("--mix", f"unknown weight {weight!r}",
                             f"use one of: {', '.join(sorted(settings.weights))}")
        try:
            priority = int(pieces[2]) if len(pieces) == 3 else settings.defaults.priority
            amount = float(share)
        except ValueError:
            raise InputError("--mix", f"{part!r}: priority and share must be numbers") from None
        if not amount > 0:
            raise InputError("--mix", f"{part!r}: the share must be above zero")
        found.append(Mix(job_type, weight, priority, amount))
    return found


def parse_outcomes(text: str) -> list[tuple[TraceOutcome, float]]:
    """`OUTCOME=SHARE,...` (--outcomes)."""
    found = []
    for part in text.split(","):
        name, _, share = part.strip().partition("=")
        try:
            found.append((TraceOutcome(name), float(share)))
        except ValueError:
            raise InputError("--outcomes", f"{part!r} is not OUTCOME=SHARE",
                             f"outcomes: {', '.join(o.value for o in TraceOutcome)}") from None
    if not found or any(share < 0 for _, share in found) or not sum(s for _, s in found) > 0:
        raise InputError("--outcomes", "shares must be >= 0 and not all zero")
    return found


def parse_durations(text: str) -> tuple[str, float, float]:
    """`fixed:SECONDS`, `exp:MEAN`, `uniform:LOW:HIGH` or `lognormal:MEDIAN:SIGMA`."""
    kind, *values = text.split(":")
    try:
        numbers = [float(value) if kind == "lognormal" and index == 1
                   else parse_duration(value) for index, value in enumerate(values)]
    except ValueError:
        numbers = []
    wanted = {"fixed": 1, "exp": 1, "uniform": 2, "lognormal": 2}
    if kind not in wanted or len(numbers) != wanted[kind]:
        raise InputError("--durations", f"{text!r} is not a duration distribution",
                         "use fixed:15m, exp:30m, uniform:5m:1h or lognormal:20m:0.8")
    return kind, numbers[0], numbers[1] if len(numbers) > 1 else 0.0


def generate_trace(settings: Settings, jobs: int, arrival_rate: float, mix: Sequence[Mix],
                   durations: tuple[str, float, float],
                   outcomes: Sequence[tuple[TraceOutcome, float]], seed: int) -> tuple[
                       TraceJob, ...]:
    """`jobs` jobs arriving as a Poisson process of `arrival_rate` per hour, their shapes
    drawn from `mix` and their ends from `outcomes`; the same seed, the same trace. True
    peaks are 50–100 % of the weight's budget, 150 % for oom and needs_heavier."""
    if jobs < 1 or not arrival_rate > 0:
        raise InputError("--jobs/--arrival-rate", "need at least one job and a rate above 0")
    chance = random.Random(seed)
    kind, first, second = durations
    at = 0.0
    found = []
    shares = [item.share for item in mix]
    outcome_names = [outcome for outcome, _ in outcomes]
    outcome_shares = [share for _, share in outcomes]
    for job_id in range(1, jobs + 1):
        at += chance.expovariate(arrival_rate / 3600.0)
        shape = chance.choices(mix, shares)[0]
        outcome = chance.choices(outcome_names, outcome_shares)[0]
        if kind == "fixed":
            duration = first
        elif kind == "exp":
            duration = chance.expovariate(1 / first) if first > 0 else 0.0
        elif kind == "uniform":
            duration = chance.uniform(first, second)
        else:
            duration = first * math.exp(chance.gauss(0.0, second))
        budget = settings.weights[shape.weight]
        peak = budget * (1.5 if outcome in (TraceOutcome.OOM, TraceOutcome.NEEDS_HEAVIER)
                         else chance.uniform(0.5, 1.0))
        found.append(TraceJob(job_id, round(at, 3), shape.job_type, shape.weight,
                              shape.priority, round(duration, 3), round(peak, 3), outcome))
    return tuple(found)


def write_trace(jobs: Sequence[TraceJob], path: Path) -> None:
    """The trace as CSV (the format `--trace` reads), to replay or edit."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("id", *TRACE_FIELDS, "affinity"))
        for job in jobs:
            writer.writerow((job.id, f"{job.arrival:.15g}", job.job_type, job.weight,
                             job.priority, f"{job.duration:.15g}", f"{job.peak_gb:.15g}",
                             job.outcome.value, job.affinity or ""))


# --- running ---------------------------------------------------------------------------


class Unplaceable(InputError):
    """Work that fits no host: the run stops and names it."""

    def __init__(self, unplaced: Sequence[Unplaced]) -> None:
        shown = ", ".join(f"{item.job_id} ({item.job_type}, {item.weight}, priority "
                          f"{item.priority})" for item in unplaced[:20])
        more = f" and {len(unplaced) - 20} more" if len(unplaced) > 20 else ""
        super().__init__("trace", f"{len(unplaced)} job(s) fit no host: {shown}{more}",
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
        rules = msgspec.structs.replace(rules, cycle=cycle)
    scenario = Scenario(fleet.start, fleet.hosts, tuple(jobs), rules, fleet.outages,
                        fleet.accounts, fleet.spawn_failure, seed)
    try:
        return simulate(scenario, keep_timelines, keep_attempts)
    except StuckError as exc:
        raise Unplaceable(exc.unplaced) from None


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
    path.write_text(json.dumps({name: report.summary() for name, report in reports.items()},
                               indent=2, sort_keys=True) + "\n")


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

    directory.mkdir(parents=True, exist_ok=True)
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
