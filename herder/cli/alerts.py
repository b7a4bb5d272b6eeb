"""The alerts command: what the server raised for a human, open ones first."""

from __future__ import annotations

import json

import click

from herder.cli.root import State, columns, edge, pass_state


@click.command()
@click.option("--all", "include_cleared", is_flag=True, help="Cleared ones too, newest first.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of alert objects.")
@pass_state
def alerts(state: State, include_cleared: bool, limit: int, as_json: bool) -> None:
    """List open alerts (a failure that needs a human, no healthy host, ...)."""
    from herder.views import iso

    with edge():
        found = state.reader.alerts(not include_cleared, limit)
    if as_json:
        click.echo(json.dumps([{"id": a.id, "key": a.key, "message": a.message,
                                "opened_at": iso(a.opened_at), "cleared_at": iso(a.cleared_at)}
                               for a in found], indent=2))
        return
    rows = [(iso(a.opened_at) or "-", iso(a.cleared_at) or "open", a.key, a.message)
            for a in found]
    for line in columns(("OPENED", "CLEARED", "KEY", "MESSAGE"), rows):
        click.echo(line)
