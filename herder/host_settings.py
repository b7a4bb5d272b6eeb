"""What `herder host add` and `host set` change on a host, as one value: the CLI parses its
options into it, the HTTP API's body is the same fields, and `apply_settings` (run where the
store and its config are) turns it into the stored record, so both paths refuse alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec
from msgspec.structs import replace

from herder.core.errors import InputError
from herder.core.model import HostRecord, Transport

if TYPE_CHECKING:
    from herder.core.settings.fleet import HostSection
    from herder.core.settings.loading import Config

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


def apply_settings(host: HostRecord, settings: HostSettings, config: Config) -> HostRecord:
    """The host with `settings` applied; InputError naming the CLI option when one cannot be."""
    refusal = transport_refusal(host, settings.transport)
    if refusal is not None:
        raise InputError("transport", *refusal)
    changes: dict[str, Any] = {}
    for key in ("ram_total_gb", "ram_reserved_gb", "cpus", "ssh_target", "priority_floor",
                "transport"):
        if getattr(settings, key) is not None:
            changes[key] = getattr(settings, key)
    for window in ("prime", "night"):
        workers = getattr(settings, f"{window}_workers")
        if workers is not None:
            changes[f"{window}_max_workers"] = workers
        weight = getattr(settings, f"{window}_max_weight")
        if weight is not None:
            if weight in ANY_WEIGHT:
                changes[f"{window}_max_weight"] = None
            else:
                config.check_weight(weight, f"--{window}-max-weight")
                changes[f"{window}_max_weight"] = weight
    if settings.job_types is not None:
        changes["allowed_job_types"] = settings.job_types or None
    if settings.weights is not None:
        for weight in sorted(settings.weights):
            config.check_weight(weight, "--weights")
        changes["allowed_weights"] = settings.weights or None
    if settings.labels:
        changes["labels"] = settings.labels
    updated = replace(host, **changes)
    if updated.transport is Transport.SSH and not updated.ssh_target:
        raise InputError("--ssh-target", "an ssh host needs a target", "pass --ssh-target u@h")
    # A host that could never take a job is refused here, on both paths, not found later
    # in `herder why`.
    _check_feasible(updated, config)
    return updated


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


def _check_feasible(host: HostRecord, config: Config) -> None:
    from herder.core.scheduling.feasibility import check_host
    from herder.core.scheduling.placement import HostSpec
    from herder.intake import ADHOC
    from herder.runtime.scheduler import Fleet

    fleet = Fleet.from_settings(config.settings)
    check_host(HostSpec.configured(host), {*config.settings.job_types, ADHOC},
               fleet.weights, fleet.policy.bookable_fraction)


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


# For each option `check_host` can name: its key under [hosts.LABEL], and the fix in the
# file's terms (None keeps the check's own, which names no option).
_DECLARED_KEYS: dict[str, tuple[list[str], str | None]] = {
    "--ram": (["ram_total_gb"], "set ram_total_gb to the host's RAM in GB"),
    "--reserved": (["ram_reserved_gb"], "reserve less than ram_total_gb"),
    "--job-types": (["job_types"], None),
    "--prime-workers": (["prime", "max_workers"],
                        "give prime or night max_workers; to keep the host idle, drain it "
                        "instead: `herder host drain`"),
    "--weights": (["weights"], "allow lighter weights, or raise a window's max_weight or "
                               "ram_total_gb"),
}


def check_declared_hosts(config: Config) -> None:
    """Refuse, naming the key, a host herder.toml declares against itself, as `herder host
    add` refuses one: checked when `herder server` starts, before it stores any (the check
    imports placement, too much for every command's config load)."""
    from herder.core.errors import ConfigError

    for label, section in config.settings.hosts.items():
        try:
            _check_feasible(declared_host(label, section), config)
        except InputError as error:
            keys, fix = _DECLARED_KEYS.get(error.field, ([], None))
            raise ConfigError(config.where(["hosts", label, *keys]), error.problem,
                              fix or error.fix) from None
