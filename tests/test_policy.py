"""The retry policy as a pure function: outcomes, failure budgets, lost budgets and backoff."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from herder.core.fleet import Fleet
from herder.core.model import Action, Budget, JobStatus, Outcome
from herder.core.scheduling.policy import (
    DEFAULT_RULES,
    QUIET_REASONS,
    SPAWN_OUTCOMES,
    RetryState,
    Rule,
    backoff_seconds,
    decide,
    quiet_ending,
)
from herder.core.settings.loading import load_config
from herder.runtime.endings import OutcomeRules

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
FAILING = (Outcome.FAILED, Outcome.TIMEOUT, Outcome.LAUNCH_FAILED)
REASONS = {
    Outcome.FAILED: "implementation_error",
    Outcome.TIMEOUT: "timeout",
    Outcome.LAUNCH_FAILED: "launch_failed",
}

# Realistic durations: up to about a year, in seconds (herder.toml durations are finite).
durations = st.floats(min_value=0.0, max_value=3.2e7, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-3, max_value=3.2e7, allow_nan=False, allow_infinity=False)
nows = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)


def state(failures: int = 0, lost: int = 0, max_attempts: int = 3, base: float = 10.0,
          cap: float = 600.0) -> RetryState:
    return RetryState(failures, lost, max_attempts, base, cap)


@st.composite
def retry_states(draw: st.DrawFn) -> RetryState:
    max_attempts = draw(st.integers(min_value=1, max_value=50))
    return RetryState(
        failures=draw(st.integers(min_value=0, max_value=max_attempts - 1)),
        lost=draw(st.integers(min_value=0, max_value=20)),
        max_attempts=max_attempts,
        backoff_base_seconds=draw(durations),
        backoff_max_seconds=draw(durations),
        spawn_failures=draw(st.integers(min_value=0, max_value=20)),
        transient=draw(st.integers(min_value=0, max_value=4)),
        escalations=draw(st.integers(min_value=0, max_value=3)),
        weight="light",
        heavier=draw(st.none() | st.just("heavy")),
    )


# -- examples ---------------------------------------------------------------------------------


def test_ok_is_done_without_spending_anything():
    decision = decide(Outcome.OK, state(failures=2, lost=4), NOW)
    assert decision.status is JobStatus.DONE
    assert decision.failure_reason is None
    assert not decision.spend_failure
    assert not decision.spend_lost


def test_cancelled_is_cancelled_without_spending_anything():
    decision = decide(Outcome.CANCELLED, state(failures=0, max_attempts=1), NOW)
    assert decision.status is JobStatus.CANCELLED
    assert decision.failure_reason == "cancelled"
    assert not decision.spend_failure
    assert not decision.spend_lost


@pytest.mark.parametrize("outcome", FAILING, ids=str)
def test_first_failure_requeues_after_the_base_backoff(outcome):
    decision = decide(outcome, state(failures=0, max_attempts=3, base=10, cap=600), NOW)
    assert decision.status is JobStatus.QUEUED
    assert decision.available_at == NOW + timedelta(seconds=10)
    assert decision.failure_reason == REASONS[outcome]
    assert decision.spend_failure
    assert not decision.spend_lost


@pytest.mark.parametrize("outcome", FAILING, ids=str)
def test_last_allowed_failure_fails_the_job(outcome):
    decision = decide(outcome, state(failures=2, max_attempts=3), NOW)
    assert decision.status is JobStatus.FAILED
    assert decision.failure_reason == REASONS[outcome]
    assert decision.spend_failure
    assert decision.available_at is None


def test_max_attempts_one_fails_on_the_first_failure():
    assert decide(Outcome.FAILED, state(max_attempts=1), NOW).status is JobStatus.FAILED


def test_backoff_doubles_then_caps():
    assert [backoff_seconds(n, 10, 600) for n in range(1, 9)] == [
        10, 20, 40, 80, 160, 320, 600, 600,
    ]


@pytest.mark.parametrize(("failures", "base"), [(0, 10), (-3, 10), (1, 0), (5, -1)])
def test_backoff_is_zero_without_failures_or_base(failures, base):
    assert backoff_seconds(failures, base, 600) == 0.0


def test_backoff_survives_huge_failure_counts():
    assert backoff_seconds(10_000, 10, 600) == 600


def test_lost_requeues_at_once_and_spends_only_the_lost_budget():
    decision = decide(Outcome.LOST, state(failures=2, lost=0, max_attempts=3), NOW, max_lost=5)
    assert decision.status is JobStatus.QUEUED
    assert decision.available_at == NOW
    assert decision.spend_lost
    assert not decision.spend_failure


def test_lost_fails_at_max_lost():
    decision = decide(Outcome.LOST, state(lost=4), NOW, max_lost=5)
    assert decision.status is JobStatus.FAILED
    assert decision.failure_reason == "lost"
    assert decision.spend_lost
    assert not decision.spend_failure


# -- properties -------------------------------------------------------------------------------


@given(
    outcome=st.sampled_from(FAILING),
    max_attempts=st.integers(min_value=1, max_value=40),
    base=durations,
    cap=durations,
    now=nows,
)
def test_failures_fail_the_job_exactly_at_max_attempts(outcome, max_attempts, base, cap, now):
    """Replaying decisions like the store applies them: max_attempts failures, then failed."""
    failures = 0
    decisions = []
    while True:
        decision = decide(outcome, RetryState(failures, 0, max_attempts, base, cap), now)
        decisions.append(decision)
        assert decision.spend_failure and not decision.spend_lost
        assert decision.failure_reason == REASONS[outcome]
        failures += 1
        if decision.status is not JobStatus.QUEUED:
            break
        assert len(decisions) <= max_attempts
    assert decision.status is JobStatus.FAILED
    assert failures == len(decisions) == max_attempts


@given(
    failures=st.integers(min_value=1, max_value=200),
    base=positive,
    cap=durations,
)
def test_backoff_is_monotone_and_never_exceeds_the_cap(failures, base, cap):
    here = backoff_seconds(failures, base, cap)
    after = backoff_seconds(failures + 1, base, cap)
    assert 0.0 <= here <= after <= cap


@given(failures=st.integers(min_value=1, max_value=40), base=positive)
def test_backoff_below_the_cap_is_base_times_two_to_the_n_minus_one(failures, base):
    exact = base * 2 ** (failures - 1)
    assert backoff_seconds(failures, base, exact * 2) == exact
    assert backoff_seconds(failures, base, exact) == exact
    assert backoff_seconds(failures, base, exact / 2) == exact / 2


@given(
    outcome=st.sampled_from(FAILING),
    retry=retry_states(),
    now=nows,
)
def test_requeue_waits_exactly_the_backoff_and_never_before_now(outcome, retry, now):
    decision = decide(outcome, retry, now)
    if decision.status is JobStatus.QUEUED:
        assert decision.available_at is not None
        assert decision.available_at >= now
        expected = backoff_seconds(retry.failures + 1, retry.backoff_base_seconds,
                                   retry.backoff_max_seconds)
        if decision.weight is not None:  # a timeout's one escalation goes at once
            assert (outcome, retry.escalations) == (Outcome.TIMEOUT, 0)
            expected = 0.0
        assert decision.available_at == now + timedelta(seconds=expected)
    else:
        assert retry.failures + 1 == retry.max_attempts


@given(
    retry=retry_states(),
    max_lost=st.integers(min_value=1, max_value=30),
    now=nows,
)
def test_lost_never_spends_failures_and_fails_only_at_max_lost(retry, max_lost, now):
    decision = decide(Outcome.LOST, retry, now, max_lost=max_lost)
    assert decision.spend_lost
    assert not decision.spend_failure
    if retry.lost + 1 >= max_lost:
        assert decision.status is JobStatus.FAILED
        assert decision.failure_reason == "lost"
    else:
        assert decision.status is JobStatus.QUEUED
        assert decision.available_at == now


@given(max_attempts=st.integers(min_value=1, max_value=10),
       max_lost=st.integers(min_value=1, max_value=30), now=nows)
def test_a_job_survives_max_lost_minus_one_losses_whatever_its_failure_budget(
    max_attempts, max_lost, now
):
    """Replay losses on a job one failure from failing: only max_lost losses fail it."""
    lost = 0
    while True:
        retry = RetryState(max_attempts - 1, lost, max_attempts, 10.0, 600.0)
        decision = decide(Outcome.LOST, retry, now, max_lost=max_lost)
        lost += 1
        if decision.status is JobStatus.FAILED:
            break
        assert decision.status is JobStatus.QUEUED
    assert lost == max_lost


def test_refused_requeues_after_retry_after_and_spends_nothing():
    decision = decide(Outcome.REFUSED, state(failures=2, lost=4), NOW, retry_after=30)
    assert decision.status is JobStatus.QUEUED
    assert decision.available_at == NOW + timedelta(seconds=30)
    assert not (decision.spend_failure or decision.spend_lost or decision.spend_spawn_failure)
    # Never at once: a refusal spends nothing, so it must wait to be unable to loop.
    assert decide(Outcome.REFUSED, state(), NOW).available_at == NOW + timedelta(seconds=1)


@given(
    outcome=st.sampled_from(sorted(o for o in SPAWN_OUTCOMES
                                   if DEFAULT_RULES[o].action is Action.RETRY)),
    retry=retry_states(),
    max_spawn_failures=st.integers(min_value=1, max_value=30),
    spawn_backoff=durations,
    retry_after=st.none() | durations,
    now=nows,
)
def test_spawn_failures_spend_only_their_own_budget(
    outcome, retry, max_spawn_failures, spawn_backoff, retry_after, now
):
    decision = decide(outcome, retry, now, retry_after=retry_after,
                      max_spawn_failures=max_spawn_failures,
                      spawn_backoff_seconds=spawn_backoff)
    assert decision.spend_spawn_failure
    assert not decision.spend_failure and not decision.spend_lost
    if retry.spawn_failures + 1 >= max_spawn_failures:
        assert decision.status is JobStatus.FAILED
    else:
        assert decision.status is JobStatus.QUEUED
        delay = max(spawn_backoff, retry_after or 0.0)
        assert decision.available_at == now + timedelta(seconds=delay)


@given(
    outcome=st.sampled_from(list(Outcome)),
    retry=retry_states(),
    max_lost=st.integers(min_value=1, max_value=30),
    retry_after=st.none() | durations,
    now=nows,
)
def test_every_decision_is_consistent(outcome, retry, max_lost, retry_after, now):
    decision = decide(outcome, retry, now, max_lost=max_lost, retry_after=retry_after)
    spent = [decision.spend_failure, decision.spend_lost, decision.spend_spawn_failure,
             decision.spend_transient]
    assert sum(spent) <= 1
    if decision.status is JobStatus.FAILED:
        assert sum(spent) == 1 or DEFAULT_RULES[outcome].spends is Budget.NONE
        assert decision.failure_reason is not None
    if decision.status is JobStatus.QUEUED:
        # Nothing loops forever: each requeue spends a bounded budget, waits for a time,
        # or moves up a weight chain that ends.
        assert (sum(spent) == 1 or decision.available_at > now
                or decision.weight is not None), decision
    if decision.available_at is not None:
        assert decision.status is JobStatus.QUEUED
        assert decision.available_at >= now
    if decision.status is JobStatus.QUEUED:
        assert decision.available_at is not None
    if decision.status is JobStatus.DONE:
        assert outcome is Outcome.OK
    if outcome is Outcome.OK:
        assert decision.status is JobStatus.DONE
    if outcome is Outcome.CANCELLED:
        assert decision.status is JobStatus.CANCELLED


# -- the outcome table (issue 14) -------------------------------------------------------------


def test_transient_spends_its_own_budget_with_its_own_backoff_and_honours_retry_after():
    delays = []
    for spent in range(4):
        decision = decide(Outcome.TRANSIENT, replace(state(failures=2), transient=spent), NOW)
        assert (decision.status, decision.spend_transient, decision.spend_failure) == (
            JobStatus.QUEUED, True, False)
        assert decision.failure_reason == "transient" and not decision.actionable
        delays.append((decision.available_at - NOW).total_seconds())
    assert delays == [10, 20, 40, 80]
    capped = decide(Outcome.TRANSIENT, replace(state(), transient=0, max_transient=99), NOW)
    assert capped.available_at == NOW + timedelta(seconds=10)
    far = decide(Outcome.TRANSIENT, replace(state(), transient=7, max_transient=99), NOW)
    assert far.available_at == NOW + timedelta(seconds=600)
    asked = decide(Outcome.TRANSIENT, state(), NOW, retry_after=120)
    assert asked.available_at == NOW + timedelta(seconds=120)
    last = decide(Outcome.TRANSIENT, replace(state(), transient=4), NOW)
    assert (last.status, last.failure_reason, last.spend_transient) == (
        JobStatus.FAILED, "transient", True)


def test_usage_blocked_waits_for_the_reset_spends_nothing_and_avoids_the_host():
    reset = NOW + timedelta(hours=3, minutes=10)
    decision = decide(Outcome.USAGE_BLOCKED, state(failures=2), NOW, resume_at=reset)
    assert (decision.status, decision.available_at, decision.avoid_host) == (
        JobStatus.QUEUED, reset, True)
    assert not any((decision.spend_failure, decision.spend_transient,
                    decision.spend_spawn_failure, decision.spend_lost))
    unknown = decide(Outcome.USAGE_BLOCKED, state(), NOW)
    assert unknown.available_at == NOW + timedelta(hours=1)
    past = decide(Outcome.USAGE_BLOCKED, state(), NOW, resume_at=NOW - timedelta(hours=1))
    assert past.available_at == NOW + timedelta(hours=1)


def test_no_healthy_account_waits_a_quarter_hour_elsewhere():
    decision = decide(Outcome.NO_HEALTHY_ACCOUNT, state(), NOW)
    assert (decision.available_at, decision.avoid_host, decision.failure_reason) == (
        NOW + timedelta(minutes=15), True, "no_healthy_account")


def test_a_revoked_login_fails_at_once_for_a_human():
    decision = decide(Outcome.AUTH_REVOKED, state(failures=0, max_attempts=9), NOW)
    assert (decision.status, decision.failure_reason, decision.human_action,
            decision.actionable) == (JobStatus.FAILED, "spawn_oauth_expired", True, True)


def test_needs_heavier_moves_up_the_chain_then_fails_at_its_end():
    up = decide(Outcome.NEEDS_HEAVIER, replace(state(), weight="light", heavier="heavy"), NOW)
    assert (up.status, up.weight, up.available_at) == (JobStatus.QUEUED, "heavy", NOW)
    top = decide(Outcome.NEEDS_HEAVIER, replace(state(), weight="heavy", heavier=None), NOW)
    assert (top.status, top.failure_reason, top.note) == (
        JobStatus.FAILED, "spawn_oom", "cannot find capacity for heavy")


def test_oom_escalates_once_then_holds_the_weight_on_the_spawn_budget():
    first = decide(Outcome.OOM, replace(state(), weight="light", heavier="heavy"), NOW)
    assert (first.weight, first.spend_spawn_failure) == ("heavy", True)
    held = decide(Outcome.OOM, replace(state(), weight="heavy", heavier="xl", escalations=1,
                                       spawn_failures=1), NOW)
    assert (held.status, held.weight, held.available_at) == (
        JobStatus.QUEUED, None, NOW + timedelta(minutes=5))
    spent = decide(Outcome.OOM, replace(state(), escalations=1, spawn_failures=4), NOW)
    assert (spent.status, spent.failure_reason) == (JobStatus.FAILED, "spawn_oom")
    # Already the heaviest: hold it rather than fail.
    heaviest = decide(Outcome.OOM, replace(state(), weight="xl", heavier=None), NOW)
    assert (heaviest.status, heaviest.weight) == (JobStatus.QUEUED, None)


def test_a_job_type_may_override_a_rule():
    rules = {**DEFAULT_RULES, Outcome.FAILED: Rule(Action.FAIL, Budget.ATTEMPTS, "broken")}
    decision = decide(Outcome.FAILED, state(max_attempts=5), NOW, rules=rules)
    assert (decision.status, decision.failure_reason) == (JobStatus.FAILED, "broken")


def test_every_default_rule_is_usable():
    assert {o: r.problems() for o, r in DEFAULT_RULES.items() if r.problems()} == {}
    assert set(DEFAULT_RULES) == set(Outcome)


@pytest.mark.parametrize(("rule", "problem"), [
    (Rule(Action.RETRY, Budget.NONE, "x"), "could loop forever"),
    (Rule(Action.WAIT, Budget.NONE, "x", delay=0.0), "could loop forever"),
    (Rule(Action.RETRY, Budget.ATTEMPTS, "x", delay=-1.0), "negative"),
    (Rule(Action.RETRY, Budget.ATTEMPTS, "x", delay=10.0, delay_max=5.0), "delay_max"),
    (Rule(Action.RETRY, Budget.ATTEMPTS), "failure_reason"),
])
def test_a_rule_that_cannot_work_says_why(rule: Rule, problem: str):
    assert any(problem in text for text in rule.problems()), rule.problems()


def test_one_weight_override_still_escalates_an_oom_to_the_next_weight(tmp_path):
    """Issue 24: `[weights] light = 0.25` alone once left a chain of only light, so an
    attempt stopped for memory held its weight with a 5-minute backoff. The chain the
    runner and the scheduler build from such a file still goes light -> heavy."""
    path = tmp_path / "herder.toml"
    path.write_text("[weights]\nlight = 0.25\n")
    settings = load_config(path).settings
    rules = OutcomeRules.from_settings(settings).weights
    assert rules is not None
    for table in (rules, Fleet.from_settings(settings).weights):
        assert table.heavier("light") == "heavy"
        decision = decide(Outcome.OOM, replace(state(), weight="light",
                                               heavier=table.heavier("light")), NOW)
        assert (decision.status, decision.weight, decision.available_at) == (
            JobStatus.QUEUED, "heavy", NOW)


def escalations_under(path) -> list[tuple[str, Outcome, JobStatus, str | None, str | None]]:
    """Each chain weight's oom and needs_heavier decisions, as the runner's and the
    scheduler's weight tables (both built from herder.toml at `path`) give them."""
    settings = load_config(path).settings
    rules = OutcomeRules.from_settings(settings).weights
    assert rules is not None
    rows = []
    for table in (rules, Fleet.from_settings(settings).weights):
        for weight in table.chain:
            for outcome in (Outcome.OOM, Outcome.NEEDS_HEAVIER):
                decision = decide(outcome, replace(state(), weight=weight,
                                                   heavier=table.heavier(weight)), NOW)
                rows.append((weight, outcome, decision.status, decision.weight,
                             decision.note))
    half = len(rows) // 2
    assert rows[:half] == rows[half:]  # the runner and the scheduler agree
    return rows[:half]


def test_an_escalation_from_heavy_skips_the_smaller_playwright(tmp_path):
    """The default chain is light -> heavy -> playwright -> orchestrator, but playwright
    books 6 GB and heavy 8 GB: a heavy job out of memory moves to orchestrator (12 GB),
    never down to 6 GB to run out of memory again. At orchestrator it is at the ceiling:
    needs_heavier fails for a human as before, an oom holds the weight."""
    path = tmp_path / "herder.toml"
    path.write_text("")
    queued, failed = JobStatus.QUEUED, JobStatus.FAILED
    ceiling = "cannot find capacity for orchestrator"
    assert escalations_under(path) == [
        ("light", Outcome.OOM, queued, "heavy", None),
        ("light", Outcome.NEEDS_HEAVIER, queued, "heavy", None),
        ("heavy", Outcome.OOM, queued, "orchestrator", None),
        ("heavy", Outcome.NEEDS_HEAVIER, queued, "orchestrator", None),
        ("playwright", Outcome.OOM, queued, "orchestrator", None),
        ("playwright", Outcome.NEEDS_HEAVIER, queued, "orchestrator", None),
        ("orchestrator", Outcome.OOM, queued, None, None),
        ("orchestrator", Outcome.NEEDS_HEAVIER, failed, None, ceiling),
    ]


def test_a_custom_chain_skips_weights_of_an_equal_budget(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[fleet]\nescalation = ["light", "browser", "heavy", "orchestrator"]\n'
                    "[weights]\nlight = 4\nbrowser = 4\nheavy = 8\norchestrator = 8\n")
    rows = [(weight, status, to, note) for weight, outcome, status, to, note
            in escalations_under(path) if outcome is Outcome.NEEDS_HEAVIER]
    assert rows == [
        ("light", JobStatus.QUEUED, "heavy", None),
        ("browser", JobStatus.QUEUED, "heavy", None),
        ("heavy", JobStatus.FAILED, None, "cannot find capacity for heavy"),
        ("orchestrator", JobStatus.FAILED, None, "cannot find capacity for orchestrator"),
    ]


# -- seed rows (issue 24) ---------------------------------------------------------------------


def test_a_timeout_moves_up_one_weight_once_then_retries_and_fails_as_a_failure():
    """Seed 004's retry_count row: an implementation timeout escalates the weight; herder
    does it once in a job's life, then timeouts spend attempts with the job's backoff."""
    first = decide(Outcome.TIMEOUT, replace(state(max_attempts=3), weight="light",
                                            heavier="heavy"), NOW)
    assert (first.status, first.weight, first.available_at, first.spend_failure,
            first.failure_reason) == (JobStatus.QUEUED, "heavy", NOW, True, "timeout")
    held = decide(Outcome.TIMEOUT, replace(state(failures=1, max_attempts=3), weight="heavy",
                                           heavier="playwright", escalations=1), NOW)
    assert (held.status, held.weight, held.available_at) == (
        JobStatus.QUEUED, None, NOW + timedelta(seconds=20))
    last = decide(Outcome.TIMEOUT, replace(state(failures=2, max_attempts=3), weight="heavy",
                                           heavier="playwright", escalations=1), NOW)
    assert (last.status, last.failure_reason, last.actionable, last.weight) == (
        JobStatus.FAILED, "timeout", True, None)
    # At the top of the chain there is nothing to move to: a plain retry.
    top = decide(Outcome.TIMEOUT, replace(state(), weight="orchestrator", heavier=None), NOW)
    assert (top.status, top.weight, top.available_at) == (
        JobStatus.QUEUED, None, NOW + timedelta(seconds=10))
    # The last attempt fails even when a heavier weight exists.
    spent = decide(Outcome.TIMEOUT, replace(state(failures=0, max_attempts=1),
                                            weight="light", heavier="heavy"), NOW)
    assert (spent.status, spent.weight) == (JobStatus.FAILED, None)


@pytest.mark.parametrize("outcome", sorted(SPAWN_OUTCOMES), ids=str)
def test_the_spawn_failure_cap_fails_the_job_for_a_human(outcome: Outcome):
    """Seed 004: MAX_SPAWN_FAILURES -> failed + human action; a RAM-contention cap is
    actionable like the others (before, it failed quietly)."""
    capped = decide(outcome, replace(state(), spawn_failures=4, escalations=1), NOW,
                    max_spawn_failures=5)
    assert (capped.status, capped.actionable, capped.human_action) == (
        JobStatus.FAILED, True, True)
    assert capped.failure_reason == DEFAULT_RULES[outcome].failure_reason
    # Below the cap it is only a retry: nothing to alert on yet.
    retry = decide(outcome, replace(state(), spawn_failures=0, escalations=1), NOW,
                   max_spawn_failures=5)
    assert retry.status is JobStatus.QUEUED


@pytest.mark.parametrize("reason", sorted(QUIET_REASONS))
def test_a_jobs_own_mutex_collision_or_stale_duplicate_ends_it_quietly(reason: str):
    """Seed 004's taxonomy: neither is retried, neither is actionable, neither alerts."""
    for outcome, claimed in ((Outcome.FAILED, Outcome.FAILED), (Outcome.FAILED, None),
                             (Outcome.OK, None)):
        decision = quiet_ending(outcome, claimed, reason)
        assert decision is not None
        assert (decision.status, decision.failure_reason, decision.actionable,
                decision.human_action, decision.spend_failure) == (
            JobStatus.FAILED, reason, False, False, False)
    # The job's explicit word for another outcome stands, and so do herder's own endings.
    assert quiet_ending(Outcome.OK, Outcome.OK, reason) is None
    assert quiet_ending(Outcome.FAILED, Outcome.TRANSIENT, reason) is None
    assert quiet_ending(Outcome.TIMEOUT, None, reason) is None
    assert quiet_ending(Outcome.CANCELLED, None, reason) is None
    assert quiet_ending(Outcome.LOST, None, reason) is None
    assert quiet_ending(Outcome.FAILED, None, "implementation_error") is None
    assert quiet_ending(Outcome.FAILED, None, None) is None
