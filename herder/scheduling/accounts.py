"""Accounts: the credential identities a host runs jobs under, and which one a job gets.

An account gives a job its environment (a Claude Code config directory, an API key
variable) and has its own quota and login. Its health is known only from positive evidence
(seed 004 #7667): an attempt that hit the usage limit (`depleted` until the reset), one whose
login was revoked (`auth_revoked`, for a cooldown), or a probe on the host that says the
credentials cannot authenticate and cannot renew (`dead_token`). Anything unknown, a probe
that hung or printed garbage included, counts as healthy: the gate fails open, so it can
only route around a dead account, never stop a fleet that works.

Pure: the clock is passed in; the store and the probe's process live in the shell
(herder.runtime.accounts).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from herder.config import FleetSection
from herder.model import Account, AccountHealth

AUTH_REVOKED_COOLDOWN_SECONDS = FleetSection().auth_revoked_cooldown
PROBE_KEYS = ("credentials_present", "has_refresh_token", "access_expired")
"""The booleans a probe prints, as one JSON object; nothing else (never a secret)."""


class AccountState(enum.StrEnum):
    HEALTHY = "healthy"
    DEPLETED = "depleted"
    AUTH_REVOKED = "auth_revoked"
    DEAD_TOKEN = "dead_token"


class Probe(msgspec.Struct, frozen=True):
    """What a probe said, booleans only."""

    credentials_present: bool
    has_refresh_token: bool
    access_expired: bool

    @property
    def dead(self) -> bool:
        """Cannot authenticate now and cannot renew (seed 004's dead token)."""
        return not self.credentials_present or (
            self.access_expired and not self.has_refresh_token)


def coerce_probe(text: str) -> Probe | None:
    """A probe's stdout as a Probe when it is exactly a JSON object of the three booleans;
    None (unknown, so healthy) for anything else: a missing key must never read as false."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or set(data) != set(PROBE_KEYS):
        return None
    if not all(isinstance(data[key], bool) for key in PROBE_KEYS):
        return None
    return Probe(data["credentials_present"], data["has_refresh_token"], data["access_expired"])


def state_of(health: AccountHealth, now: datetime,
             cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS) -> tuple[AccountState, str]:
    """The account's state now and a short why (for `herder accounts` and the alerts)."""
    if health.depleted_until is not None and health.depleted_until > now:
        return AccountState.DEPLETED, f"depleted until {_clock(health.depleted_until)}"
    if health.auth_revoked_at is not None and (
            now - health.auth_revoked_at).total_seconds() < cooldown:
        return AccountState.AUTH_REVOKED, f"auth_revoked since {_clock(health.auth_revoked_at)}"
    if health.dead_token:
        return AccountState.DEAD_TOKEN, "dead_token (the probe found no usable credentials)"
    return AccountState.HEALTHY, "healthy"


def usable_at(health: AccountHealth, now: datetime,
              cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS) -> datetime | None:
    """When an unhealthy account turns usable by itself; None when only a human or a new
    probe can tell (a dead token)."""
    state, _ = state_of(health, now, cooldown)
    if state is AccountState.DEPLETED:
        return health.depleted_until
    if state is AccountState.AUTH_REVOKED and health.auth_revoked_at is not None:
        return health.auth_revoked_at + timedelta(seconds=cooldown)
    return None


class Choice(msgspec.Struct, frozen=True):
    """The account a job runs under, or why none: each candidate's refusal, and when the
    first of them turns usable by itself (a quota's reset, the end of a cooldown)."""

    account: Account | None
    refusals: tuple[tuple[str, str], ...] = ()
    resume_at: datetime | None = None
    full: bool = False
    """Every healthy candidate is at its session cap: a session ending frees one."""

    def describe(self) -> str:
        return (", ".join(f"{name} ({why})" for name, why in self.refusals)
                or "no account serves it")


def pick(accounts: Sequence[Account], healths: Mapping[str, AccountHealth],
         sessions: Mapping[str, int], job_type: str, names: frozenset[str] | None,
         now: datetime, cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS) -> Choice:
    """The healthiest account with the most headroom of those serving `job_type` (probed
    healthy before unknown, then the most free sessions, then by name); or no account,
    with each candidate's refusal. `healths` and `sessions` are keyed by account name."""
    ranked: list[tuple[int, int, str, Account]] = []
    refusals: list[tuple[str, str]] = []
    resumes: list[datetime] = []
    full = False
    for account in accounts:
        if not account.serves(job_type, names):
            continue
        health = healths.get(account.name, AccountHealth())
        state, why = state_of(health, now, cooldown)
        if state is not AccountState.HEALTHY:
            refusals.append((account.name, why))
            at = usable_at(health, now, cooldown)
            if at is not None:
                resumes.append(at)
            continue
        free = account.max_sessions - sessions.get(account.name, 0)
        if free <= 0:
            full = True
            refusals.append((account.name, f"{account.max_sessions} of "
                                           f"{account.max_sessions} sessions in use"))
            continue
        ranked.append((0 if health.dead_token is False else 1, -free, account.name, account))
    if ranked:
        return Choice(min(ranked)[3])
    return Choice(None, tuple(refusals), min(resumes) if resumes else None, full)


def _clock(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at.utcoffset() is not None and (
        at.utcoffset() == timedelta(0)) else at.isoformat(timespec="seconds")
