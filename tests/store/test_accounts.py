"""Accounts in the store, on both backends: declared and updated without touching their
health, health marks and their clearing, sessions counted from live attempts bound to the
account and capped by it, and the env never read by the list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from herder.core.model import Account, AttemptResult, Decision, JobSpec, JobStatus, Outcome
from herder.store import Store

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def claimed(store: Store, count: int = 1, host: str = "h1"):
    store.job_insert([JobSpec(command=("true",)) for _ in range(count)], T0)
    return store.job_claim(host, "w1", count, at(1))


def test_an_account_is_declared_listed_without_its_env_and_removed(store: Store):
    store.account_upsert(Account("h1", "main", {"API_KEY": "s3cret"}, 2,
                                 frozenset({"fix"}), ("probe", "--json")), T0)
    store.account_upsert(Account("h2", "other", source="cli"), T0)
    [record] = store.account_list("h1")
    assert record.account.name == "main" and record.account.env == {}
    assert (record.account.max_sessions, record.account.job_types, record.account.probe) == (
        2, frozenset({"fix"}), ("probe", "--json"))
    assert record.sessions == 0 and record.health.depleted_until is None
    assert [r.account.source for r in store.account_list()] == ["config", "cli"]
    assert store.account_env("h1", "main") == {"API_KEY": "s3cret"}
    assert store.account_delete("h2", "other") and not store.account_delete("h2", "other")
    assert [r.account.name for r in store.account_list()] == ["main"]


def test_health_marks_survive_a_redeclaration_and_a_success_clears_them(store: Store):
    store.account_upsert(Account("h1", "main"), T0)
    assert store.account_mark_depleted("h1", "main", at(3600), at(1))
    assert store.account_mark_revoked("h1", "main", at(2))
    assert store.account_record_probe("h1", "main", True, at(3))
    store.account_upsert(Account("h1", "main", max_sessions=3), at(4))
    [record] = store.account_list()
    assert record.account.max_sessions == 3
    assert (record.health.depleted_until, record.health.auth_revoked_at,
            record.health.dead_token, record.health.probed_at) == (at(3600), at(2), True, at(3))
    assert store.account_clear("h1", "main", at(5))
    assert not store.account_clear("h1", "main", at(6))
    [record] = store.account_list()
    assert (record.health.depleted_until, record.health.auth_revoked_at,
            record.health.dead_token) == (None, None, True)
    assert not store.account_mark_depleted("h1", "nobody", at(9), at(9))


def test_sessions_are_live_attempts_bound_to_the_account_up_to_its_cap(store: Store):
    store.account_upsert(Account("h1", "main", max_sessions=1), T0)
    first, second = claimed(store, 2)
    assert store.attempt_bind_account(first.token, "h1", "main", 1, at(2))
    assert not store.attempt_bind_account(second.token, "h1", "main", 1, at(2))
    [record] = store.account_list()
    assert record.sessions == 1
    assert store.attempt_get_account(first.token) == ("h1", "main")
    assert store.attempt_get_account(second.token) is None
    [event] = [e for e in store.event_list(first.id) if e.kind == "account"]
    assert event.detail == {"account": "main", "host": "h1"}
    decision = Decision(JobStatus.DONE)
    store.attempt_finish([AttemptResult(first.token, Outcome.OK, 0, decision)], at(3))
    assert store.job_clear_account(first.id)
    assert store.account_list()[0].sessions == 0
    assert store.attempt_bind_account(second.token, "h1", "main", 1, at(4))


def test_an_ending_teaches_the_account_it_ran_under(store: Store):
    """record_ending, where herder up and the server judge attempts: a revoked login stamps
    the account, a success clears it, and the ended attempt frees its session."""
    from herder.core.scheduling.accounts import AccountRules
    from herder.runtime.sources import OutcomeRules, PolicyLimits, record_ending

    limits = PolicyLimits(5, 5, 300.0, OutcomeRules(accounts=AccountRules({"adhoc": None})))
    store.account_upsert(Account("h1", "main", max_sessions=2), T0)
    revoked, fine = claimed(store, 2)
    for job in (revoked, fine):
        assert store.attempt_bind_account(job.token, "h1", "main", 2, at(2))
    assert store.account_list()[0].sessions == 2
    assert record_ending(store, revoked, Outcome.AUTH_REVOKED, at(3), limits) is (
        JobStatus.FAILED)
    [record] = store.account_list()
    assert (record.health.auth_revoked_at, record.sessions) == (at(3), 1)
    assert record_ending(store, fine, Outcome.OK, at(4), limits) is JobStatus.DONE
    [record] = store.account_list()
    assert (record.health.auth_revoked_at, record.sessions) == (None, 0)
