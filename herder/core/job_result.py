"""What a job may say of its own ending (`$HERDER_RESULT`), as a pydantic value: the
scheduling decisions read it, and the HTTP contract's request bodies share its strictness
(`Strict`), so the two refuse alike."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from herder.core.model import INT_MAX, JOB_OUTCOMES, Outcome
from herder.core.settings.fields import MAX_DURATION
from herder.core.submission import storable

Seconds = Annotated[float, Field(ge=0, le=MAX_DURATION, allow_inf_nan=False)]


class Strict(BaseModel):
    """A value read from outside: strict (no unknown fields), and every field storable."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _storable(cls, value: Any) -> Any:
        problem = storable(value, depth=1)
        if problem:
            raise ValueError(problem)
        return value


class JobResult(Strict):
    """What a job may write to `$HERDER_RESULT` (a JSON object) to say how it ended; it wins
    over the exit code and the log. Unknown fields make it invalid (a typo must not pass as
    a claim)."""

    summary: str | None = Field(default=None, max_length=4000)
    outcome: Outcome | None = None
    failure_reason: str | None = Field(default=None, max_length=100,
                                       pattern=r"^[a-z][a-z0-9_]*$")
    """Recorded as the job's failure_reason, e.g. mutex_collision or stale_duplicate."""
    cost_usd: float | None = Field(default=None, ge=0, le=1e9, allow_inf_nan=False)
    turns: int | None = Field(default=None, ge=0, le=INT_MAX)
    links: list[Annotated[str, Field(max_length=2000)]] = Field(default_factory=list,
                                                              max_length=50)
    retry_after: Seconds | None = None
    resume_at: datetime | None = None
    """When the job can run again (a quota's reset it saw); timezone-aware."""

    @field_validator("outcome")
    @classmethod
    def _claimable(cls, value: Outcome | None) -> Outcome | None:
        if value is not None and value not in JOB_OUTCOMES:
            raise ValueError(f"{value} is herder's to say; a job may claim one of "
                             f"{', '.join(sorted(JOB_OUTCOMES))}")
        return value

    @field_validator("resume_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("give a timezone, e.g. 2026-12-01T15:00:00+01:00")
        return value
