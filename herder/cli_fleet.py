"""Fleet commands of the `herder` CLI: hosts, placement answers, server, agent, slots."""

from __future__ import annotations

import ipaddress
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

from herder.api.tokens import active_admins, new_token, token_hash
from herder.cli import State, edge, fail, main, pass_state
from herder.errors import InputError
from herder.model import (
    HostRecord,
    ReservationKind,
    ReservationStatus,
    Scope,
    TokenRecord,
    Transport,
)
from herder.runtime.coordinator import claim_slot, complete_reservation, host_view, why
from herder.runtime.scheduler import Fleet, expires
from herder.store import Store
from herder.views import iso


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
        if store.host_get(label) is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        store.token_revoke_host(label, utcnow())
        token = _agent_token(store, label)
    click.echo(token)


def _agent_token(store: Store, label: str) -> str:
    token = new_token()
    store.token_insert(f"host:{label}", Scope.AGENT, token_hash(token), utcnow(), host=label)
    return token


# -- API tokens ----------------------------------------------------------------------------------


@main.group()
def token() -> None:
    """API tokens: create (printed once), list, revoke."""


@token.command("create")
@click.option("--scope", type=click.Choice([s.value for s in Scope]), required=True,
              help="admin: everything; submit: submit, cancel, slots (and read); read: look "
                   "only; agent: one host's agent (needs --host).")
@click.option("--name", help="Who holds it (shown by `token list`) [default: the scope].")
@click.option("--host", "label", help="The host an agent token is bound to.")
@click.option("--job-types", help="submit: only these job types (comma-separated).")
@click.option("--priority-floor", type=click.IntRange(-(2**31), 2**31 - 1),
              help="submit: refuse priorities below this (lower numbers run first).")
@pass_state
def token_create(state: State, scope: str, name: str | None, label: str | None,
                 job_types: str | None, priority_floor: int | None) -> None:
    """Create a token and print it once; only its hash is kept."""
    chosen = Scope(scope)
    with edge():
        if chosen is Scope.AGENT and not label:
            raise InputError("--host", "an agent token is bound to one host",
                             "pass --host LABEL")
        if chosen is not Scope.AGENT and label:
            raise InputError("--host", f"a {chosen} token is not bound to a host",
                             "drop --host, or use --scope agent")
        if chosen is not Scope.SUBMIT and (job_types is not None or priority_floor is not None):
            raise InputError("--job-types", "limits apply to submit tokens only",
                             "drop --job-types/--priority-floor, or use --scope submit")
        limited = _names(job_types)
        if job_types is not None and limited is None:
            raise InputError("--job-types", "names no job type", "e.g. --job-types dev-issue")
        store = state.client.store
        if label and store.host_get(label) is None:
            fail(f"no host {label!r} (see `herder hosts`)")
        secret = new_token()
        token_id = store.token_insert(name or (f"host:{label}" if label else chosen.value),
                                      chosen, token_hash(secret), utcnow(), host=label,
                                      job_types=limited, priority_floor=priority_floor)
    click.echo(f"token {token_id} ({chosen}) created; it is shown once, store it now", err=True)
    click.echo(secret)


@token.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include revoked tokens.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def token_list(state: State, show_all: bool, as_json: bool) -> None:
    """List tokens (never the tokens themselves)."""
    with edge():
        records = [r for r in state.client.store.token_list()
                   if show_all or r.revoked_at is None]
    if as_json:
        click.echo(json.dumps([token_view(r) for r in records], indent=2))
        return
    table = Table(box=None, header_style="bold")
    for column in ("ID", "NAME", "SCOPE", "HOST", "LIMITS", "CREATED", "REVOKED"):
        table.add_column(column)
    for record in records:
        limits = []
        if record.job_types is not None:
            limits.append("types " + ",".join(sorted(record.job_types)))
        if record.priority_floor is not None:
            limits.append(f"priority >= {record.priority_floor}")
        revoked = "" if record.revoked_at is None else f"{record.revoked_at:%Y-%m-%d %H:%M}"
        table.add_row(str(record.id), record.name, str(record.scope), record.host or "",
                      "; ".join(limits), f"{record.created_at:%Y-%m-%d %H:%M}", revoked)
    Console().print(table)


def token_view(record: TokenRecord) -> dict[str, Any]:
    return {"id": record.id, "name": record.name, "scope": str(record.scope),
            "host": record.host,
            "job_types": None if record.job_types is None else sorted(record.job_types),
            "priority_floor": record.priority_floor, "created_at": iso(record.created_at),
            "revoked_at": iso(record.revoked_at)}


@token.command("revoke")
@click.argument("token_id", type=click.IntRange(1, 2**63 - 1))
@pass_state
def token_revoke(state: State, token_id: int) -> None:
    """Revoke a token by its id (see `herder token list`); it stops working at once."""
    with edge():
        if not state.client.store.token_revoke(token_id, utcnow()):
            fail(f"no live token {token_id} (see `herder token list --all`)")
    click.echo(f"token {token_id} revoked")


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


DEFAULT_TOKEN_FILE = "~/.config/herder/agent-token"


def token_options(function: Any) -> Any:
    """--token and --token-file, shared by the commands that talk to a server as a host."""
    options = [
        click.option("--token", envvar="HERDER_AGENT_TOKEN",
                     help="The host token; wins over --token-file [env HERDER_AGENT_TOKEN]."),
        click.option("--token-file", envvar="HERDER_TOKEN_FILE", default=DEFAULT_TOKEN_FILE,
                     show_default=True,
                     help="File holding the host token, mode 0600 [env HERDER_TOKEN_FILE]."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def agent_token(token: str | None, token_file: str) -> str:
    """--token / HERDER_AGENT_TOKEN, else the file (refused when others may read it)."""
    from herder.runtime.agent_client import read_token_file

    if token and token.strip():
        return token.strip()
    return read_token_file(os.path.expanduser(token_file))


def forget_token_variable() -> None:
    """Jobs start from this process's environment: the host token must not be in it."""
    os.environ.pop("HERDER_AGENT_TOKEN", None)


@main.command()
@click.option("--host", "label", required=True, help="The host's label.")
@click.option("--server", help="Report through this server instead of the database.")
@token_options
@click.option("--ca", type=click.Path(exists=True, dir_okay=False),
              help="CA bundle that signed the server's certificate.")
@pass_state
def heartbeat(state: State, label: str, server: str | None, token: str | None,
              token_file: str, ca: str | None) -> None:
    """One heartbeat for a host (cron on ssh push hosts: `* * * * * herder heartbeat ...`)."""
    if server:
        from herder.runtime.agent_client import ServerClient, Verdict, setup_problem

        with edge():
            client = ServerClient(server, agent_token(token, token_file), label,
                                  verify=ca or True)
            reply = client.request("POST", f"/api/v1/hosts/{label}/heartbeat")
            client.close()
            if reply.status is None:
                problem = setup_problem(reply.error, client.server, client.ca)
                if problem is not None:
                    raise problem
                fail(f"cannot reach {client.server}: {reply.problem}")
            if reply.verdict is Verdict.UNAUTHORIZED:
                fail(client.refusal(reply))
            if reply.verdict is not Verdict.OK:
                fail(f"the server answered {reply.problem}")
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


def loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind.strip("[]")).is_loopback
    except ValueError:
        return False


@main.command()
@click.option("--listen", help="HOST:PORT [default: server.listen, 127.0.0.1:8470].")
@click.option("--host", "label", help="This machine's label [default: hostname].")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False))
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False))
@click.option("--insecure-no-auth", is_flag=True,
              help="Loopback only: operator routes need no token (agents still need theirs).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
              default="info", show_default=True)
@pass_state
def server(state: State, listen: str | None, label: str | None, tls_cert: str | None,
           tls_key: str | None, insecure_no_auth: bool, log_level: str) -> None:
    """The fleet coordinator: store, scheduler (one leader among replicas), HTTP API."""
    import uvicorn

    from herder.api.app import Access, create_app
    from herder.runtime.coordinator import Coordinator

    _logging(log_level)
    log = logging.getLogger("herder.server")
    with edge():
        settings = state.config.settings.server
        address = listen or settings.listen
        bind, _, port_text = address.rpartition(":")
        if not bind or not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise InputError("--listen", f"{address!r} is not HOST:PORT", "e.g. 127.0.0.1:8470")
        cert = tls_cert or settings.tls_cert
        key = tls_key or settings.tls_key
        if bool(cert) != bool(key):
            raise InputError("--tls-cert", "TLS needs both a certificate and a key",
                             "pass --tls-cert and --tls-key together")
        legacy = os.environ.get(settings.api_token_env) or None
        if insecure_no_auth and not loopback(bind):
            raise InputError("--insecure-no-auth", f"{bind} is reachable from the network",
                             "listen on 127.0.0.1, or drop --insecure-no-auth and use tokens")
        admins = active_admins(state.client.store.token_list())
        if not admins and not legacy and not insecure_no_auth:
            if not loopback(bind):
                raise InputError(
                    "--listen", f"{bind} is reachable from the network and no admin token "
                    "exists", "create one first: herder token create --scope admin --name ops")
            log.warning("no admin token exists: operator routes answer 401 until one is "
                        "created (herder token create --scope admin)")
        if legacy:
            log.warning("%s is deprecated: it works as an admin token; create a scoped token "
                        "with `herder token create` and unset it", settings.api_token_env)
        if insecure_no_auth:
            log.warning("--insecure-no-auth: anyone who can reach %s has admin rights", address)
        coordinator = Coordinator(state.client.store, state.config, label)
        if not coordinator.public_url:
            scheme = "https" if cert else "http"
            coordinator.public_url = f"{scheme}://{bind}:{port_text}"
        app = create_app(coordinator, Access(open_access=insecure_no_auth,
                                             legacy_admin_token=legacy,
                                             max_body_bytes=settings.max_body_bytes))
    uvicorn.run(app, host=bind, port=int(port_text), log_level="warning",
                ssl_certfile=cert, ssl_keyfile=key, timeout_graceful_shutdown=5)
    if coordinator.fatal is not None:
        fail(f"{coordinator.fatal} (exiting so a supervisor restarts the server)", 1)


@main.group(invoke_without_command=True)
@click.option("--server", "server_url", envvar="HERDER_SERVER", help="https://server:8470")
@token_options
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
def agent(ctx: click.Context, server_url: str | None, token: str | None, token_file: str,
          label: str | None, concurrency: int, job_types: str | None, weights: str | None,
          priority_floor: int | None, no_ram_check: bool, drain_timeout: str, ca: str | None,
          log_dir: str | None, log_level: str) -> None:
    """Run this host's jobs for a `herder server` (outbound HTTP(S) only)."""
    if ctx.invoked_subcommand is not None:
        return
    from pathlib import Path

    from herder.cli import _duration
    from herder.runtime.agent import HttpSource, LocalGate
    from herder.runtime.agent_client import ServerClient, check_server_url
    from herder.runtime.runner import Runner, RunnerOptions

    _logging(log_level)
    state: State = ctx.obj
    with edge():
        if not label:
            raise InputError("--host", "is required", "pass the host label it was added with")
        if not server_url:
            raise InputError("--server", "is required", "pass --server https://host:8470")
        check_server_url(server_url)
        secret = agent_token(token, token_file)
        forget_token_variable()
        drain = _duration(drain_timeout, "--drain-timeout")
        runtime = state.config.settings.runtime
        if runtime.kill_grace >= runtime.attempt_lease:
            logging.getLogger("herder.agent").warning(
                "kill_grace (%.0fs) is not shorter than attempt_lease (%.0fs): after a crash "
                "the server may rerun a job before its old processes are gone",
                runtime.kill_grace, runtime.attempt_lease)
        client = ServerClient(server_url, secret, label, verify=ca or True)
        # A setup that cannot work (scheme, TLS, certificate) ends here, in one line; a
        # server that is not up yet is waited for.
        client.check()
        # Then, before any thread exists: the guardian that cleans up if this agent dies.
        from herder.runtime.agent import start_guardian

        guardian = start_guardian(label, runtime.kill_grace, server=server_url, token=secret,
                                  ca=ca)
        source = HttpSource(
            client, LocalGate(_names(job_types), _names(weights), priority_floor),
            concurrency, runtime.heartbeat_interval, state.config.settings.server.long_poll,
            check_ram=not no_ram_check, kill_grace=runtime.kill_grace,
        )
        source.guardian_fd = guardian
        options = RunnerOptions(
            host=label, log_dir=Path(log_dir) if log_dir else state.config.log_dir,
            concurrency=concurrency, heartbeat_interval=runtime.heartbeat_interval,
            attempt_lease=runtime.attempt_lease, kill_grace=runtime.kill_grace,
            poll_interval=runtime.poll_interval, max_lost=runtime.max_lost,
            pass_env=tuple(runtime.pass_env), fence_margin=runtime.fence_margin,
            drain_timeout=drain,
        )
        runner = Runner(None, options, source=source)
        source.in_flight = lambda: len(runner.running)
        sys.exit(runner.run())


@agent.command("install-systemd")
@click.option("--server", "server_url", required=True)
@click.option("--host", "label", required=True)
@click.option("--user", default=lambda: os.environ.get("USER", "herder"))
@click.option("--token-file", default="/etc/herder/agent-token", show_default=True,
              help="Where the unit's agent reads the host token (mode 0600, owned by --user).")
@click.option("--drain-seconds", type=int, default=600, show_default=True)
def install_systemd(server_url: str, label: str, user: str, token_file: str,
                    drain_seconds: int) -> None:
    """Print a systemd unit (Restart=always) for this host's agent."""
    from herder.runtime.agent import SYSTEMD_UNIT
    from herder.runtime.agent_client import check_server_url

    with edge():
        server_url = check_server_url(server_url)
        if not os.path.isabs(token_file):
            raise InputError("--token-file", f"{token_file!r} is not an absolute path",
                             "systemd needs one, e.g. /etc/herder/agent-token")
    herder_path = shutil.which("herder") or f"{sys.executable} -m herder.cli"
    click.echo(SYSTEMD_UNIT.format(label=label, user=user, workdir=os.getcwd(),
                                   token_file=token_file,
                                   token_dir=os.path.dirname(token_file) or "/",
                                   herder=herder_path, server=server_url,
                                   stop_seconds=drain_seconds + 30))



RUN_ATTEMPT_PATIENCE = 30.0
"""How long `run-attempt` waits for an unreachable server before it gives up (exit 2)."""


@main.command("run-attempt")
@click.option("--server", "server_url", required=True)
@click.option("--host", "label", required=True)
@click.option("--job", "job_id", type=int, required=True)
@click.option("--attempt", type=int, required=True)
@token_options
@click.option("--ca", type=click.Path(exists=True, dir_okay=False))
@click.option("--no-ram-check", is_flag=True)
@click.option("--log-dir", type=click.Path(file_okay=False))
@pass_state
def run_attempt(state: State, server_url: str, label: str, job_id: int, attempt: int,
                token: str | None, token_file: str, ca: str | None, no_ram_check: bool,
                log_dir: str | None) -> None:
    """Run one placed attempt on this host and report it (what ssh push runs remotely).

    Exit codes: 0 ran and reported; 1 bad arguments (token, URL, certificate) or no such
    attempt; 2 the server cannot be reached; 3 RAM contention.
    """
    from pathlib import Path

    from herder.model import AttemptToken, Outcome
    from herder.runtime.agent import LocalGate, SingleAttemptSource, fetch_attempt
    from herder.runtime.agent_client import ServerClient, ServerUnavailable
    from herder.runtime.runner import Runner, RunnerOptions

    _logging("info")
    runtime = state.config.settings.runtime
    try:
        client = ServerClient(server_url, agent_token(token, token_file), label,
                              verify=ca or True, retry_cap=max(runtime.heartbeat_interval, 0.2))
        forget_token_variable()
        client.check(patience=RUN_ATTEMPT_PATIENCE)
    except InputError as exc:
        fail(str(exc), code=1)
    except ServerUnavailable as exc:
        fail(str(exc), code=2)
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
        pass_env=tuple(runtime.pass_env), fence_margin=runtime.fence_margin,
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
