"""Jobs, attempts and events as plain JSON-ready dicts, for `--json`; the shapes are the HTTP
API's (`herder.wire`), so the CLI and the API print the same fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from herder.model import Job
from herder.wire import JobView


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_view(job: Job) -> dict[str, Any]:
    return JobView.of(job).model_dump(mode="json")
