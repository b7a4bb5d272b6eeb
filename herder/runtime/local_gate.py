"""The agent's own gate: its local allow-lists, checked on every assignment (fail-closed), and
the real free RAM it checks before spawning."""

from __future__ import annotations

from typing import Any

import msgspec
import psutil

from herder.core.model import Job

RAM_FACTOR = 1.2
"""Spawn only when MemAvailable covers the job's budget with 20% headroom: a job started
short of RAM would be killed by the OOM killer, so it ends as RAM contention (exit 3)
instead."""


class LocalGate(msgspec.Struct, frozen=True):
    """The agent's own allow-lists; None means "no local restriction"."""

    job_types: frozenset[str] | None = None
    weights: frozenset[str] | None = None
    priority_floor: int | None = None

    def view(self) -> dict[str, Any]:
        """Advertised to the server, so placement respects it and refusals stay rare."""
        return {
            "job_types": None if self.job_types is None else sorted(self.job_types),
            "weights": None if self.weights is None else sorted(self.weights),
            "priority_floor": self.priority_floor,
        }

    def refusal(self, job: Job) -> str | None:
        if self.job_types is not None and job.job_type not in self.job_types:
            return f"job type {job.job_type!r} is not allowed on this host"
        if self.weights is not None and job.weight not in self.weights:
            return f"weight {job.weight!r} is not allowed on this host"
        if self.priority_floor is not None and job.priority < self.priority_floor:
            return f"priority {job.priority} is below this host's floor {self.priority_floor}"
        return None


def mem_available_gb() -> float | None:
    """What the kernel could give new work without swapping (MemAvailable on Linux)."""
    try:
        return float(psutil.virtual_memory().available) / 1024**3
    except (OSError, RuntimeError):
        return None
