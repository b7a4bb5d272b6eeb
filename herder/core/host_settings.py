"""What `herder host add` and `host set` change on a host, as one value: the CLI parses its
options into it, the HTTP API's body (`herder.wire.hosts.HostSettingsBody`) is the same
fields, and the server applies it to the stored record."""

from __future__ import annotations

import msgspec

from herder.core.model import Transport


class HostSettings(msgspec.Struct, frozen=True):
    """The options given; None leaves a field as it is. `job_types` and `weights` empty
    mean any; a window's max weight "" or "any" means no cap."""

    ram_total_gb: float | None = None
    ram_reserved_gb: float | None = None
    cpus: int | None = None
    transport: Transport | None = None
    ssh_target: str | None = None
    prime_workers: int | None = None
    prime_max_weight: str | None = None
    night_workers: int | None = None
    night_max_weight: str | None = None
    job_types: frozenset[str] | None = None
    weights: frozenset[str] | None = None
    priority_floor: int | None = None
    labels: frozenset[str] | None = None
