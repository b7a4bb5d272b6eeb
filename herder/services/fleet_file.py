"""`herder simulate`'s fleet file (docs/simulate.md): hosts, windows, outages and accounts,
read with the file, line and field of every error (InputError: the CLI exits 2)."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime, time
from pathlib import Path
from typing import Any

import msgspec

from herder.core.errors import InputError
from herder.core.host_settings import declared_host
from herder.core.scheduling.capacity import WindowCaps, WindowSchedule
from herder.core.scheduling.placement import HostSpec
from herder.core.settings.fields import NAME, parse_duration
from herder.core.settings.sections import Settings
from herder.core.simulation.scenario import (
    Outage,
    SimAccount,
)

DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
"""A Monday, 00:00 UTC: where a fleet file that names no `start` begins."""
LATEST_START_YEAR = 9000
"""A later `start` would leave too few years for the run's clock (a trace spans up to 100
years)."""
MAX_HOSTS = 100_000
"""Hosts a fleet file may declare, in all and in one `count`."""
MAX_NUMBER = 1_000_000.0
"""The largest RAM (GB) or CPU count a host may give."""

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


def fleet_of_settings(settings: Settings) -> Fleetfile:
    """The fleet herder.toml declares (`[hosts.LABEL]` and their accounts), as `herder
    server` stores it: what `herder simulate` runs without --fleet. Accounts have no
    quota (herder.toml cannot say one) and there is no outage."""
    hosts = tuple(HostSpec.configured(declared_host(label, section))
                  for label, section in sorted(settings.hosts.items()))
    if not hosts:
        raise InputError("--fleet", "herder.toml declares no host",
                         "give a fleet file (--fleet FILE, docs/simulate.md) or declare "
                         "[hosts.LABEL] in herder.toml")
    accounts = tuple(
        SimAccount(label, name, account.max_sessions,
                   None if account.job_types is None else frozenset(account.job_types))
        for label, section in sorted(settings.hosts.items())
        for name, account in sorted(section.accounts.items()))
    return Fleetfile(DEFAULT_START, hosts, (), accounts, {})


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
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(str(path), f"cannot read the fleet file: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}", "not UTF-8 text",
                         "save the fleet file as UTF-8") from None
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
        if not isinstance(value, datetime) or value.tzinfo is None or not (
                1 < value.year <= LATEST_START_YEAR):
            raise InputError(f"{path}:{_start_line(text)}: start",
                             f"not a time with its offset in the years 2 to {LATEST_START_YEAR}",
                             "e.g. 2026-01-05T00:00:00Z")
        start = value.astimezone(UTC)
    schedule = _windows(data.get("windows", {}), where)
    hosts: list[HostSpec] = []
    spawn_failure: dict[str, float] = {}
    for index, entry in enumerate(_entries(data, "hosts", where)):
        specs = _hosts(entry, index, where, settings)
        hosts.extend(specs)
        if len(hosts) > MAX_HOSTS:
            raise where.error("hosts", index, "count" if "count" in entry else None,
                              f"the fleet would have more than {MAX_HOSTS} hosts",
                              "simulate a smaller fleet")
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
        if quota is not None and (not isinstance(quota, int) or isinstance(quota, bool)
                                  or quota < 1):
            raise where.error("accounts", index, "quota_jobs", "must be a whole number >= 1",
                              "leave it out for an account without a quota")
        sessions = entry.get("max_sessions", 1)
        if not isinstance(sessions, int) or isinstance(sessions, bool) or not (
                1 <= sessions <= MAX_HOSTS):
            raise where.error("accounts", index, "max_sessions",
                              f"must be a whole number from 1 to {MAX_HOSTS}")
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
    if not isinstance(host, str):
        raise where.error(table, index, "host", "must be a host's label (a string)")
    if host not in known:
        raise where.error(table, index, "host", f"no host {host!r} in the fleet")
    return host


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
            value) or not minimum <= value <= MAX_NUMBER:
        raise where.error(table, index, key,
                          f"must be a number from {minimum:g} to {MAX_NUMBER:g}")
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
    if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= MAX_HOSTS:
        raise where.error("hosts", index, "count",
                          f"must be a whole number from 1 to {MAX_HOSTS}")
    weights = set(settings.weights)
    caps = {}
    for window in ("prime", "night"):
        workers = entry.get(f"{window}_workers", 1)
        if not isinstance(workers, int) or isinstance(workers, bool) or not (
                0 <= workers <= MAX_HOSTS):
            raise where.error("hosts", index, f"{window}_workers",
                              f"must be a whole number from 0 to {MAX_HOSTS}")
        max_weight = entry.get(f"{window}_max_weight")
        if max_weight is not None and not isinstance(max_weight, str):
            raise where.error("hosts", index, f"{window}_max_weight",
                              "must be a weight's name (a string)",
                              f"use one of: {', '.join(sorted(weights))}")
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


def _start_line(text: str) -> int:
    """The line of the top-level `start` key (1 when it is not found)."""
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("["):
            break
        if stripped.split("=", 1)[0].strip() == "start":
            return number
    return 1
