"""What a store needs from its database, per dialect: connections and transactions, the
named queries in the dialect's placeholder style, parameter and column adapters (time,
JSON), and a wake-up for other processes.

The store's logic is written once over this protocol (`Store` in base.py); what must differ
between SQLite and PostgreSQL (claim, finish, migrations, locking, the leader lease) stays
in each dialect's store, under the same query names. The event rows those per-dialect
writes make are one SQL text for both (`sql/events.sql`).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import msgspec

Row = dict[str, Any]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_NAMED_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")
_EVENTS = re.compile(r"^[ \t]*\{\{ events\.(\w+) \}\}[ \t]*$", re.MULTILINE)

SQL = Path(__file__).with_name("sql")
"""The package's SQL files, read by path: `importlib.resources` costs every command ~6 ms
of imports (zipfile, tempfile), and herder is installed as plain files."""


class Json(msgspec.Struct, frozen=True):
    """A parameter stored as JSON: each driver passes it in its dialect's form."""

    value: Any


def _named_blocks(path: str) -> Iterator[tuple[str, str]]:
    text = (SQL / path).read_text()
    parts = _NAME.split(text)
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        yield name, body.strip().rstrip(";")


JOB_RECORDS = {"sqlite": "herder_job_records", "postgres": "herder_jobs"}
"""What `{{ job_records }}` names in a query: each job with its spec (SQLite keeps the
spec in a table of its own and joins the two in a view; PostgreSQL keeps one row)."""


def load_queries(dialect: str) -> dict[str, str]:
    """The named SQL blocks a dialect runs, all written with `:name` parameters:
    `sql/queries.sql`, the queries both dialects share, then `sql/<dialect>/queries.sql`,
    the ones that must differ. A name lives in one of the two files only, so one grep finds
    it. A line `{{ events.<kind> }}` in a dialect's query is that kind's event INSERT from
    `sql/events.sql`, so both dialects write the same event rows with the same SQL."""
    events = dict(_named_blocks("events.sql"))
    queries: dict[str, str] = dict(_named_blocks("queries.sql"))
    for name, body in _named_blocks(f"{dialect}/queries.sql"):
        if name in queries:
            raise ValueError(f"query {name!r} is both shared and in sql/{dialect}/queries.sql")
        queries[name] = _EVENTS.sub(lambda match: events[match.group(1)], body)
    return {name: dialect_text(dialect, body) for name, body in queries.items()}


def dialect_text(dialect: str, body: str) -> str:
    """A query in the dialect's terms: its `{{ job_records }}` and, for PostgreSQL, its
    placeholders."""
    body = body.replace("{{ job_records }}", JOB_RECORDS[dialect])
    return body if dialect == "sqlite" else postgres_placeholders(body)


def postgres_placeholders(text: str) -> str:
    """`:name` parameters as psycopg's `%(name)s` (a `::type` cast is left alone)."""
    return _NAMED_PARAMETER.sub(r"%(\1)s", text.replace("%", "%%"))


class Waker(abc.ABC):
    """Blocks until the store may have new work (or the timeout passes)."""

    @property
    def connected(self) -> bool:
        """False while it cannot hear the store (it keeps trying to)."""
        return True

    @abc.abstractmethod
    def wait(self, timeout: float) -> bool:
        """True when woken by a change, False on timeout."""

    def wait_topics(self, timeout: float) -> set[str] | None:
        """The topics notified meanwhile: empty on timeout, None when woken without them
        (this dialect has none, or a reconnect may have lost some: anything may have
        changed)."""
        return None if self.wait(timeout) else set()

    @abc.abstractmethod
    def close(self) -> None: ...


class Transaction(abc.ABC):
    """Statements that commit together."""

    @abc.abstractmethod
    def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run the named query; its rows with Python values (datetimes, decoded JSON)."""

    @abc.abstractmethod
    def notify(self, topic: str) -> None:
        """Wake listeners in other processes once this transaction commits."""


class Driver(abc.ABC):
    """One dialect's connections, placeholders and adapters."""

    dialect: str
    queries: Mapping[str, str]
    conflict: type[Exception]
    """What a statement raises when a unique index refuses its row."""

    @abc.abstractmethod
    def read(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run a read-only query outside any transaction."""

    @abc.abstractmethod
    def write(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        """Run one writing statement in its own transaction."""

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[Transaction]:
        """Several statements that commit together (rolled back on an exception)."""

    @abc.abstractmethod
    def notify(self, topic: str) -> None:
        """Wake listeners in other processes now."""

    @abc.abstractmethod
    def listen(self) -> Waker:
        """A waker that returns early when another process may have changed the store."""

    @abc.abstractmethod
    def close(self) -> None: ...
