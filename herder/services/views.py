"""Jobs, attempts and events as plain JSON-ready dicts, for `--json`; the shapes are the HTTP
API's (`herder.wire`), so the CLI and the API print the same fields."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from herder.core.model import AccountRecord, Job
from herder.store.records import Alert
from herder.wire.accounts import AccountView
from herder.wire.alerts import AlertView
from herder.wire.jobs import JobView


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def job_view(job: Job) -> dict[str, Any]:
    return JobView.model_validate(job).model_dump(mode="json")


def account_view(record: AccountRecord, now: datetime, cooldown: float) -> AccountView:
    """One account for `herder accounts` and `GET /api/v1/accounts` alike."""
    from herder.core.scheduling.accounts import state_of

    account, health = record.account, record.health
    condition, why = state_of(health, now, cooldown)
    return AccountView(
        host=account.host, name=account.name, state=str(condition),
        detail="healthy (probe: unknown)" if (
            condition == "healthy" and account.probe and health.dead_token is None) else why,
        sessions=record.sessions, max_sessions=account.max_sessions,
        job_types=None if account.job_types is None else sorted(account.job_types),
        source=account.source, depleted_until=health.depleted_until,
        auth_revoked_at=health.auth_revoked_at, dead_token=health.dead_token,
        usage_percent=health.usage.percent, usage_resets_at=health.usage.resets_at)


def alert_view(alert: Alert) -> AlertView:
    return AlertView(id=alert.id, key=alert.key, message=alert.message,
                     opened_at=alert.opened_at, cleared_at=alert.cleared_at,
                     sent_at=alert.sent_at, resolved_sent_at=alert.resolved_sent_at,
                     sent_count=alert.sent_count)
