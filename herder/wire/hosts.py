"""Operators' host bodies (`/api/v1/hosts`): add, set, drain and enable, and a host's view."""

from __future__ import annotations

from typing import Any

import msgspec
from pydantic import Field

from herder.core.host_settings import HostSettings
from herder.core.model import (
    INT_MAX,
    Transport,
)
from herder.core.submission import NAME_LENGTH
from herder.wire.base import (
    Body,
    Gigabytes,
    Int32,
    Name,
    Reply,
    Timestamp,
)


class HostSwitched(Reply):
    """A host drained or enabled by an operator."""

    label: str
    enabled: bool


class HostSettingsBody(Body):
    """`herder host set`'s options (`herder.core.host_settings.HostSettings`); a field left out
    is left as it is. `job_types` / `weights` empty: any."""

    ram_total_gb: Gigabytes | None = None
    ram_reserved_gb: Gigabytes | None = None
    cpus: int | None = Field(default=None, ge=1, le=INT_MAX)
    transport: Transport | None = None
    ssh_target: Name | None = None
    prime_workers: int | None = Field(default=None, ge=0, le=INT_MAX)
    prime_max_weight: Name | None = None
    night_workers: int | None = Field(default=None, ge=0, le=INT_MAX)
    night_max_weight: Name | None = None
    job_types: list[Name] | None = Field(default=None, max_length=1000)
    weights: list[Name] | None = Field(default=None, max_length=1000)
    priority_floor: Int32 | None = None
    labels: list[Name] | None = Field(default=None, max_length=1000)

    def settings(self) -> HostSettings:
        fields = set(HostSettingsBody.model_fields)  # not HostAddBody's own
        return msgspec.convert(self.model_dump(mode="json", include=fields), HostSettings)

    @classmethod
    def body_of(cls, settings: HostSettings) -> dict[str, Any]:
        """The JSON body for `settings`: only the fields given."""
        return {key: sorted(value) if isinstance(value, frozenset) else value
                for key, value in msgspec.structs.asdict(settings).items()
                if value is not None}


class HostAddBody(HostSettingsBody):
    label: str = Field(max_length=NAME_LENGTH)
    enabled: bool = True


class HostToken(Reply):
    """A host's new agent token: shown in this answer only (the server keeps its hash)."""

    label: str
    token: str


class HostChanged(Reply):
    label: str


class WindowView(Reply):
    max_workers: int
    max_weight: str | None


class HostView(Reply):
    label: str
    enabled: bool
    agent: str | None
    """"stopped" or "draining" as its agent last said; None when it takes work."""
    transport: str
    health: str
    last_heartbeat: Timestamp | None
    agent_down: str | None
    """Why its agent is not live for placement (missed heartbeats); None when it is."""
    condition: str | None = None
    """"enabled", "drained" (`herder host drain`), "agent draining" or "agent stopped":
    the words `herder why` uses. None from a server older than the field."""
    liveness: str | None = None
    """By placement's rule: live, late (missed a heartbeat), down, stopped or unknown."""
    missed_heartbeats: int = 0
    heartbeat_age_seconds: float | None = None
    """Seconds since its last heartbeat when the view was made."""
    ram_total_gb: float
    ram_reserved_gb: float
    bookable_gb: float
    booked_gb: float
    free_gb: float
    cpus: int
    workers: int
    window: str
    max_workers: int
    max_weight: str | None
    prime: WindowView
    night: WindowView
    allowed_job_types: list[str] | None
    allowed_weights: list[str] | None
    priority_floor: int | None
    labels: list[str]
    ssh_target: str | None
    measured_available_gb: float | None = None
    """RAM its agent last measured available (`MemAvailable`); None with no agent."""
    breakers: dict[str, str] = Field(default_factory=dict)
    """Job type -> its circuit breaker on this host, where it is not closed."""
    preflight_failed: dict[str, str] = Field(default_factory=dict)
    """Job type -> why its preflight failed on this host (its agent's last word)."""

