"""Reservation commands: CI slots (claim, release) and subagent slots (reserve, complete)."""

from __future__ import annotations

import click

from herder.cli.root import State, edge, fleet_of, known_host, pass_state, utcnow
from herder.model import ReservationKind, ReservationStatus


@click.group()
def slots() -> None:
    """CI-runner RAM slots (idempotent per run id)."""


@slots.command("claim")
@click.argument("run_id")
@click.option("--host", "label", required=True)
@click.option("--weight", required=True)
@pass_state
def slots_claim(state: State, run_id: str, label: str, weight: str) -> None:
    """Book a CI run's RAM on a host; claiming again returns the same slot."""
    from herder.runtime.coordinator import claim_slot

    with edge():
        slot = claim_slot(state.client.store, state.config, fleet_of(state), run_id, label,
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


@click.command()
@click.argument("owner")
@click.option("--host", "label", required=True)
@click.option("--count", type=click.IntRange(1, 1000), required=True)
@click.option("--weight", default="subagent", show_default=True)
@pass_state
def reserve(state: State, owner: str, label: str, count: int, weight: str) -> None:
    """Reserve subagent slots for OWNER (e.g. a parent job); prints the ids that fit."""
    from herder.runtime.scheduler import expires

    with edge():
        store = state.client.store
        record = known_host(store, label)
        state.config.check_weight(weight)
        fleet = fleet_of(state)
        now = utcnow()
        created = store.reservation_create(
            ReservationKind.SUBAGENT, owner, label, weight, fleet.weights.budget(weight), count,
            expires(now, state.config.settings.fleet.reservation_ttl), fleet.bookable(record),
            now)
    for reservation in created:
        click.echo(reservation.id)
    if len(created) < count:
        click.echo(f"herder: only {len(created)} of {count} slot(s) fit on {label}", err=True)


@click.command()
@click.argument("reservation_id", type=int)
@click.option("--status", required=True,
              type=click.Choice(["done", "failed", "cancelled"]))
@pass_state
def complete(state: State, reservation_id: int, status: str) -> None:
    """Mark a subagent slot done, failed or cancelled."""
    from herder.runtime.coordinator import complete_reservation

    with edge():
        ended = complete_reservation(state.client.store, reservation_id,
                                     ReservationStatus(status), utcnow())
    click.echo(f"reservation {reservation_id}: {ended.status}")


