"""Errors that cross the edge; the CLI maps InputError and StoreUnavailable to exit 2."""

from __future__ import annotations


class HerderError(Exception):
    """Base of every error herder raises on purpose."""


class InputError(HerderError):
    """Bad input at the edge: the message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        message = f"{field}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class ConfigError(InputError):
    """An invalid herder.toml; the field is `file:line: key`."""


class StoreUnavailable(HerderError):
    """The database cannot be reached or opened."""


class NotFound(HerderError):
    """No such job."""


class Conflict(HerderError):
    """A request the current state refuses (HTTP 409): a report about an attempt that is no
    longer live (fenced out, ended, moved on), a host label taken, a host with running jobs."""
