"""Fleet commands of the `herder` CLI: hosts, placement answers, server, agent, slots."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from herder.api.tokens import new_token, token_hash
from herder.cli import State, edge, fail, main, pass_state
from herder.errors import InputError
from herder.model import HostRecord, ReservationKind, ReservationStatus, Transport
from herder.runtime.coordinator import claim_slot, complete_reservation, host_view, why
from herder.runtime.scheduler import Fleet, expires


def utcnow() -> datetime:
    return datetime.now(UTC)


def _names(value: str | None) -> frozenset[str] | None:
    if value is None:
        return None
    names = frozenset(part.strip() for part in value.split(",") if part.strip())
    return names or None


def _fleet(state: State) -> Fleet:
    return Fleet.from_settings(state.config.settings)


# -- hosts -------------------------------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="A JSON list of host objects.")
@pass_state
def hosts(state: State, as_json: bool) -> None:
    """List hosts with health, window caps and RAM headroom."""
    with edge():
        store = state.client.store
        fleet = _fleet(state)
        now = utcnow()
        usage = store.host_usage(now)
        views = [host_view(fleet, h, usage.get(h.label), now) for h in store.host_list()]
    if as_json:
        click.echo(json.dumps(views, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("HOST", "STATE", "HEALTH", "TRANSPORT", "WINDOW", "WORKERS", "MAX WEIGHT",
                   "RAM FREE/BOOKABLE"):
        table.add_column(column)
    for view in views:
        condition = "drained" if not view["enabled"] else (
            f"agent {view['agent']}" if view["agent"] else "enabled")
        health = f"{view['health']}, not live" if view.get("agent_down") else view["health"]
        table.add_row(view["label"], condition,
                      health, view["transport"], view["window"],
                      f"{view['workers']}/{view['max_workers']}", view["max_weight"] or "any",
                      f"{view['free_gb']:.1f}/{view['bookable_gb']:.1f} GB")
    Console().print(table)


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
        changes["allowed_job_types"] = _names(options["job_types"])
    if options.get("weights") is not None:
        names = _names(options["weights"])
        for weight in names or ():
            state.config.check_weight(weight, "--weights")
        changes["allowed_weights"] = names
    if options.get("labels"):
        changes["labels"] = frozenset(options["labels"])
    updated = replace(host, **changes)
    if updated.transport is Transport.SSH and not updated.ssh_target:
        raise InputError("--ssh-target", "an ssh host needs a target", "pass --ssh-target u@h")
    return updated


@main.group()
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
        token = new_token()
        store.host_set_token(label, token_hash(token), now)
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
        record = store.host_get(label)
        if record is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        store.host_update(_apply(state, record, options), utcnow())
    click.echo(f"updated host {label}")


def _set_enabled(state: State, label: str, enabled: bool) -> None:
    with edge():
        store = state.client.store
        record = store.host_get(label)
        if record is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        store.host_update(replace(record, enabled=enabled), utcnow())


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
        if store.host_get(label) is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        if not store.host_remove(label):
            fail(f"host {label!r} still has claimed or running jobs; drain it first")
    click.echo(f"removed host {label}")


@host.command("token")
@click.argument("label")
@pass_state
def host_token(state: State, label: str) -> None:
    """Issue a new agent token for a host (the old one stops working)."""
    with edge():
        store = state.client.store
        token = new_token()
        if not store.host_set_token(label, token_hash(token), utcnow()):
            fail(f"no host {label!r} (see `herder hosts`)")
    click.echo(token)


@main.command()
@click.argument("label")
@pass_state
def ram(state: State, label: str) -> None:
    """Bookable RAM headroom of a host in GB (negative when overbooked)."""
    with edge():
        store = state.client.store
        record = store.host_get(label)
        if record is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        usage = store.host_usage(utcnow()).get(label)
        booked = usage.booked_gb if usage else 0.0
    click.echo(f"{_fleet(state).bookable(record) - booked:.1f}")


@main.command("why")
@click.argument("job_id", type=int)
@pass_state
def why_command(state: State, job_id: int) -> None:
    """One line: why a job is (not) running."""
    with edge():
        click.echo(why(state.client.store, _fleet(state), job_id, utcnow()))


@main.command()
@click.option("--host", "label", required=True, help="The host's label.")
@click.option("--server", help="Report through this server instead of the database.")
@click.option("--token", envvar="HERDER_AGENT_TOKEN", help="Host token [env HERDER_AGENT_TOKEN].")
@pass_state
def heartbeat(state: State, label: str, server: str | None, token: str | None) -> None:
    """One heartbeat for a host (cron on ssh push hosts: `* * * * * herder heartbeat ...`)."""
    if server:
        import httpx

        if not token:
            fail("--token (or HERDER_AGENT_TOKEN) is required with --server")
        try:
            response = httpx.post(f"{server.rstrip('/')}/api/v1/hosts/{label}/heartbeat",
                                  headers={"Authorization": f"Bearer {token}"}, timeout=10)
        except httpx.HTTPError as exc:
            fail(f"cannot reach {server}: {exc}")
        if response.status_code != 200:
            fail(f"server said {response.status_code}: {response.text[:200]}")
        click.echo(f"heartbeat sent for {label}")
        return
    with edge():
        if not state.client.store.host_heartbeat(label, utcnow(), {"via": "cli"}):
            fail(f"no host {label!r} (see `herder hosts`)")
    click.echo(f"heartbeat recorded for {label}")


# -- reservations ---------------------------------------------------------------------------------


@main.group()
def slots() -> None:
    """CI-runner RAM slots (idempotent per run id)."""


@slots.command("claim")
@click.argument("run_id")
@click.option("--host", "label", required=True)
@click.option("--weight", required=True)
@pass_state
def slots_claim(state: State, run_id: str, label: str, weight: str) -> None:
    """Book a CI run's RAM on a host; claiming again returns the same slot."""
    with edge():
        slot = claim_slot(state.client.store, state.config, _fleet(state), run_id, label,
                          weight, utcnow())
    click.echo(slot.id)


@slots.command("release")
@click.argument("run_id")
@pass_state
def slots_release(state: State, run_id: str) -> None:
    """Release a CI run's slot (idempotent: releasing twice is fine)."""
    with edge():
        released = state.client.store.reservation_release_ci(run_id, utcnow())
    click.echo("released" if released else "nothing to release")


@main.command()
@click.argument("owner")
@click.option("--host", "label", required=True)
@click.option("--count", type=click.IntRange(1, 1000), required=True)
@click.option("--weight", default="subagent", show_default=True)
@pass_state
def reserve(state: State, owner: str, label: str, count: int, weight: str) -> None:
    """Reserve subagent slots for OWNER (e.g. a parent job); prints the ids that fit."""
    with edge():
        store = state.client.store
        record = store.host_get(label)
        if record is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        state.config.check_weight(weight)
        fleet = _fleet(state)
        now = utcnow()
        created = store.reservation_create(
            ReservationKind.SUBAGENT, owner, label, weight, fleet.weights.budget(weight), count,
            expires(now, state.config.settings.fleet.reservation_ttl), fleet.bookable(record),
            now)
    for reservation in created:
        click.echo(reservation.id)
    if len(created) < count:
        click.echo(f"herder: only {len(created)} of {count} slot(s) fit on {label}", err=True)


@main.command()
@click.argument("reservation_id", type=int)
@click.option("--status", required=True,
              type=click.Choice(["done", "failed", "cancelled"]))
@pass_state
def complete(state: State, reservation_id: int, status: str) -> None:
    """Mark a subagent slot done, failed or cancelled."""
    with edge():
        ended = complete_reservation(state.client.store, reservation_id,
                                     ReservationStatus(status), utcnow())
    click.echo(f"reservation {reservation_id}: {ended.status}")


# -- server and agent -------------------------------------------------------------------------


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


@main.command()
@click.option("--listen", help="HOST:PORT [default: server.listen, 127.0.0.1:8470].")
@click.option("--host", "label", help="This machine's label [default: hostname].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@pass_state
def server(state: State, listen: str | None, label: str | None, tls_cert: str | None,
           tls_key: str | None, log_level: str) -> None:
    """The fleet coordinator: store, scheduler (one leader among replicas), HTTP API."""
    import uvicorn

    from herder.api.app import create_app
    from herder.runtime.coordinator import Coordinator

    _logging(log_level)
    with edge():
        settings = state.config.settings.server
        address = listen or settings.listen
        bind, _, port_text = address.rpartition(":")
        if not bind or not port_text.isdigit():
            raise InputError("--listen", f"{address!r} is not HOST:PORT", "e.g. 127.0.0.1:8470")
        cert = tls_cert or settings.tls_cert
        key = tls_key or settings.tls_key
        if bool(cert) != bool(key):
            raise InputError("--tls-cert", "TLS needs both a certificate and a key",
                             "pass --tls-cert and --tls-key together")
        coordinator = Coordinator(state.client.store, state.config, label)
        if not coordinator.public_url:
            scheme = "https" if cert else "http"
            coordinator.public_url = f"{scheme}://{bind}:{port_text}"
        app = create_app(coordinator)
    uvicorn.run(app, host=bind, port=int(port_text), log_level="warning",
                ssl_certfile=cert, ssl_keyfile=key, timeout_graceful_shutdown=5)


@main.group(invoke_without_command=True)
@click.option("--server", "server_url", envvar="HERDER_SERVER", help="https://server:8470")
@click.option("--token", envvar="HERDER_AGENT_TOKEN", help="Host token [env HERDER_AGENT_TOKEN].")
@click.option("--host", "label", help="This host's label (as registered).")
@click.option("--concurrency", type=click.IntRange(1, 1024), default=64, show_default=True,
              help="Upper bound; the host's window cap from the server applies too.")
@click.option("--job-types", help="Local allow-list of job types (fail-closed).")
@click.option("--weights", help="Local allow-list of weights (fail-closed).")
@click.option("--priority-floor", type=int, help="Refuse jobs more urgent than this.")
@click.option("--no-ram-check", is_flag=True, help="Skip the /proc/meminfo check.")
@click.option("--drain-timeout", default="10m", show_default=True,
              help="On SIGTERM, how long running jobs may finish before being handed back.")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle that signed the server's certificate.")
@click.option("--log-dir", type=click.Path(file_okay=False), help="Local attempt logs.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@click.pass_context
def agent(ctx: click.Context, server_url: str | None, token: str | None, label: str | None,
          concurrency: int, job_types: str | None, weights: str | None,
          priority_floor: int | None, no_ram_check: bool, drain_timeout: str, ca: str | None,
          log_dir: str | None, log_level: str) -> None:
    """Run this host's jobs for a `herder server` (outbound HTTP(S) only)."""
    if ctx.invoked_subcommand is not None:
        return
    from pathlib import Path

    from herder.cli import _duration
    from herder.runtime.agent import HttpSource, LocalGate, ServerClient
    from herder.runtime.runner import Runner, RunnerOptions

    _logging(log_level)
    state: State = ctx.obj
    with edge():
        if not label:
            raise InputError("--host", "is required", "pass the host label it was added with")
        runtime = state.config.settings.runtime
        if runtime.kill_grace >= runtime.attempt_lease:
            logging.getLogger("herder.agent").warning(
                "kill_grace (%.0fs) is not shorter than attempt_lease (%.0fs): after a crash "
                "the server may rerun a job before its old processes are gone",
                runtime.kill_grace, runtime.attempt_lease)
        # First, before any thread exists: the guardian that cleans up if this agent dies.
        from herder.runtime.agent import start_guardian

        start_guardian(label, runtime.kill_grace, server=server_url, token=token, ca=ca)
        if not server_url:
            raise InputError("--server", "is required", "pass --server https://host:8470")
        if not token:
            raise InputError("--token", "is required", "pass --token or set HERDER_AGENT_TOKEN")
        drain = _duration(drain_timeout, "--drain-timeout")
        client = ServerClient(server_url, token, label, verify=ca or True)
        source = HttpSource(
            client, LocalGate(_names(job_types), _names(weights), priority_floor),
            concurrency, runtime.heartbeat_interval, state.config.settings.server.long_poll,
            check_ram=not no_ram_check, kill_grace=runtime.kill_grace,
        )
        options = RunnerOptions(
            host=label, log_dir=Path(log_dir) if log_dir else state.config.log_dir,
            concurrency=concurrency, heartbeat_interval=runtime.heartbeat_interval,
            attempt_lease=runtime.attempt_lease, kill_grace=runtime.kill_grace,
            poll_interval=runtime.poll_interval, max_lost=runtime.max_lost,
            drain_timeout=drain,
        )
        runner = Runner(None, options, source=source)
        source.in_flight = lambda: len(runner.running)
        sys.exit(runner.run())


@agent.command("install-systemd")
@click.option("--server", "server_url", required=True)
@click.option("--host", "label", required=True)
@click.option("--user", default=lambda: os.environ.get("USER", "herder"))
@click.option("--env-file", default="/etc/herder/agent.env", show_default=True)
@click.option("--drain-seconds", type=int, default=600, show_default=True)
def install_systemd(server_url: str, label: str, user: str, env_file: str,
                    drain_seconds: int) -> None:
    """Print a systemd unit (Restart=always) for this host's agent."""
    from herder.runtime.agent import SYSTEMD_UNIT

    herder_path = shutil.which("herder") or f"{sys.executable} -m herder.cli"
    click.echo(SYSTEMD_UNIT.format(label=label, user=user, workdir=os.getcwd(),
                                   env_file=env_file, herder=herder_path, server=server_url,
                                   stop_seconds=drain_seconds + 30))



@main.command("run-attempt")
@click.option("--server", "server_url", required=True)
@click.option("--host", "label", required=True)
@click.option("--job", "job_id", type=int, required=True)
@click.option("--attempt", type=int, required=True)
@click.option("--token", envvar="HERDER_AGENT_TOKEN", help="[env HERDER_AGENT_TOKEN]")
@click.option("--token-file", envvar="HERDER_TOKEN_FILE",
              default=lambda: os.path.expanduser("~/.config/herder/agent-token"),
              help="Where this host keeps its token [env HERDER_TOKEN_FILE].")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-ram-check", is_flag=True)
@click.option("--log-dir", type=click.Path(file_okay=False))
@pass_state
def run_attempt(state: State, server_url: str, label: str, job_id: int, attempt: int,
                token: str | None, token_file: str, ca: str | None, no_ram_check: bool,
                log_dir: str | None) -> None:
    """Run one placed attempt on this host and report it (what ssh push runs remotely).

    Exit codes: 0 ran and reported, 1 bad arguments or no such attempt, 3 RAM contention.
    """
    from pathlib import Path

    from herder.model import AttemptToken, Outcome
    from herder.runtime.agent import LocalGate, ServerClient, SingleAttemptSource, fetch_attempt
    from herder.runtime.runner import Runner, RunnerOptions

    _logging("info")
    if not token:
        try:
            token = Path(token_file).read_text().strip()
        except OSError:
            fail(f"no token: set HERDER_AGENT_TOKEN or write it to {token_file}", code=1)
    runtime = state.config.settings.runtime
    client = ServerClient(server_url, token, label, verify=ca or True)
    job = fetch_attempt(client, AttemptToken(job_id, attempt))
    if job is None:
        fail(f"attempt {job_id}.{attempt} is not placed on {label}", code=1)
    source = SingleAttemptSource(client, LocalGate(), job, check_ram=not no_ram_check,
                                 heartbeat_interval=runtime.heartbeat_interval,
                                 kill_grace=runtime.kill_grace)
    options = RunnerOptions(
        host=label, log_dir=Path(log_dir) if log_dir else state.config.log_dir, concurrency=1,
        heartbeat_interval=runtime.heartbeat_interval, attempt_lease=runtime.attempt_lease,
        kill_grace=runtime.kill_grace, poll_interval=0.2, exit_when_idle=True,
        drain_timeout=None,
    )
    Runner(None, options, source=source).run()
    if source.handed_back is Outcome.RAM_CONTENTION:
        sys.exit(3)


@main.command()
@click.option("--keep", is_flag=True, help="Keep the demo's folder (database, logs).")
def demo(keep: bool) -> None:
    """See a fleet work: a server, three agents posing as hosts, a mixed workload."""
    from herder.demo import run_demo

    sys.exit(run_demo(click.echo, keep=keep))
