"""`herder fleet cap`: the fleet-wide cap on running jobs (`[fleet] emergency_max_workers`),
shown, set, lifted or handed back to herder.toml at run time, against the database or with
--server through the API (admin token)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from herder.cli.root import State, edge, fail, pass_state
from herder.core.model import INT_MAX

if TYPE_CHECKING:
    from herder.wire.fleet import FleetCapView


@click.group()
def fleet() -> None:
    """Fleet-wide switches an operator flips at run time."""


@fleet.command("cap")
@click.argument("max_workers", required=False, type=click.IntRange(0, INT_MAX))
@click.option("--lift", is_flag=True, help="No cap: start as many jobs as the hosts take.")
@click.option("--reset", is_flag=True,
              help="Back to herder.toml's [fleet] emergency_max_workers.")
@click.option("--json", "as_json", is_flag=True, help="The cap as a JSON object.")
@pass_state
def cap(state: State, max_workers: int | None, lift: bool, reset: bool, as_json: bool) -> None:
    """Show the fleet-wide cap on running jobs, or set it (MAX_WORKERS, 0 or more), lift it
    or reset it, for every replica at once. New starts beyond it wait (`herder why` says
    so); jobs already running are not stopped."""
    if sum((max_workers is not None, lift, reset)) > 1:
        fail("give one of MAX_WORKERS, --lift and --reset")
    with edge():
        if max_workers is not None or lift:
            view = state.client.fleet_cap_set(max_workers)
        elif reset:
            view = state.client.fleet_cap_reset()
        else:
            view = state.reader.fleet_cap()
    if as_json:
        click.echo(json.dumps(view.model_dump(mode="json"), indent=2))
        return
    click.echo(describe(view))


def describe(view: FleetCapView) -> str:
    """One line: the cap, where it comes from, and what runs against it."""
    limit = "none" if view.max_workers is None else str(view.max_workers)
    if view.at_run_time:
        stamp = "" if view.updated_at is None else f" at {view.updated_at:%Y-%m-%d %H:%M:%S}"
        source = f"set at run time by {view.updated_by}{stamp}"
    else:
        source = "herder.toml [fleet] emergency_max_workers"
    return f"fleet cap: {limit} ({source}); {view.running} running"
