"""A runner's calls to the store or server, each a step of its own: a failed step backs off
and is retried on a later turn, and never holds up the others (supervision first)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from herder.runtime.pending_results import Retry

log = logging.getLogger("herder.runner")
T = TypeVar("T")

BUSY_TICK = 0.02
"""A turn's shortest wait while attempts run, and the soonest a failed heartbeat is retried."""


class Steps:
    """Each named step's retry clock."""

    def __init__(self) -> None:
        self._retries: dict[str, Retry] = {}

    def retry(self, step: str) -> Retry:
        return self._retries.setdefault(step, Retry())

    def due(self, mono: float) -> list[float]:
        """When the steps backing off now may be tried again."""
        return [retry.due for retry in self._retries.values() if retry.due > mono]

    def call(self, step: str, call: Callable[[], T], mono: float) -> T | None:
        """One call to the store or server: on failure log it, back this step off and let
        the turn go on (None); the other steps, supervision first, do not wait for it."""
        retry = self.retry(step)
        if not retry.ready(mono):
            return None
        try:
            value = call()
        except Exception as exc:
            delay = retry.failed(mono)
            log.error("runner turn failed in %s (%s: %s); retrying in %.2fs", step,
                      type(exc).__name__, exc, delay)
            return None
        retry.succeeded()
        return value
