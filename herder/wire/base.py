"""The contract's shared pieces: the request and reply bases and the bounded field types."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from herder.core.job_result import Strict
from herder.core.model import BIGINT_MAX, INT_MAX, INT_MIN
from herder.core.submission import NAME_LENGTH

Timestamp = Annotated[datetime, PlainSerializer(datetime.isoformat, return_type=str,
                                                       when_used="json")]
"""Written as `datetime.isoformat()` (`+00:00`, not pydantic's `Z`), as before the models."""
Int32 = Annotated[int, Field(ge=INT_MIN, le=INT_MAX)]
Bytes = Annotated[int, Field(ge=0, le=BIGINT_MAX)]
JobNumber = Annotated[int, Field(ge=1, le=BIGINT_MAX)]
AttemptNumber = Annotated[int, Field(ge=1, le=INT_MAX)]
Name = Annotated[str, Field(max_length=NAME_LENGTH)]
Gigabytes = Annotated[float, Field(ge=0, le=1_000_000, allow_inf_nan=False)]


class Body(Strict):
    """A request body: strict (no unknown fields), and every field storable."""


class Reply(BaseModel):
    """A response body: fields a reader does not know are ignored. Built on first use, so
    a command that imports the contract for the submit body pays for no reply model. The
    server builds one from the core value of the same shape (`model_validate(job)`)."""

    model_config = ConfigDict(extra="ignore", defer_build=True, from_attributes=True)
