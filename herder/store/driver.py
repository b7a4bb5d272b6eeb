"""What a store needs from its database, per dialect (as River's drivers): connections and
transactions, the named queries in the dialect's placeholder style, parameter and column
adapters (time, JSON), a wake-up for other processes, and the few operations whose
statements or locking must differ: submitting (SQLite splits a job over two tables), claim
(`BEGIN IMMEDIATE` vs `FOR UPDATE SKIP LOCKED`), finish, the migrations' runner and the
leader lease.

The store's logic is written once over this protocol (`Store` in base.py). A driver
operation runs the query of its own name; the event rows the set-based writes make are one
SQL text for both dialects (`sql/events.sql`).
"""

from __future__ import annotations

import abc
import re
import sqlite3
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec

from herder.core.errors import StoreUnavailable
from herder.core.model import InsertResult

Row = dict[str, Any]

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_NAMED_PARAMETER = re.compile(r"(?<![:\w]):(\w+)")
_PSYCOPG_PARAMETER = re.compile(r"%\(\w+\)s")
_EVENTS = re.compile(r"^[ \t]*\{\{ events\.(\w+) \}\}[ \t]*$", re.MULTILINE)

SQL = Path(__file__).with_name("sql")
"""The package's SQL files, read by path: `importlib.resources` would add its imports
(zipfile, tempfile) to every command (figure in bench/README.md), and herder is installed as
plain files."""


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
    for name, body in queries.items():
        if _PSYCOPG_PARAMETER.search(body):
            raise ValueError(f"query {name!r} has a %(name)s parameter: write it :name")
    return {name: dialect_text(dialect, body) for name, body in queries.items()}


def dialect_text(dialect: str, body: str) -> str:
    """A query in the dialect's terms: its `{{ job_records }}` and, for PostgreSQL, its
    placeholders."""
    body = body.replace("{{ job_records }}", JOB_RECORDS[dialect])
    return body if dialect == "sqlite" else postgres_placeholders(body)


def postgres_placeholders(text: str) -> str:
    """`:name` parameters as psycopg's `%(name)s` (a `::type` cast is left alone)."""
    return _NAMED_PARAMETER.sub(r"%(\1)s", text.replace("%", "%%"))


def lost_session_errors(psycopg: ModuleType) -> tuple[type[Exception], ...]:
    """PostgreSQL errors that mean the session failed, not the statement's logic: the server
    is down or restarting, cancelled a statement past its timeout, or ended a session left
    idle in a transaction (an InternalError to psycopg, yet the connection is gone)."""
    return (psycopg.OperationalError, psycopg.errors.IdleInTransactionSessionTimeout)


def as_unavailable(error: BaseException) -> StoreUnavailable | None:
    """The database failed after connect (down, restarting, locked, an I/O error): the same
    StoreUnavailable the edges already answer with one line, or None for any other error."""
    if isinstance(error, StoreUnavailable):
        return error
    psycopg = sys.modules.get("psycopg")  # not imported: it cannot be a PostgreSQL error
    if isinstance(error, sqlite3.OperationalError) or (
            psycopg is not None and isinstance(error, lost_session_errors(psycopg))):
        detail = " ".join(str(error).split()) or type(error).__name__
        unavailable = StoreUnavailable(f"the database is unavailable: {detail}")
        unavailable.__cause__ = error
        return unavailable
    return None


class Lease(abc.ABC):
    """Leadership: at most one holder at a time across every process on the store."""

    @abc.abstractmethod
    def try_acquire(self) -> bool:
        """True while this process holds the lease (re-checked on every call)."""

    @abc.abstractmethod
    def release(self) -> None: ...


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

    @abc.abstractmethod
    def script(self, text: str) -> None:
        """Run a migration file (several statements, no parameters)."""

    @abc.abstractmethod
    def job_insert(self, specs: Sequence[Mapping[str, Any]], release: Sequence[str],
                   now: datetime) -> list[InsertResult]:
        """Insert jobs (`spec_params` each) with their `submitted` events, after releasing
        the `release` dedup keys from done jobs; a dedup conflict returns the holder."""


class Driver(abc.ABC):
    """One dialect's connections, placeholders and adapters."""

    dialect: str
    queries: Mapping[str, str]
    conflict: type[Exception]
    """What a statement raises when a unique index refuses its row."""
    schema_read_first: bool
    """Whether `migrate` reads the schema version before taking the migration lock, and
    stops there when it is current (else every open waits for the lock)."""

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
    def migration(self) -> AbstractContextManager[Transaction]:
        """A transaction that holds off every other migrator until it ends, with no
        statement timeout."""

    def job_insert(self, specs: Sequence[Mapping[str, Any]], release: Sequence[str],
                   now: datetime) -> list[InsertResult]:
        """`Transaction.job_insert` in a transaction of its own."""
        with self.transaction() as transaction:
            return transaction.job_insert(specs, release, now)

    @abc.abstractmethod
    def job_claim(self, params: Mapping[str, Any]) -> dict[str, Sequence[Any]] | None:
        """Run job_claim (`host`, `worker`, `limit`, `now`, `detail`, `blocked`) with its
        `claimed` events: the claimed jobs' columns, each column's values in claim order
        (priority, id; JSON and times decoded), None for no job. Two claimers never take
        one job."""

    @abc.abstractmethod
    def attempt_finish(self, groups: Sequence[Mapping[str, Any]]
                       ) -> list[list[tuple[int, int, str]]]:
        """Run attempt_finish (with its `finished` events) for each group's parameters (its
        tokens as `Json({job_id: attempt})`), all in one transaction: each group's applied
        (job id, attempt, status)."""

    @abc.abstractmethod
    def leader_lease(self) -> Lease:
        """The lease that elects one leader among every process on this database."""

    @abc.abstractmethod
    def listen(self) -> Waker:
        """A waker that returns early when another process may have changed the store."""

    @abc.abstractmethod
    def close(self) -> None: ...
