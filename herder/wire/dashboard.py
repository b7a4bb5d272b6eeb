"""The dashboard's own bodies (`/api/v1/dashboard/…`)."""

from __future__ import annotations

from herder.wire.base import (
    Reply,
)
from herder.wire.queue import QueueJob


class JobRow(QueueJob):
    """A row of the dashboard's jobs view: a queued job says why it waits (`herder why`)."""

    dedup_key: str | None
    max_attempts: int
    why: str | None = None



class JobPage(Reply):
    """`GET /api/v1/dashboard/jobs`: one page, newest first; `next_before` asks for the
    next (older) page, None on the last."""

    jobs: list[JobRow]
    next_before: int | None


class SessionView(Reply):
    """`GET /api/v1/dashboard/session`: who the dashboard's caller is and what it may do;
    `csrf` is the value a state-changing request sends in `X-Herder-CSRF` (signed in with a
    cookie only)."""

    name: str
    scope: str
    can_submit: bool
    can_admin: bool
    csrf: str | None

