"""What every group of operations works on: the store, the config, and the server's hooks
(wake the scheduler after a change; a recent placement for `why` on a page of jobs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from herder.core.settings.loading import Config
from herder.store import Store

if TYPE_CHECKING:
    from herder.core.fleet import Fleet
    from herder.core.scheduling.placement import Plan, Snapshot

    Placement = Callable[[set[int]], tuple[Plan, Snapshot]]
    """Given the ids of due jobs, a placement that saw them (the server reuses its own)."""


def nothing() -> None:
    """No scheduler to wake: against the database, `herder up` polls the store."""


class OperationsBase:
    store: Store
    config: Config
    on_change: Callable[[], None]
    """Told after a change that may place work now (a submit, a lifted cap)."""
    placement: Placement | None

    def _fleet(self) -> Fleet:
        from herder.core.fleet import Fleet

        return Fleet.from_settings(self.config.settings)
