"""Issue 24 item 1, rotation: an attempt that hits its account's usage limit or finds its
login revoked runs again at once under another account, with nothing spent; only when no
account anywhere can serve it does the job wait (for the earliest reset) or fail for a human.
Accounts are ranked by the quota headroom their probe reports; one nearly spent is passed
over; usage fields that are missing, malformed or out of range are unknown (fail-open).
Each depleted or revoked account raises `account:<host>:<name>`, cleared with it.

Pure functions first, then the store on both backends (record_ending and bind_jobs, where
`herder up`, local hosts and the server judge and bind attempts). The end-to-end runs under
`herder up` and through an agent are in tests/test_accounts.py."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from herder.core.model import (
    Account,
    AccountHealth,
    AccountRecord,
    Decision,
    HostRecord,
    JobSpec,
    JobStatus,
    Outcome,
    Usage,
)
from herder.core.scheduling.accounts import (
    AccountRules,
    AccountState,
    Rotation,
    coerce_probe,
    coerce_usage,
    pick,
    rotated,
    rotation,
    state_of,
    usable_at,
)
from herder.runtime.accounts import (
    accounts_why,
    record_probes,
    sync_account_alerts,
    usage_report,
    went_again_at_once,
)
from herder.runtime.endings import (
    Ending,
    OutcomeRules,
    PolicyLimits,
    bind_jobs,
    record_ending,
)
from herder.services.views import account_view
from herder.store import Store

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
BOOLEANS = {"credentials_present": True, "has_refresh_token": True, "access_expired": False}


def at(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def probe_text(**usage: object) -> str:
    return json.dumps({**BOOLEANS, **usage})


# -- the probe's usage fields ---------------------------------------------------------------


def test_a_probe_may_add_its_quota_usage_and_reset():
    found = coerce_probe(probe_text(usage_percent=42.5, resets_at="2030-01-01T17:00:00+00:00"))
    assert found is not None and not found.dead
    assert found.usage == Usage(42.5, datetime(2030, 1, 1, 17, tzinfo=UTC))
    # Epoch seconds, an offset other than UTC, one field alone, an integer percentage.
    found = coerce_probe(probe_text(resets_at=1893517200))
    assert found is not None and found.usage == Usage(None, datetime.fromtimestamp(
        1893517200, UTC))
    found = coerce_probe(probe_text(usage_percent=100, resets_at="2030-01-01T18:00:00+01:00"))
    assert found is not None and found.usage == Usage(100.0, datetime(2030, 1, 1, 17,
                                                                      tzinfo=UTC))
    # The booleans alone still work (the usage is unknown), as before.
    found = coerce_probe(json.dumps(BOOLEANS))
    assert found is not None and found.usage == Usage()


@pytest.mark.parametrize(("percent", "resets_at"), [
    (-0.1, None), (100.01, None), (True, None), ("50", None), (None, None), ([50], None),
    (float("nan"), None), (float("inf"), None), ({"v": 1}, None),
    (None, "tomorrow"), (None, "2030-01-01T17:00:00"), (None, "2030-13-01T00:00:00Z"),
    (None, False), (None, -1e20), (None, 1e20), (None, "9" * 100), (None, [2030]),
    (None, "1970-01-01T00:00:00Z"), (10**400, -10**400), (None, 10**400),
])
def test_bad_usage_fields_are_unknown_and_keep_the_booleans(percent: object,
                                                             resets_at: object):
    """Out of range, the wrong type, not finite, no offset, far past or future: unknown."""
    text = json.dumps({**BOOLEANS, "usage_percent": percent, "resets_at": resets_at},
                      allow_nan=True)  # NaN and Infinity: Python's json reads them back
    found = coerce_probe(text)
    assert found is not None and not found.dead
    assert found.usage == Usage()


def test_keys_besides_the_booleans_and_usage_still_make_the_probe_say_nothing():
    assert coerce_probe(probe_text(usage_percent=10, token="sk-1")) is None
    assert coerce_probe(json.dumps({"usage_percent": 10, "resets_at": 1893517200})) is None


@settings(max_examples=300, deadline=None)
@given(percent=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                         st.text(max_size=20), st.lists(st.integers(), max_size=2)),
       resets_at=st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                           st.text(max_size=40), st.datetimes().map(str)))
def test_any_usage_values_give_a_usable_verdict_or_unknown(percent: object,
                                                           resets_at: object):
    """Whatever a probe (or an agent's heartbeat) says, coercion never raises, a known
    percentage is within 0-100, a known reset is aware, and the state is decided."""
    usage = coerce_usage(percent, resets_at)
    if usage.percent is not None:
        assert 0 <= usage.percent <= 100 and math.isfinite(usage.percent)
    if usage.resets_at is not None:
        assert usage.resets_at.utcoffset() == timedelta(0)
    state, why = state_of(AccountHealth(usage=usage), NOW)
    assert state in (AccountState.HEALTHY, AccountState.NEAR_LIMIT) and why


# -- the exclusion rule and the ranking -----------------------------------------------------


@pytest.mark.parametrize(("percent", "resets_in", "excluded", "usable"), [
    (99.0, None, True, None),                      # spent; only a new probe can tell
    (99.5, 3600, True, 3600),                      # spent until its reset
    (100, 3 * 86400, True, 3 * 86400),
    (95.0, 86400 + 60, True, 60),                  # 95 % and the reset over a day away
    (97.0, 2 * 86400, True, 86400),
    (95.0, 86400, False, None),                    # reset within a day: still chosen
    (98.9, None, False, None),                     # 95 % with its reset unknown: fail-open
    (94.9, 30 * 86400, False, None),
    (99.9, -1, False, None),                       # its reset passed: the figure is stale
    (None, 3600, False, None),
])
def test_an_account_nearly_spent_is_passed_over(percent: float | None, resets_in: int | None,
                                                excluded: bool, usable: int | None):
    usage = Usage(percent, None if resets_in is None else at(resets_in))
    health = AccountHealth(dead_token=False, usage=usage)
    state, why = state_of(health, NOW)
    assert (state is AccountState.NEAR_LIMIT) is excluded, why
    if excluded:
        assert why.startswith(f"near_limit: usage {percent:g}%")
        assert usable_at(health, NOW) == (None if usable is None else at(usable))
        choice = pick([Account("h", "a")], {"a": health}, {}, "t", None, NOW)
        assert choice.account is None and choice.refusals == (("a", why),)
        assert choice.resume_at == (None if usable is None else at(usable))


def test_accounts_are_ranked_by_the_quota_their_probe_reports():
    accounts = [Account("h", name, max_sessions=2) for name in ("a", "b", "c", "d")]
    healths = {"a": AccountHealth(dead_token=False, usage=Usage(80.0, at(3600))),
               "b": AccountHealth(dead_token=False, usage=Usage(20.0, at(3600))),
               "c": AccountHealth(dead_token=False),
               "d": AccountHealth(dead_token=False, usage=Usage(99.5, at(3600)))}
    assert pick(accounts, healths, {}, "t", None, NOW).account == accounts[1]
    # The most quota left wins over free sessions; unknown usage comes after known.
    assert pick(accounts, healths, {"b": 1}, "t", None, NOW).account == accounts[1]
    assert pick(accounts[:1] + accounts[2:], healths, {}, "t", None, NOW).account == (
        accounts[0])
    # A stale figure (its reset passed) is unknown again.
    stale = {**healths, "b": AccountHealth(dead_token=False, usage=Usage(20.0, at(-1)))}
    assert pick(accounts, stale, {}, "t", None, NOW).account == accounts[0]


def test_the_accounts_view_shows_usage_and_the_exclusion():
    record = AccountRecord(Account("h", "a", probe=("p",)),
                           AccountHealth(dead_token=False, usage=Usage(99.5, at(3600))))
    view = account_view(record, NOW, 1800)
    assert (view.state, view.usage_percent, view.usage_resets_at) == (
        "near_limit", 99.5, at(3600))
    assert view.detail == "near_limit: usage 99.5%, resets 2030-01-01T13:00:00Z"
    fine = AccountRecord(Account("h", "b"), AccountHealth(dead_token=False,
                                                          usage=Usage(12.0, None)))
    assert account_view(fine, NOW, 1800).detail == "healthy (usage 12%)"


def test_placement_names_the_nearly_spent_accounts_it_passes_over():
    """`herder why` and the fleet-stopped alert: the host refuses the type and each
    account's reason is listed, its headroom included."""
    from herder.core.scheduling.placement import Reason

    rules = AccountRules({"fix": None})
    spent = [AccountRecord(Account("h1", "a"), AccountHealth(
                 dead_token=False, usage=Usage(99.5, at(3600)))),
             AccountRecord(Account("h1", "b"), AccountHealth(
                 dead_token=False, usage=Usage(96.0, at(3 * 86400))))]
    reason, detail = rules.blocked(spent, ["h1"], NOW)["h1"]["fix"]
    assert reason is Reason.NO_HEALTHY_ACCOUNT
    assert detail == ("no healthy account for fix (0 of 2): a (near_limit: usage 99.5%, "
                      "resets 2030-01-01T13:00:00Z), b (near_limit: usage 96% with its reset "
                      "more than a day away, resets 2030-01-04T12:00:00Z)")
    fine = [*spent, AccountRecord(Account("h1", "c"), AccountHealth(
        dead_token=False, usage=Usage(94.0, at(3 * 86400))))]
    assert rules.blocked(fine, ["h1"], NOW) == {}


# -- rotation, pure ---------------------------------------------------------------------------

FIRST = ("h1", "first")
WAIT = Decision(JobStatus.QUEUED, available_at=at(3600), failure_reason="usage_blocked",
                avoid_host=True)
FAIL = Decision(JobStatus.FAILED, failure_reason="spawn_oauth_expired", actionable=True,
                human_action=True)


def records(*items: tuple[str, str, AccountHealth]) -> list[AccountRecord]:
    return [AccountRecord(Account(host, name), health) for host, name, health in items]


def test_another_healthy_account_serves_the_job_at_once_with_nothing_spent():
    found = rotation(records(("h1", "first", AccountHealth(depleted_until=at(3600))),
                             ("h2", "other", AccountHealth()),
                             ("h1", "second", AccountHealth())), FIRST, "t", None, NOW)
    assert found == Rotation(("h1", "second"), same_host=True)  # its own host first
    decision = rotated(WAIT, Outcome.USAGE_BLOCKED, found, FIRST, NOW)
    assert (decision.status, decision.available_at, decision.avoid_host) == (
        JobStatus.QUEUED, NOW, False)
    assert not (decision.spend_failure or decision.spend_transient or decision.spend_lost
                or decision.spend_spawn_failure or decision.actionable
                or decision.human_action)
    assert decision.failure_reason == "usage_blocked"
    assert "account first on h1 is depleted: runs again at once" in (decision.note or "")
    # A revoked login too: no human needed while another account works.
    decision = rotated(FAIL, Outcome.AUTH_REVOKED, found, FIRST, NOW)
    assert (decision.status, decision.human_action) == (JobStatus.QUEUED, False)


def test_an_account_on_another_host_serves_it_and_that_host_is_preferred():
    found = rotation(records(("h1", "first", AccountHealth(depleted_until=at(3600))),
                             ("h2", "other", AccountHealth())), FIRST, "t", None, NOW)
    assert found == Rotation(("h2", "other"), same_host=False)
    assert rotated(WAIT, Outcome.USAGE_BLOCKED, found, FIRST, NOW).avoid_host
    # A host that may not run the job (drained, refusing its type) does not count.
    held = rotation(records(("h1", "first", AccountHealth(depleted_until=at(3600))),
                            ("h2", "other", AccountHealth())), FIRST, "t", None, NOW,
                    hosts=frozenset({"h1"}))
    assert held == Rotation(resume_at=at(3600))


def test_when_every_account_is_blocked_the_job_waits_for_the_earliest_reset():
    found = rotation(records(("h1", "first", AccountHealth(depleted_until=at(7200))),
                             ("h1", "second", AccountHealth(depleted_until=at(600))),
                             ("h1", "dead", AccountHealth(dead_token=True))),
                     FIRST, "t", None, NOW)
    assert found == Rotation(resume_at=at(600))
    waiting = Decision(JobStatus.QUEUED, available_at=at(7200),
                       failure_reason="usage_blocked", avoid_host=True)
    decision = rotated(waiting, Outcome.USAGE_BLOCKED, found, FIRST, NOW)
    assert (decision.status, decision.available_at, decision.avoid_host) == (
        JobStatus.QUEUED, at(600), True)
    # Its own reset is the earliest: unchanged. A revoked login keeps its rule (a human).
    assert rotated(WAIT, Outcome.USAGE_BLOCKED, Rotation(resume_at=at(4000)), FIRST,
                   NOW) is WAIT
    assert rotated(FAIL, Outcome.AUTH_REVOKED, found, FIRST, NOW) is FAIL
    assert rotated(WAIT, Outcome.FAILED, Rotation(("h1", "x"), True), FIRST, NOW) is WAIT


def test_the_account_that_failed_the_job_never_serves_it_again_at_once():
    """Even when its mark did not stick (its stored health still says healthy), and
    accounts serving another type or not in the job type's list do not count."""
    healthy = AccountHealth()
    found = rotation([AccountRecord(Account("h1", "first"), healthy),
                      AccountRecord(Account("h1", "typed", job_types=frozenset({"x"})),
                                    healthy),
                      AccountRecord(Account("h1", "unlisted"), healthy)],
                     FIRST, "t", frozenset({"first", "typed"}), NOW)
    assert found == Rotation()


HEALTHS = st.one_of(
    st.just(AccountHealth()),
    st.builds(AccountHealth, depleted_until=st.integers(-100, 100_000).map(at)),
    st.builds(AccountHealth, auth_revoked_at=st.integers(-4000, 0).map(at)),
    st.builds(AccountHealth, dead_token=st.booleans()),
    st.builds(AccountHealth, usage=st.builds(Usage, st.floats(0, 100),
                                             st.one_of(st.none(),
                                                       st.integers(-10, 300_000).map(at)))),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["h1", "h2"]), HEALTHS), min_size=1, max_size=6),
       st.sampled_from([Outcome.USAGE_BLOCKED, Outcome.AUTH_REVOKED]))
def test_rotation_never_loops(accounts: list[tuple[str, AccountHealth]], outcome: Outcome):
    """A job goes again at once only to another account that is healthy now, which this
    ending cannot have been: each rotation spends one usable account, so a job meets at
    most as many at-once retries as there are accounts before it waits or fails; and a
    wait is never in the past."""
    items = [AccountRecord(Account(host, f"a{i}"), health)
             for i, (host, health) in enumerate(accounts)]
    marked = (items[0].account.host, items[0].account.name)
    found = rotation(items, marked, "t", None, NOW)
    decision = rotated(WAIT if outcome is Outcome.USAGE_BLOCKED else FAIL, outcome, found,
                       marked, NOW)
    if found.serves is not None:
        assert found.serves != marked
        [served] = [r for r in items if (r.account.host, r.account.name) == found.serves]
        assert state_of(served.health, NOW)[0] is AccountState.HEALTHY
        assert decision.status is JobStatus.QUEUED and decision.available_at == NOW
    elif outcome is Outcome.USAGE_BLOCKED:
        assert decision.available_at is not None and decision.available_at > NOW
    else:
        assert decision is FAIL


# -- on both backends: record_ending and bind_jobs ---------------------------------------------

LIMITS = PolicyLimits(5, 5, 300.0, OutcomeRules(accounts=AccountRules({"adhoc": None})))


def two_accounts(store: Store, second_host: str = "h1") -> None:
    store.account_upsert(Account("h1", "first", {"WHO": "first"}), NOW)
    store.account_upsert(Account(second_host, "second", {"WHO": "second"}), NOW)


def claim_and_bind(store: Store, when: datetime, host: str = "h1"):  # type: ignore[no-untyped-def]
    [job] = store.job_claim(host, "w1", 1, when)
    [bound] = bind_jobs(store, host, [job], when, LIMITS)
    assert store.attempt_start(bound.token, 4242, "/dev/null", when)
    return bound


def avoided(store: Store, job_id: int, when: datetime) -> str | None:
    [due] = [job for job in store.job_list_due(when, 10) if job.id == job_id]
    return due.avoid_host


def open_alerts(store: Store) -> dict[str, str]:
    return {alert.key: alert.message for alert in store.alert_list()}


def test_a_limited_job_runs_again_at_once_under_the_other_account(store: Store):
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert job.env["WHO"] == "first"  # both unknown and free: by name
    status = record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS,
                           resume_at=at(3600))
    assert status is JobStatus.QUEUED
    queued = store.job_get(job.id)
    assert queued is not None and queued.available_at == at(2)  # at once
    assert (queued.failures, queued.transient_attempts, queued.spawn_failures,
            queued.lost) == (0, 0, 0, 0)
    assert (queued.failure_reason, avoided(store, job.id, at(2))) == ("usage_blocked", None)
    [finished] = [e for e in store.event_list(job.id) if e.kind == "finished"]
    assert "runs again at once (account second on h1" in finished.detail["note"]
    depleted = {r.account.name: r.health.depleted_until for r in store.account_list()}
    assert depleted == {"first": at(3600), "second": None}
    alerts = open_alerts(store)
    assert alerts.keys() == {"account:h1:first"}
    assert "account first on h1 is depleted until 2030-01-01T13:00:00Z" in alerts[
        "account:h1:first"]

    again = claim_and_bind(store, at(2))  # the depleted account is skipped
    assert (again.attempt, again.env["WHO"]) == (2, "second")
    assert store.attempt_get_account(again.token) == ("h1", "second")
    assert record_ending(store, again, Outcome.OK, at(3), LIMITS) is JobStatus.DONE
    # first is still depleted: its alert stays until its reset passes.
    assert sync_account_alerts(store, at(3599)) == {"opened": 0, "cleared": 0}
    assert sync_account_alerts(store, at(3600)) == {"opened": 0, "cleared": 1}
    assert open_alerts(store) == {}


def test_all_accounts_blocked_one_after_the_other_wait_for_the_earliest_reset(store: Store):
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS,
                         resume_at=at(600)) is JobStatus.QUEUED
    again = claim_and_bind(store, at(2))
    assert again.env["WHO"] == "second"
    assert record_ending(store, again, Outcome.USAGE_BLOCKED, at(3), LIMITS,
                         resume_at=at(7200)) is JobStatus.QUEUED
    waiting = store.job_get(job.id)
    assert waiting is not None and waiting.available_at == at(600)  # first's reset
    assert (waiting.failures, waiting.transient_attempts, waiting.spawn_failures) == (0, 0, 0)
    assert not store.job_claim("h1", "w1", 1, at(599))
    assert accounts_why(store, LIMITS.rules.accounts, "adhoc", at(4)) == (
        "accounts: h1/first depleted until 2030-01-01T12:10:00Z, "
        "h1/second depleted until 2030-01-01T14:00:00Z")
    assert accounts_why(store, LIMITS.rules.accounts, "other", at(4)) is None
    assert open_alerts(store).keys() == {"account:h1:first", "account:h1:second"}
    # first's reset passes: it serves the job, its alert clears, second's stays.
    third = claim_and_bind(store, at(600))
    assert (third.attempt, third.env["WHO"]) == (3, "first")
    assert record_ending(store, third, Outcome.OK, at(601), LIMITS) is JobStatus.DONE
    assert open_alerts(store).keys() == {"account:h1:second"}


def test_a_job_goes_again_at_once_only_once_in_a_row(store: Store):
    """A job whose output says every account it meets is spent (a prompt-injected agent)
    spends two accounts, not all: after one at-once rotation, the next failure waits for
    the first blocked account to turn usable, though a third is healthy; a success in
    between lets it rotate again."""
    for name in ("first", "second", "third"):
        store.account_upsert(Account("h1", name, {"WHO": name}), NOW)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS,
                         resume_at=at(600)) is JobStatus.QUEUED
    again = claim_and_bind(store, at(2))
    assert (again.attempt, again.env["WHO"]) == (2, "second")
    assert record_ending(store, again, Outcome.USAGE_BLOCKED, at(3), LIMITS,
                         resume_at=at(7200)) is JobStatus.QUEUED
    waiting = store.job_get(job.id)
    assert waiting is not None and waiting.available_at == at(600)  # not third, at once
    assert (waiting.failures, waiting.spawn_failures) == (0, 0)
    [*_, finished] = [e for e in store.event_list(job.id) if e.kind == "finished"]
    assert "failed it twice in a row" in finished.detail["note"]
    depleted = {r.account.name for r in store.account_list() if r.health.depleted_until}
    assert depleted == {"first", "second"}
    # third, healthy all along, still serves other jobs.
    store.job_insert([JobSpec(command=("agent",))], NOW)
    other = claim_and_bind(store, at(4))
    assert other.env["WHO"] == "third"
    assert record_ending(store, other, Outcome.OK, at(5), LIMITS) is JobStatus.DONE


def test_the_previous_attempt_decides_whether_it_went_again_at_once(store: Store):
    """Only the attempt before counts, a refusal skipped: usage_blocked, refused, now
    revoked is twice in a row; usage_blocked, ok-then-retried would not be."""
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert not went_again_at_once(store, job)
    record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS, resume_at=at(600))
    refused = store.job_claim("h1", "w1", 1, at(2))[0]
    record_ending(store, refused, Outcome.REFUSED, at(2), LIMITS)
    later = claim_and_bind(store, at(4))
    assert later.attempt == 3 and went_again_at_once(store, later)
    assert record_ending(store, later, Outcome.AUTH_REVOKED, at(5), LIMITS) is (
        JobStatus.FAILED)  # no third account, and twice in a row: a human acts


def test_pure_rotation_with_serve_off_names_only_when_the_first_blocked_turns_usable():
    accounts = records(("h1", "first", AccountHealth(depleted_until=at(3600))),
                       ("h1", "second", AccountHealth(depleted_until=at(900))),
                       ("h1", "third", AccountHealth()))
    assert rotation(accounts, FIRST, "t", None, NOW).serves == ("h1", "third")
    held = rotation(accounts, FIRST, "t", None, NOW, serve=False)
    assert held == Rotation(resume_at=at(900))
    decision = rotated(WAIT, Outcome.USAGE_BLOCKED, held, FIRST, NOW, again=True)
    assert decision.available_at == at(900)
    assert "twice in a row" in (decision.note or "")
    assert rotated(FAIL, Outcome.AUTH_REVOKED, held, FIRST, NOW, again=True) is FAIL


def test_a_revoked_login_on_one_of_two_accounts_runs_the_job_under_the_other(store: Store):
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert record_ending(store, job, Outcome.AUTH_REVOKED, at(2), LIMITS) is JobStatus.QUEUED
    queued = store.job_get(job.id)
    assert queued is not None and (queued.available_at, queued.failures) == (at(2), 0)
    assert open_alerts(store).keys() == {"account:h1:first"}  # no job:<id>:human_action
    assert "must log it in again" in open_alerts(store)["account:h1:first"]
    again = claim_and_bind(store, at(2))
    assert (again.id, again.env["WHO"]) == (job.id, "second")
    # With no other account left, a revoked login fails the job for a human, as before.
    assert record_ending(store, again, Outcome.AUTH_REVOKED, at(4), LIMITS) is (
        JobStatus.FAILED)
    failed = store.job_get(job.id)
    assert failed is not None and failed.human_action
    assert f"job:{job.id}:human_action" in open_alerts(store)
    # `herder account clear` and the next sync clear the account's alert.
    store.account_clear("h1", "first", at(5))
    assert sync_account_alerts(store, at(5))["cleared"] == 1
    assert "account:h1:first" not in open_alerts(store)


def test_an_account_on_another_host_takes_it_and_the_host_is_avoided(store: Store):
    two_accounts(store, second_host="h2")
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS,
                         resume_at=at(3600)) is JobStatus.QUEUED
    queued = store.job_get(job.id)
    assert queued is not None and queued.available_at == at(2)
    assert avoided(store, job.id, at(2)) == "h1"
    again = claim_and_bind(store, at(2), host="h2")
    assert again.env["WHO"] == "second"


def test_a_job_on_no_account_is_never_rotated(store: Store):
    """An attempt that ran under no account (it was not bound) marks nothing: its rule
    applies, so nothing can bounce on it."""
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    [job] = store.job_claim("h1", "w1", 1, at(1))
    assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), LIMITS,
                         resume_at=at(3600)) is JobStatus.QUEUED
    queued = store.job_get(job.id)
    assert queued is not None and queued.available_at == at(3600)
    assert open_alerts(store) == {}


def test_a_heartbeat_usage_ranks_and_excludes_accounts_and_bad_values_fail_open(store: Store):
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",)) for _ in range(3)], NOW)
    # An agent's heartbeat: first nearly spent with its reset two days away, second fine.
    record_probes(store, "h1", {"first": False, "second": False}, at(1), {
        "first": {"usage_percent": 96, "resets_at": at(2 * 86400).isoformat()},
        "second": {"usage_percent": 30.5, "resets_at": None}})
    health = {r.account.name: r.health for r in store.account_list()}
    assert health["first"].usage == Usage(96.0, at(2 * 86400))
    assert health["second"].usage == Usage(30.5, None)
    assert claim_and_bind(store, at(2)).env["WHO"] == "second"
    # Second at its limit too: no account, and the wait ends when first's reset is a day off.
    record_probes(store, "h1", {"first": False, "second": False}, at(3), {
        "first": {"usage_percent": 96, "resets_at": at(2 * 86400).isoformat()},
        "second": {"usage_percent": 99.0}})
    [job] = store.job_claim("h1", "w1", 1, at(4))
    assert bind_jobs(store, "h1", [job], at(4), LIMITS) == []
    waiting = store.job_get(job.id)
    assert waiting is not None and waiting.failure_reason == "no_healthy_account"
    assert waiting.available_at == at(86400)
    # Garbage from a heartbeat is unknown: both accounts are candidates again (fail-open).
    record_probes(store, "h1", {"first": False, "second": False}, at(5), {
        "first": {"usage_percent": "96", "resets_at": "soon"}, "second": [99]})
    assert {r.account.name: r.health.usage for r in store.account_list()} == {
        "first": Usage(), "second": Usage()}
    assert claim_and_bind(store, at(5)).env["WHO"] == "first"
    # What a probe said goes into the heartbeat as JSON and comes back the same.
    said = coerce_probe(probe_text(usage_percent=12, resets_at="2030-01-02T00:00:00Z"))
    report = json.loads(json.dumps(usage_report({"first": said, "second": None})))
    record_probes(store, "h1", {"first": False, "second": None}, at(6), report)
    assert [r.health.usage for r in store.account_list()] == [
        Usage(12.0, datetime(2030, 1, 2, tzinfo=UTC)), Usage()]


def test_a_job_that_ended_on_its_own_quiet_word_is_not_rotated(store: Store):
    """A job whose $HERDER_RESULT says mutex_collision (a sibling holds its work) ends,
    without a retry, even when its log also shows a revoked key and another account could
    serve it: its own word wins over its log (policy.quiet_ending)."""
    two_accounts(store)
    store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    ending = Ending(log_tail="Error: 401 Unauthorized: invalid x-api-key\n",
                    result=json.dumps({"failure_reason": "mutex_collision"}))
    assert record_ending(store, job, Outcome.FAILED, at(2), LIMITS, ending=ending,
                         exit_code=1) is JobStatus.FAILED
    ended = store.job_get(job.id)
    assert ended is not None and ended.failure_reason == "mutex_collision"
    assert not (ended.actionable or ended.human_action)


@pytest.mark.parametrize("pin", ["affinity", "job_type_hosts"])
def test_an_account_on_a_host_the_job_may_not_run_on_does_not_serve_it(store: Store, pin: str):
    """A job held to h1 (its --host, or its type's `hosts`) whose h1 account is depleted
    waits for that reset: the healthy account on h2 cannot run it."""
    two_accounts(store, second_host="h2")
    for label in ("h1", "h2"):
        store.host_insert(HostRecord(label=label, ram_total_gb=16.0), NOW)
    limits = LIMITS
    if pin == "affinity":
        store.job_insert([JobSpec(command=("agent",), affinity="h1")], NOW)
    else:
        limits = PolicyLimits(5, 5, 300.0, OutcomeRules(
            accounts=AccountRules({"adhoc": None}), pinned={"adhoc": frozenset({"h1"})}))
        store.job_insert([JobSpec(command=("agent",))], NOW)
    job = claim_and_bind(store, at(1))
    assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2), limits,
                         resume_at=at(3600)) is JobStatus.QUEUED
    queued = store.job_get(job.id)
    assert queued is not None and queued.available_at == at(3600)


def test_herder_up_alone_honours_a_jobs_host_and_its_types_pin(store: Store):
    """No host registered (`herder up`): claims honour --host and the type's `hosts`, so
    an account elsewhere cannot serve a job held by either; one held by neither rotates."""
    two_accounts(store, second_host="h2")
    accounts = AccountRules({"adhoc": None})
    loose = PolicyLimits(5, 5, 300.0, OutcomeRules(accounts=accounts))
    pinned = PolicyLimits(5, 5, 300.0, OutcomeRules(
        accounts=accounts, pinned={"adhoc": frozenset({"h1"})}))
    store.job_insert([JobSpec(command=("agent",), affinity="h1"), JobSpec(command=("agent",)),
                      JobSpec(command=("agent",))], NOW)
    ended = {}
    for step, limits in enumerate((loose, pinned, loose)):
        job = claim_and_bind(store, at(1 + 2 * step))
        assert record_ending(store, job, Outcome.USAGE_BLOCKED, at(2 + 2 * step), limits,
                             resume_at=at(3600)) is JobStatus.QUEUED
        ended[step] = job.id
        store.account_clear("h1", "first", at(2 + 2 * step))
    waits = [store.job_get(ended[step]) for step in range(3)]
    assert [job.available_at for job in waits if job is not None] == [
        at(3600), at(3600), at(6)]
