"""`herder simulate`'s workload: a trace read from CSV or JSON lines (errors name the line and
field), or generated from an arrival rate, a mix, durations and outcomes with a seed."""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from herder.core.errors import InputError
from herder.core.settings.fields import parse_duration
from herder.core.settings.sections import Settings
from herder.core.simulation.scenario import (
    TraceJob,
    TraceOutcome,
)

TRACE_FIELDS = ("arrival", "job_type", "weight", "priority", "duration", "peak_gb",
                "outcome")
OPTIONAL_FIELDS = ("id", "affinity")
MAX_SECONDS = 100 * 365 * 86400.0
"""The latest arrival and the longest duration a trace may give (100 years)."""
MAX_PEAK_GB = 1_000_000.0
MAX_ID = 2**53
"""Ids and priorities are whole numbers of at most this size (JSON's exact integers)."""
MAX_GENERATED_DURATION = 365 * 86400.0
"""A generated duration longer than a year is cut to a year (a lognormal's far tail)."""
MAX_SIGMA = 5.0
"""The widest lognormal --durations takes."""


# --- the trace ------------------------------------------------------------------------


def _lines(handle: Iterator[bytes], path: Path) -> Iterator[str]:
    """The file's lines as text, each decoded alone so that bad UTF-8 names its line."""
    for number, raw in enumerate(handle, 1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError:
            raise InputError(f"{path}:{number}", "not UTF-8 text",
                             "save the trace as UTF-8") from None


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a CSV (a header line first) or JSON lines file."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise InputError(str(path), f"cannot read the trace: {exc.strerror}") from None
    with handle:
        lines = _lines(iter(handle), path)
        if path.suffix in (".jsonl", ".json", ".ndjson"):
            for number, line in enumerate(lines, 1):
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
        reader = csv.DictReader(lines)
        try:
            missing = [name for name in TRACE_FIELDS if name not in (reader.fieldnames or [])]
            if missing:
                raise InputError(f"{path}:1: {missing[0]}", "missing column",
                                 f"the header needs {', '.join(TRACE_FIELDS)}")
            for row in reader:
                if None in row:
                    raise InputError(f"{path}:{reader.line_num}",
                                     "more columns than the header",
                                     "remove the extra values or name them in the header")
                yield reader.line_num, {key: value for key, value in row.items()
                                        if value not in (None, "")}
        except csv.Error as exc:
            # A field over the csv module's limit (128 KiB), a NUL byte, a stray quote.
            raise InputError(f"{path}:{reader.line_num + 1}", f"not CSV: {exc}") from None


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
    if not isinstance(job_type, str) or job_type not in settings.job_types:
        known = ", ".join(sorted(settings.job_types)) or "none: add [job_types] to herder.toml"
        raise error("job_type", f"unknown job type {job_type!r}", f"use one of: {known}")
    declared = settings.job_types[str(job_type)]
    weight = row.get("weight", declared.weight or settings.defaults.weight)
    if not isinstance(weight, str) or weight not in settings.weights:
        raise error("weight", f"unknown weight {weight!r}",
                    f"use one of: {', '.join(sorted(settings.weights))}")

    def number(field: str, default: float | None, most: float) -> float:
        value = row.get(field, default)
        if value is None:
            raise error(field, "is required")
        try:
            found = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError, OverflowError):
            found = math.nan
        if not math.isfinite(found):
            raise error(field, f"{value!r} is not a number")
        if found < 0:
            raise error(field, f"{found:g} is negative", "use 0 or more")
        if found > most:
            raise error(field, f"{found:g} is above the most the simulator takes ({most:g})")
        return found

    def whole(field: str, default: int, least: int) -> int:
        value = row.get(field, default)
        found: int | None = None
        if isinstance(value, int) and not isinstance(value, bool):
            found = value
        elif isinstance(value, float) and value.is_integer() and abs(value) <= MAX_ID:
            found = int(value)
        elif isinstance(value, str):
            try:
                found = int(value.strip())
            except ValueError:
                found = None
        if found is None or not least <= found <= MAX_ID:
            raise error(field, f"{value!r} is not a whole number from {least} to {MAX_ID}")
        return found

    priority = whole("priority", declared.priority if declared.priority is not None
                     else settings.defaults.priority, -MAX_ID)
    outcome_value = row.get("outcome", TraceOutcome.DONE.value)
    try:
        if not isinstance(outcome_value, str):
            raise ValueError(outcome_value)
        outcome = TraceOutcome(outcome_value)
    except ValueError:
        raise error("outcome", f"unknown outcome {outcome_value!r}",
                    f"use one of: {', '.join(o.value for o in TraceOutcome)}") from None
    budget = settings.weights[weight]
    job_id = whole("id", serial, 0)
    affinity = row.get("affinity")
    if affinity is not None and not isinstance(affinity, str):
        raise error("affinity", "must be a host's label (a string)")
    return TraceJob(job_id, number("arrival", None, MAX_SECONDS), job_type, weight, priority,
                    number("duration", None, MAX_SECONDS),
                    number("peak_gb", budget, MAX_PEAK_GB), outcome, affinity)


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
    if kind == "lognormal" and not (math.isfinite(numbers[1]) and 0 <= numbers[1] <= MAX_SIGMA):
        raise InputError("--durations", f"{text!r}: the sigma must be from 0 to {MAX_SIGMA:g}",
                         "e.g. lognormal:20m:0.8")
    if kind == "uniform" and numbers[1] < numbers[0]:
        raise InputError("--durations", f"{text!r}: LOW is above HIGH", "e.g. uniform:5m:1h")
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
        duration = min(duration, MAX_GENERATED_DURATION)
        budget = settings.weights[shape.weight]
        peak = budget * (1.5 if outcome in (TraceOutcome.OOM, TraceOutcome.NEEDS_HEAVIER)
                         else chance.uniform(0.5, 1.0))
        found.append(TraceJob(job_id, round(at, 3), shape.job_type, shape.weight,
                              shape.priority, round(duration, 3), round(peak, 3), outcome))
    return tuple(found)


def write_trace(jobs: Sequence[TraceJob], path: Path) -> None:
    """The trace as CSV (the format `--trace` reads), to replay or edit; InputError naming
    --save-trace when the path is unwritable."""
    try:
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(("id", *TRACE_FIELDS, "affinity"))
            for job in jobs:
                writer.writerow((job.id, f"{job.arrival:.15g}", job.job_type, job.weight,
                                 job.priority, f"{job.duration:.15g}", f"{job.peak_gb:.15g}",
                                 job.outcome.value, job.affinity or ""))
    except OSError as exc:
        raise InputError("--save-trace", f"cannot write {path}: {exc.strerror or exc}",
                         "give a path in a directory you can write") from None
