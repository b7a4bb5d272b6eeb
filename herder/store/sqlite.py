"""The embedded store: one SQLite file in WAL mode, safe for several processes on one machine.

`SQLiteDriver` is the dialect's driver (see driver.py): its own are the connections, the
adapters, and the statements and locking of submit, claim, finish, migrations and the lease.
Writes run in `BEGIN IMMEDIATE` transactions, so the write lock is taken up front and two
claimers can never read the same queued row and both update it; readers never block writers.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from herder.core.errors import InputError, StoreUnavailable
from herder.core.model import InsertResult, JobStatus
from herder.store.base import Store
from herder.store.driver import Driver, Json, Lease, Row, Transaction, Waker, load_queries
from herder.store.parameters import DEDUP_RELEASED_DETAIL
from herder.store.rows import object_from_json

Q = load_queries("sqlite")
_TIME_COLUMNS = frozenset(
    {
        "available_at", "created_at", "claimed_at", "started_at", "finished_at", "updated_at",
        "heartbeat_at", "ended_at", "at", "last_heartbeat", "expires_at", "opened_at",
        "cleared_at", "revoked_at", "depleted_until", "auth_revoked_at", "probed_at",
        "received_at", "sent_at", "resolved_sent_at", "usage_resets_at", "last_turn_at",
        "database_now",
    }
)
_JSON_COLUMNS = frozenset(
    {"command", "payload", "env", "detail", "allowed_job_types", "allowed_weights", "labels",
     "agent_info", "job_types", "probe", "job_ids"}
)
_SYNCHRONOUS = ("off", "normal", "full", "extra")
PAGE_SIZE = 2048


def from_epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _times(column: Sequence[float | None]) -> list[datetime | None]:
    """A time column's values: each distinct stamp is converted once per statement (a claim's
    rows share `now`, and jobs submitted together share their stamps); datetimes are
    immutable, so rows may share one."""
    decoded = {stamp: from_epoch(stamp) for stamp in set(column)}
    return [decoded[stamp] for stamp in column]


def _objects(column: Sequence[str | None]) -> list[Any]:
    """A JSON column's values, one parse per row: the results are mutable (the caller may
    change a job's payload), so no two rows share one."""
    return [object_from_json(text) for text in column]


def _commands(column: Sequence[str]) -> list[tuple[str, ...]]:
    """A command column's values as the tuples a Job holds, each distinct command parsed
    once per statement (a claim's jobs often run the same one; tuples may be shared)."""
    decoded = {text: tuple(json.loads(text)) for text in set(column)}
    return [decoded[text] for text in column]


# How a column is stored here -> how a statement's column of values is decoded.
_DECODE: dict[str, Any] = {
    **dict.fromkeys(_TIME_COLUMNS, _times), **dict.fromkeys(_JSON_COLUMNS, _objects),
    "command": _commands}


def _fetch(conn: sqlite3.Connection, sql: str, params: Mapping[str, Any]
           ) -> tuple[list[str], list[tuple[Any, ...]]]:
    """A statement's column names and rows as stored (epoch seconds, JSON text)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    values: list[tuple[Any, ...]] = cursor.execute(sql, params).fetchall()
    return [column[0] for column in cursor.description or ()], values


def _columns(names: list[str], values: list[tuple[Any, ...]]) -> dict[str, Sequence[Any]]:
    """Rows as {column name: its values in row order}, stored forms decoded column by column:
    which columns need decoding is worked out once per statement, not once per row."""
    return {name: column if decode is None else decode(column)
            for name, column, decode in zip(names, zip(*values, strict=True),
                                            (_DECODE.get(name) for name in names), strict=True)}


def _decode(names: list[str], values: list[tuple[Any, ...]]) -> list[Row]:
    """Rows as dicts with Python values."""
    if not values:
        return []
    columns = _columns(names, values)
    return [dict(zip(names, value, strict=True))
            for value in zip(*(columns[name] for name in names), strict=True)]


def _rows(conn: sqlite3.Connection, sql: str, params: Mapping[str, Any]) -> list[Row]:
    """A statement's rows as dicts with Python values."""
    return _decode(*_fetch(conn, sql, params))


def create_private(path: str) -> None:
    """A new database file is created 0600 (it holds jobs' env and accounts' credentials);
    SQLite gives its -wal and -shm the database file's mode."""
    if path == ":memory:" or path.startswith("file:"):
        return
    # There already, or not creatable: then sqlite3 says why, in its own terms.
    with suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def parse_sqlite_url(url: str) -> tuple[str, str]:
    """`sqlite:///rel/path.db`, `sqlite:////abs/path.db`, optional `?synchronous=normal`."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite":
        raise InputError("db", f"{url!r} is not a sqlite:// URL", "use sqlite:///path/herder.db")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise InputError("db", "the sqlite URL names no file", "use sqlite:///path/herder.db")
    options = parse_qs(parts.query)
    synchronous = options.pop("synchronous", ["full"])[-1].lower()
    if synchronous not in _SYNCHRONOUS:
        raise InputError(
            "db", f"synchronous={synchronous!r} is not valid", f"use one of {_SYNCHRONOUS}"
        )
    if options:
        raise InputError("db", f"unknown option(s) {sorted(options)}", "only synchronous=")
    return path, synchronous


class SQLiteWaker(Waker):
    """Polls `PRAGMA data_version`, which changes whenever another connection commits.

    The poll reads a counter in shared memory, so a 10 ms period costs next to nothing and
    needs no socket or file watch between processes.
    """

    def __init__(self, path: str, period: float = 0.01) -> None:
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._period = period
        self._version = self._read()

    def _read(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            version = self._read()
            if version != self._version:
                self._version = version
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(self._period, remaining))

    def close(self) -> None:
        self._conn.close()


class _SQLiteTransaction(Transaction):
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return _rows(self._conn, Q[name], _adapt(params))

    def notify(self, topic: str) -> None:
        """Nothing to send: every commit already moves `data_version` for the wakers."""

    def script(self, text: str) -> None:
        for statement in _split_statements(text):
            self._conn.execute(statement)

    def job_insert(self, specs: Sequence[Mapping[str, Any]], release: Sequence[str],
                   now: datetime) -> list[InsertResult]:
        """Each job is a state row and a spec row; the events are one statement at the end."""
        conn = self._conn
        stamp = now.timestamp()
        results: list[InsertResult] = []
        released = [row[0] for key in release for row in conn.execute(
            Q["job_dedup_release"], {"dedup_key": key, "now": stamp}).fetchall()]
        if released:
            conn.execute(Q["job_dedup_release_events"], {
                "job_ids": json.dumps(released), "now": stamp,
                "detail": json.dumps(DEDUP_RELEASED_DETAIL)})
        for spec in specs:
            params = _adapt(spec)
            row = conn.execute(Q["job_insert"], params).fetchone()
            if row is not None:
                params["job_id"] = row[0]
                conn.execute(Q["job_spec_insert"], params)
                results.append(InsertResult(int(row[0]), True, JobStatus.QUEUED))
                continue
            assert spec["dedup_key"] is not None, "insert without a dedup key cannot conflict"
            holder = conn.execute(
                Q["job_dedup_holder"], {"dedup_key": spec["dedup_key"]}).fetchone()
            results.append(InsertResult(int(holder[0]), False, JobStatus(holder[1])))
        created = [result.job_id for result in results if result.created]
        if created:
            conn.execute(Q["job_insert_events"], {"job_ids": json.dumps(created), "now": stamp})
        return results


class SQLiteDriver(Driver):
    """One connection per thread (sqlite3 connections are not for sharing), in autocommit;
    writes take the write lock up front with `BEGIN IMMEDIATE`."""

    dialect = "sqlite"
    queries = Q
    conflict = sqlite3.IntegrityError
    schema_read_first = True  # an open never waits for `herder up`'s write lock

    def __init__(self, path: str, synchronous: str, busy_timeout: float) -> None:
        self.path = path
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(f"cannot open {self.path}: directory {directory} does not exist")
        create_private(self.path)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.connection()

    def connection(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self.path,
                    timeout=self.busy_timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
                conn.row_factory = sqlite3.Row
                # Takes effect only while the file is new (the WAL switch fixes it): every
                # commit fsyncs each page it touched, and a claim or finish touches a few rows
                # in each of several trees, so half-size pages halve what is written for the
                # same rows (the gain is in bench/README.md).
                conn.execute(f"PRAGMA page_size = {PAGE_SIZE}")
                self._enable_wal(conn)
                conn.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open {self.path}: {exc}") from exc
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _enable_wal(self, conn: sqlite3.Connection) -> None:
        """Switching a new file to WAL takes an exclusive lock without the busy handler, so
        two processes opening a fresh database at once (`herder up` and `herder submit`) can
        see "database is locked" here: retry for as long as a busy write would wait."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.005
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @contextmanager
    def immediate(self) -> Iterator[sqlite3.Connection]:
        """A write transaction holding the write lock from its start."""
        conn = self.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()

    def read(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return _rows(self.connection(), Q[name], _adapt(params))

    def write(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        with self.transaction() as transaction:
            return transaction.fetch(name, params)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self.immediate() as conn:
            yield _SQLiteTransaction(conn)

    def notify(self, topic: str) -> None:
        """Nothing to send: every commit already moves `data_version` for the wakers."""

    def listen(self) -> Waker:
        return SQLiteWaker(self.path)

    def migration(self) -> AbstractContextManager[Transaction]:
        """`BEGIN IMMEDIATE` already holds off every other writer, migrators included."""
        return self.transaction()

    def job_claim(self, params: Mapping[str, Any]) -> dict[str, Sequence[Any]] | None:
        adapted = _adapt(params)
        # The write lock is held for the statements only: the rows are decoded and the specs
        # read after COMMIT (a job's spec never changes once it is submitted).
        with self.immediate() as conn:
            names, values = _fetch(conn, Q["job_claim"], adapted)
            if not values:
                return None
            job_id, attempt, priority = (names.index(name) for name in
                                         ("id", "attempt", "priority"))
            conn.execute(Q["job_claim_events"], {
                **adapted, "tokens": json.dumps({row[job_id]: row[attempt] for row in values})})
        values.sort(key=lambda row: (row[priority], row[job_id]))
        ids = [row[job_id] for row in values]
        spec_names, spec_values = _fetch(self.connection(), Q["job_claim_specs"],
                                         {"job_ids": json.dumps(ids)})
        specs = {row[0]: row for row in spec_values}
        missing = [claimed for claimed in ids if claimed not in specs]
        if missing:
            raise StoreUnavailable(
                f"claimed jobs {missing} have no spec row: the database is damaged")
        return {**_columns(spec_names, [specs[claimed] for claimed in ids]),
                **_columns(names, values)}

    def attempt_finish(self, groups: Sequence[Mapping[str, Any]]
                       ) -> list[list[tuple[int, int, str]]]:
        # The parameters are adapted before the write lock is taken, so it is held for the
        # statements only.
        adapted = [_adapt(params) for params in groups]
        applied: list[list[tuple[int, int, str]]] = []
        with self.immediate() as conn:
            for params in adapted:
                cursor = conn.cursor()
                cursor.row_factory = None  # (id, attempt, status) tuples
                rows = cursor.execute(Q["attempt_finish"], params).fetchall()
                if rows:
                    params["applied"] = json.dumps([job_id for job_id, _, _ in rows])
                    conn.execute(Q["attempt_finish_events"], params)
                applied.append(rows)
        return applied

    def leader_lease(self) -> Lease:
        return SQLiteLease(self.path + ".leader")


def _adapt(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """Parameters in SQLite's stored forms: times as epoch seconds, JSON as text, and a list
    (an array parameter, as PostgreSQL takes it) as a JSON array."""
    adapted = dict(params or {})
    for key, value in adapted.items():
        if value is None or type(value) in _STORED_AS_IS:
            continue  # most values: checked once, not against each adapted type
        if isinstance(value, datetime):
            adapted[key] = value.timestamp()
        elif isinstance(value, Json):
            adapted[key] = json.dumps(value.value)
        elif isinstance(value, list):
            adapted[key] = json.dumps(value)
    return adapted


_STORED_AS_IS = frozenset({int, str, float, bool})


def sqlite_store(url: str, busy_timeout: float = 30.0) -> Store:
    """The store on the SQLite file the URL names (not migrated)."""
    path, synchronous = parse_sqlite_url(url)
    return Store(url, SQLiteDriver(path, synchronous, busy_timeout))


class SQLiteLease(Lease):
    """An exclusive flock on a file beside the database; the kernel drops it with the
    process, so a crashed leader never blocks its successor."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _split_statements(sql: str) -> list[str]:
    statements: list[str] = []
    buffer = ""
    for line in sql.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements
