"""How a batch of attempt results is split into finish statements (pure code: no store)."""

from __future__ import annotations

from datetime import UTC, datetime

from herder.core.model import AttemptResult, AttemptToken, Decision, JobStatus, Outcome
from herder.store.parameters import finish_groups

DONE = Decision(JobStatus.DONE)
RETRY = Decision(JobStatus.QUEUED, available_at=datetime(2026, 1, 1, tzinfo=UTC),
                 spend_failure=True)


def result(job_id: int, attempt: int, decision: Decision = DONE,
           outcome: Outcome = Outcome.OK, exit_code: int | None = 0) -> AttemptResult:
    return AttemptResult(AttemptToken(job_id, attempt), outcome, exit_code, decision)


def test_a_batch_sharing_one_decision_is_one_group_holding_the_callers_tokens():
    results = [result(job_id, 1) for job_id in (3, 1, 2)]
    [(key, tokens, held)] = finish_groups(results)
    assert key == (Outcome.OK, 0, DONE, None, None)
    assert tokens == {3: 1, 1: 1, 2: 1}
    assert all(held[r.token.job_id] is r.token for r in results)


def test_equal_decisions_group_together_and_different_ones_apart():
    results = [result(1, 1), result(2, 1, Decision(JobStatus.DONE)),  # equal, not identical
               result(3, 2, RETRY, Outcome.FAILED, 1), result(4, 1, exit_code=None),
               result(5, 1)]
    groups = {key: tokens for key, tokens, _ in finish_groups(results)}
    assert groups == {
        (Outcome.OK, 0, DONE, None, None): {1: 1, 2: 1, 5: 1},
        (Outcome.FAILED, 1, RETRY, None, None): {3: 2},
        (Outcome.OK, None, DONE, None, None): {4: 1},
    }


def test_two_attempts_of_one_job_go_to_separate_statements():
    groups = finish_groups([result(1, 1), result(1, 2), result(2, 1)])
    assert [tokens for _, tokens, _ in groups] == [{1: 1, 2: 1}, {1: 2}]


def test_a_repeated_token_keeps_its_first_result():
    first = result(1, 1, RETRY, Outcome.FAILED, 1)
    groups = finish_groups([first, result(1, 1), result(2, 1)])
    assert [(key, tokens) for key, tokens, _ in groups] == [
        ((Outcome.FAILED, 1, RETRY, None, None), {1: 1}),
        ((Outcome.OK, 0, DONE, None, None), {2: 1})]


def test_results_with_different_reports_go_to_separate_groups():
    """An attempt's report (its verdict's evidence, cost, result) is its own: it is written
    into the attempt's `finished` event, so only results with the same report share one."""
    results = [result(1, 1), AttemptResult(AttemptToken(2, 1), Outcome.OK, 0, DONE,
                                           '{"cost_usd": 0.5}'), result(3, 1)]
    assert [(key[3], tokens) for key, tokens, _ in finish_groups(results)] == [
        (None, {1: 1, 3: 1}), ('{"cost_usd": 0.5}', {2: 1})]
