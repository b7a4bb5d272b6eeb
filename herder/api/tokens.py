"""API tokens: shown once, stored only as a SHA-256 hash, each with one scope.

`authorize` is the whole access policy as a pure function, so the scope matrix can be tested
without a server: admin > submit > read for operators, and agent tokens bound to one host,
never valid on an operator route (a job that steals its host's token can reach nothing else).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable

import msgspec

from herder.model import Scope, TokenRecord

TOKEN_PREFIX = "hdr_"
OPERATOR_RANK = {Scope.READ: 1, Scope.SUBMIT: 2, Scope.ADMIN: 3}


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison, so a probe learns nothing from timing."""
    return hmac.compare_digest(given.encode(), expected.encode())


def plausible_token(text: str) -> bool:
    """Cheap shape check before any lookup: printable ASCII, no spaces, bounded length."""
    return 8 <= len(text) <= 256 and text.isascii() and text.isprintable() and " " not in text


class Denied(Exception):
    """Access refused: 401 when the caller is not known, 403 when it may not do this."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class Caller(msgspec.Struct, frozen=True):
    """Who made a request, as far as access goes."""

    name: str
    scope: Scope
    host: str | None = None
    job_types: frozenset[str] | None = None
    priority_floor: int | None = None

    @classmethod
    def of(cls, record: TokenRecord) -> Caller:
        return cls(record.name, record.scope, record.host, record.job_types,
                   record.priority_floor)


ANONYMOUS_ADMIN = Caller("anonymous (--insecure-no-auth)", Scope.ADMIN)
LEGACY_ADMIN = Caller("HERDER_API_TOKEN (deprecated)", Scope.ADMIN)


def authorize(caller: Caller, required: Scope, host: str | None = None) -> None:
    """Raise Denied unless `caller` may use a route that needs `required` (for `host`)."""
    if required is Scope.AGENT:
        if caller.scope is not Scope.AGENT:
            raise Denied(403, "this route is for agents: use the host's agent token")
        if caller.host != host:
            raise Denied(403, f"this token is not valid for host {host!r}")
        return
    if caller.scope is Scope.AGENT:
        raise Denied(403, "an agent token cannot use operator routes")
    if OPERATOR_RANK[caller.scope] < OPERATOR_RANK[required]:
        raise Denied(403, f"this route needs a {required} token; this one is {caller.scope}")


def authorize_job_type(caller: Caller, job_type: str) -> None:
    """A submit token limited to some job types reaches only jobs of those types."""
    if caller.job_types is not None and job_type not in caller.job_types:
        allowed = ", ".join(sorted(caller.job_types)) or "none"
        raise Denied(403, f"this token may not act on job type {job_type!r} (allowed: {allowed})")


def authorize_submit(caller: Caller, job_type: str, priority: int) -> None:
    authorize_job_type(caller, job_type)
    if caller.priority_floor is not None and priority < caller.priority_floor:
        raise Denied(403, f"this token may not submit priority {priority}: its floor is "
                          f"{caller.priority_floor} (lower numbers run first)")


def identify(record: TokenRecord | None) -> Caller:
    """The caller a stored token stands for; Denied(401) when unknown or revoked."""
    if record is None:
        raise Denied(401, "unknown token")
    if record.revoked_at is not None:
        raise Denied(401, "this token was revoked")
    return Caller.of(record)


def active_admins(records: Iterable[TokenRecord]) -> list[TokenRecord]:
    return [r for r in records if r.scope is Scope.ADMIN and r.revoked_at is None]
