"""What an attempt's outcome means for its job, as a table of rules (data) and one pure
function that applies a rule to the job's counters.

Each outcome maps to an action (done, retry after a delay, move to a heavier weight, wait
until a time, fail), to the budget it spends (the job's attempts, its transient attempts,
its spawn failures, its lost attempts, or none), to the `failure_reason` it records and to
two flags: actionable (someone should look at it) and human action (only a human can fix
it). The defaults follow the launch wrapper's exit codes and treat rate limits as weather; a
job type may override any rule in `herder.toml`.

Separate budgets are the point: host trouble (spawn failures), rate limits (transient) and
infrastructure churn (lost) never burn the attempts a job has for its own faults.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

import msgspec
from msgspec.structs import replace

from herder.core.model import Action, Budget, Decision, JobStatus, Outcome
from herder.core.settings.sections import DEFAULTS

MAX_TRANSIENT_ATTEMPTS = 5
"""Transient outcomes (a 429, an overloaded API) a job may meet before it fails."""


class Rule(msgspec.Struct, frozen=True):
    action: Action
    spends: Budget = Budget.NONE
    failure_reason: str | None = None
    actionable: bool = False
    human_action: bool = False
    delay: float | None = None
    """Seconds before the next attempt. None: the budget's own backoff (the job's backoff for
    attempts, the spawn backoff for spawn failures, at once for lost)."""
    delay_max: float | None = None
    """When set, `delay` doubles with each spend of the budget, up to this."""
    avoid_host: bool = False
    """The outcome was the host's doing: the next attempt goes elsewhere if it can."""
    escalations: int | None = None
    """ESCALATE only this many times in a job's life, then RETRY on the same weight."""

    def problems(self) -> list[str]:
        """What makes this rule unusable; empty when it is fine."""
        found = []
        if self.delay is not None and self.delay < 0:
            found.append("delay must not be negative")
        if self.delay_max is not None and (self.delay is None or self.delay_max < self.delay):
            found.append("delay_max needs a delay no longer than it")
        if (self.action in (Action.RETRY, Action.WAIT) and self.spends is Budget.NONE
                and not self.delay):
            found.append("a retry that spends no budget must wait (set delay > 0), or it "
                         "could loop forever")
        if self.action is Action.ESCALATE and self.spends is Budget.NONE and self.escalations:
            found.append("an escalation with a limit holds the weight afterwards; it must "
                         "spend a budget then")
        if self.action in (Action.FAIL, Action.RETRY, Action.ESCALATE, Action.WAIT) and (
                not self.failure_reason):
            found.append("needs a failure_reason")
        return found


DEFAULT_RULES: Mapping[Outcome, Rule] = {
    Outcome.OK: Rule(Action.DONE),
    Outcome.CANCELLED: Rule(Action.CANCEL, failure_reason="cancelled"),
    # The job's own faults spend its attempts, with its backoff.
    Outcome.FAILED: Rule(Action.RETRY, Budget.ATTEMPTS, "implementation_error",
                         actionable=True),
    # A timeout may mean too little room: one step up the chain, then as a failure.
    Outcome.TIMEOUT: Rule(Action.ESCALATE, Budget.ATTEMPTS, "timeout", actionable=True,
                          escalations=1),
    Outcome.STUCK: Rule(Action.RETRY, Budget.ATTEMPTS, "stuck", actionable=True),
    Outcome.LAUNCH_FAILED: Rule(Action.RETRY, Budget.ATTEMPTS, "launch_failed",
                                actionable=True),
    # Weather: its own budget, min(2^n x 10 s, 600 s), at least what Retry-After asks.
    Outcome.TRANSIENT: Rule(Action.RETRY, Budget.TRANSIENT, "transient", delay=10.0,
                            delay_max=600.0),
    # Quotas and accounts: nothing spent, a time waited, another host preferred.
    Outcome.USAGE_BLOCKED: Rule(Action.WAIT, Budget.NONE, "usage_blocked", delay=3600.0,
                                avoid_host=True),
    Outcome.NO_HEALTHY_ACCOUNT: Rule(Action.WAIT, Budget.NONE, "no_healthy_account",
                                     delay=900.0, avoid_host=True),
    Outcome.AUTH_REVOKED: Rule(Action.FAIL, Budget.NONE, "spawn_oauth_expired",
                               actionable=True, human_action=True),
    # Capacity: a heavier weight, bounded by the chain (needs_heavier) or once (oom).
    Outcome.NEEDS_HEAVIER: Rule(Action.ESCALATE, Budget.NONE, "spawn_oom", actionable=True),
    Outcome.OOM: Rule(Action.ESCALATE, Budget.SPAWN, "spawn_oom", actionable=True,
                      human_action=True, escalations=1),
    # Host trouble spends spawn failures, never the job's attempts (not the job's fault); a
    # job that reaches max_spawn_failures fails for a human to look at the hosts (the flags of a
    # retrying rule only count when its budget runs out).
    Outcome.RAM_CONTENTION: Rule(Action.RETRY, Budget.SPAWN, "spawn_ram", actionable=True,
                                 human_action=True, avoid_host=True),
    Outcome.WORKSPACE_FAILED: Rule(Action.RETRY, Budget.SPAWN, "spawn_git_auth",
                                   actionable=True, human_action=True, avoid_host=True),
    Outcome.UNREACHABLE: Rule(Action.RETRY, Budget.SPAWN, "spawn_ssh_failure",
                              actionable=True, human_action=True, avoid_host=True),
    Outcome.SPAWN_FAILED: Rule(Action.RETRY, Budget.SPAWN, "spawn_failed", actionable=True,
                               human_action=True, avoid_host=True),
    # Not the job's doing: at once, on its own budget.
    Outcome.LOST: Rule(Action.RETRY, Budget.LOST, "lost", delay=0.0),
    # A host's allow-list said no (an agent re-checking its assignment): elsewhere, soon.
    Outcome.REFUSED: Rule(Action.RETRY, Budget.NONE, "refused", delay=1.0, avoid_host=True),
}

QUIET_REASONS = frozenset({"mutex_collision", "stale_duplicate"})
"""A job's own `failure_reason` ($HERDER_RESULT) that ends it at once, neither retried nor
actionable: a sibling holds its work (mutex_collision), or the work is already done or moot
(stale_duplicate). Both stay out of the alert count: nothing is wrong."""


def quiet_ending(ended: Outcome, claimed: Outcome | None, reason: str | None
                 ) -> Decision | None:
    """The end of a job that said one of the QUIET_REASONS on its own: it exited by itself
    (the runner saw it end `ok` or `failed`, whatever its exit code and log say) and named
    no outcome but `failed`. None for every other ending, which the rules decide: a job
    that named another outcome is taken at that word, and a timeout, cancel or loss is
    herder's."""
    if reason not in QUIET_REASONS or claimed not in (None, Outcome.FAILED):
        return None
    if ended in (Outcome.OK, Outcome.FAILED):
        return Decision(JobStatus.FAILED, failure_reason=reason)
    return None


SPAWN_OUTCOMES = frozenset(outcome for outcome, rule in DEFAULT_RULES.items()
                           if rule.spends is Budget.SPAWN)


class RetryState(msgspec.Struct, frozen=True):
    """The counters a decision needs, as they were before this attempt ended."""

    failures: int
    lost: int
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float
    spawn_failures: int = 0
    transient: int = 0
    max_transient: int = MAX_TRANSIENT_ATTEMPTS
    escalations: int = 0
    """Weight escalations the job has had."""
    weight: str = ""
    heavier: str | None = None
    """The weight an escalation moves to (`WeightTable.heavier`: further on in the chain, with
    a larger budget); None at the ceiling."""


class Limits(msgspec.Struct, frozen=True):
    """The fleet-wide budgets (the job's own are in its RetryState)."""

    max_lost: int
    max_spawn_failures: int
    spawn_backoff_seconds: float


def backoff_seconds(failures: int, base: float, cap: float) -> float:
    """Exponential backoff after the n-th failure (n >= 1): base, 2*base, 4*base ... capped."""
    if failures <= 0 or base <= 0:
        return 0.0
    exponent = min(failures - 1, 62)
    return float(min(base * (2**exponent), cap))


def decide(
    outcome: Outcome,
    state: RetryState,
    now: datetime,
    max_lost: int = DEFAULTS.runtime.max_lost,
    *,
    retry_after: float | None = None,
    max_spawn_failures: int = DEFAULTS.fleet.max_spawn_failures,
    spawn_backoff_seconds: float = DEFAULTS.fleet.spawn_backoff,
    resume_at: datetime | None = None,
    rules: Mapping[Outcome, Rule] = DEFAULT_RULES,
) -> Decision:
    """Apply `outcome`'s rule to the job's counters.

    `retry_after` (seconds the attempt asked to wait) is a floor on any requeue's delay;
    `resume_at` (a quota's reset) is when a WAIT ends."""
    limits = Limits(max_lost, max_spawn_failures, spawn_backoff_seconds)
    rule = rules.get(outcome) or DEFAULT_RULES[outcome]
    floor = max(0.0, retry_after) if retry_after is not None else 0.0
    spends = rule.spends
    flags = Decision(JobStatus.QUEUED, failure_reason=rule.failure_reason,
                     spend_failure=spends is Budget.ATTEMPTS, spend_lost=spends is Budget.LOST,
                     spend_spawn_failure=spends is Budget.SPAWN,
                     spend_transient=spends is Budget.TRANSIENT,
                     actionable=rule.actionable, human_action=rule.human_action)
    if rule.action is Action.DONE:
        return Decision(JobStatus.DONE)
    if rule.action is Action.CANCEL:
        return Decision(JobStatus.CANCELLED, failure_reason=rule.failure_reason)
    if rule.action is Action.FAIL:
        return replace(flags, status=JobStatus.FAILED)
    count, budget = _count(rule.spends, state, limits)
    if budget is not None and count >= budget:
        return replace(flags, status=JobStatus.FAILED)
    action = rule.action
    if action is Action.ESCALATE and rule.escalations is not None and (
            state.escalations >= rule.escalations):
        action = Action.RETRY  # escalated as often as allowed: hold the weight
    if action is Action.ESCALATE and state.heavier is None:
        if rule.escalations is None:  # needs heavier, and there is none
            return replace(flags, status=JobStatus.FAILED,
                           note=f"cannot find capacity for {state.weight or 'its weight'}")
        action = Action.RETRY  # escalate once if it can, else hold the weight
    if action is Action.ESCALATE:
        return replace(flags, available_at=now + timedelta(seconds=floor),
                       weight=state.heavier, avoid_host=rule.avoid_host)
    if action is Action.WAIT and resume_at is not None and resume_at > now:
        wait = max((resume_at - now).total_seconds(), floor)
    else:
        wait = max(_delay(rule, state, count, limits), floor)
    return replace(flags, available_at=now + timedelta(seconds=wait),
                   avoid_host=rule.avoid_host)


def _count(budget: Budget, state: RetryState, limits: Limits) -> tuple[int, int | None]:
    """The budget's count after this spend, and its limit (None: unlimited)."""
    if budget is Budget.ATTEMPTS:
        return state.failures + 1, state.max_attempts
    if budget is Budget.TRANSIENT:
        return state.transient + 1, state.max_transient
    if budget is Budget.SPAWN:
        return state.spawn_failures + 1, limits.max_spawn_failures
    if budget is Budget.LOST:
        return state.lost + 1, limits.max_lost
    return 0, None


def _delay(rule: Rule, state: RetryState, count: int, limits: Limits) -> float:
    if rule.delay is not None:
        if rule.delay_max is None:
            return rule.delay
        return backoff_seconds(max(count, 1), rule.delay, rule.delay_max)
    if rule.spends is Budget.ATTEMPTS:
        return backoff_seconds(count, state.backoff_base_seconds, state.backoff_max_seconds)
    if rule.spends is Budget.SPAWN:
        return limits.spawn_backoff_seconds
    return 0.0
