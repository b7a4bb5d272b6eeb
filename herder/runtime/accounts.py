"""Accounts in the shell: declare them from herder.toml, bind a claimed attempt to the best
account of its host (or end it as `no_healthy_account`), learn health from outcomes, and
probe credentials on the host. The decisions are herder.scheduling.accounts'.

An account's env may hold secrets: it goes from the store into the job's environment and
nowhere else (never a log line, an event or an API answer; only account names are shown).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import msgspec
from msgspec.structs import replace

from herder.config import AccountSection, Settings
from herder.hardening import JOB_UMASK
from herder.model import Account, AccountRecord, Job, Outcome
from herder.runtime.executor import BASE_ENVIRONMENT, passes
from herder.scheduling.accounts import (
    AUTH_REVOKED_COOLDOWN_SECONDS,
    Choice,
    coerce_probe,
    pick,
)
from herder.scheduling.placement import Reason
from herder.store import Store

log = logging.getLogger("herder.accounts")

FLEET_STOPPED = "fleet:stopped"
"""The fleet-stopped alert's key (the scheduler raises it too, for hosts)."""
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
                       now: datetime) -> None:
    """What an ended attempt says of the account it ran under: the usage limit depletes it
    until `resume_at`, a revoked login stamps it, a success clears both."""
    bound = store.attempt_get_account(job.token)
    if bound is None:
        return
    host, name = bound
    if outcome is Outcome.USAGE_BLOCKED and resume_at is not None:
        store.account_mark_depleted(host, name, resume_at, now)
        log.warning("account %s on %s is depleted until %s", name, host, resume_at)
    elif outcome is Outcome.AUTH_REVOKED:
        store.account_mark_revoked(host, name, now)
        log.warning("account %s on %s: its login was revoked", name, host)
    elif outcome is Outcome.OK:
        store.account_clear(host, name, now)


# -- the probe ---------------------------------------------------------------------------------


class ProbeCommand(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]
    timeout: float
    interval: float


def run_probe(command: ProbeCommand, pass_env: Sequence[str] = ()) -> bool | None:
    """Run a probe in a session of its own with a job's environment allow-list; True when
    it positively says the token is dead, None when it says nothing usable (it failed,
    hung past its timeout and was killed, or printed anything but the three booleans)."""
    patterns = (*BASE_ENVIRONMENT, *pass_env)
    env = {name: value for name, value in os.environ.items() if passes(name, patterns)}
    try:
        process = subprocess.Popen(command.argv, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                   env=env, start_new_session=True, umask=JOB_UMASK)
    except OSError as exc:
        log.warning("account probe %s could not start: %s", command.argv[0], exc)
        return None
    try:
        stdout, _ = process.communicate(timeout=command.timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        log.warning("account probe %s gave no answer within %gs: ignored", command.argv[0],
                    command.timeout)
        return None
    if process.returncode != 0:
        return None
    found = coerce_probe(stdout[:PROBE_OUTPUT_LIMIT].decode(errors="replace"))
    return None if found is None else found.dead


class Prober:
    """The host's probe results per account, each refreshed when older than its interval
    (so a probe runs at most once per interval, whatever asks)."""

    def __init__(self, pass_env: Sequence[str] = (),
                 runner: Callable[[ProbeCommand, Sequence[str]], bool | None] = run_probe,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pass_env = tuple(pass_env)
        self.runner = runner
        self.clock = clock
        self._lock = threading.Lock()
        self.results: dict[str, tuple[bool | None, float]] = {}

    def refresh(self, probes: Mapping[str, ProbeCommand]) -> dict[str, bool | None]:
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
            return {name: dead for name, (dead, _) in self.results.items()}


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
                  now: datetime) -> None:
    """Store what the host's probes said (from its heartbeat: untrusted, so only booleans
    and null are taken, for accounts the host has)."""
    known = {r.account.name: r.health for r in store.account_list(host)}
    for name, dead in results.items():
        if name in known and (dead is None or isinstance(dead, bool)) and (
                known[name].dead_token != dead or known[name].probed_at is None):
            store.account_record_probe(host, name, dead, now)


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
                record_probes(store, host, fresh, clock())
            wait = min((c.interval for c in commands.values()), default=60.0)
        except Exception:
            log.exception("account probes failed; trying again")
            wait = 10.0
        stop.wait(min(wait, 60.0))
