"""Accounts in the shell: declare them from herder.toml, bind a claimed attempt to the best
account of its host (or end it as `no_healthy_account`), learn health from outcomes (and
send a job whose account failed it to another account at once), keep each account's alert
in step with its health, and probe credentials on the host. The decisions are
herder.core.scheduling.accounts'.

An account's env may hold secrets: it goes from the store into the job's environment and
nowhere else (never a log line, an event or an API answer; only account names are shown).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import msgspec
from msgspec.structs import replace

from herder.core.model import Account, AccountRecord, AttemptResult, Job, Outcome, Usage
from herder.core.scheduling.accounts import (
    AUTH_REVOKED_COOLDOWN_SECONDS,
    ROTATING,
    UNHEALTHY_ALERTED,
    AccountRules,
    AccountState,
    Probe,
    coerce_probe,
    coerce_usage,
    rotated,
    rotation,
    state_of,
)
from herder.core.scheduling.placement import Reason
from herder.core.settings.fleet import AccountSection
from herder.core.settings.sections import Settings
from herder.runtime.hardening import JOB_UMASK
from herder.runtime.job_environment import BASE_ENVIRONMENT, passes
from herder.runtime.short_process import run_within
from herder.store import Store

log = logging.getLogger("herder.accounts")

FLEET_STOPPED = "fleet:stopped"
"""The fleet-stopped alert's key (the scheduler raises it too, for hosts)."""
ACCOUNT_ALERT = "account:"
"""An unhealthy account's alert key: `account:<host>:<name>`."""
PROBE_OUTPUT_LIMIT = 4096
"""A probe prints one small JSON object; more than this is garbage, read no further."""


def declared_accounts(settings: Settings) -> list[Account]:
    """The accounts herder.toml declares, on every host."""
    return [
        Account(label, name, dict(section.env), section.max_sessions,
                None if section.job_types is None else frozenset(section.job_types),
                None if section.probe is None else tuple(section.probe), "config")
        for label, host in settings.hosts.items()
        for name, section in host.accounts.items()]


def sync_accounts(store: Store, settings: Settings, now: datetime) -> None:
    """Make the store's config-declared accounts those of herder.toml (their health stays);
    accounts added with `herder account add` are the operator's and stay."""
    declared = declared_accounts(settings)
    names = {(account.host, account.name) for account in declared}
    for record in store.account_list():
        account = record.account
        if account.source == "config" and (account.host, account.name) not in names:
            store.account_delete(account.host, account.name)
    for account in declared:
        store.account_upsert(account, now)


def accounts_why(store: Store, rules: AccountRules, job_type: str, now: datetime) -> str | None:
    """The accounts that could serve `job_type` and each one's state (its headroom, why it
    is passed over), for `herder why` of a job waiting for one; None for types without."""
    if job_type not in rules.needs:
        return None
    names = rules.needs[job_type]
    shown = [f"{r.account.host}/{r.account.name} "
             f"{state_of(r.health, now, rules.cooldown)[1]}"
             for r in store.account_list() if r.account.serves(job_type, names)]
    return f"accounts: {', '.join(shown)}" if shown else "accounts: none serves it"


Finish = Callable[[Job, Outcome, datetime | None], object]
"""Records an attempt that did not launch (its outcome, when it may run again)."""


def bind_accounts(store: Store, rules: AccountRules, host: str, jobs: Sequence[Job],
                  now: datetime, finish: Finish) -> list[Job]:
    """The claimed jobs that may launch, each that needs an account bound to the best one
    of `host` and given its env; the others are ended (nothing spent) through `finish`:
    `no_healthy_account` until the first account turns usable, or `refused` (tried again
    soon) when every healthy account is at its session cap."""
    if not any(job.job_type in rules.needs for job in jobs):
        return list(jobs)
    ready = []
    for job in jobs:
        if job.job_type not in rules.needs:
            ready.append(job)
            continue
        records = store.account_list(host)
        choice = rules.choose(records, host, job.job_type, now)
        env = None
        if choice.account is not None:
            env = store.account_env(host, choice.account.name)
        if choice.account is not None and env is not None and store.attempt_bind_account(
                job.token, host, choice.account.name, choice.account.max_sessions, now):
            log.info("job %d attempt %d runs under account %s", job.id, job.attempt,
                     choice.account.name)
            store.alert_clear(FLEET_STOPPED, now)
            ready.append(replace(job, env={**job.env, **env}))
            continue
        if choice.account is not None or choice.full:
            finish(job, Outcome.REFUSED, None)
            continue
        log.warning("job %d: no healthy account on %s: %s", job.id, host, choice.describe())
        _alert_when_no_host_can(store, rules, job.job_type, now)
        finish(job, Outcome.NO_HEALTHY_ACCOUNT, choice.resume_at)
    return ready


def _alert_when_no_host_can(store: Store, rules: AccountRules, job_type: str,
                            now: datetime) -> None:
    """Raise the fleet-stopped alert, naming each host and its accounts, when no host has
    a healthy account for the type (`herder up` has no scheduler to say so)."""
    records = store.account_list()
    hosts = sorted({r.account.host for r in records})
    blocked = rules.blocked(records, hosts, now)
    if all(blocked.get(host, {}).get(job_type, (None,))[0] is Reason.NO_HEALTHY_ACCOUNT
           for host in hosts):
        text = "; ".join(f"{host}: {blocked[host][job_type][1]}" for host in hosts) or (
            f"no host has an account for {job_type}")
        if store.alert_open(FLEET_STOPPED, f"work is queued and no host can run any of it: "
                            f"{text}", now):
            log.error("ALERT: work is queued and no host can run any of it: %s", text)


def learn_from_outcome(store: Store, job: Job, outcome: Outcome, resume_at: datetime | None,
                       now: datetime, cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS,
                       ) -> tuple[str, str] | None:
    """What an ended attempt says of the account it ran under: the usage limit depletes it
    until `resume_at`, a revoked login stamps it (each raising the account's alert), a
    success clears both (and the alert, once it is healthy). The account it marked, if any."""
    bound = store.attempt_get_account(job.token)
    if bound is None:
        return None
    host, name = bound
    marked = None
    if outcome is Outcome.USAGE_BLOCKED and resume_at is not None:
        if store.account_mark_depleted(host, name, resume_at, now):
            marked = bound
        log.warning("account %s on %s is depleted until %s", name, host, resume_at)
    elif outcome is Outcome.AUTH_REVOKED:
        if store.account_mark_revoked(host, name, now):
            marked = bound
        log.warning("account %s on %s: its login was revoked", name, host)
    elif outcome is Outcome.OK:
        store.account_clear(host, name, now)
    if marked is not None or outcome is Outcome.OK:
        sync_account_alerts(store, now, cooldown, host, name)
    return marked


def rotate(store: Store, rules: AccountRules, job: Job, result: AttemptResult,
           marked: tuple[str, str], hosts: frozenset[str] | None,
           now: datetime) -> AttemptResult:
    """`result` for a job whose account (`marked`) just hit its limit or lost its login:
    run again at once, nothing spent, when another account (of `hosts`, those that may run
    it; None: any) can serve it; else wait for the earliest reset (herder.core.scheduling
    .accounts.rotated)."""
    if result.outcome not in ROTATING:
        return result
    again = went_again_at_once(store, job)
    found = rotation(store.account_list(), marked, job.job_type,
                     rules.needs.get(job.job_type), now, hosts, rules.cooldown,
                     serve=not again)
    decision = rotated(result.decision, result.outcome, found, marked, now, again)
    if decision is result.decision:
        return result
    if found.serves is not None:
        log.warning("job %d: account %s on %s failed it (%s); it runs again at once under "
                    "account %s on %s", job.id, marked[1], marked[0], result.outcome,
                    found.serves[1], found.serves[0])
    report = json.loads(result.report) if result.report else {}
    report = {**(report if isinstance(report, dict) else {}), "note": decision.note}
    return replace(result, decision=decision, report=json.dumps(report, sort_keys=True))


def went_again_at_once(store: Store, job: Job) -> bool:
    """Whether the job's previous attempt (one that ran: a refusal is skipped) also ended on
    its account's limit or login: then it does not go again at once a second time in a
    row, so a job whose output lies (a prompt-injected agent printing a usage limit) spends
    at most two accounts a run instead of every one."""
    earlier = sorted((attempt for attempt in store.attempt_list(job.id)
                      if attempt.attempt < job.attempt and attempt.outcome is not None
                      and attempt.outcome is not Outcome.REFUSED),
                     key=lambda attempt: attempt.attempt)
    return bool(earlier) and earlier[-1].outcome in ROTATING


def sync_account_alerts(store: Store, now: datetime,
                        cooldown: float = AUTH_REVOKED_COOLDOWN_SECONDS,
                        host: str | None = None, name: str | None = None) -> dict[str, int]:
    """Keep `account:<host>:<name>` open while the account is depleted, revoked or has a dead
    token, and clear it once it is healthy again (its reset passed, a success, `herder
    account clear`, a new probe) or removed; only `host`'s `name` when given. Counts."""
    counts = {"opened": 0, "cleared": 0}
    unhealthy = {}
    for record in store.account_list(host):
        account = record.account
        if name is not None and account.name != name:
            continue
        state, why = state_of(record.health, now, cooldown)
        if state in UNHEALTHY_ALERTED:
            key = f"{ACCOUNT_ALERT}{account.host}:{account.name}"
            unhealthy[key] = _account_message(account, state, why)
    for key, message in unhealthy.items():
        if store.alert_open(key, message, now):
            counts["opened"] += 1
            log.error("ALERT: %s", message)
    prefix = ACCOUNT_ALERT if host is None else f"{ACCOUNT_ALERT}{host}:"
    for alert in store.alert_list(open_only=True, limit=100_000):
        if not alert.key.startswith(prefix) or alert.key in unhealthy:
            continue
        if name is not None and alert.key != f"{prefix}{name}":
            continue
        if store.alert_clear(alert.key, now):
            counts["cleared"] += 1
            log.warning("alert cleared: %s is usable again", alert.key)
    return counts


def _account_message(account: Account, state: AccountState, why: str) -> str:
    act = (" (its quota resets by itself)" if state is AccountState.DEPLETED else
           f": a human must log it in again, then `herder account clear {account.host} "
           f"{account.name}`")
    return (f"account {account.name} on {account.host} is {why}{act}; jobs run under the "
            "other accounts meanwhile")


# -- the probe ---------------------------------------------------------------------------------


class ProbeCommand(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]
    timeout: float
    interval: float


def run_probe(command: ProbeCommand, pass_env: Sequence[str] = ()) -> Probe | None:
    """Run a probe in a session of its own with a job's environment allow-list: what it
    said (`.dead` when it positively says the token is dead, `.usage` its quota), or None
    when it says nothing usable (it failed, hung past its timeout and was killed, or
    printed anything but the three booleans and the usage keys)."""
    patterns = (*BASE_ENVIRONMENT, *pass_env)
    env = {name: value for name, value in os.environ.items() if passes(name, patterns)}
    try:
        ended = run_within(command.argv, command.timeout, env, JOB_UMASK, stderr=False)
    except OSError as exc:
        log.warning("account probe %s could not start: %s", command.argv[0], exc)
        return None
    if ended is None:
        log.warning("account probe %s gave no answer within %gs: ignored", command.argv[0],
                    command.timeout)
        return None
    if ended.returncode != 0:
        return None
    return coerce_probe(ended.stdout[:PROBE_OUTPUT_LIMIT].decode(errors="replace"))


class Prober:
    """The host's probe results per account, each refreshed when older than its interval
    (so a probe runs at most once per interval, whatever asks)."""

    def __init__(self, pass_env: Sequence[str] = (),
                 runner: Callable[[ProbeCommand, Sequence[str]], Probe | None] = run_probe,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pass_env = tuple(pass_env)
        self.runner = runner
        self.clock = clock
        self._lock = threading.Lock()
        self.results: dict[str, tuple[Probe | None, float]] = {}

    def refresh(self, probes: Mapping[str, ProbeCommand]) -> dict[str, Probe | None]:
        """Run the probes that are due; the accounts whose verdict was just taken."""
        with self._lock:
            for name in [n for n in self.results if n not in probes]:
                del self.results[name]
            now = self.clock()
            due = {name: probe for name, probe in probes.items()
                   if name not in self.results or now - self.results[name][1] >= probe.interval}
        fresh = {}
        for name, probe in sorted(due.items()):
            fresh[name] = self.runner(probe, self.pass_env)
            with self._lock:
                self.results[name] = (fresh[name], self.clock())
        return fresh

    def view(self) -> dict[str, bool | None]:
        """Account -> dead_token (None: unknown), for the host's heartbeat."""
        with self._lock:
            return dead_tokens({name: probe for name, (probe, _) in self.results.items()})

    def usage_view(self) -> dict[str, dict[str, object]]:
        """Account -> its quota (heartbeat `account_usage`), where its probe said."""
        with self._lock:
            return usage_report({name: probe for name, (probe, _) in self.results.items()})


def dead_tokens(results: Mapping[str, Probe | None]) -> dict[str, bool | None]:
    return {name: None if probe is None else probe.dead for name, probe in results.items()}


def usage_report(results: Mapping[str, Probe | None]) -> dict[str, dict[str, object]]:
    """The usage the probes reported, as the heartbeat carries it (JSON values)."""
    return {name: {"usage_percent": probe.usage.percent,
                   "resets_at": None if probe.usage.resets_at is None
                   else probe.usage.resets_at.isoformat()}
            for name, probe in results.items()
            if probe is not None and probe.usage != Usage()}


def probe_commands(records: Sequence[AccountRecord], settings: Settings,
                   ) -> dict[str, ProbeCommand]:
    """The probes of one host's accounts; timeouts and intervals from herder.toml where the
    account is declared there, else its defaults."""
    commands = {}
    for record in records:
        account = record.account
        if account.probe is None:
            continue
        host = settings.hosts.get(account.host)
        section = (host.accounts.get(account.name) if host is not None else None) or (
            AccountSection())
        commands[account.name] = ProbeCommand(account.probe, section.probe_timeout,
                                              section.probe_interval)
    return commands


def record_probes(store: Store, host: str, results: Mapping[str, object],
                  now: datetime, usage: Mapping[str, object] | None = None) -> None:
    """Store what the host's probes said (from its heartbeat: untrusted, so only booleans
    and null are taken, for accounts the host has; usage values that are not a percentage
    and a time are unknown)."""
    known = {r.account.name: r.health for r in store.account_list(host)}
    usage = usage if isinstance(usage, Mapping) else {}
    for name, dead in results.items():
        if name not in known or not (dead is None or isinstance(dead, bool)):
            continue
        given = usage.get(name)
        said = coerce_usage(given.get("usage_percent"), given.get("resets_at")) if (
            isinstance(given, Mapping)) else Usage()
        health = known[name]
        if health.dead_token != dead or health.usage != said or health.probed_at is None:
            store.account_record_probe(host, name, dead, now, said)


def probe_loop(store: Store, settings: Settings, host: str, stop: threading.Event,
               clock: Callable[[], datetime], prober: Prober | None = None) -> None:
    """`herder up`'s probes: run the host's due probes and store their verdicts, until
    `stop`; a store error skips a round."""
    prober = prober or Prober(settings.runtime.pass_env)
    while not stop.is_set():
        try:
            commands = probe_commands(store.account_list(host), settings)
            fresh = prober.refresh(commands)
            if fresh:
                record_probes(store, host, dead_tokens(fresh), clock(), usage_report(fresh))
            wait = min((c.interval for c in commands.values()), default=60.0)
        except Exception:
            log.exception("account probes failed; trying again")
            wait = 10.0
        stop.wait(min(wait, 60.0))
