"""The `herder` command: the root group in `herder.cli.root`, one module per command group."""

from herder.cli.root import main

__all__ = ["main"]
