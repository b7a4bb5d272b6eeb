"""How much a host may take: RAM budgets per weight, time windows, and fleet-wide shedding.

All of it is arithmetic over plain values; the clock is an argument, never read here. The
defaults are herder.toml's, from the settings module.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, time
from types import MappingProxyType
from zoneinfo import ZoneInfo

import msgspec

from herder.core.settings.fleet import DEFAULT_WEIGHTS as DEFAULT_BUDGETS
from herder.core.settings.fleet import ESCALATION_CHAIN, SHEDDING_STEPS
from herder.core.settings.sections import DEFAULTS, Settings

PRIME = "prime"
NIGHT = "night"
NIGHT_START = time.fromisoformat(DEFAULTS.fleet.night_start)
NIGHT_END = time.fromisoformat(DEFAULTS.fleet.night_end)


class WindowCaps(msgspec.Struct, frozen=True):
    """What a host takes during one window; `max_weight=None` means any weight."""

    max_workers: int
    max_weight: str | None = None


class WindowSchedule(msgspec.Struct, frozen=True):
    """Splits the day into prime and night, so hosts can run more (or nothing) at night.

    The night runs from `night_start` (inclusive) to `night_end` (exclusive) on the wall
    clock of `timezone` and may wrap midnight (the default 20:00–03:00 does). Equal start
    and end mean there is no night at all.
    """

    timezone: str = DEFAULTS.fleet.timezone
    night_start: time = NIGHT_START
    night_end: time = NIGHT_END

    def window_at(self, now: datetime) -> str:
        """"prime" or "night" at `now`; a naive `now` is taken as UTC."""
        if now.tzinfo is None:
            now = now.replace(tzinfo=UTC)
        clock = now.astimezone(ZoneInfo(self.timezone)).time().replace(tzinfo=None)
        start, end = self.night_start, self.night_end
        if start <= end:
            return NIGHT if start <= clock < end else PRIME
        return NIGHT if clock >= start or clock < end else PRIME


DEFAULT_SCHEDULE = WindowSchedule()


class WeightTable(msgspec.Struct, frozen=True):
    """RAM budget per weight and the escalation chain that orders them.

    The chain's order ranks weights for window and shedding caps as written; an escalation
    follows it too, but only ever to a larger budget (`heavier`). Weights outside the chain
    (e.g. `subagent`, which books no host RAM) rank below every chain weight, so any window
    or shedding cap lets them through.
    """

    budgets: Mapping[str, float]
    chain: tuple[str, ...] = ESCALATION_CHAIN

    def __post_init__(self) -> None:
        # A private read-only copy: the table is shared by every cycle and must not drift.
        msgspec.structs.force_setattr(self, "budgets", MappingProxyType(dict(self.budgets)))

    @classmethod
    def from_settings(cls, settings: Settings) -> WeightTable:
        """`[weights]` and `[fleet] escalation`; the chain keeps only the weights these
        Settings define (a loaded herder.toml names no others)."""
        return cls(dict(settings.weights),
                   tuple(w for w in settings.fleet.escalation if w in settings.weights))

    def budget(self, weight: str) -> float:
        """GB booked by one attempt of this weight; KeyError for an unknown weight."""
        return self.budgets[weight]

    def known(self, weight: str) -> bool:
        return weight in self.budgets

    def rank(self, weight: str) -> int:
        """Index in the chain; -1 (below everything) for weights outside it."""
        try:
            return self.chain.index(weight)
        except ValueError:
            return -1

    def allows(self, max_weight: str | None, weight: str) -> bool:
        """Whether a cap of `max_weight` (None = no cap) admits `weight`."""
        return max_weight is None or self.rank(weight) <= self.rank(max_weight)

    def heavier(self, weight: str) -> str | None:
        """The next weight to escalate to: the first one after `weight` in the chain whose
        budget is strictly larger, since an escalation that books less RAM (the default
        chain's heavy 8 GB -> playwright 6 GB) would run out of memory again. None at the
        ceiling (no larger budget further on), outside the chain, or for a weight without a
        budget; a chain weight without a budget is never a step."""
        rank = self.rank(weight)
        budget = self.budgets.get(weight)
        if rank < 0 or budget is None:
            return None
        return next((name for name in self.chain[rank + 1:]
                     if self.budgets.get(name, budget) > budget), None)

    def climb(self) -> list[str]:
        """Where each chain weight escalates to, and the steps it passes over for booking no
        more, e.g. "heavy -> orchestrator (past playwright 6 GB)" (`herder doctor`)."""
        lines = []
        for rank, weight in enumerate(self.chain):
            target = self.heavier(weight)
            end = self.rank(target) if target is not None else len(self.chain)
            passed = ", ".join(f"{name} {self.budgets.get(name, 0):g} GB"
                               for name in self.chain[rank + 1:end])
            notes = [*(["the ceiling"] if target is None else []),
                     *([f"past {passed}"] if passed else [])]
            lines.append(f"{weight} -> {target or 'none'}"
                         + (f" ({'; '.join(notes)})" if notes else ""))
        return lines


DEFAULT_WEIGHTS = WeightTable(DEFAULT_BUDGETS)


class Shedding(msgspec.Struct, frozen=True):
    """Fleet capacity ratio → the heaviest weight still placed, so a shrunken fleet keeps
    its remaining slots for the light, urgent work.

    `steps` go from the highest threshold down; the first threshold the ratio reaches
    decides, and a ratio below every threshold gets the last step's weight.
    """

    steps: tuple[tuple[float, str | None], ...] = SHEDDING_STEPS

    def __post_init__(self) -> None:
        thresholds = [threshold for threshold, _ in self.steps]
        if not thresholds:
            raise ValueError("shedding needs at least one step")
        if thresholds != sorted(thresholds, reverse=True):
            raise ValueError("shedding steps must go from the highest ratio down")

    def max_weight(self, ratio: float) -> str | None:
        for threshold, weight in self.steps:
            if ratio >= threshold:
                return weight
        return self.steps[-1][1]


SEED_SHEDDING = Shedding()


def bookable_gb(total_gb: float, reserved_gb: float,
                fraction: float = DEFAULTS.fleet.bookable_fraction) -> float:
    """RAM the scheduler may book on a host: a fraction of what the OS reservation leaves,
    so measured use above the budgets still has headroom (e.g. 0.8 × (32 − 4) = 22.4)."""
    return max(0.0, fraction * (total_gb - reserved_gb))


def capacity_ratio(healthy_slots: int, enabled_slots: int) -> float:
    """Share of the enabled slots that sit on hosts accepting work.

    With no enabled slots at all the ratio is 1.0: nothing was lost, and every host is
    already refused for being drained or closed, so shedding would only blur the reason.
    """
    if enabled_slots <= 0:
        return 1.0
    return min(1.0, max(0.0, healthy_slots / enabled_slots))
