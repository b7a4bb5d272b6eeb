"""attempt_finish applies every field of the outcome table's decisions, on both backends:
the transient budget, weight escalation, host avoidance, the flags, and the attempt's
report in its `finished` event."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from herder.core.model import AttemptResult, Decision, JobSpec, JobStatus, Outcome
from herder.store import Store

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def started_job(store: Store, host: str = "h1") -> int:
    [inserted] = store.job_insert([JobSpec(command=("true",), weight="light")], T0)
    [job] = store.job_claim(host, "w1", 1, at(1))
    assert store.attempt_start(job.token, 4242, "/tmp/log", at(2))
    return inserted.job_id


def test_a_transient_outcome_spends_its_own_budget_and_records_its_report(store: Store):
    job_id = started_job(store)
    job = store.job_get(job_id)
    assert job is not None
    report = json.dumps({"source": "log", "evidence": "API Error: 429", "cost_usd": 0.12,
                         "outcome": "not this"})
    decision = Decision(JobStatus.QUEUED, available_at=at(120), failure_reason="transient",
                        spend_transient=True)
    assert store.attempt_finish([AttemptResult(job.token, Outcome.TRANSIENT, 1, decision,
                                               report)], at(3)) == [(job.token,
                                                                     JobStatus.QUEUED)]
    after = store.job_get(job_id)
    assert after is not None
    assert (after.transient_attempts, after.failures, after.spawn_failures, after.lost) == (
        1, 0, 0, 0)
    assert (after.failure_reason, after.available_at, after.actionable) == (
        "transient", at(120), False)
    [finished] = [e for e in store.event_list(job_id) if e.kind == "finished"]
    assert finished.detail == {"source": "log", "evidence": "API Error: 429",
                               "cost_usd": 0.12, "outcome": "transient", "exit_code": 1}
    # The claim hands the counters to the runner that decides the next time.
    [again] = store.job_claim("h1", "w1", 1, at(121))
    assert again.transient_attempts == 1


def test_an_escalation_moves_the_job_to_the_heavier_weight(store: Store):
    job_id = started_job(store)
    job = store.job_get(job_id)
    assert job is not None
    decision = Decision(JobStatus.QUEUED, available_at=at(3), failure_reason="spawn_oom",
                        spend_spawn_failure=True, weight="heavy", actionable=True)
    store.attempt_finish([AttemptResult(job.token, Outcome.OOM, 2, decision)], at(3))
    after = store.job_get(job_id)
    assert after is not None
    assert (after.weight, after.escalations, after.spawn_failures, after.actionable) == (
        "heavy", 1, 1, True)


def test_a_host_caused_outcome_avoids_the_host_and_a_human_one_says_so(store: Store):
    job_id = started_job(store, host="h7")
    job = store.job_get(job_id)
    assert job is not None
    waits = Decision(JobStatus.QUEUED, available_at=at(3600), failure_reason="usage_blocked",
                     avoid_host=True)
    store.attempt_finish([AttemptResult(job.token, Outcome.USAGE_BLOCKED, 5, waits)], at(3))
    after = store.job_get(job_id)
    assert after is not None
    assert (after.failures, after.transient_attempts) == (0, 0)
    [due] = store.job_list_due(at(3600), 10)
    assert due.avoid_host == "h7"

    [second] = store.job_claim("h8", "w1", 1, at(3601))
    revoked = Decision(JobStatus.FAILED, failure_reason="spawn_oauth_expired",
                       actionable=True, human_action=True)
    store.attempt_finish([AttemptResult(second.token, Outcome.AUTH_REVOKED, 7, revoked)],
                         at(3602))
    failed = store.job_get(job_id)
    assert failed is not None
    assert (failed.status, failed.failure_reason, failed.actionable, failed.human_action) == (
        JobStatus.FAILED, "spawn_oauth_expired", True, True)


def test_the_breakers_history_is_each_host_and_types_newest_ended_attempts(store: Store):
    for index, (host, job_type, outcome) in enumerate([
            ("h1", "claude", Outcome.TRANSIENT), ("h1", "claude", Outcome.OK),
            ("h1", "claude", Outcome.TRANSIENT), ("h1", "claude", Outcome.TRANSIENT),
            ("h2", "claude", Outcome.FAILED), ("h1", "aider", Outcome.OK)]):
        [inserted] = store.job_insert([JobSpec(command=("true",), job_type=job_type)], at(index))
        [job] = store.job_claim(host, "w1", 1, at(index))
        assert job.id == inserted.job_id
        store.attempt_finish([AttemptResult(job.token, outcome, 0, Decision(
            JobStatus.DONE))], at(index + 0.5))
    [live] = store.job_insert([JobSpec(command=("true",), job_type="claude")], at(10))
    store.job_claim("h1", "w1", 1, at(11))
    recent = store.attempt_list_recent_outcomes(at(0.9), 2)
    assert recent == {
        ("h1", "claude"): [(Outcome.TRANSIENT, at(3.5)), (Outcome.TRANSIENT, at(2.5))],
        ("h2", "claude"): [(Outcome.FAILED, at(4.5))],
        ("h1", "aider"): [(Outcome.OK, at(5.5))]}
    assert store.job_list_running_types() == {("h1", "claude"): at(11)}
    assert live.created
