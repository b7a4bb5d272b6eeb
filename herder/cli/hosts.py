"""Host commands: hosts, host add/set/enable/drain/remove/token, ram, why."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from herder.cli.root import State, columns, edge, elapsed, names, pass_state
from herder.core.errors import NotFound
from herder.core.model import INT_MAX, INT_MIN, Transport

if TYPE_CHECKING:
    from herder.core.host_settings import HostSettings


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
    from herder.core.scheduling.health import HostLiveness, LivenessState

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
        click.option("--ram", "ram_total_gb", type=click.FloatRange(0, 1_000_000),
                     help="Total RAM in GB."),
        click.option("--reserved", "ram_reserved_gb", type=click.FloatRange(0, 1_000_000),
                     help="RAM kept for the OS and services, GB."),
        click.option("--cpus", type=click.IntRange(1, INT_MAX)),
        click.option("--transport", type=click.Choice(["agent", "local", "ssh"]),
                     help="agent or ssh; local is refused (only herder.toml declares one)."),
        click.option("--ssh-target", help="user@host for transport ssh."),
        click.option("--prime-workers", type=click.IntRange(0, INT_MAX)),
        click.option("--prime-max-weight"),
        click.option("--night-workers", type=click.IntRange(0, INT_MAX)),
        click.option("--night-max-weight"),
        click.option("--job-types", help="Allowed job types, comma-separated ('' = any)."),
        click.option("--weights", help="Allowed weights, comma-separated ('' = any)."),
        click.option("--priority-floor", type=click.IntRange(INT_MIN, INT_MAX),
                     help="Refuse jobs with a lower priority."),
        click.option("--label", "labels", multiple=True, help="A free-form label (repeatable)."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def settings_of(options: dict[str, Any]) -> HostSettings:
    """`host add/set`'s options as the settings the database or the server applies."""
    from herder.core.host_settings import HostSettings

    def names_given(key: str) -> frozenset[str] | None:
        value = options.get(key)
        return None if value is None else names(value) or frozenset()

    transport = options.get("transport")
    return HostSettings(
        ram_total_gb=options.get("ram_total_gb"), ram_reserved_gb=options.get("ram_reserved_gb"),
        cpus=options.get("cpus"), transport=Transport(transport) if transport else None,
        ssh_target=options.get("ssh_target"), prime_workers=options.get("prime_workers"),
        prime_max_weight=options.get("prime_max_weight"),
        night_workers=options.get("night_workers"),
        night_max_weight=options.get("night_max_weight"),
        job_types=names_given("job_types"), weights=names_given("weights"),
        priority_floor=options.get("priority_floor"),
        labels=frozenset(options["labels"]) if options.get("labels") else None)


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
    with edge():
        token = state.client.host_add(label, settings_of(options), enabled=not disabled)
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
        state.client.host_set(label, settings_of(options))
    click.echo(f"updated host {label}")


def _enabling_command(name: str, enabled: bool, help_text: str, said: str) -> click.Command:
    """`host enable` and `host drain`: one switch, each with its name, help and message."""

    @host.command(name, help=help_text)
    @click.argument("label")
    @pass_state
    def command(state: State, label: str) -> None:
        with edge():
            state.client.host_enable(label, enabled)
        click.echo(f"host {label}: {said}")

    return command


host_enable = _enabling_command("enable", True, "Let a host take new work.", "enabled")
host_drain = _enabling_command(
    "drain", False, "Take nothing new; running jobs finish. `disable` is another name for it.",
    "drained (running jobs finish; nothing new is placed)")
host.add_command(host_drain, name="disable")


@host.command("remove")
@click.argument("label")
@pass_state
def host_remove(state: State, label: str) -> None:
    """Forget a host (refused while jobs are claimed or running on it)."""
    with edge():
        state.client.host_remove(label)
    click.echo(f"removed host {label}")


@host.command("token")
@click.argument("label")
@pass_state
def host_token(state: State, label: str) -> None:
    """Issue a new agent token for a host (the old ones stop working)."""
    with edge():
        token = state.client.host_token(label)
    click.echo(token)


@click.command()
@click.argument("label")
@pass_state
def ram(state: State, label: str) -> None:
    """Bookable RAM headroom of a host in GB (negative when overbooked)."""
    with edge():
        view = next((view for view in state.reader.hosts() if view.label == label), None)
        if view is None:
            raise NotFound(f"no host {label!r} (see `herder hosts`)")
    click.echo(f"{view.free_gb:.1f}")


@click.command("why")
@click.argument("job_id", type=int)
@pass_state
def why_command(state: State, job_id: int) -> None:
    """One line: why a job is (not) running."""
    with edge():
        click.echo(state.reader.why(job_id))


