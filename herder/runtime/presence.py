"""`herder up`'s presence: what its loop writes so the machine shows like a host in the fleet
view, `herder hosts`, `/queue`, `/metrics` and `herder why`: its slots, the RAM its running
attempts book and the RAM the machine has. Never read by placement (`herder up` claims its
own work); an old write is a runner that died or froze."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import datetime

import psutil

from herder.core.model import RUNNER_PRESENCE_INTERVAL, AttemptToken, RunnerPresence
from herder.core.scheduling.capacity import WeightTable
from herder.runtime.executor import RunningAttempt
from herder.runtime.memory import GB, budget_bytes
from herder.runtime.steps import Steps


class Presence:
    """When a runner writes its presence: at once when its slots change, else every
    RUNNER_PRESENCE_INTERVAL (one write every few seconds, not one a turn)."""

    def __init__(self, label: str, worker: str, concurrency: int,
                 weights: WeightTable | None, started_at: datetime) -> None:
        self.label = label
        self.worker = worker
        self.concurrency = concurrency
        self.weights = weights
        self.started_at = started_at
        self.next_due = 0.0
        """Monotonic seconds when the next write is due, whatever changes."""
        self._sent: tuple[int, float] | None = None

    def publish(self, running: Mapping[AttemptToken, RunningAttempt], mono: float,
                now: datetime, steps: Steps, send: Callable[[RunnerPresence], None]) -> None:
        """Write the presence if it is due or the slots changed; a failed write is retried
        as a step of its own (it never holds up supervision)."""
        slots = (len(running), round(sum(budget_bytes(attempt.job, self.weights) or 0
                                         for attempt in running.values()) / GB, 3))
        if (slots == self._sent and mono < self.next_due) or not steps.retry(
                "presence").ready(mono):
            return  # backing off: no reading of the machine's RAM every turn meanwhile
        total, available = machine_ram_gb()
        presence = RunnerPresence(
            label=self.label, worker=self.worker, concurrency=self.concurrency,
            running=slots[0], cpus=os.cpu_count() or 1, ram_total_gb=total,
            ram_booked_gb=slots[1], ram_available_gb=available, started_at=self.started_at,
            last_turn_at=now)  # the store stamps it with the database's clock instead

        def write() -> bool:
            send(presence)
            return True

        if steps.call("presence", write, mono):
            self._sent = slots
            self.next_due = mono + RUNNER_PRESENCE_INTERVAL


def machine_ram_gb() -> tuple[float, float | None]:
    """The machine's RAM and what the kernel could give new work without swapping
    (MemAvailable); (0, None) where it cannot be read."""
    try:
        memory = psutil.virtual_memory()
    except (OSError, RuntimeError):
        return 0.0, None
    return round(memory.total / GB, 3), round(memory.available / GB, 3)
