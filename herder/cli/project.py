"""Setting up a project: init (herder.toml), migrate (the database schema)."""

from __future__ import annotations

from pathlib import Path

import click

from herder.cli.root import State, edge, fail, pass_state


@click.command()
@click.option("--force", is_flag=True, help="Overwrite an existing herder.toml.")
@click.argument("directory", type=click.Path(file_okay=False), default=".")
def init(directory: str, force: bool) -> None:
    """Write a commented sample herder.toml."""
    from herder.core.settings.loading import CONFIG_FILE, sample_config

    target = Path(directory) / CONFIG_FILE
    if target.exists() and not force:
        fail(f"{target} already exists (pass --force to overwrite it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(sample_config())
    click.echo(f"wrote {target}")


@click.command()
@pass_state
def migrate(state: State) -> None:
    """Apply pending schema migrations (also done on every start)."""
    with edge():
        store = state.database.store
        click.echo(f"schema version {store.schema_version()} ({store.dialect})")
