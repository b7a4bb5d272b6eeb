"""Operators' alert view (`/api/v1/alerts`)."""

from __future__ import annotations

from herder.wire.base import (
    Reply,
    Timestamp,
)


class AlertView(Reply):
    id: int
    key: str
    message: str
    opened_at: Timestamp
    cleared_at: Timestamp | None
    sent_at: Timestamp | None = None
    """When its opening went to the delivery queue (None: not sent, or held back)."""
    resolved_sent_at: Timestamp | None = None
    sent_count: int = 0

