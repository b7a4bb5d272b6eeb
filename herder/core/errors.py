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


class Refused(HerderError):
    """A request refused with an HTTP status and a reason the caller may read: access (401
    when the caller is not known, 403 when it may not do this), a webhook delivery (its
    `reason` never holds the secret or the signature sent), a log chunk (410, 413, 416)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
