"""Account commands: accounts, account add/remove (herder.scheduling.accounts)."""

from __future__ import annotations

import json
import shlex

import click

from herder.cli.root import State, edge, fail, pass_state, utcnow
from herder.errors import InputError


@click.command()
@click.option("--host", help="Only this host's accounts.")
@click.option("--json", "as_json", is_flag=True, help="A JSON list of account objects.")
@pass_state
def accounts(state: State, host: str | None, as_json: bool) -> None:
    """List accounts: state, sessions and the job types each serves (never env values)."""
    with edge():
        views = [view.model_dump(mode="json") for view in state.reader.accounts(host)]
    if as_json:
        click.echo(json.dumps(views, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for column in ("HOST", "ACCOUNT", "STATE", "SESSIONS", "JOB TYPES", "SOURCE"):
        table.add_column(column)
    for view in views:
        types = view["job_types"]
        table.add_row(view["host"], view["name"], view["detail"],
                      f"{view['sessions']}/{view['max_sessions']}",
                      "any" if types is None else ",".join(types), view["source"])
    Console().print(table)


@click.group()
def account() -> None:
    """Add or remove an account (herder.toml's [hosts.LABEL.accounts.NAME] are kept in
    step with the file at each start)."""


@account.command("add")
@click.argument("host")
@click.argument("name")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE",
              help="A variable the account gives a job (repeatable); its value is never shown.")
@click.option("--max-sessions", type=int, default=1, show_default=True,
              help="Jobs at once under this account.")
@click.option("--job-type", "job_types", multiple=True,
              help="A job type it serves (repeatable; none: every type that asks).")
@click.option("--probe", help="The probe command, e.g. 'probe-claude ~/.claude-2'.")
@pass_state
def account_add(state: State, host: str, name: str, env: tuple[str, ...], max_sessions: int,
                job_types: tuple[str, ...], probe: str | None) -> None:
    """Add or update an account on HOST."""
    from herder.config import _ENV_NAME, _NAME
    from herder.model import Account

    with edge():
        if not _NAME.match(host):
            raise InputError("HOST", f"{host!r} is not a valid host label",
                             "use letters, digits, '.', '_' and '-'")
        if not _NAME.match(name):
            raise InputError("NAME", f"{name!r} is not a valid account name",
                             "use letters, digits, '.', '_' and '-'")
        variables = {}
        for entry in env:
            key, sep, value = entry.partition("=")
            if not sep or not _ENV_NAME.match(key):
                raise InputError("--env", f"{key!r} is not NAME=VALUE with a variable name",
                                 "e.g. --env CLAUDE_CONFIG_DIR=/home/me/.claude-2")
            variables[key] = value
        if not 1 <= max_sessions <= 10_000:
            raise InputError("--max-sessions", f"{max_sessions} is out of range",
                             "use 1 to 10000")
        argv = None
        if probe is not None:
            try:
                argv = tuple(shlex.split(probe))
            except ValueError as exc:
                raise InputError("--probe", f"cannot split it: {exc}", "quote it") from None
            if not argv:
                raise InputError("--probe", "is empty", "give a command, or leave it out")
        unknown = sorted(set(job_types) - set(state.config.settings.job_types))
        if unknown:
            raise InputError("--job-type", f"unknown job type {unknown[0]!r}",
                             f"use one of {sorted(state.config.settings.job_types)}")
        state.client.store.account_upsert(Account(
            host, name, variables, max_sessions, frozenset(job_types) or None, argv, "cli"),
            utcnow())
    click.echo(f"account {name} on {host}: saved ({len(variables)} variable(s))")


@account.command("remove")
@click.argument("host")
@click.argument("name")
@pass_state
def account_remove(state: State, host: str, name: str) -> None:
    """Forget an account (its running jobs keep running)."""
    with edge():
        removed = state.client.store.account_delete(host, name)
    if not removed:
        fail(f"no account {name!r} on {host!r} (see `herder accounts`)")
    click.echo(f"account {name} on {host}: removed")


@account.command("clear")
@click.argument("host")
@click.argument("name")
@pass_state
def account_clear(state: State, host: str, name: str) -> None:
    """Mark an account usable again once a human re-logged it in or its quota came back
    early: clears `depleted` and `auth_revoked` (a dead token waits for the next probe)."""
    with edge():
        store = state.client.store
        if not [r for r in store.account_list(host) if r.account.name == name]:
            fail(f"no account {name!r} on {host!r} (see `herder accounts`)")
        cleared = store.account_clear(host, name, utcnow())
    click.echo(f"account {name} on {host}: " + ("cleared" if cleared else "already healthy"))
