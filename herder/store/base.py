"""The store: one concrete class over a dialect's driver, composed of a mixin per domain noun.

A store method and its SQL query share one name in both dialects (`job_claim`, ...), so one
grep finds the Python call and its SQL (shared, or one version per dialect); the method lives
in the module of its name's first word (`job_` in jobs.py, `attempt_` and `event_` in
attempts.py, `host_`, `reservation_`, `account_` and `runner_` in hosts.py, `token_` and
`session_` in access.py, `alert_` in alerts.py); migrations, the leader lease and fleet
settings are here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime

from herder.core.errors import StoreUnavailable
from herder.store.access import AccessStore
from herder.store.alerts import AlertStore
from herder.store.attempts import AttemptStore
from herder.store.driver import SQL, Driver, Lease, Waker
from herder.store.hosts import HostStore
from herder.store.jobs import JobStore
from herder.store.records import FleetSetting


def refuse_newer_schema(current: int, migrations: Sequence[tuple[int, str, str]]) -> None:
    """A database migrated by a newer herder may have tables this code would misuse (v4 made
    the attempt history a view an older finish cannot insert into): stop at open instead."""
    known = max((version for version, _, _ in migrations), default=0)
    if current > known:
        raise StoreUnavailable(
            f"the database is at schema v{current}, newer than this herder knows (v{known}); "
            "upgrade herder on this machine (every process sharing a database needs the same "
            "or a newer version)")


def load_migrations(dialect: str) -> list[tuple[int, str, str]]:
    """(version, name, sql) sorted by version, from `sql/<dialect>/migrations/NNNN_name.sql`."""
    folder = SQL / dialect / "migrations"
    found = []
    for entry in folder.iterdir():
        match = re.match(r"^(\d{4})_(\w+)\.sql$", entry.name)
        if match:
            found.append((int(match.group(1)), match.group(2), entry.read_text()))
    return sorted(found)


class Store(JobStore, AttemptStore, HostStore, AccessStore, AlertStore):
    """Durable jobs, attempts and events. Every state change is a guarded statement.

    Written once, over `driver`: what differs between SQLite and PostgreSQL (connections
    and transactions, claim locking, the leader lease, migrations' runner) is the driver's
    (see driver.py)."""

    def __init__(self, url: str, driver: Driver) -> None:
        self.url = url
        self.driver = driver
        self.dialect = driver.dialect

    def migrate(self) -> list[int]:
        """Apply pending migrations; returns the versions applied."""
        migrations = load_migrations(self.dialect)
        if self.driver.schema_read_first:
            current = self.schema_version()
            refuse_newer_schema(current, migrations)
            if current == max((version for version, _, _ in migrations), default=0):
                return []  # the usual open: two reads, never waiting for a writer's lock
        applied: list[int] = []
        with self.driver.migration() as transaction:
            transaction.fetch("schema_table_create")
            current = int(transaction.fetch("schema_version")[0]["version"] or 0)
            refuse_newer_schema(current, migrations)
            for version, name, text in migrations:
                if version <= current:
                    continue
                transaction.script(text)
                transaction.fetch("schema_version_record", {
                    "version": version, "name": name, "now": datetime.now(UTC)})
                applied.append(version)
        return applied

    def schema_version(self) -> int:
        """The latest migration applied; 0 for a blank database."""
        if not self.driver.read("schema_table_exists")[0]["present"]:
            return 0
        return int(self.driver.read("schema_version")[0]["version"] or 0)

    def leader_lease(self) -> Lease:
        """Leadership among every process on this store."""
        return self.driver.leader_lease()

    def statistics_refresh(self) -> bool:
        """Refresh the planner's statistics of the jobs table when many rows changed since
        the last refresh; True when it ran. The claim's plan depends on them."""
        if not self.driver.read("statistics_stale")[0]["stale"]:
            return False
        self.driver.write("statistics_refresh")
        return True

    def notify(self, topic: str) -> None:
        """Wake listeners in other processes (PostgreSQL); SQLite's waker needs nothing."""
        self.driver.notify(topic)

    def listen(self) -> Waker:
        """A waker that returns early when jobs are submitted, requeued or cancelled."""
        return self.driver.listen()

    def fleet_setting_get(self, name: str) -> FleetSetting | None:
        """The run-time value of a fleet setting; None when herder.toml's holds."""
        rows = self.driver.read("fleet_setting_get", {"name": name})
        if not rows:
            return None
        row = rows[0]
        return FleetSetting(str(row["name"]), None if row["value"] is None
                            else int(row["value"]), row["updated_at"], str(row["updated_by"]))

    def fleet_setting_put(self, name: str, value: int | None, now: datetime, by: str) -> None:
        """Set (or with None, lift) a fleet setting for every replica, over herder.toml."""
        self.driver.write("fleet_setting_put", {"name": name, "value": value, "now": now,
                                                "by": by})

    def fleet_setting_delete(self, name: str) -> bool:
        """Hand a fleet setting back to herder.toml; False when it was not changed."""
        return bool(self.driver.write("fleet_setting_delete", {"name": name}))

    def close(self) -> None:
        self.driver.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
