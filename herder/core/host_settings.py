"""What `herder host add` and `host set` change on a host, as one value: the CLI parses its
options into it, the HTTP API's body (`herder.wire.hosts.HostSettingsBody`) is the same
fields, and
`herder.services.host_settings.apply_settings` (run where the store and its config are)
turns it into the stored record, so both paths refuse alike."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from herder.core.model import HostRecord, Transport

if TYPE_CHECKING:
    from herder.core.settings.fleet import HostSection

ANY_WEIGHT = ("", "any")
"""A window's max weight that lifts the cap."""


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


def transport_refusal(host: HostRecord, transport: Transport | None) -> tuple[str, str] | None:
    """(problem, fix) when `host add/set` (CLI or API) would make a host local or stop one
    being local: a local host runs its jobs on the server's own machine (under a child
    agent the server starts), so only herder.toml, which the server's operator writes,
    declares one."""
    if transport is Transport.LOCAL and host.transport is not Transport.LOCAL:
        return ("a local host runs jobs on the server's own machine; only herder.toml "
                "declares one", f"declare [hosts.{host.label}] with transport = \"local\" "
                "in herder.toml")
    if host.transport is Transport.LOCAL and transport not in (None, Transport.LOCAL):
        return (f"host {host.label!r} is local, as herder.toml declares it",
                f"change transport under [hosts.{host.label}] in herder.toml")
    return None


def declared_host(label: str, section: HostSection) -> HostRecord:
    """The host herder.toml declares under [hosts.LABEL], as `herder server` stores it."""
    return HostRecord(
        label=label, ram_total_gb=section.ram_total_gb,
        ram_reserved_gb=section.ram_reserved_gb, cpus=section.cpus,
        enabled=section.enabled, transport=Transport(section.transport),
        ssh_target=section.ssh_target,
        prime_max_workers=section.prime.max_workers,
        prime_max_weight=section.prime.max_weight,
        night_max_workers=section.night.max_workers,
        night_max_weight=section.night.max_weight,
        allowed_job_types=None if section.job_types is None else frozenset(section.job_types),
        allowed_weights=None if section.weights is None else frozenset(section.weights),
        priority_floor=section.priority_floor, labels=frozenset(section.labels),
    )
