"""The circuit breaker per host and job type, as a pure function of the attempt history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from herder.core.model import Outcome
from herder.core.scheduling.breaker import BreakerState, Ended, breaker

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def history(*outcomes: Outcome, last_ended: float = 10.0) -> list[Ended]:
    """Newest first, a minute apart, the newest `last_ended` seconds ago."""
    return [Ended(outcome, ago(last_ended + 60 * index)) for index, outcome in enumerate(outcomes)]


T, OK, FAILED = Outcome.TRANSIENT, Outcome.OK, Outcome.FAILED


def test_two_transient_outcomes_leave_it_closed():
    state = breaker(history(T, T, OK), None, NOW)
    assert (state.state, state.transient_in_a_row, state.blocks) == (BreakerState.CLOSED, 2,
                                                                     False)


def test_three_in_a_row_open_it_for_the_pause():
    state = breaker(history(T, T, T, OK), None, NOW)
    assert (state.state, state.blocks, state.until) == (
        BreakerState.OPEN, True, ago(10) + timedelta(seconds=300))
    assert "3 transient outcomes in a row" in state.describe()


def test_after_the_pause_it_is_half_open_for_one_trial_job():
    closed_for = history(T, T, T, last_ended=301)
    state = breaker(closed_for, None, NOW)
    assert (state.state, state.blocks) == (BreakerState.HALF_OPEN, False)
    # The trial runs (it started after the pause): nothing more until its outcome.
    trying = breaker(closed_for, ago(0.5), NOW)
    assert (trying.state, trying.blocks) == (BreakerState.HALF_OPEN, True)
    assert "one job is trying" in trying.describe()
    # A job still running from before the breaker opened is no trial.
    assert not breaker(closed_for, ago(3600), NOW).blocks


def test_the_trial_s_outcome_closes_it_or_opens_it_again():
    assert breaker(history(OK, T, T, T), None, NOW).state is BreakerState.CLOSED
    assert breaker(history(FAILED, T, T, T), None, NOW).state is BreakerState.CLOSED
    again = breaker(history(T, T, T, T, last_ended=1), None, NOW)
    assert (again.state, again.transient_in_a_row) == (BreakerState.OPEN, 4)


@given(st.lists(st.sampled_from([T, OK, FAILED, Outcome.LOST]), max_size=8),
       st.floats(min_value=0, max_value=10_000), st.none() | st.floats(0, 10_000))
def test_it_blocks_only_after_a_run_of_transient_outcomes(outcomes, last, running):
    state = breaker(history(*outcomes, last_ended=last),
                    None if running is None else ago(running), NOW)
    if state.blocks:
        assert outcomes[:3] == [T, T, T]
    if outcomes[:3] != [T, T, T]:
        assert state.state is BreakerState.CLOSED
