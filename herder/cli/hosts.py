"""Host commands: hosts, host add/set/enable/drain/remove/token, ram, why."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click

from herder.cli.root import (
    State,
    columns,
    edge,
    elapsed,
    fail,
    fleet_of,
    known_host,
    names,
    pass_state,
    utcnow,
)
from herder.errors import InputError
from herder.model import HostRecord, Scope, Transport

if TYPE_CHECKING:
    from herder.store import Store


@click.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of host objects.")
@pass_state
def hosts(state: State, as_json: bool) -> None:
    """List hosts: drain state, liveness, last heartbeat, health, window caps, allow-lists
    and RAM headroom."""
    with edge():
        views = [view.model_dump(mode="json") for view in state.reader.hosts()]
    if as_json:
        click.echo(json.dumps(views, indent=2))
        return
    for line in columns(HOST_COLUMNS, [host_row(view) for view in views]):
        click.echo(line)
    for view in views:  # what keeps a job type off a host for now
        for job_type, why in {**view["preflight_failed"], **view["breakers"]}.items():
            click.echo(f"{view['label']} {job_type}: {why}")


HOST_COLUMNS = ("HOST", "STATE", "LIVENESS", "HEARTBEAT", "HEALTH", "TRANSPORT", "WINDOW",
                "WORKERS", "MAX WEIGHT", "JOB TYPES", "WEIGHTS", "FLOOR", "RAM FREE/BOOKABLE")


def host_row(view: dict[str, Any]) -> tuple[str, ...]:
    """One host's cells of `herder hosts` from its JSON view (a server's or our own)."""
    return (view["label"], _condition(view), _liveness(view),
            ago(view.get("heartbeat_age_seconds"), view["last_heartbeat"]), view["health"],
            view["transport"], view["window"], f"{view['workers']}/{view['max_workers']}",
            view["max_weight"] or "any", ",".join(view["allowed_job_types"] or ["any"]),
            ",".join(view["allowed_weights"] or ["any"]),
            "-" if view["priority_floor"] is None else str(view["priority_floor"]),
            f"{view['free_gb']:.1f}/{view['bookable_gb']:.1f} GB")


def _condition(view: dict[str, Any]) -> str:
    """The view's own word; worked out for a server older than it."""
    if view.get("condition"):
        return str(view["condition"])
    if not view["enabled"]:
        return "drained"
    return f"agent {view['agent']}" if view["agent"] else "enabled"


def _liveness(view: dict[str, Any]) -> str:
    from herder.scheduling.health import HostLiveness, LivenessState

    state = view.get("liveness")
    if state is None:  # a server older than the field
        return "down" if view.get("agent_down") else "-"
    try:
        liveness = HostLiveness(LivenessState(state), int(view.get("missed_heartbeats") or 0))
    except ValueError:  # a word of a newer server
        return str(state)
    return liveness.describe()


def ago(seconds: float | None, stamp: str | None = None) -> str:
    """A heartbeat's age as `herder hosts` shows it: 12s ago, 3m ago, 2h ago, never."""
    if seconds is None:
        return "never" if stamp is None else "-"
    return f"{elapsed(seconds)} ago"


def host_options(function: Any) -> Any:
    options = [
        click.option("--ram", "ram_total_gb", type=click.FloatRange(min=0),
                     help="Total RAM in GB."),
        click.option("--reserved", "ram_reserved_gb", type=click.FloatRange(min=0),
                     help="RAM kept for the OS and services, GB."),
        click.option("--cpus", type=click.IntRange(min=1)),
        click.option("--transport", type=click.Choice(["agent", "local", "ssh"])),
        click.option("--ssh-target", help="user@host for transport ssh."),
        click.option("--prime-workers", type=click.IntRange(min=0)),
        click.option("--prime-max-weight"),
        click.option("--night-workers", type=click.IntRange(min=0)),
        click.option("--night-max-weight"),
        click.option("--job-types", help="Allowed job types, comma-separated ('' = any)."),
        click.option("--weights", help="Allowed weights, comma-separated ('' = any)."),
        click.option("--priority-floor", type=int, help="Refuse jobs with a lower priority."),
        click.option("--label", "labels", multiple=True, help="A free-form label (repeatable)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _apply(state: State, host: HostRecord, options: dict[str, Any]) -> HostRecord:
    changes: dict[str, Any] = {}
    for key in ("ram_total_gb", "ram_reserved_gb", "cpus", "ssh_target", "priority_floor"):
        if options.get(key) is not None:
            changes[key] = options[key]
    if options.get("transport"):
        changes["transport"] = Transport(options["transport"])
    for window in ("prime", "night"):
        if options.get(f"{window}_workers") is not None:
            changes[f"{window}_max_workers"] = options[f"{window}_workers"]
        weight = options.get(f"{window}_max_weight")
        if weight is not None:
            if weight in ("", "any"):
                changes[f"{window}_max_weight"] = None
            else:
                state.config.check_weight(weight, f"--{window}-max-weight")
                changes[f"{window}_max_weight"] = weight
    if options.get("job_types") is not None:
        changes["allowed_job_types"] = names(options["job_types"])
    if options.get("weights") is not None:
        allowed = names(options["weights"])
        for weight in allowed or ():
            state.config.check_weight(weight, "--weights")
        changes["allowed_weights"] = allowed
    if options.get("labels"):
        changes["labels"] = frozenset(options["labels"])
    updated = replace(host, **changes)
    if updated.transport is Transport.SSH and not updated.ssh_target:
        raise InputError("--ssh-target", "an ssh host needs a target", "pass --ssh-target u@h")
    from herder.intake import ADHOC
    from herder.scheduling.feasibility import check_host
    from herder.scheduling.placement import HostSpec

    fleet = fleet_of(state)
    check_host(HostSpec.configured(updated), {*state.config.settings.job_types, ADHOC},
               fleet.weights, fleet.policy.bookable_fraction)
    return updated


@click.group()
def host() -> None:
    """Add, change, drain or remove a host."""


@host.command("add")
@click.argument("label")
@host_options
@click.option("--disabled", is_flag=True, help="Add it drained (enable it later).")
@pass_state
def host_add(state: State, /, label: str, disabled: bool, **options: Any) -> None:
    """Register a host; prints its agent token once (store it; only its hash is kept)."""
    from herder.config import _NAME

    with edge():
        if not _NAME.match(label):
            raise InputError("LABEL", f"{label!r} is not a valid host label",
                             "use letters, digits, '.', '_' and '-'")
        if options.get("ram_total_gb") is None:
            raise InputError("--ram", "is required", "pass the host's total RAM in GB")
        record = _apply(state, HostRecord(label=label, ram_total_gb=0.0,
                                          enabled=not disabled), options)
        store = state.client.store
        now = utcnow()
        if not store.host_insert(record, now):
            fail(f"host {label!r} exists already (use `herder host set`)")
        token = _agent_token(store, label)
    click.echo(f"added host {label}", err=True)
    click.echo(f"agent token (shown once): {token}", err=True)
    click.echo(token)


@host.command("set")
@click.argument("label")
@host_options
@pass_state
def host_set(state: State, /, label: str, **options: Any) -> None:
    """Change a host's configuration."""
    with edge():
        store = state.client.store
        record = known_host(store, label)
        store.host_update(_apply(state, record, options), utcnow())
    click.echo(f"updated host {label}")


def _set_enabled(state: State, label: str, enabled: bool) -> None:
    with edge():
        state.client.host_enable(label, enabled)


@host.command("enable")
@click.argument("label")
@pass_state
def host_enable(state: State, label: str) -> None:
    """Let a host take new work."""
    _set_enabled(state, label, True)
    click.echo(f"host {label}: enabled")


@host.command("drain")
@click.argument("label")
@pass_state
def host_drain(state: State, label: str) -> None:
    """Take nothing new; running jobs finish. `disable` is another name for it."""
    _set_enabled(state, label, False)
    click.echo(f"host {label}: drained (running jobs finish; nothing new is placed)")


host.add_command(host_drain, name="disable")


@host.command("remove")
@click.argument("label")
@pass_state
def host_remove(state: State, label: str) -> None:
    """Forget a host (refused while jobs are claimed or running on it)."""
    with edge():
        store = state.client.store
        known_host(store, label)
        if not store.host_remove(label):
            fail(f"host {label!r} still has claimed or running jobs; drain it first")
        # A host added again later under this label must not accept the old tokens.
        store.token_revoke_host(label, utcnow())
    click.echo(f"removed host {label}")


@host.command("token")
@click.argument("label")
@pass_state
def host_token(state: State, label: str) -> None:
    """Issue a new agent token for a host (the old ones stop working)."""
    with edge():
        store = state.client.store
        known_host(store, label)
        store.token_revoke_host(label, utcnow())
        token = _agent_token(store, label)
    click.echo(token)


def _agent_token(store: Store, label: str) -> str:
    from herder.api.tokens import new_token, token_hash

    token = new_token()
    store.token_insert(f"host:{label}", Scope.AGENT, token_hash(token), utcnow(), host=label)
    return token



@click.command()
@click.argument("label")
@pass_state
def ram(state: State, label: str) -> None:
    """Bookable RAM headroom of a host in GB (negative when overbooked)."""
    with edge():
        store = state.client.store
        record = known_host(store, label)
        usage = store.host_usage(utcnow()).get(label)
        booked = usage.booked_gb if usage else 0.0
    click.echo(f"{fleet_of(state).bookable(record) - booked:.1f}")


@click.command("why")
@click.argument("job_id", type=int)
@pass_state
def why_command(state: State, job_id: int) -> None:
    """One line: why a job is (not) running."""
    with edge():
        click.echo(state.reader.why(job_id))


