"""Where a runner gets attempts from and where it reports them.

The runner loop (process trees, timeouts, cancels, heartbeats) is the same everywhere; only
the source differs: `herder up` claims straight from the store, a `local` host under
`herder server` takes what the scheduler placed on it, and `herder agent` talks HTTP.
"""

from __future__ import annotations

import abc
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import msgspec
from msgspec.structs import replace

from herder.core.errors import ConfigError
from herder.core.model import (
    INT_MAX,
    Action,
    AttemptResult,
    AttemptToken,
    Budget,
    HeartbeatReply,
    Job,
    JobStatus,
    MemoryUse,
    Outcome,
)
from herder.core.scheduling.alerting import HEAVY_OUTCOMES, in_memory_loop
from herder.core.scheduling.capacity import WeightTable
from herder.core.scheduling.classification import (
    DEFAULT_PATTERNS,
    SEED_EXIT_CODES,
    Pattern,
    verdict,
)
from herder.core.scheduling.policy import (
    DEFAULT_RULES,
    MAX_TRANSIENT_ATTEMPTS,
    RetryState,
    Rule,
    decide,
    quiet_ending,
)
from herder.core.settings.job_types import RuleSection
from herder.core.settings.sections import AlertsSection, Settings
from herder.runtime.accounts import (
    AccountRules,
    bind_accounts,
    learn_from_outcome,
    rotate,
    sync_account_alerts,
)
from herder.runtime.guardian import GuardianLink
from herder.runtime.maintenance import Rescuer
from herder.store import Store, Waker

if TYPE_CHECKING:
    from herder.runtime.preflight import Refresher

log = logging.getLogger("herder.sources")


class OutcomeRules(msgspec.Struct, frozen=True):
    """What turns an attempt's end into an outcome beyond its exit status: each job type's
    exit-code map, and the weight chain an escalation climbs."""

    exit_codes: Mapping[str, Mapping[int, Outcome]] = msgspec.field(default_factory=dict)
    weights: WeightTable | None = None
    policies: Mapping[str, Mapping[Outcome, Rule]] = msgspec.field(default_factory=dict)
    """Job type -> its outcome table, where herder.toml overrides a rule."""
    patterns: Mapping[str, tuple[Pattern, ...]] = msgspec.field(default_factory=dict)
    """Job type -> its log patterns, where herder.toml adds or replaces some."""
    accounts: AccountRules = msgspec.field(default_factory=lambda: AccountRules({}))
    """Which job types run under an account (herder.runtime.accounts)."""
    log_on_success: frozenset[str] = frozenset()
    """Job types whose log is read after exit 0 too (`log_on_success`)."""
    max_transient: Mapping[str, int] = msgspec.field(default_factory=dict)
    """Job type -> its transient budget, where it differs from `default_max_transient`."""
    default_max_transient: int = MAX_TRANSIENT_ATTEMPTS
    """[defaults] max_transient_attempts."""
    pinned: Mapping[str, frozenset[str]] = msgspec.field(default_factory=dict)
    """Job type -> the only hosts that run it (`[job_types.X] hosts`)."""

    def transient_budget(self, job_type: str) -> int:
        return self.max_transient.get(job_type, self.default_max_transient)

    @classmethod
    def from_settings(cls, settings: Settings) -> OutcomeRules:
        """Raises ConfigError naming the key of a rule that could not work."""
        exit_codes = {
            name: SEED_EXIT_CODES if job_type.exit_codes is None
            else {int(code): Outcome(outcome) for code, outcome in job_type.exit_codes.items()}
            for name, job_type in settings.job_types.items()}
        chain = tuple(w for w in settings.fleet.escalation if w in settings.weights)
        policies = {name: policy_of(name, job_type.policy)
                    for name, job_type in settings.job_types.items() if job_type.policy}
        patterns = {
            name: (*(Pattern.of(p.outcome, p.regex) for p in job_type.patterns),
                   *(() if job_type.replace_patterns else DEFAULT_PATTERNS))
            for name, job_type in settings.job_types.items()
            if job_type.patterns or job_type.replace_patterns}
        budget = settings.defaults.max_transient_attempts
        max_transient = {name: job_type.max_transient_attempts
                         for name, job_type in settings.job_types.items()
                         if job_type.max_transient_attempts not in (None, budget)}
        return cls(exit_codes, WeightTable(dict(settings.weights), chain), policies, patterns,
                   AccountRules.from_settings(settings),
                   log_on_success=frozenset(
                       name for name, job_type in settings.job_types.items()
                       if job_type.log_on_success),
                   max_transient=max_transient, default_max_transient=budget,
                   pinned={name: frozenset(job_type.hosts)
                           for name, job_type in settings.job_types.items()
                           if job_type.hosts is not None})


def policy_of(job_type: str, overrides: Mapping[str, RuleSection]) -> Mapping[Outcome, Rule]:
    """The default table with a job type's rules laid over it."""
    table = dict(DEFAULT_RULES)
    for name, section in overrides.items():
        outcome = Outcome(name)
        given = {key: value for key, value in msgspec.structs.asdict(section).items()
                 if value is not None}
        if "action" in given:
            given["action"] = Action(given["action"])
        if "spends" in given:
            given["spends"] = Budget(given["spends"])
        rule = replace(table[outcome], **given)
        problems = rule.problems()
        if problems:
            raise ConfigError(f"job_types.{job_type}.policy.{name}", "; ".join(problems),
                              "see the outcome table in docs/outcomes.md")
        table[outcome] = rule
    return table


class PolicyLimits(msgspec.Struct, frozen=True):
    max_lost: int
    max_spawn_failures: int
    spawn_backoff_seconds: float
    rules: OutcomeRules = msgspec.field(default_factory=OutcomeRules)
    alerts: AlertsSection = msgspec.field(default_factory=AlertsSection)
    """The OOM-loop alert's count and window."""

    @classmethod
    def from_settings(cls, settings: Settings) -> PolicyLimits:
        return cls(settings.runtime.max_lost, settings.fleet.max_spawn_failures,
                   settings.fleet.spawn_backoff, OutcomeRules.from_settings(settings),
                   settings.alerts)


class Ending(msgspec.Struct, frozen=True):
    """What an ended attempt left to judge it by: its log's tail and its $HERDER_RESULT."""

    log_tail: str = ""
    result: str | None = None
    memory: MemoryUse | None = None
    """Its process tree's peak RSS against its budget."""
    launch_error: str | None = None
    """Why it could not start, in the OS's words ("spawn failed: [Errno 2] No such file or
    directory: 'claud'"): recorded on its `finished` event for `herder show` and `why`."""


def decide_for(
    job: Job, outcome: Outcome, now: datetime, limits: PolicyLimits,
    retry_after: float | None = None, ending: Ending | None = None,
    exit_code: int | None = None, resume_at: datetime | None = None,
) -> AttemptResult:
    """The outcome of one ended attempt of `job`, all its signals weighed (given its
    `ending`), and the policy's decision, as the store applies them; `resume_at` is when a
    wait ends unless the ending says."""
    report: dict[str, object] = {}
    reason = claimed = None
    ended = outcome  # as the runner saw it, before the signals are weighed
    if ending is not None and ending.launch_error:
        report["launch_error"] = ending.launch_error  # nothing ran: nothing to classify
    elif ending is not None:
        found = verdict(outcome, exit_code, ending.log_tail, now, ending.result,
                        limits.rules.exit_codes.get(job.job_type, {}),
                        limits.rules.patterns.get(job.job_type, DEFAULT_PATTERNS),
                        job.job_type in limits.rules.log_on_success)
        outcome, reason = found.outcome, found.failure_reason
        claimed = found.result.outcome if found.result is not None else None
        resume_at = found.resume_at or resume_at
        if found.retry_after is not None:
            retry_after = max(retry_after or 0.0, found.retry_after)
        report = found.report()
    weights = limits.rules.weights
    state = RetryState(job.failures, job.lost, job.max_attempts, job.backoff_base_seconds,
                       job.backoff_max_seconds, job.spawn_failures, job.transient_attempts,
                       limits.rules.transient_budget(job.job_type),
                       escalations=job.escalations, weight=job.weight,
                       heavier=weights.heavier(job.weight) if weights else None)
    decision = decide(outcome, state, now, limits.max_lost, retry_after=retry_after,
                      max_spawn_failures=limits.max_spawn_failures,
                      spawn_backoff_seconds=limits.spawn_backoff_seconds, resume_at=resume_at,
                      rules=limits.rules.policies.get(job.job_type, DEFAULT_RULES))
    decision = quiet_ending(ended, claimed, reason) or decision
    if reason and decision.status is not JobStatus.DONE:
        decision = replace(decision, failure_reason=reason)  # the job's own word
    if decision.note:  # e.g. "cannot find capacity for orchestrator"
        report["note"] = decision.note
    return AttemptResult(job.token, outcome, exit_code, decision,
                         json.dumps(report, sort_keys=True) if report else None,
                         memory=ending.memory if ending is not None else None)


def record_ending(
    store: Store, job: Job, outcome: Outcome, now: datetime, limits: PolicyLimits,
    retry_after: float | None = None, ending: Ending | None = None,
    exit_code: int | None = None, resume_at: datetime | None = None,
) -> JobStatus | None:
    """Judge one ended attempt, record it and what it says of its account, and alert when
    only a human can fix what happened; None when the store refused it (the attempt was
    no longer live)."""
    result = decide_for(job, outcome, now, limits, retry_after, ending, exit_code, resume_at)
    accounts = job.job_type in limits.rules.accounts.needs
    if accounts:  # before the finish: the job row names the account while it is live
        rules = limits.rules.accounts
        marked = learn_from_outcome(store, job, result.outcome, result.decision.available_at,
                                    now, rules.cooldown)
        if marked is not None:  # another account may serve it at once (issue 24)
            result = rotate(store, rules, job, result, marked,
                            hosts_for(store, job, limits.rules.pinned.get(job.job_type)), now)
    applied = store.attempt_finish([result], now)
    if accounts:
        store.job_clear_account(job.id)
    if not applied:
        return None
    status = applied[0][1]
    log_ending(job, result, status)
    alert_on_ending(store, job, result, now, limits,
                    ending.launch_error if ending is not None else None)
    return status


def hosts_for(store: Store, job: Job, pinned: frozenset[str] | None = None
              ) -> frozenset[str] | None:
    """The hosts that may run `job` (enabled, allowing its type, within its type's `hosts`
    and its own `--host`, which every claim honours); None when nothing limits it (no host
    registered: `herder up` alone, which ignores allow-lists, and no pin)."""
    hosts = store.host_list()
    found = None
    if hosts:
        found = frozenset(host.label for host in hosts if host.enabled and (
            host.allowed_job_types is None or job.job_type in host.allowed_job_types))
    if pinned is not None:
        found = pinned if found is None else found & pinned
    if job.affinity is not None:
        found = frozenset({job.affinity}) & (found if found is not None else {job.affinity})
    return found


def log_ending(job: Job, result: AttemptResult, status: JobStatus) -> None:
    """The seeds' log event of an ended attempt (`--log-format json` carries its name)."""
    event = ending_event(result.outcome, status)
    if event is None:
        return
    decision = result.decision
    level, name = event
    log.log(level, "job %d attempt %d on %s: %s -> %s%s", job.id, job.attempt, job.host,
            result.outcome, status,
            f" ({decision.failure_reason})" if decision.failure_reason else "",
            extra={"event": name, "job_id": job.id, "attempt": job.attempt,
                   "host": job.host, "job_type": job.job_type,
                   "outcome": str(result.outcome), "status": str(status),
                   "failure_reason": decision.failure_reason,
                   "actionable": decision.actionable})


ENDING_EVENTS: Mapping[Outcome, tuple[int, str]] = {
    Outcome.OOM: (logging.ERROR, "spawn_oom"),
    Outcome.RAM_CONTENTION: (logging.WARNING, "spawn_ram_contention"),
    Outcome.NEEDS_HEAVIER: (logging.WARNING, "dispatch_exit4"),
}
"""Seed 004's log events for an attempt's end, by outcome (a failed job says
`dispatch_failed` whatever its outcome)."""


def ending_event(outcome: Outcome, status: JobStatus) -> tuple[int, str] | None:
    """The log level and the seeds' event name of an ended attempt; None for the rest
    (a job done, a retry of weather), which the runner's own lines already tell."""
    if status is JobStatus.FAILED:
        return logging.ERROR, "dispatch_failed"
    return ENDING_EVENTS.get(outcome)


def alert_on_ending(store: Store, job: Job, result: AttemptResult, now: datetime,
                    limits: PolicyLimits, launch_error: str | None = None) -> None:
    """The alerts an ended attempt opens or clears (delivered by herder.runtime.delivery).
    Waiting for someone to read `herder jobs` is how such a fleet stops for a day."""
    decision = result.decision
    where = job.host or "its host"
    if decision.human_action and decision.status is JobStatus.FAILED:
        store.alert_open(f"job:{job.id}:human_action",
                         f"job {job.id} ({job.job_type}) failed with {decision.failure_reason} "
                         f"on {where}: a human must act (e.g. log in again), "
                         "then `herder retry`", now)
    elif decision.actionable and decision.status is JobStatus.FAILED:
        store.alert_open(f"job:{job.id}:failed",
                         f"job {job.id} ({job.job_type}) failed on {where}: "
                         f"{decision.failure_reason or result.outcome}"
                         f"{f' ({launch_error})' if launch_error else ''} (see `herder show "
                         f"{job.id}`; `herder retry {job.id}` once fixed)", now)
    loop_key = f"job:{job.id}:oom_loop"
    if result.outcome in HEAVY_OUTCOMES:
        section = limits.alerts
        window = timedelta(seconds=section.oom_loop_window)
        if in_memory_loop(store.attempt_list(job.id), now, section.oom_loop_count, window):
            store.alert_open(loop_key, f"job {job.id} ({job.job_type}) ran out of memory "
                             f"{section.oom_loop_count} times within "
                             f"{section.oom_loop_window:g}s (last on {where}, weight "
                             f"{job.weight}): a heavier weight or more RAM is needed", now)
    elif result.outcome is Outcome.OK:  # a failure leaves it open until `herder retry`
        store.alert_clear(loop_key, now)


def bind_jobs(store: Store, host: str, jobs: list[Job], now: datetime,
              limits: PolicyLimits) -> list[Job]:
    """`jobs` bound to accounts (herder.runtime.accounts.bind_accounts); those that cannot
    launch are recorded as ended with nothing spent."""
    def finish(job: Job, outcome: Outcome, resume_at: datetime | None) -> None:
        record_ending(store, job, outcome, now, limits, resume_at=resume_at)

    return bind_accounts(store, limits.rules.accounts, host, jobs, now, finish)


class WorkSource(abc.ABC):
    worker: str = ""
    guardian: GuardianLink | None = None
    """This process's guardian (`herder.runtime.guardian`), when it has one."""
    lease_seconds: float | None = None
    """The lease the other side enforces, when it says (the server's); else the runner's
    own `attempt_lease`."""

    def attach(self, worker: str) -> None:
        """The runner's identity (host/pid/start time), recorded on every attempt."""
        self.worker = worker

    @abc.abstractmethod
    def take(self, free: int, now: datetime) -> list[Job]:
        """Up to `free` attempts to start now (already claimed for this runner)."""

    @abc.abstractmethod
    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        """False when the attempt was fenced out before it started; an exception means
        "not recorded yet" (the runner retries it, the process stays supervised)."""

    @abc.abstractmethod
    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        """Renew the attempts' leases; raise when they could not be renewed (the runner
        stops them before their lease ends if that lasts)."""

    @abc.abstractmethod
    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None, ending: Ending | None = None,
    ) -> JobStatus | None:
        """Report an ended attempt; None when its result was rejected (fenced out)."""

    @abc.abstractmethod
    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]: ...

    @abc.abstractmethod
    def idle(self) -> bool:
        """True when nothing is queued, claimed or running anywhere this source serves."""

    @abc.abstractmethod
    def waker(self) -> Waker: ...

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def asked_at(self, token: AttemptToken) -> float | None:
        """When (monotonic) the request that brought this attempt left, if it came in
        ahead of `take` (a long-poll); None means "when `take` was called"."""
        return None

    def fenced_out(self) -> set[AttemptToken]:
        """Attempts the other side has said are no longer live since the last call."""
        return set()

    def leases(self, deadlines: Mapping[str, float]) -> None:
        """The running attempts' backstop deadlines (attempt marker -> monotonic seconds),
        after each change, for the guardian that outlives a frozen runner."""
        if self.guardian is not None:
            self.guardian.publish(self.worker, deadlines)

    def maintain(self, now: datetime) -> None:
        """Periodic upkeep (rescuing orphans); nothing by default."""

    supervised: bool = False
    """Its attempts run under a supervisor and may be adopted by a next runner (an
    agent's: herder.runtime.supervisor)."""

    def predecessors(self) -> list[tuple[AttemptToken, str]]:
        """Live attempts of this host whose runner (the worker named) is gone, that this
        one may adopt; none but an agent's."""
        return []

    def adopt(self, token: AttemptToken, previous: str, log_path: str) -> bool:
        """Take the attempt over from the dead `previous`: False when the other side no
        longer holds it live (kill it); raise when it could not be asked."""
        return False

    def close(self) -> None:
        """Release what the source holds."""


class StoreSource(WorkSource):
    """Shared by the store-backed sources: reports go straight to the store."""

    def __init__(self, store: Store, host: str, limits: PolicyLimits, rescuer: Rescuer) -> None:
        self.store = store
        self.host = host
        self.limits = limits
        self.rescuer = rescuer

    def started(self, token: AttemptToken, pid: int, log_path: str, now: datetime) -> bool:
        return self.store.attempt_start(token, pid, log_path, now)

    def heartbeat(self, tokens: Sequence[AttemptToken], now: datetime) -> HeartbeatReply:
        return self.store.attempt_heartbeat(self.host, tokens, now)

    def finished(
        self, job: Job, outcome: Outcome, exit_code: int | None, now: datetime,
        retry_after: float | None = None, ending: Ending | None = None,
    ) -> JobStatus | None:
        return record_ending(self.store, job, outcome, now, self.limits, retry_after, ending,
                             exit_code)

    def cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        return self.store.job_cancel_requested(job_ids)

    def bind(self, jobs: list[Job], now: datetime) -> list[Job]:
        """The jobs that may launch, each under its account if its type needs one."""
        return bind_jobs(self.store, self.host, jobs, now, self.limits)

    def waker(self) -> Waker:
        return self.store.listen()

    def drain(self) -> None:
        """Ask for no new work (the runner is shutting down)."""

    def maintain(self, now: datetime) -> None:
        self.rescuer.run_once(now)
        self.store.statistics_refresh()


class ClaimSource(StoreSource):
    """`herder up`: claim due jobs in priority order with SKIP LOCKED / BEGIN IMMEDIATE,
    none of a job type whose preflight fails here (seed 002: the job stays queued, nothing
    spent; an alert `preflight:<host>:<type>` says so until it passes)."""

    def __init__(self, store: Store, host: str, limits: PolicyLimits, rescuer: Rescuer,
                 max_workers: int | None = None, preflight: Refresher | None = None) -> None:
        super().__init__(store, host, limits, rescuer)
        self.max_workers = max_workers
        """`[fleet] emergency_max_workers` as herder.toml starts it (`herder fleet cap`
        changes it at run time)."""
        self.preflight = preflight
        self.pinned_elsewhere = frozenset(
            job_type for job_type, hosts in limits.rules.pinned.items() if host not in hosts)
        """Job types pinned to other hosts (`hosts = [...]`): never claimed here."""
        self.alerted: dict[str, str] | None = None
        """The failed job types with an open alert, with why (None: not read yet; a
        former runner of this host may have left some open)."""

    def attach(self, worker: str) -> None:
        super().attach(worker)
        if self.preflight is not None:
            self.preflight.start()

    def maintain(self, now: datetime) -> None:
        super().maintain(now)
        if self.limits.rules.accounts.needs:  # no scheduler here to clear them
            sync_account_alerts(self.store, now, self.limits.rules.accounts.cooldown)

    def take(self, free: int, now: datetime) -> list[Job]:
        free = min(free, self.fleet_room())
        if free <= 0:
            return []
        blocked = self.blocked(now)
        if blocked is None:
            return []  # the first preflights have not ended yet
        blocked |= self.sessions_full(now) | self.pinned_elsewhere
        return self.bind(self.store.job_claim(self.host, self.worker, free, now, blocked), now)

    def sessions_full(self, now: datetime) -> frozenset[str]:
        """The job types whose every usable account here is at its session cap: claiming
        one would only end it `refused` (an attempt, a second's wait, again and again until
        a session ends), as the server's placement passes such a host over (`slots_full`).
        A type with no usable account at all is still claimed: it waits for the first reset."""
        rules = self.limits.rules.accounts
        if not rules.needs:
            return frozenset()
        records = self.store.account_list(self.host)
        return frozenset(job_type for job_type in rules.needs
                         if rules.choose(records, self.host, job_type, now).full)

    def blocked(self, now: datetime) -> frozenset[str] | None:
        """The job types not to claim; an alert opened or cleared for each change."""
        if self.preflight is None:
            return frozenset()
        failed = self.preflight.failed()
        if failed is None:
            return None
        if self.alerted is None:
            prefix = preflight_alert(self.host, "")
            self.alerted = {alert.key.removeprefix(prefix): alert.message
                            for alert in self.store.alert_list(open_only=True, limit=1000)
                            if alert.key.startswith(prefix)}
        for job_type, detail in sorted(failed.items()):
            if job_type not in self.alerted:
                log.warning("preflight for job type %s failed (%s): not claiming it for now",
                            job_type, detail)
                self.store.alert_open(preflight_alert(self.host, job_type),
                                      f"preflight for job type {job_type} failed on "
                                      f"{self.host}: {detail}", now)
        for job_type in sorted(set(self.alerted) - set(failed)):
            log.info("preflight for job type %s passes again", job_type)
            self.store.alert_clear(preflight_alert(self.host, job_type), now)
        self.alerted = dict(failed)
        return frozenset(failed)

    def fleet_room(self) -> int:
        """How many more jobs the fleet-wide cap lets start (every process on this store
        counts; two claiming at the same instant may pass it by one each)."""
        from herder.runtime.scheduler import fleet_cap

        cap = fleet_cap(self.store, self.max_workers).max_workers
        if cap is None:
            return INT_MAX
        counts = self.store.job_counts()
        return cap - counts.get(JobStatus.CLAIMED, 0) - counts.get(JobStatus.RUNNING, 0)

    def idle(self) -> bool:
        """Nothing queued, claimed or running; or only jobs this runner never claims: their
        type's preflight fails here, or their type is pinned to other hosts
        (`--exit-when-idle` would wait forever for them: they stay queued, said)."""
        counts = self.store.job_counts()
        if not any(counts.values()):
            return True
        failed = self.preflight.failed() if self.preflight is not None else None
        unclaimed = set(failed or ()) | self.pinned_elsewhere
        if not unclaimed or counts.get(JobStatus.CLAIMED) or counts.get(JobStatus.RUNNING):
            return False
        queued = self.store.job_list([JobStatus.QUEUED], counts.get(JobStatus.QUEUED, 0) + 1)
        if any(job.job_type not in unclaimed for job in queued):
            return False
        log.warning("%d queued job(s) left: their job types' preflight fails here or they "
                    "are pinned to other hosts (%s)", len(queued),
                    ", ".join(sorted({job.job_type for job in queued})))
        return True

    def close(self) -> None:
        if self.preflight is not None:
            self.preflight.stop()


def preflight_alert(host: str, job_type: str) -> str:
    """The alert a failing preflight raises under `herder up` (`herder why` reads it)."""
    return f"preflight:{host}:{job_type}"


class AssignmentSource(StoreSource):
    """A `local` host under `herder server`: run what the scheduler placed on this host."""

    def take(self, free: int, now: datetime) -> list[Job]:
        jobs = self.store.attempt_list_assigned(self.host, free)
        return self.bind([job for job in jobs
                          if self.store.attempt_set_worker(job.token, self.worker, now)], now)

    def idle(self) -> bool:
        return not any(self.store.job_counts().values())
