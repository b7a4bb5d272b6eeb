"""`herder alerts`: the open alerts and the recent ones, with what was sent of each; against
the database or, with --server, through the API (the same output either way)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from herder.cli.root import State, edge, pass_state

if TYPE_CHECKING:
    from herder.store.records import Alert
    from herder.wire.alerts import AlertView

    AlertLike = Alert | AlertView
    """The store's Alert (against the database) or the API's AlertView (with --server)."""


def _stamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def alert_view(alert: AlertLike) -> dict[str, Any]:
    return {
        "id": alert.id, "key": alert.key, "message": alert.message,
        "open": alert.cleared_at is None, "opened_at": _stamp(alert.opened_at),
        "cleared_at": _stamp(alert.cleared_at), "sent_at": _stamp(alert.sent_at),
        "resolved_sent_at": _stamp(alert.resolved_sent_at), "sent_count": alert.sent_count,
    }


@click.command()
@click.option("--all", "show_all", is_flag=True, help="Cleared alerts too, newest first.")
@click.option("--limit", type=click.IntRange(1, 10000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list of alert objects.")
@pass_state
def alerts(state: State, show_all: bool, limit: int, as_json: bool) -> None:
    """List open alerts (with --all, recent cleared ones too) and what was sent of each."""
    with edge():
        found: list[AlertLike] = list(state.reader.alerts(not show_all, limit))
    views = [alert_view(alert) for alert in found]
    if as_json:
        click.echo(json.dumps(views, indent=2))
        return
    if not views:
        click.echo("no open alerts" if not show_all else "no alerts")
        return
    for view in views:
        state_text = "open" if view["open"] else f"cleared {_short(view['cleared_at'])}"
        sent = (f"sent {view['sent_count']}" if view["sent_count"] else
                "not sent")
        click.echo(f"{view['key']}  {state_text}  opened {_short(view['opened_at'])}  {sent}")
        click.echo(f"    {view['message']}")


def _short(stamp: str | None) -> str:
    return "-" if stamp is None else stamp[:19].replace("T", " ")
