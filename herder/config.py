"""herder.toml → validated settings. Every error names the file, the key and its line."""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from herder.errors import ConfigError, InputError
from herder.model import MAX_DURATION
from herder.urls import DEFAULT_DB

CONFIG_FILE = "herder.toml"
_DURATION = re.compile(r"^\s*(?:(\d+(?:\.\d+)?)\s*h)?\s*(?:(\d+(?:\.\d+)?)\s*m(?!s))?"
                       r"\s*(?:(\d+(?:\.\d+)?)\s*s)?\s*(?:(\d+(?:\.\d+)?)\s*ms)?\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_duration(value: object) -> float:
    """Seconds from a number or a string like `90s`, `10m`, `2h`, `1h30m`, `250ms`."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 90s, 10m or 2h")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 10m, 2h or 1h30m")
        if value < 0:
            raise ValueError("a duration cannot be negative")
        if value > MAX_DURATION:
            raise ValueError(f"{value!r}s is longer than a year; use at most 365d worth")
        return float(value)
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match and any(match.groups()):
            hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
            return parse_duration(hours * 3600 + minutes * 60 + seconds + millis / 1000)
        try:
            return parse_duration(float(value))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not a duration; use e.g. 90s, 10m, 2h or 1h30m")


Duration = Annotated[float, BeforeValidator(parse_duration)]


def quoted_placeholder(script: str) -> str | None:
    """The first {placeholder} that stands inside single or double quotes in a shell script."""
    quote: str | None = None
    index = 0
    while index < len(script):
        char = script[index]
        if char == "\\" and quote != "'":
            index += 2
            continue
        if quote is None and char in "'\"":
            quote = char
        elif quote is not None and char == quote:
            quote = None
        elif char == "{":
            if script.startswith("{{", index):
                index += 2
                continue
            match = re.match(r"\{(\w+)\}", script[index:])
            if match and quote is not None:
                return match.group(1)
        index += 1
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HerderSection(_Strict):
    db: str | None = None
    log_dir: str = "herder-logs"
    host: str | None = None


def pass_env_refusal(entry: str, secret: str = "HERDER_") -> str | None:
    """Why a `pass_env` entry is not allowed, or None. An entry is a variable name or a
    `PREFIX*` pattern; none may name or match herder's own variables (`secret` is a name or
    a prefix ending in `_`), which hold its credentials."""
    prefix = entry[:-1] if entry.endswith("*") else None
    name = entry if prefix is None else prefix
    if not (_ENV_NAME.match(name) or (prefix == "")):
        return (f"{entry!r} is not a variable name or a PREFIX* pattern; use e.g. "
                "\"OPENAI_API_KEY\" or \"AWS_*\"")
    if prefix is None:
        clash = entry == secret or (secret.endswith("_") and entry.startswith(secret))
    else:
        clash = secret.startswith(prefix) or (secret.endswith("_") and prefix.startswith(secret))
    if clash:
        return (f"{entry!r} would pass herder's own variables ({secret}...: database URL, "
                "tokens) to jobs; remove it from pass_env")
    return None


def _pass_env_entry(entry: str) -> str:
    refusal = pass_env_refusal(entry)
    if refusal is not None:
        raise ValueError(refusal)
    return entry


PassEnvEntry = Annotated[str, AfterValidator(_pass_env_entry)]


class RuntimeSection(_Strict):
    concurrency: int = Field(default=4, ge=1, le=1024)
    heartbeat_interval: Duration = 10.0
    attempt_lease: Duration = 60.0
    kill_grace: Duration = 10.0
    poll_interval: Duration = 1.0
    max_lost: int = Field(default=5, ge=1)
    pass_env: list[PassEnvEntry] = Field(default_factory=list)
    """Variables of the runner's environment a job gets besides the base allow-list."""
    fence_margin: Duration | None = None
    """A runner whose heartbeats fail stops its attempts this long before their lease ends;
    None is a quarter of the lease."""

    @field_validator("heartbeat_interval", "poll_interval")
    @classmethod
    def _positive(cls, value: float) -> float:
        if value <= 0:
            raise ValueError("must be greater than zero")
        return value

    @field_validator("fence_margin")
    @classmethod
    def _margin_positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be greater than zero (or left out for a quarter of "
                             "attempt_lease)")
        return value


class DefaultsSection(_Strict):
    priority: int = 100
    weight: str = "light"
    max_attempts: int = Field(default=3, ge=1)
    timeout: Duration | None = None
    backoff_base: Duration = 10.0
    backoff_max: Duration = 600.0


class JobTypeSection(_Strict):
    command: list[str] | str
    shell: bool = False
    prompt_file: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    export: list[str] = Field(default_factory=list)
    weight: str | None = None
    priority: int | None = None
    timeout: Duration | None = None
    max_attempts: int | None = Field(default=None, ge=1)
    backoff_base: Duration | None = None
    backoff_max: Duration | None = None
    workdir: str | None = None
    description: str | None = None
    preflight: list[str] | bool = True
    """Run by an agent before it takes this type: true is `<program> --version` (the program
    must exist and answer), a list is a command that must exit 0, false is none."""
    preflight_timeout: Duration = Field(default=5.0, gt=0)

    @field_validator("preflight")
    @classmethod
    def _preflight(cls, value: list[str] | bool) -> list[str] | bool:
        if isinstance(value, list) and not value:
            raise ValueError("the preflight command is empty; give an argv list like "
                             "[\"claude\", \"--version\"], or false for none")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and not value:
            raise ValueError("the command is empty; give an argv list like [\"aider\", \"--yes\"]")
        if isinstance(value, str) and not value.strip():
            raise ValueError("the command is empty")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not a valid environment variable name")
        return value

    @field_validator("export")
    @classmethod
    def _export(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_NAME.match(name):
                raise ValueError(f"payload field {name!r} cannot become HERDER_PAYLOAD_"
                                 f"{name.upper()}; use letters, digits and _")
        return value

    @model_validator(mode="after")
    def _quoted_placeholders(self) -> JobTypeSection:
        """herder shell-quotes every value it fills in; a placeholder the template itself
        wraps in quotes would be re-opened by the shell ("$(...)" runs inside "...")."""
        if self.shell and isinstance(self.command, str):
            name = quoted_placeholder(self.command)
            if name is not None:
                raise ValueError(f"{{{name}}} is inside quotes in a shell command; remove the "
                                 "quotes around it (herder quotes every value itself)")
        return self


class WindowCapsSection(_Strict):
    max_workers: int = Field(default=1, ge=0)
    max_weight: str | None = None


class HostSection(_Strict):
    """A host declared in herder.toml; `herder server` creates or updates it at start."""

    ram_total_gb: float = Field(ge=0)
    ram_reserved_gb: float = Field(default=0.0, ge=0)
    cpus: int = Field(default=1, ge=1)
    transport: str = "agent"
    ssh_target: str | None = None
    prime: WindowCapsSection = WindowCapsSection()
    night: WindowCapsSection = WindowCapsSection()
    job_types: list[str] | None = None
    weights: list[str] | None = None
    priority_floor: int | None = None
    labels: list[str] = Field(default_factory=list)
    enabled: bool = True

    @field_validator("transport")
    @classmethod
    def _transport(cls, value: str) -> str:
        if value not in ("local", "agent", "ssh"):
            raise ValueError("transport must be local, agent or ssh")
        return value


class FleetSection(_Strict):
    bookable_fraction: float = Field(default=0.8, gt=0, le=1)
    strategy: str = "best_fit"
    starvation_wait: Duration = 600.0
    healthy_within: Duration = 300.0
    degraded_within: Duration = 900.0
    night_start: str = "20:00"
    night_end: str = "03:00"
    timezone: str = "UTC"
    escalation: list[str] = Field(
        default_factory=lambda: ["light", "heavy", "playwright", "orchestrator"]
    )
    shedding: list[tuple[float, str | None]] = Field(
        default_factory=lambda: [(0.75, None), (0.5, "heavy"), (0.25, "heavy"), (0.0, "light")]
    )
    max_spawn_failures: int = Field(default=5, ge=1)
    spawn_backoff: Duration = 300.0
    scheduler_interval: Duration = 1.0
    missed_heartbeats: int = Field(default=3, ge=1)
    pickup_timeout: Duration | None = None
    """A placement no runner has taken by then goes back to the queue (None: 2 heartbeat
    intervals + 5 s, see herder.runtime.scheduler.pickup_timeout_seconds)."""
    reservation_ttl: Duration = 10800.0
    ci_slot_ttl: Duration = 28800.0
    ssh_command: list[str] = Field(default_factory=lambda: ["ssh"])
    remote_herder: str = "herder"

    @field_validator("shedding", mode="before")
    @classmethod
    def _shedding(cls, value: Any) -> Any:
        """TOML has no null: "any" (or "") stands for "every weight" in a step."""
        if isinstance(value, list):
            return [[step[0], None if step[1] in ("", "any") else step[1]]
                    if isinstance(step, list | tuple) and len(step) == 2 else step
                    for step in value]
        return value

    @field_validator("pickup_timeout")
    @classmethod
    def _pickup_timeout(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be greater than zero (or left out for the default)")
        return value

    @field_validator("strategy")
    @classmethod
    def _strategy(cls, value: str) -> str:
        if value not in ("best_fit", "spread"):
            raise ValueError("strategy must be best_fit or spread")
        return value

    @field_validator("night_start", "night_end")
    @classmethod
    def _clock(cls, value: str) -> str:
        if not re.match(r"^([01]\d|2[0-3]):[0-5]\d$", value):
            raise ValueError(f"{value!r} is not a time of day like 20:00")
        return value

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown timezone {value!r}") from exc
        return value


class ServerSection(_Strict):
    listen: str = "127.0.0.1:8470"
    api_token_env: str = "HERDER_API_TOKEN"
    long_poll: Duration = 25.0
    tls_cert: str | None = None
    tls_key: str | None = None
    public_url: str | None = None
    """How remote hosts reach this server (ssh push); default http(s)://listen."""
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024, le=1024**3)
    """Larger request bodies are refused with 413 (agents ship logs in 512 KiB chunks)."""


DEFAULT_WEIGHTS: dict[str, float] = {
    "light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0,
}


class Settings(_Strict):
    herder: HerderSection = HerderSection()
    runtime: RuntimeSection = RuntimeSection()
    defaults: DefaultsSection = DefaultsSection()
    weights: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_WEIGHTS))
    job_types: dict[str, JobTypeSection] = Field(default_factory=dict)
    fleet: FleetSection = FleetSection()
    server: ServerSection = ServerSection()
    hosts: dict[str, HostSection] = Field(default_factory=dict)

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: dict[str, HostSection]) -> dict[str, HostSection]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a valid host label")
        return value

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("at least one weight is needed")
        for name, budget in value.items():
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a valid weight name")
            if budget < 0:
                raise ValueError(f"weight {name!r} has a negative RAM budget")
        return value

    @field_validator("job_types")
    @classmethod
    def _job_types(cls, value: dict[str, JobTypeSection]) -> dict[str, JobTypeSection]:
        for name in value:
            if not _NAME.match(name):
                raise ValueError(f"{name!r} is not a valid job type name")
        return value


@dataclass(frozen=True)
class Config:
    """Validated settings plus where they came from (relative paths resolve against it)."""

    settings: Settings
    path: Path | None

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    def resolve_path(self, value: str) -> Path:
        path = Path(os.path.expanduser(value))
        return path if path.is_absolute() else (self.base_dir / path)

    @property
    def log_dir(self) -> Path:
        return self.resolve_path(self.settings.herder.log_dir)

    def db_url(self, override: str | None = None) -> str:
        """--db, then HERDER_DB, then the config's [herder] db, then ./herder.db."""
        url = override or os.environ.get("HERDER_DB") or self.settings.herder.db
        if url is None:
            return DEFAULT_DB
        if not override and not os.environ.get("HERDER_DB") and url.startswith("sqlite:///"):
            rest = url[len("sqlite:///"):]
            if not rest.startswith("/"):
                return "sqlite:///" + str(self.resolve_path(rest))
        return url

    def check_weight(self, weight: str, field: str = "weight") -> None:
        if weight not in self.settings.weights:
            known = ", ".join(sorted(self.settings.weights))
            raise InputError(field, f"unknown weight {weight!r}", f"use one of: {known}")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Load herder.toml from `path`, HERDER_CONFIG or ./herder.toml; defaults if absent."""
    explicit = path is not None or bool(os.environ.get("HERDER_CONFIG"))
    candidate = Path(path or os.environ.get("HERDER_CONFIG") or CONFIG_FILE)
    if not candidate.exists():
        if explicit:
            raise ConfigError(str(candidate), "file not found", "run `herder init` to write one")
        return Config(Settings(), None)
    text = candidate.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"{candidate}:{at.group(1)}" if at else str(candidate)
        raise ConfigError(where, f"invalid TOML: {exc}") from exc
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = _data_loc(data, error["loc"])
        if error["type"] == "missing" and len(loc) == len(error["loc"]) - 1:
            loc.append(str(error["loc"][-1]))
        line = _line_of(text, loc)
        where = f"{candidate}:{line}" if line else str(candidate)
        raise ConfigError(f"{where}: {'.'.join(loc)}", _message(error)) from exc
    config = Config(settings, candidate.resolve())
    _cross_check(config, text)
    return config


def _data_loc(data: Any, loc: tuple[int | str, ...]) -> list[str]:
    """The part of a pydantic error location that names keys in the file.

    Unions add the member they tried (`command.list[str]`); those are not keys, so stop
    at the first part the data does not contain.
    """
    out: list[str] = []
    node = data
    for part in loc:
        in_dict = isinstance(node, dict) and isinstance(part, str) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            break
        node = node[part]
        out.append(str(part))
    return out or [str(part) for part in loc[:1]]


def _where(config: Config, text: str, loc: list[str]) -> str:
    line = _line_of(text, loc)
    prefix = f"{config.path}:{line}" if line else str(config.path)
    return f"{prefix}: {'.'.join(loc)}"


def _message(error: Any) -> str:
    kind = error.get("type", "")
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against `herder init`'s sample"
    if kind == "missing":
        return "required key is missing"
    return str(error.get("msg", "invalid value")).removeprefix("Value error, ")


def _cross_check(config: Config, text: str) -> None:
    settings = config.settings
    runtime = settings.runtime
    if runtime.fence_margin is not None and runtime.fence_margin >= runtime.attempt_lease:
        raise ConfigError(
            _where(config, text, ["runtime", "fence_margin"]),
            f"fence_margin ({runtime.fence_margin:g}s) must be shorter than attempt_lease "
            f"({runtime.attempt_lease:g}s)",
            "lower runtime.fence_margin or raise runtime.attempt_lease")
    for index, entry in enumerate(runtime.pass_env):
        refusal = pass_env_refusal(entry, settings.server.api_token_env)
        if refusal is not None:
            raise ConfigError(_where(config, text, ["runtime", "pass_env", str(index)]),
                              refusal)
    if settings.defaults.weight not in settings.weights:
        raise ConfigError(
            _where(config, text, ["defaults", "weight"]),
            f"unknown weight {settings.defaults.weight!r}",
            f"define it under [weights] or use one of {sorted(settings.weights)}",
        )
    known = set(settings.weights)
    explicit = "escalation" in settings.fleet.model_fields_set
    for name in settings.fleet.escalation if explicit else ():
        if name not in known:
            raise ConfigError(_where(config, text, ["fleet", "escalation"]),
                              f"unknown weight {name!r}",
                              f"use weights from [weights]: {sorted(known)}")
    shedding = settings.fleet.shedding if "shedding" in settings.fleet.model_fields_set else ()
    for _ratio, weight in shedding:
        if weight is not None and weight not in known:
            raise ConfigError(_where(config, text, ["fleet", "shedding"]),
                              f"unknown weight {weight!r}",
                              f"use \"any\" or one of {sorted(known)}")
    for label, host in settings.hosts.items():
        for window in ("prime", "night"):
            weight = getattr(host, window).max_weight
            if weight is not None and weight not in known:
                raise ConfigError(_where(config, text, ["hosts", label, window, "max_weight"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        for weight in host.weights or ():
            if weight not in known:
                raise ConfigError(_where(config, text, ["hosts", label, "weights"]),
                                  f"unknown weight {weight!r}", f"use one of {sorted(known)}")
        if host.transport == "ssh" and not host.ssh_target:
            raise ConfigError(_where(config, text, ["hosts", label, "ssh_target"]),
                              "an ssh host needs ssh_target", "set ssh_target = \"user@host\"")
    for name, job_type in settings.job_types.items():
        if job_type.weight is not None and job_type.weight not in settings.weights:
            raise ConfigError(
                _where(config, text, ["job_types", name, "weight"]),
                f"unknown weight {job_type.weight!r}",
                f"define it under [weights] or use one of {sorted(settings.weights)}",
            )
        if job_type.shell != isinstance(job_type.command, str):
            raise ConfigError(
                _where(config, text, ["job_types", name, "command"]),
                "shell = true needs a command string; otherwise the command is an argv list",
                "write command = [\"prog\", \"arg\"], or set shell = true with a string",
            )
        if job_type.prompt_file is not None:
            prompt = config.resolve_path(job_type.prompt_file)
            if not prompt.is_file():
                raise ConfigError(
                    _where(config, text, ["job_types", name, "prompt_file"]),
                    f"{prompt} does not exist",
                    "create the file or fix the path (relative to herder.toml)",
                )


def _line_of(text: str, loc: list[str]) -> int | None:
    """Best-effort line number of a dotted key: find its table header, then the key."""
    lines = text.splitlines()
    for split in range(len(loc), -1, -1):
        table, keys = loc[:split], loc[split:]
        header = _find_header(lines, table) if table else -1
        if header is None:
            continue
        if not keys:
            return header + 1
        found = _find_key(lines, header + 1, keys)
        if found is not None:
            return found + 1
        if table:
            return header + 1
    if loc:  # a table that only appears through its sub-tables, like [job_types.x]
        header = _find_header(lines, loc, prefix=True)
        if header is not None:
            return header + 1
    return None


def _find_key(lines: list[str], start: int, keys: list[str]) -> int | None:
    """The line (0-based) from `start` to the next header that assigns `keys`, written
    plainly (`a = `), dotted (`a.b = `) or as an inline table (`a = { b = ... }`)."""
    for count in range(len(keys), 0, -1):
        dotted = r"\s*\.\s*".join(
            rf"(?:\"{re.escape(k)}\"|'{re.escape(k)}'|{re.escape(k)})" for k in keys[:count]
        )
        pattern = re.compile(rf"^\s*{dotted}\s*[=.]")
        for index in range(start, len(lines)):
            if _HEADER.match(lines[index]):
                break
            if pattern.match(lines[index]):
                return index
    return None


_HEADER = re.compile(r"^\s*\[(?!\[)\s*([^\]]+?)\s*\]\s*(?:#.*)?$")


def _find_header(lines: list[str], table: list[str], prefix: bool = False) -> int | None:
    wanted = ".".join(table)
    for index, line in enumerate(lines):
        match = _HEADER.match(line)
        if match:
            name = ".".join(part.strip().strip("\"'") for part in match.group(1).split("."))
            if name == wanted or (prefix and name.startswith(wanted + ".")):
                return index
    return None


def sample_config() -> str:
    """The commented herder.toml that `herder init` writes."""
    from importlib import resources  # only `herder init` reads it; the import costs ~4 ms

    return resources.files("herder").joinpath("sample.toml").read_text()
