"""Settings that can never be satisfied, refused at the edge (exit 2, HTTP 422). Pure.

Placement explains a job that waits; a job that would wait forever is better refused when
it is submitted: bound (`--host`) to a host that does not exist or that refuses its type,
weight or priority, or whose weight books more RAM than any host can. So is a host whose
own settings contradict each other: reserved RAM at or above its RAM, a job-type
allow-list naming a type that does not exist (a typo), no window with workers, allowed
weights no open window admits or that can never fit its RAM.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from herder.core.errors import InputError
from herder.core.scheduling.capacity import WeightTable, bookable_gb
from herder.core.scheduling.placement import HostSpec


def check_job(job_type: str, weight: str, priority: int, affinity: str | None,
              hosts: Sequence[HostSpec], weights: WeightTable,
              bookable_fraction: float, pinned: Collection[str] | None = None) -> None:
    """Raise InputError (naming the field and the fix) for a job no registered host can
    ever take; nothing without hosts (`herder up` runs whatever is queued) or for an
    unknown weight (the config's check names it). `pinned`: the only hosts its type runs
    on (`[job_types.NAME] hosts`)."""
    if not hosts or not weights.known(weight):
        return
    if pinned is not None and affinity is None:
        registered = [spec for spec in hosts if spec.label in pinned]
        if not registered:
            raise InputError("job_type", f"job type {job_type} runs only on "
                             f"{', '.join(sorted(pinned))} (job_types.{job_type}.hosts), "
                             "and none of them is a registered host",
                             "register one (`herder host add LABEL`), or change "
                             f"job_types.{job_type}.hosts in herder.toml")
        hosts = registered
    budget = weights.budget(weight)
    if affinity is not None:
        host = next((spec for spec in hosts if spec.label == affinity), None)
        if host is None:
            raise InputError("affinity", f"--host {affinity}: no such host",
                             f"use one of: {', '.join(sorted(h.label for h in hosts))}")
        _check_bound(host, job_type, weight, priority, budget, weights, bookable_fraction)
        return
    largest = max(hosts, key=lambda spec: _bookable(spec, bookable_fraction))
    room = _bookable(largest, bookable_fraction)
    if budget > room:
        raise InputError("weight", f"{weight} books {budget:g} GB of RAM; the largest host, "
                         f"{largest.label}, can book {room:.1f} GB",
                         "use a lighter weight, or give a host more RAM (`herder host set`)")


def _check_bound(host: HostSpec, job_type: str, weight: str, priority: int, budget: float,
                 weights: WeightTable, bookable_fraction: float) -> None:
    label = host.label
    elsewhere = "or submit without --host"
    if host.allowed_job_types is not None and job_type not in host.allowed_job_types:
        raise InputError("affinity", f"host {label} refuses job type {job_type} (it takes "
                         f"{', '.join(sorted(host.allowed_job_types))})",
                         f"`herder host set {label} --job-types ...`, {elsewhere}")
    if host.allowed_weights is not None and weight not in host.allowed_weights:
        raise InputError("weight", f"host {label} refuses weight {weight} (it takes "
                         f"{', '.join(sorted(host.allowed_weights))})",
                         f"pass one of those with --weight, {elsewhere}")
    if host.priority_floor is not None and priority < host.priority_floor:
        raise InputError("priority", f"host {label} refuses priorities below "
                         f"{host.priority_floor}, and this job's is {priority}",
                         f"pass --priority {host.priority_floor} or more, {elsewhere}")
    room = _bookable(host, bookable_fraction)
    if budget > room:
        raise InputError("weight", f"{weight} books {budget:g} GB of RAM; host {label} "
                         f"can book {room:.1f} GB", f"use a lighter weight, {elsewhere}")
    windows = (("prime", host.prime), ("night", host.night))
    if not any(caps.max_workers > 0 and weights.allows(caps.max_weight, weight)
               for _, caps in windows):
        caps_text = ", ".join(
            f"{name}: {'closed' if caps.max_workers <= 0 else f'max {caps.max_weight}'}"
            for name, caps in windows)
        raise InputError("weight", f"host {label} takes no {weight} job in any window "
                         f"({caps_text})", f"use a lighter weight, {elsewhere}")


def check_host(host: HostSpec, job_types: Collection[str], weights: WeightTable,
               bookable_fraction: float) -> None:
    """Raise InputError naming the option for a host configured against itself.
    `job_types` are the names a job may have (the config's, and `adhoc`)."""
    if host.ram_total_gb <= 0:
        raise InputError("--ram", "must be more than 0 GB", "pass the host's total RAM")
    if host.ram_reserved_gb >= host.ram_total_gb:
        raise InputError("--reserved", f"{host.ram_reserved_gb:g} GB reserved of "
                         f"{host.ram_total_gb:g} GB leaves nothing to book",
                         "reserve less than --ram")
    unknown = sorted(set(host.allowed_job_types or ()) - set(job_types))
    if unknown:
        raise InputError("--job-types", f"no job type named {', '.join(unknown)}",
                         f"use names from herder.toml: {', '.join(sorted(job_types))}")
    windows = [(name, caps) for name, caps in (("prime", host.prime), ("night", host.night))
               if caps.max_workers > 0]
    if not windows:
        raise InputError("--prime-workers", "0 workers in prime time and at night: the host "
                         "would never take work", "give a window workers (to park a host, "
                         "drain it: `herder host drain`, or add it with --disabled)")
    allowed = sorted(host.allowed_weights or ())
    if allowed and not any(weights.allows(caps.max_weight, weight)
                           for _, caps in windows for weight in allowed):
        caps_text = ", ".join(f"{name} max {caps.max_weight}" for name, caps in windows)
        raise InputError("--weights", f"no open window admits {', '.join(allowed)} "
                         f"({caps_text})", "allow a lighter weight, or raise a window's "
                         "--prime-max-weight / --night-max-weight")
    room = _bookable(host, bookable_fraction)
    too_big = sorted(weight for weight in host.allowed_weights or ()
                     if weights.known(weight) and weights.budget(weight) > room)
    if too_big:
        raise InputError("--weights", f"{', '.join(too_big)} can never fit: host "
                         f"{host.label} can book {room:.1f} GB",
                         "allow lighter weights, or raise --ram / lower --reserved")


def _bookable(host: HostSpec, fraction: float) -> float:
    return bookable_gb(host.ram_total_gb, host.ram_reserved_gb, fraction)
