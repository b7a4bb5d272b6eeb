"""Capacity arithmetic: windows, weights, shedding, bookable RAM (pure, no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.core.scheduling.capacity import (
    DEFAULT_WEIGHTS,
    NIGHT,
    PRIME,
    Shedding,
    WeightTable,
    WindowSchedule,
    bookable_gb,
    capacity_ratio,
)

CHAIN = ("light", "heavy", "playwright", "orchestrator")


def at(hour: int, minute: int = 0, tz: timezone = UTC) -> datetime:
    return datetime(2026, 7, 1, hour, minute, tzinfo=tz)


@pytest.mark.parametrize(
    ("clock", "window"),
    [
        ((19, 59), PRIME),
        ((20, 0), NIGHT),
        ((23, 59), NIGHT),
        ((0, 0), NIGHT),
        ((2, 59), NIGHT),
        ((3, 0), PRIME),
        ((12, 0), PRIME),
    ],
)
def test_default_night_is_20_to_03_utc_wrapping_midnight(clock, window):
    assert WindowSchedule().window_at(at(*clock)) == window


def test_window_is_read_on_the_schedules_wall_clock():
    berlin = WindowSchedule(timezone="Europe/Berlin")
    # 18:30 UTC is 20:30 in Berlin (CEST, +2) in July.
    assert berlin.window_at(at(18, 30)) == NIGHT
    assert WindowSchedule().window_at(at(18, 30)) == PRIME
    # The same instant expressed in another offset gives the same answer.
    plus_five = timezone(timedelta(hours=5))
    assert berlin.window_at(at(18, 30).astimezone(plus_five)) == NIGHT


def test_naive_now_is_taken_as_utc():
    assert WindowSchedule().window_at(datetime(2026, 7, 1, 21, 0)) == NIGHT
    assert WindowSchedule().window_at(datetime(2026, 7, 1, 9, 0)) == PRIME


def test_non_wrapping_and_empty_nights():
    early = WindowSchedule(night_start=time(1, 0), night_end=time(5, 0))
    assert early.window_at(at(0, 59)) == PRIME
    assert early.window_at(at(1, 0)) == NIGHT
    assert early.window_at(at(5, 0)) == PRIME
    never = WindowSchedule(night_start=time(4, 0), night_end=time(4, 0))
    assert {never.window_at(at(hour)) for hour in range(24)} == {PRIME}


def test_weight_table_matches_seed_004():
    assert {name: DEFAULT_WEIGHTS.budget(name) for name in DEFAULT_WEIGHTS.budgets} == {
        "light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0,
    }
    assert DEFAULT_WEIGHTS.chain == CHAIN
    with pytest.raises(KeyError):
        DEFAULT_WEIGHTS.budget("mystery")
    assert not DEFAULT_WEIGHTS.known("mystery")


def test_escalation_climbs_to_a_bigger_budget_then_ends():
    """The default chain lists playwright (6 GB) after heavy (8 GB): an escalation from
    heavy skips it for orchestrator (12 GB), since 6 GB would run out of memory again."""
    steps = []
    weight: str | None = "light"
    while weight is not None:
        steps.append(weight)
        weight = DEFAULT_WEIGHTS.heavier(weight)
    assert steps == ["light", "heavy", "orchestrator"]
    assert DEFAULT_WEIGHTS.heavier("playwright") == "orchestrator"
    assert DEFAULT_WEIGHTS.heavier("orchestrator") is None  # the ceiling
    assert DEFAULT_WEIGHTS.heavier("subagent") is None  # outside the chain
    assert DEFAULT_WEIGHTS.heavier("mystery") is None


def test_escalation_skips_steps_of_the_same_or_a_smaller_budget():
    table = WeightTable({"small": 2.0, "twin": 2.0, "less": 1.0, "big": 4.0, "top": 4.0},
                        ("small", "twin", "less", "big", "top"))
    assert table.heavier("small") == "big"
    assert table.heavier("twin") == "big"
    assert table.heavier("less") == "big"
    assert table.heavier("big") is None  # "top" books no more than "big"
    # A chain weight with no budget (Settings built in code) is never a step.
    assert WeightTable({"light": 3.0}).heavier("light") is None
    # The chain's order still ranks the caps as written.
    assert [table.rank(name) for name in ("small", "less", "top")] == [0, 2, 4]
    assert table.climb() == [
        "small -> big (past twin 2 GB, less 1 GB)", "twin -> big (past less 1 GB)",
        "less -> big", "big -> none (the ceiling; past top 4 GB)", "top -> none (the ceiling)"]


@given(st.dictionaries(st.sampled_from("abcdef"), st.floats(0.0, 64.0), min_size=1),
       st.permutations("abcdefg"), st.integers(0, 7), st.sampled_from("abcdefg"))
def test_escalation_never_books_less_ram(budgets, order, length, weight):
    """Whatever the budgets and the chain's order: an escalation moves further on in the
    chain to a strictly bigger budget, and None only when no such weight follows."""
    table = WeightTable(budgets, tuple(order[:length]))
    found = table.heavier(weight)
    if found is None:
        rank = table.rank(weight)
        assert rank < 0 or weight not in budgets or all(
            budgets.get(name, 0.0) <= budgets[weight] for name in table.chain[rank + 1:])
    else:
        assert table.budget(found) > table.budget(weight)
        assert table.rank(found) > table.rank(weight)


def test_rank_and_allows():
    assert [DEFAULT_WEIGHTS.rank(name) for name in CHAIN] == [0, 1, 2, 3]
    assert DEFAULT_WEIGHTS.rank("subagent") == -1
    assert DEFAULT_WEIGHTS.allows(None, "orchestrator")
    assert DEFAULT_WEIGHTS.allows("heavy", "light")
    assert DEFAULT_WEIGHTS.allows("heavy", "heavy")
    assert not DEFAULT_WEIGHTS.allows("heavy", "playwright")
    assert DEFAULT_WEIGHTS.allows("light", "subagent")  # outside the chain: below everything


def test_weight_table_keeps_its_own_copy():
    budgets = {"light": 3.0}
    table = WeightTable(budgets)
    budgets["light"] = 99.0
    assert table.budget("light") == 3.0
    with pytest.raises(TypeError):
        table.budgets["light"] = 1.0  # type: ignore[index]


@given(st.sampled_from((None, *CHAIN)), st.sampled_from((*CHAIN, "subagent")))
def test_allows_is_monotone_along_the_chain(cap, weight):
    """A weight a cap admits is admitted by every heavier cap too."""
    if DEFAULT_WEIGHTS.allows(cap, weight) and cap is not None:
        heavier = DEFAULT_WEIGHTS.heavier(cap)
        assert heavier is None or DEFAULT_WEIGHTS.allows(heavier, weight)


@pytest.mark.parametrize(
    ("ratio", "max_weight"),
    [
        (1.0, None),
        (0.75, None),
        (0.74, "heavy"),
        (0.5, "heavy"),
        (0.49, "heavy"),
        (0.25, "heavy"),
        (0.24, "light"),
        (0.0, "light"),
    ],
)
def test_seed_003_shedding_table(ratio, max_weight):
    assert Shedding().max_weight(ratio) == max_weight


def test_shedding_below_every_threshold_takes_the_last_step():
    assert Shedding(((0.5, None), (0.2, "heavy"))).max_weight(0.1) == "heavy"


def test_shedding_steps_must_descend():
    with pytest.raises(ValueError, match="highest"):
        Shedding(((0.25, "heavy"), (0.75, None)))
    with pytest.raises(ValueError, match="at least one"):
        Shedding(())


def test_bookable_ram_is_80_percent_of_what_the_os_leaves():
    assert bookable_gb(32, 4) == pytest.approx(22.4)
    assert bookable_gb(8, 2) == pytest.approx(4.8)
    assert bookable_gb(10, 0, fraction=1.0) == 10.0
    assert bookable_gb(4, 8) == 0.0


@given(st.floats(0, 1024), st.floats(0, 1024), st.floats(0.01, 1))
def test_bookable_is_never_negative_nor_above_the_total(total, reserved, fraction):
    bookable = bookable_gb(total, reserved, fraction)
    assert 0.0 <= bookable <= total + 1e-9


def test_capacity_ratio():
    assert capacity_ratio(3, 4) == 0.75
    assert capacity_ratio(0, 4) == 0.0
    # No enabled slots is not a loss of capacity: nothing to shed for.
    assert capacity_ratio(0, 0) == 1.0
