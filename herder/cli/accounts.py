"""Account commands: accounts, account add/remove (herder.core.scheduling.accounts)."""

from __future__ import annotations

import json
import re
import shlex

import click

from herder.cli.root import State, columns, edge, pass_state
from herder.core.errors import InputError


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
    header = ("HOST", "ACCOUNT", "STATE", "SESSIONS", "JOB TYPES", "SOURCE")
    rows = [(view["host"], view["name"], view["detail"],
             f"{view['sessions']}/{view['max_sessions']}",
             "any" if view["job_types"] is None else ",".join(view["job_types"]),
             view["source"]) for view in views]
    for line in columns(header, rows):
        click.echo(line)


@click.group()
def account() -> None:
    """Add or remove an account (herder.toml's [hosts.LABEL.accounts.NAME] are kept in
    step with the file at each start)."""


@account.command("add")
@click.argument("host")
@click.argument("name")
@click.option("--env", "env", multiple=True, metavar="NAME[=VALUE]",
              help="A variable the account gives a job (repeatable); its value is never "
              "shown. NAME alone takes the value from this environment, off the command "
              "line (for a key or token).")
@click.option("--max-sessions", type=int, default=1, show_default=True,
              help="Jobs at once under this account.")
@click.option("--job-type", "job_types", multiple=True,
              help="A job type it serves (repeatable; none: every type that asks).")
@click.option("--probe", help="The probe command, e.g. 'probe-claude ~/.claude-2'.")
@pass_state
def account_add(state: State, host: str, name: str, env: tuple[str, ...], max_sessions: int,
                job_types: tuple[str, ...], probe: str | None) -> None:
    """Add or update an account on HOST."""
    from herder.core.model import Account

    with edge():
        variables = {}
        for entry in env:
            key, sep, value = entry.partition("=")
            if not sep:
                value = environment_value(key)
            elif SECRET_NAME.search(key):
                click.echo(f"herder: warning: --env {key}=... puts a secret in the command "
                           "line, which every process on this machine can read; pass "
                           f"--env {key} to take it from this environment", err=True)
            variables[key] = value
        argv = None
        if probe is not None:
            try:
                argv = tuple(shlex.split(probe))
            except ValueError as exc:
                raise InputError("--probe", f"cannot split it: {exc}", "quote it") from None
        state.client.account_add(Account(host, name, variables, max_sessions,
                                         frozenset(job_types) or None, argv, "cli"))
    click.echo(f"account {name} on {host}: saved ({len(variables)} variable(s))")


SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
"""A variable whose name says it holds a secret."""


def environment_value(name: str) -> str:
    """`--env NAME`: the variable's value here; an InputError when it is not a set name."""
    import os

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise InputError("--env", f"{name!r} is not NAME or NAME=VALUE with a variable name",
                         "e.g. --env CLAUDE_CONFIG_DIR=/home/me/.claude-2")
    value = os.environ.get(name)
    if value is None:
        raise InputError("--env", f"{name} is not set in this environment",
                         f"export {name} first, or pass --env {name}=VALUE")
    return value


@account.command("remove")
@click.argument("host")
@click.argument("name")
@pass_state
def account_remove(state: State, host: str, name: str) -> None:
    """Forget an account (its running jobs keep running)."""
    with edge():
        state.client.account_remove(host, name)
    click.echo(f"account {name} on {host}: removed")


@account.command("clear")
@click.argument("host")
@click.argument("name")
@pass_state
def account_clear(state: State, host: str, name: str) -> None:
    """Mark an account usable again once a human re-logged it in or its quota came back
    early: clears `depleted` and `auth_revoked` (a dead token waits for the next probe)."""
    with edge():
        cleared = state.client.account_clear(host, name)
    click.echo(f"account {name} on {host}: " + ("cleared" if cleared else "already healthy"))
