"""API token commands: token create (printed once), list, revoke."""

from __future__ import annotations

import json
from typing import Any

import click

from herder.cli.root import (
    State,
    columns,
    edge,
    fail,
    known_host,
    names,
    pass_state,
    utcnow,
)
from herder.core.errors import InputError
from herder.core.model import Scope, TokenRecord


@click.group()
@pass_state
def token(state: State) -> None:
    """API tokens: create (printed once), list, revoke. Against the database only."""
    if state.server is not None:
        fail("`herder token` works against the database only (--db / HERDER_DB), not "
             "--server / HERDER_SERVER: the first admin token can only come from there, and "
             "no API route hands out operator tokens")


@token.command("create")
@click.option("--scope", type=click.Choice([s.value for s in Scope]), required=True,
              help="admin: everything; submit: submit, cancel, slots (and read); read: look "
                   "only; agent: one host's agent (needs --host).")
@click.option("--name", help="Who holds it (shown by `token list`) [default: the scope].")
@click.option("--host", "label", help="The host an agent token is bound to.")
@click.option("--job-types", help="submit: only these job types (comma-separated).")
@click.option("--priority-floor", type=click.IntRange(-(2**31), 2**31 - 1),
              help="submit: refuse priorities below this (lower numbers run first).")
@click.option("--allow-adhoc", is_flag=True,
              help="submit: may also run ad-hoc commands (`herder submit -- CMD`), a shell "
                   "on every host (with --job-types: only if it lists adhoc).")
@pass_state
def token_create(state: State, scope: str, name: str | None, label: str | None,
                 job_types: str | None, priority_floor: int | None,
                 allow_adhoc: bool) -> None:
    """Create a token and print it once; only its hash is kept."""
    from herder.core.access import new_token, token_hash

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
        if allow_adhoc and chosen is not Scope.SUBMIT:
            raise InputError("--allow-adhoc", "is for submit tokens (admin tokens run "
                             "ad-hoc commands anyway; read and agent tokens submit nothing)",
                             "drop --allow-adhoc, or use --scope submit")
        limited = names(job_types)
        if job_types is not None and limited is None:
            raise InputError("--job-types", "names no job type", "e.g. --job-types dev-issue")
        store = state.store
        if label:
            known_host(store, label)
        secret = new_token()
        token_id = store.token_insert(name or (f"host:{label}" if label else chosen.value),
                                      chosen, token_hash(secret), utcnow(), host=label,
                                      job_types=limited, priority_floor=priority_floor,
                                      allow_adhoc=allow_adhoc)
    click.echo(f"token {token_id} ({chosen}) created; it is shown once, store it now", err=True)
    click.echo(secret)


@token.command("list")
@click.option("--all", "show_all", is_flag=True, help="Include revoked tokens.")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def token_list(state: State, show_all: bool, as_json: bool) -> None:
    """List tokens (never the tokens themselves)."""
    with edge():
        records = [r for r in state.store.token_list()
                   if show_all or r.revoked_at is None]
    if as_json:
        click.echo(json.dumps([token_view(r) for r in records], indent=2))
        return
    rows = []
    for record in records:
        limits = []
        if record.job_types is not None:
            limits.append("types " + ",".join(sorted(record.job_types)))
        if record.priority_floor is not None:
            limits.append(f"priority >= {record.priority_floor}")
        if record.allow_adhoc:
            limits.append("ad-hoc commands")
        revoked = "" if record.revoked_at is None else f"{record.revoked_at:%Y-%m-%d %H:%M}"
        rows.append((str(record.id), record.name, str(record.scope), record.host or "",
                     "; ".join(limits), f"{record.created_at:%Y-%m-%d %H:%M}", revoked))
    for line in columns(("ID", "NAME", "SCOPE", "HOST", "LIMITS", "CREATED", "REVOKED"), rows):
        click.echo(line)


def token_view(record: TokenRecord) -> dict[str, Any]:
    from herder.services.views import iso  # views load the wire models (pydantic): only when asked

    return {"id": record.id, "name": record.name, "scope": str(record.scope),
            "host": record.host,
            "job_types": None if record.job_types is None else sorted(record.job_types),
            "priority_floor": record.priority_floor, "allow_adhoc": record.allow_adhoc,
            "created_at": iso(record.created_at),
            "revoked_at": iso(record.revoked_at)}


@token.command("revoke")
@click.argument("token_id", type=click.IntRange(1, 2**63 - 1))
@pass_state
def token_revoke(state: State, token_id: int) -> None:
    """Revoke a token by its id (see `herder token list`); it stops working at once."""
    with edge():
        if not state.store.token_revoke(token_id, utcnow()):
            fail(f"no live token {token_id} (see `herder token list --all`)")
    click.echo(f"token {token_id} revoked")


