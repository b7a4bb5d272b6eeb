"""The store's alerts: opened, cleared, and handed to delivery once."""

from __future__ import annotations

from datetime import datetime

from herder.store.driver import Driver
from herder.store.records import Alert
from herder.store.rows import alert_from_row


class AlertStore:
    """Alert operations of `Store` (a mixin over its driver)."""

    driver: Driver

    def alert_open(self, key: str, message: str, now: datetime) -> bool:
        """True when newly opened; an open alert with the same key dedups it."""
        return bool(self.driver.write("alert_open", {"key": key, "message": message,
                                                     "now": now}))

    def alert_record(self, key: str, message: str, now: datetime) -> None:
        """An alert already over and sent by someone else: kept for `herder alerts`, never
        sent."""
        self.driver.write("alert_record", {"key": key, "message": message, "now": now})

    def alert_clear(self, key: str, now: datetime) -> bool:
        return bool(self.driver.write("alert_clear", {"key": key, "now": now}))

    def alert_list(self, open_only: bool = True, limit: int = 100) -> list[Alert]:
        return [alert_from_row(row) for row in self.driver.read(
            "alert_list", {"open_only": open_only, "limit": limit})]

    def alert_list_since(self, since: datetime) -> list[Alert]:
        """The open alerts and those opened or cleared since `since`, oldest first: what
        alert delivery weighs (herder.alerting)."""
        return [alert_from_row(row) for row in self.driver.read(
            "alert_list_since", {"since": since})]

    def alert_mark_sent(self, alert_id: int, now: datetime) -> bool:
        """Record that the opening was handed to delivery; False when another process did
        it first (so only one of them sends it)."""
        return bool(self.driver.write("alert_mark_sent", {"id": alert_id, "now": now}))

    def alert_mark_resolved_sent(self, alert_id: int, now: datetime) -> bool:
        """Record that the clearing was handed to delivery; False when already recorded."""
        return bool(self.driver.write("alert_mark_resolved_sent",
                                      {"id": alert_id, "now": now}))
