"""Accounts: the credential identities a host runs jobs under, and which one a job gets.

An account gives a job its environment (a Claude Code config directory, an API key
variable) and has its own quota and login. Its health is known only from positive evidence
(a guess would take a working account out of the fleet): an attempt that hit the usage limit
(`depleted` until the reset), one whose login was revoked (`auth_revoked`, for a cooldown),
or a probe on the host that says the credentials cannot authenticate and cannot renew
(`dead_token`). Anything unknown, a probe that hung or printed garbage included, counts as
healthy: the gate fails open, so it can only route around a dead account, never stop a fleet
that works.

A probe may also say how much of the account's quota is used (`usage_percent`) and when it
resets (`resets_at`): accounts are ranked by that headroom, and one nearly spent (at least
99 %, or 95 % with its reset more than a day away: it would stop mid-job) is passed
over (`near_limit`). Usage that is missing, malformed or out of range is unknown.

When an attempt hits an account's limit or finds its login revoked, `rotation` says whether
another account can serve the job now (it runs again at once, nothing spent) or, when none
can, when the first turns usable by itself.

Pure: the clock is passed in; the store and the probe's process live in the shell
(herder.runtime.accounts).
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import msgspec
from msgspec.structs import replace

from herder.core.model import (
    Account,
    AccountHealth,
    AccountRecord,
    Decision,
    JobStatus,
    Outcome,
    Usage,
)
from herder.core.scheduling.placement import Reason
from herder.core.scheduling.policy import QUIET_REASONS
from herder.core.settings.sections import DEFAULTS, Settings

AUTH_REVOKED_COOLDOWN_SECONDS = DEFAULTS.fleet.auth_revoked_cooldown
PROBE_KEYS = ("credentials_present", "has_refresh_token", "access_expired")
"""The booleans a probe prints, as one JSON object (never a secret)."""
USAGE_KEYS = ("usage_percent", "resets_at")
"""What a probe may add about the account's quota; each may be left out."""
USAGE_LIMIT_PERCENT = 99.0
"""An account at or above this share of its quota is not chosen: a job would stop mid-way."""
USAGE_HIGH_PERCENT = 95.0
FAR_RESET = timedelta(days=1)
"""An account at or above USAGE_HIGH_PERCENT whose quota resets further away than this is
not chosen either: it would run dry long before its reset."""
EARLIEST_RESET = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_RESET = datetime(9000, 1, 1, tzinfo=UTC)
"""A reset outside these is a probe's garbage (unknown), and stays storable everywhere."""


class AccountState(enum.StrEnum):
    HEALTHY = "healthy"
    DEPLETED = "depleted"
    AUTH_REVOKED = "auth_revoked"
    DEAD_TOKEN = "dead_token"
    NEAR_LIMIT = "near_limit"
    """A probe says its quota is (nearly) spent: passed over, not an alert."""


UNHEALTHY_ALERTED = frozenset({AccountState.DEPLETED, AccountState.AUTH_REVOKED,
                               AccountState.DEAD_TOKEN})
"""The states that raise the account's alert (`account:<host>:<name>`)."""


class Probe(msgspec.Struct, frozen=True):
    """What a probe said: the credential booleans, and the quota where it reports it."""

    credentials_present: bool
    has_refresh_token: bool
    access_expired: bool
    usage: Usage = Usage()

    @property
    def dead(self) -> bool:
        """Cannot authenticate now and cannot renew: a dead token, only a human can fix it."""
        return not self.credentials_present or (
            self.access_expired and not self.has_refresh_token)


def coerce_probe(text: str) -> Probe | None:
    """A probe's stdout as a Probe when it is a JSON object of the three booleans (and at
    most the usage keys besides); None (unknown, so healthy) for anything else: a missing
    key must never read as false. Bad usage values only make the usage unknown."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not set(PROBE_KEYS) <= set(data) <= {
            *PROBE_KEYS, *USAGE_KEYS}:
        return None
    if not all(isinstance(data[key], bool) for key in PROBE_KEYS):
        return None
    return Probe(data["credentials_present"], data["has_refresh_token"], data["access_expired"],
                 coerce_usage(data.get("usage_percent"), data.get("resets_at")))


def coerce_usage(percent: object, resets_at: object) -> Usage:
    """Usage from untrusted values (a probe's output, an agent's heartbeat): a percentage
    from 0 to 100 and a reset as an ISO 8601 time with its offset or as epoch seconds;
    anything else is unknown (fail-open), each field on its own."""
    found = None
    if isinstance(percent, int | float) and not isinstance(percent, bool) and (
            0 <= percent <= 100 and math.isfinite(percent)):  # range first: a huge int
        found = float(percent)
    return Usage(found, _reset_time(resets_at))


def _reset_time(value: object) -> datetime | None:
    at: datetime | None = None
    try:
        if isinstance(value, str) and len(value) <= 64:
            at = datetime.fromisoformat(value)
        elif isinstance(value, int | float) and not isinstance(value, bool) and (
                math.isfinite(value)):
            at = datetime.fromtimestamp(value, UTC)
    except (ValueError, OverflowError, OSError):
        return None
    if at is None or at.utcoffset() is None or not EARLIEST_RESET <= at <= LATEST_RESET:
        return None
    return at.astimezone(UTC)


def current_percent(usage: Usage, now: datetime) -> float | None:
    """The share of the quota used, unless unknown or stale (its reset has passed)."""
    if usage.resets_at is not None and usage.resets_at <= now:
        return None
    return usage.percent


def usage_refusal(usage: Usage, now: datetime) -> tuple[str, datetime | None] | None:
    """Why a quota is too spent to choose the account (a subscription's usage check), and
    when that ends by itself (None: only a new probe can tell); None when it is fine or
    unknown. A reset that has passed makes the figure stale: unknown."""
    percent, resets_at = current_percent(usage, now), usage.resets_at
    if percent is None:
        return None
    resets = f", resets {_clock(resets_at)}" if resets_at is not None else ""
    if percent >= USAGE_LIMIT_PERCENT:
        return f"near_limit: usage {percent:g}%{resets}", resets_at
    if percent >= USAGE_HIGH_PERCENT and resets_at is not None and (
            resets_at - now > FAR_RESET):
        return (f"near_limit: usage {percent:g}% with its reset more than a day away{resets}",
                resets_at - FAR_RESET)
    return None


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
    refusal = usage_refusal(health.usage, now)
    if refusal is not None:
        return AccountState.NEAR_LIMIT, refusal[0]
    percent = current_percent(health.usage, now)
    if percent is not None:
        return AccountState.HEALTHY, f"healthy (usage {percent:g}%)"
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
    if state is AccountState.NEAR_LIMIT:
        refusal = usage_refusal(health.usage, now)
        return None if refusal is None else refusal[1]
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
    healthy before unknown, then the most quota left where a probe says, then the most free
    sessions, then by name); or no account, with each candidate's refusal. `healths` and
    `sessions` are keyed by account name."""
    ranked: list[tuple[int, float, int, str, Account]] = []
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
        used = current_percent(health.usage, now)
        ranked.append((0 if health.dead_token is False else 1,
                       100.0 if used is None else used, -free, account.name, account))
    if ranked:
        return Choice(min(ranked)[4])
    return Choice(None, tuple(refusals), min(resumes) if resumes else None, full)


ROTATING = frozenset({Outcome.USAGE_BLOCKED, Outcome.AUTH_REVOKED})
"""Outcomes that say the account is spent or locked out, not the job at fault."""


class Rotation(msgspec.Struct, frozen=True):
    """Whether another account can serve a job whose account just failed it: `serves`
    names one usable now (host, name), `same_host` says one is on the job's own host; else
    `resume_at` is when the first account turns usable by itself (None: never by itself)."""

    serves: tuple[str, str] | None = None
    same_host: bool = False
    resume_at: datetime | None = None


def rotation(records: Sequence[AccountRecord], marked: tuple[str, str], job_type: str,
             names: frozenset[str] | None, now: datetime,
             hosts: Collection[str] | None = None,
             cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS, serve: bool = True) -> Rotation:
    """The accounts anywhere (on `hosts`, those that may run the job; None: every host)
    that could run `job_type` now, the `marked` one (just depleted or revoked) never among
    them, whatever its stored health says: so a job cannot bounce on one account. Sessions
    do not count: a busy account frees one soon. With `serve` false none serves: only when
    the first blocked account turns usable (a job that already went again at once)."""
    serves: tuple[str, str] | None = None
    same_host = False
    resumes: list[datetime] = []
    for record in records:
        account = record.account
        key = (account.host, account.name)
        if not account.serves(job_type, names) or (
                hosts is not None and account.host not in hosts and key != marked):
            continue
        state, _ = state_of(record.health, now, cooldown)
        if serve and key != marked and state is AccountState.HEALTHY:
            if serves is None or (account.host == marked[0] and not same_host):
                serves = key
            same_host = same_host or account.host == marked[0]
            continue
        at = usable_at(record.health, now, cooldown)
        if at is not None:
            resumes.append(at)
    if serves is not None:
        return Rotation(serves, same_host)
    return Rotation(resume_at=min(resumes) if resumes else None)


def rotated(decision: Decision, outcome: Outcome, found: Rotation, marked: tuple[str, str],
            now: datetime, again: bool = False) -> Decision:
    """The decision for a job whose account hit its limit or lost its login: at once and
    with nothing spent when another account serves it (another host preferred only when
    none on its own does); when none can, a usage limit waits for the first account to
    turn usable (the earliest reset) and a revoked login keeps its rule (a human acts).
    `again`: its previous attempt went again at once already (`found` then serves none)."""
    if outcome not in ROTATING or decision.failure_reason in QUIET_REASONS:
        return decision  # a job that ended on its own quiet word is not run again
    if found.serves is not None:
        host, name = found.serves
        return Decision(JobStatus.QUEUED, available_at=now,
                        failure_reason=decision.failure_reason, avoid_host=not found.same_host,
                        note=f"account {marked[1]} on {marked[0]} is {_spent(outcome)}: "
                             f"runs again at once (account {name} on {host} can serve it)")
    if (outcome is Outcome.USAGE_BLOCKED and decision.status is JobStatus.QUEUED
            and found.resume_at is not None and found.resume_at > now
            and (decision.available_at is None or found.resume_at < decision.available_at)):
        when = _clock(found.resume_at)
        note = (f"its accounts failed it twice in a row: waits for the first blocked account "
                f"to turn usable ({when})" if again
                else f"every account is blocked: waits for the first to turn usable ({when})")
        return replace(decision, available_at=found.resume_at, note=note)
    return decision


def _spent(outcome: Outcome) -> str:
    return "depleted" if outcome is Outcome.USAGE_BLOCKED else "revoked"


def _clock(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ") if at.utcoffset() is not None and (
        at.utcoffset() == timedelta(0)) else at.isoformat(timespec="seconds")


def account_needs(settings: Settings) -> dict[str, frozenset[str] | None]:
    """Job type -> the account names it may use (None: any), for the types that need one."""
    return {name: None if job_type.accounts is True else frozenset(job_type.accounts)
            for name, job_type in settings.job_types.items()
            if job_type.accounts is True or (isinstance(job_type.accounts, list)
                                              and job_type.accounts)}


class AccountRules(msgspec.Struct, frozen=True):
    """Which job types run under an account, and how long a revoked login is skipped."""

    needs: Mapping[str, frozenset[str] | None]
    cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS

    @classmethod
    def from_settings(cls, settings: Settings) -> AccountRules:
        return cls(account_needs(settings), settings.fleet.auth_revoked_cooldown)

    def choose(self, records: Sequence[AccountRecord], host: str, job_type: str,
               now: datetime) -> Choice:
        mine = [r for r in records if r.account.host == host]
        return pick([r.account for r in mine], {r.account.name: r.health for r in mine},
                    {r.account.name: r.sessions for r in mine}, job_type,
                    self.needs.get(job_type), now, self.cooldown)

    def blocked(self, records: Sequence[AccountRecord], hosts: Sequence[str],
                now: datetime) -> dict[str, dict[str, tuple[Reason, str]]]:
        """Host -> the job types needing an account that it cannot run now, with why (for
        placement, which names the unhealthy ones in the fleet-stopped alert). A host whose
        healthy accounts are all busy is only full: a session ending frees one."""
        found: dict[str, dict[str, tuple[Reason, str]]] = {}
        for host in hosts:
            for job_type in self.needs:
                choice = self.choose(records, host, job_type, now)
                if choice.account is None:
                    found.setdefault(host, {})[job_type] = (
                        (Reason.SLOTS_FULL, f"every account for {job_type} in use")
                        if choice.full else
                        (Reason.NO_HEALTHY_ACCOUNT, f"no healthy account for {job_type}"
                         f"{_of(choice)}: {choice.describe()}"))
        return found


def _of(choice: Choice) -> str:
    """How many accounts were weighed, for the alert (none usable of that many)."""
    return f" (0 of {len(choice.refusals)})" if choice.refusals else ""
