"""The fleet-wide cap (`/api/v1/fleet/cap`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt

from herder.core.model import (
    INT_MAX,
)
from herder.wire.base import (
    Body,
    Reply,
    Timestamp,
)


class FleetCapView(Reply):
    """`[fleet] emergency_max_workers` now: the fleet-wide cap on running jobs (None: no
    cap), whether an operator set it at run time (else herder.toml's), and the jobs
    running (claimed or running) against it."""

    max_workers: int | None
    at_run_time: bool = False
    updated_at: Timestamp | None = None
    updated_by: str | None = None
    running: int = 0


class FleetCapBody(Body):
    """`PUT /api/v1/fleet/cap`: a cap (a whole number, 0 or more), or null to lift it."""

    max_workers: Annotated[StrictInt, Field(ge=0, le=INT_MAX)] | None

