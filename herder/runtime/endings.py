"""How an attempt's end becomes the job's next state: the outcome rules and limits a runner
applies, the decision, and its recording (events, alerts, account health)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timedelta

import msgspec
from msgspec.structs import replace

from herder.core.errors import ConfigError
from herder.core.model import Action, AttemptResult, Budget, Job, JobStatus, MemoryUse, Outcome
from herder.core.scheduling.accounts import AccountRules
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
from herder.runtime.accounts import bind_accounts, learn_from_outcome, rotate
from herder.store import Store

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
        return cls(exit_codes, WeightTable.from_settings(settings), policies, patterns,
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
    """The documented log event of an ended attempt (docs/monitoring.md; `--log-format json`
    carries its name)."""
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
"""The documented log events for an attempt's end (docs/monitoring.md), by outcome (a failed
job says `dispatch_failed` whatever its outcome)."""


def ending_event(outcome: Outcome, status: JobStatus) -> tuple[int, str] | None:
    """The log level and the documented event name (docs/monitoring.md) of an ended attempt;
    None for the rest (a job done, a retry of weather), which the runner's own lines already
    tell."""
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
