"""Reservation commands: CI slots (claim, release) and subagent slots (reserve, complete),
against the database or, with --server, through the API (a CI runner holds a submit token)."""

from __future__ import annotations

import click

from herder.cli.root import State, edge, pass_state
from herder.core.model import ReservationStatus


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
    with edge():
        slot_id = state.client.claim_slot(run_id, label, weight)
    click.echo(slot_id)


@slots.command("release")
@click.argument("run_id")
@pass_state
def slots_release(state: State, run_id: str) -> None:
    """Release a CI run's slot (idempotent: releasing twice is fine)."""
    with edge():
        released = state.client.release_slot(run_id)
    click.echo("released" if released else "nothing to release")


@click.command()
@click.argument("owner")
@click.option("--host", "label", required=True)
@click.option("--count", type=click.IntRange(1, 1000), required=True)
@click.option("--weight", default="subagent", show_default=True)
@click.option("--job", "job_id", type=click.IntRange(1, 2**63 - 1), envvar="HERDER_JOB_ID",
              help="The running job that books them (default: $HERDER_JOB_ID, set inside a "
              "job): its weight caps them ([fleet] max_subagents_for_weight).")
@pass_state
def reserve(state: State, owner: str, label: str, count: int, weight: str,
            job_id: int | None) -> None:
    """Reserve subagent slots for OWNER (e.g. a parent job); prints the ids that fit."""
    with edge():
        created = state.client.reserve(owner, label, weight, count, job=job_id)
    for reservation_id in created:
        click.echo(reservation_id)
    if len(created) < count:
        click.echo(f"herder: only {len(created)} of {count} slot(s) fit on {label}", err=True)


@click.command()
@click.argument("reservation_id", type=click.IntRange(1, 2**63 - 1))
@click.option("--status", required=True,
              type=click.Choice(["done", "failed", "cancelled"]))
@pass_state
def complete(state: State, reservation_id: int, status: str) -> None:
    """Mark a subagent slot done, failed or cancelled."""
    with edge():
        ended = state.client.complete_reservation(reservation_id, ReservationStatus(status))
    click.echo(f"reservation {reservation_id}: {ended}")
