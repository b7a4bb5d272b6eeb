"""`herder host add` and `host set` on the stored record: `apply_settings` turns the
options (`herder.core.host_settings.HostSettings`) into the host, refusing alike on the
CLI's and the HTTP API's path, and `check_declared_hosts` refuses herder.toml's hosts the
same way when `herder server` starts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from msgspec.structs import replace

from herder.core.errors import InputError
from herder.core.host_settings import ANY_WEIGHT, HostSettings, declared_host, transport_refusal
from herder.core.model import HostRecord, Transport

if TYPE_CHECKING:
    from herder.core.settings.loading import Config


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


def _check_feasible(host: HostRecord, config: Config) -> None:
    from herder.core.fleet import Fleet
    from herder.core.model import ADHOC
    from herder.core.scheduling.feasibility import check_host
    from herder.core.scheduling.placement import HostSpec

    fleet = Fleet.from_settings(config.settings)
    check_host(HostSpec.configured(host), {*config.settings.job_types, ADHOC},
               fleet.weights, fleet.policy.bookable_fraction)


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
