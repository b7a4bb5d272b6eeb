"""API tokens: shown once, stored only as a SHA-256 hash, each with one scope.

`authorize` is the whole access policy as a pure function, so the scope matrix can be tested
without a server: admin > submit > read for operators, and agent tokens bound to one host,
never valid on an operator route (a job that steals its host's token can reach nothing else).
Pure, so the routes, the CLI, the Python API and the runtime all share it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import msgspec

from herder.core.env_policy import allowed
from herder.core.errors import Refused
from herder.core.model import ADHOC, JobSpec, Reservation, Scope, TokenRecord

if TYPE_CHECKING:
    from herder.core.settings.job_types import JobTypeSection

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


class Caller(msgspec.Struct, frozen=True):
    """Who made a request, as far as access goes."""

    name: str
    scope: Scope
    host: str | None = None
    job_types: frozenset[str] | None = None
    priority_floor: int | None = None
    id: int | None = None
    """The stored token's id; None for the legacy and the anonymous admin."""
    allow_adhoc: bool = False

    @classmethod
    def of(cls, record: TokenRecord) -> Caller:
        return cls(record.name, record.scope, record.host, record.job_types,
                   record.priority_floor, record.id, record.allow_adhoc)


ANONYMOUS_ADMIN = Caller("anonymous (--insecure-no-auth)", Scope.ADMIN)
LEGACY_ADMIN = Caller("HERDER_API_TOKEN (deprecated)", Scope.ADMIN)


def authorize(caller: Caller, required: Scope, host: str | None = None) -> None:
    """Raise Refused unless `caller` may use a route that needs `required` (for `host`)."""
    if required is Scope.AGENT:
        if caller.scope is not Scope.AGENT:
            raise Refused(403, "this route is for agents: use the host's agent token")
        if caller.host != host:
            raise Refused(403, f"this token is not valid for host {host!r}")
        return
    if caller.scope is Scope.AGENT:
        raise Refused(403, "an agent token cannot use operator routes")
    if OPERATOR_RANK[caller.scope] < OPERATOR_RANK[required]:
        raise Refused(403, f"this route needs a {required} token; this one is {caller.scope}")


def authorize_job_type(caller: Caller, job_type: str) -> None:
    """A submit token limited to some job types reaches only jobs of those types."""
    if caller.job_types is not None and job_type not in caller.job_types:
        allowed = ", ".join(sorted(caller.job_types)) or "none"
        raise Refused(403, f"this token may not act on job type {job_type!r} (allowed: {allowed})")


class SubmitterChoices(Protocol):
    """What a submitter set, read alike from a `SubmitRequest` and the API's `SubmitBody`
    (which the core cannot name: the HTTP contract sits above it)."""

    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def workdir(self) -> str | None: ...
    @property
    def affinity(self) -> str | None: ...
    @property
    def weight(self) -> str | None: ...
    @property
    def timeout_seconds(self) -> float | None: ...
    @property
    def max_attempts(self) -> int | None: ...


def authorize_submit(caller: Caller, request: SubmitterChoices, spec: JobSpec,
                     job_type: JobTypeSection | None, budgets: Mapping[str, float]) -> None:
    """What a submit token was given. Ad-hoc commands (a shell on every host) need admin or
    `--allow-adhoc`. A token restricted to job types sets what picks and orders the work
    (payload, dedup key, priority within its floor, delay, force) and nothing that changes
    what runs or where unless the job type lets a submitter: `submit_env`,
    `allow_workdir`, `allow_host`, `submit_max_weight` / `_timeout` / `_attempts`.
    `request` says what the submitter set, `spec` is it resolved, `budgets` the weights."""
    authorize_job_type(caller, spec.job_type)
    if caller.priority_floor is not None and spec.priority < caller.priority_floor:
        raise Refused(403, f"priority: this token may not submit priority {spec.priority}: "
                          f"its floor is {caller.priority_floor} (lower numbers run first)")
    if job_type is None or spec.job_type == ADHOC:
        if caller.scope is not Scope.ADMIN and not caller.allow_adhoc:
            raise Refused(403, "command: this token may not submit ad-hoc commands (one is a "
                              "shell on every host): submit a job type, or use a token "
                              "created with `herder token create --scope submit "
                              "--allow-adhoc`")
        return
    if caller.job_types is None:
        return
    where = f"[job_types.{spec.job_type}]"
    for name in request.env:
        if not allowed(name, job_type.submit_env):
            raise Refused(403, f"env.{name}: this token may not set {name} on job type "
                              f"{spec.job_type!r}: leave it out, or list it in {where} "
                              "submit_env")
    for field, given, allowed_by in (("workdir", request.workdir, "allow_workdir"),
                                     ("affinity", request.affinity, "allow_host")):
        if given is not None and not getattr(job_type, allowed_by):
            raise Refused(403, f"{field}: this token may not choose the {field} of job type "
                              f"{spec.job_type!r}: leave it out, or set {allowed_by} = true "
                              f"in {where}")
    weight_bound = job_type.submit_max_weight
    if request.weight is not None and (
            weight_bound is None
            or budgets.get(request.weight, 0.0) > budgets.get(weight_bound, 0.0)):
        raise Refused(403, _over("weight", request.weight, weight_bound,
                                "submit_max_weight", where))
    for field, value, bound, key in (
            ("timeout", request.timeout_seconds, job_type.submit_max_timeout,
             "submit_max_timeout"),
            ("max_attempts", request.max_attempts, job_type.submit_max_attempts,
             "submit_max_attempts")):
        if value is not None and (bound is None or value > bound):
            raise Refused(403, _over(field, value, bound, key, where))


def _over(field: str, value: object, bound: object, key: str, where: str) -> str:
    if bound is None:
        return (f"{field}: this token may not choose the {field} ({value}): leave it out, "
                f"or set {key} in {where}")
    return f"{field}: {value} is over this job type's {key} ({bound}): pass at most {bound}"


def authorize_reservation(caller: Caller, weight: str, budgets: Mapping[str, float],
                          max_weight: str | None) -> None:
    """A non-admin token reserves (or claims a slot) no heavier than the server's
    `max_reservation_weight`; an unknown weight is left to the 422 that names it."""
    if caller.scope is Scope.ADMIN or max_weight is None or weight not in budgets:
        return
    if budgets[weight] > budgets.get(max_weight, 0.0):
        raise Refused(403, f"weight: this token may reserve at most {max_weight!r}; "
                          f"{weight!r} books more RAM (server.max_reservation_weight)")


def authorize_owner(caller: Caller, reservation: Reservation) -> None:
    """A non-admin token completes or releases only what it made."""
    if caller.scope is Scope.ADMIN or reservation.created_by == caller.id:
        return
    what = "CI slot" if reservation.kind == "ci" else "reservation"
    raise Refused(403, f"this {what} ({reservation.owner!r}) was made by another token; only "
                      "that token or an admin may end it")


def held_by(caller: Caller, cap: int) -> tuple[int | None, int | None]:
    """(created_by, max_held) for what `caller` reserves: admins are not capped."""
    return caller.id, None if caller.scope is Scope.ADMIN else cap


def identify(record: TokenRecord | None) -> Caller:
    """The caller a stored token stands for; Refused(401) when unknown or revoked."""
    if record is None:
        raise Refused(401, "unknown token")
    if record.revoked_at is not None:
        raise Refused(401, "this token was revoked")
    return Caller.of(record)


def active_admins(records: Iterable[TokenRecord]) -> list[TokenRecord]:
    return [r for r in records if r.scope is Scope.ADMIN and r.revoked_at is None]
