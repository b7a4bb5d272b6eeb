"""The distributed store: PostgreSQL through psycopg 3 and a connection pool.

`PostgresDriver` is the dialect's driver (see driver.py): its own are the pool, the
adapters, and the statements and locking of submit, claim, finish, migrations and the lease.
Claims use `FOR UPDATE SKIP LOCKED`, so concurrent
claimers never wait on each other's rows; a claim and a finish are each one statement with
data-modifying CTEs (job row and event row together), so a job costs two round trips from
claim to finish. Submits, requeues, retries and cancels `NOTIFY herder`, which wakes idle
runners at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row, tuple_row
from psycopg.types.json import Jsonb, set_json_loads
from psycopg_pool import ConnectionPool

from herder.core.backoff import Backoff
from herder.core.errors import StoreUnavailable
from herder.core.model import InsertResult, JobStatus
from herder.core.urls import redact_url
from herder.store.base import Store
from herder.store.driver import (
    Driver,
    Json,
    Lease,
    Row,
    Transaction,
    Waker,
    as_unavailable,
    load_queries,
    lost_session_errors,
)
from herder.store.parameters import DEDUP_RELEASED_DETAIL
from herder.store.rows import object_from_json

log = logging.getLogger("herder.store")
Q = load_queries("postgres")
# Every connection herder opens: a bounded connect, and TCP keepalives so a connection to a
# vanished server (a partition, a dead host) fails in about half a minute instead of hanging
# the thread that waits on it.
POOL_WAIT_SECONDS = 10.0
CONNECT_OPTIONS: dict[str, Any] = {
    "connect_timeout": 5, "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
    "keepalives_count": 3,
}
# Server-side limits on every herder session, each unless something else set it (see the
# `session_limits` query): a runaway statement ends instead of holding a thread (and its
# locks) forever, and a session left idle inside a transaction (a replica frozen or paused
# mid-transaction, its row locks held) is ended by the server, so the rest of the fleet can
# touch those rows again. Each is a few hundred times herder's slowest statement;
# migrations lift the first.
SESSION_LIMITS: dict[str, str] = {
    "statement_timeout": "60s",
    "idle_in_transaction_session_timeout": "60s",
}
CHANNEL = "herder"
_MIGRATION_LOCK = 0x6865726465720001  # "herder" + 1: one migrator at a time
_LEADER_LOCK = 0x6865726465720002  # "herder" + 2: the scheduler leader
MAX_CLAIM = 1000


def _claim_query(limit: int) -> str:
    """job_claim with its LIMIT as a literal: PostgreSQL then settles on one cached plan
    instead of planning every claim afresh (see queries.sql)."""
    return Q["job_claim"].replace("%(limit)s", str(min(int(limit), MAX_CLAIM)))


def _insert_result(conn: psycopg.Connection[DictRow], spec: Mapping[str, Any],
                   row: DictRow | None) -> InsertResult:
    if row is not None:
        return InsertResult(int(row["id"]), True, JobStatus.QUEUED)
    holder = conn.execute(Q["job_dedup_holder"], {"dedup_key": spec["dedup_key"]}).fetchone()
    if holder is None:  # the holder ended between our insert and this read
        raise StoreUnavailable("dedup holder vanished; retry the submit")
    return InsertResult(int(holder["id"]), False, JobStatus(holder["status"]))


def connect(url: str) -> psycopg.Connection[Any]:
    """A connection of herder's own (LISTEN, the leader lease) with its session limits."""
    conn = psycopg.connect(url, autocommit=True, **CONNECT_OPTIONS)
    try:
        apply_session_limits(conn)
    except BaseException:
        _close_quietly(conn)
        raise
    return conn


def apply_session_limits(conn: psycopg.Connection[Any]) -> None:
    """SESSION_LIMITS on this session, where nothing else set them (after connecting, not
    as startup `options`: those would hide a service file's and outrank the DBA's)."""
    conn.execute(Q["session_limits"], SESSION_LIMITS)


class PostgresWaker(Waker):
    """A dedicated LISTEN connection; woken by NOTIFY from submits, requeues and cancels.

    It heals itself: a restart or an outage never ends the thread waiting on it. While the
    connection is down, `wait` sleeps its timeout (the caller's poll interval takes over) and
    reconnects with backoff; the first wait after a reconnect returns True, since whatever
    was notified meanwhile is lost.
    """

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._url = url
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        self._backoff = Backoff(base=0.2, cap=10.0)
        self._next_connect = 0.0
        self._connect()

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def _connect(self) -> bool:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = connect(self._url)
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))
        except psycopg.Error as exc:
            if conn is not None:
                _close_quietly(conn)
            delay = self._backoff.next()
            self._next_connect = self._clock() + delay
            log.warning("LISTEN connection unavailable (%s); retrying in %.1fs",
                        " ".join(str(exc).split()), delay)
            return False
        if self._backoff.failures:
            log.warning("LISTEN connection is back")
        self._backoff.reset()
        self._conn = conn
        return True

    def wait(self, timeout: float) -> bool:
        return self.wait_topics(timeout) != set()

    def wait_topics(self, timeout: float) -> set[str] | None:
        if self._conn is None:
            if self._clock() >= self._next_connect and self._connect():
                return None
            time.sleep(max(timeout, 0.0))
            return set()
        topics: set[str] = set()
        try:
            for notify in self._conn.notifies(timeout=max(timeout, 0.0), stop_after=1):
                topics.add(notify.payload)
            if topics:  # drain what else arrived, so the next wait blocks again
                for notify in self._conn.notifies(timeout=0.0):
                    topics.add(notify.payload)
        except psycopg.Error as exc:
            log.warning("LISTEN connection lost (%s); reconnecting", " ".join(str(exc).split()))
            _close_quietly(self._conn)
            self._conn = None
            self._connect()
            return None  # the caller re-reads the store: a notification may be lost
        return topics

    def close(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None


def _close_quietly(conn: psycopg.Connection[Any]) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.close()


class _PostgresTransaction(Transaction):
    def __init__(self, conn: psycopg.Connection[DictRow]) -> None:
        self._conn = conn

    def fetch(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        cursor = self._conn.execute(Q[name], _adapt(params))
        return cursor.fetchall() if cursor.description else []

    def notify(self, topic: str) -> None:
        self._conn.execute(Q["notify"], {"channel": CHANNEL, "topic": topic})

    def script(self, text: str) -> None:
        self._conn.execute(text.encode())  # bytes: psycopg reads no placeholders in it

    def job_insert(self, specs: Sequence[Mapping[str, Any]], release: Sequence[str],
                   now: datetime) -> list[InsertResult]:
        """One statement a job, with its event (and NOTIFY); several are pipelined."""
        conn = self._conn
        for key in release:
            conn.execute(Q["job_dedup_release"], {
                "dedup_key": key, "now": now, "detail": Jsonb(DEDUP_RELEASED_DETAIL)})
        if len(specs) == 1:
            rows = [conn.execute(Q["job_insert"], _adapt(specs[0])).fetchone()]
        else:
            with conn.pipeline():
                cursors = [conn.execute(Q["job_insert"], _adapt(spec)) for spec in specs]
            rows = [cursor.fetchone() for cursor in cursors]
        return [_insert_result(conn, spec, row) for spec, row in zip(specs, rows, strict=True)]


class PostgresDriver(Driver):
    """A connection pool in autocommit: a single statement is its own transaction."""

    dialect = "postgres"
    queries = Q
    conflict = psycopg.errors.UniqueViolation
    schema_read_first = False  # a server opening mid-migration waits for it to end

    def __init__(self, url: str, max_connections: int, connect_timeout: float) -> None:
        self.url = url
        try:
            probe = psycopg.connect(url, connect_timeout=max(1, int(connect_timeout)))
            probe.close()
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to {redact_url(url)}: {str(exc).strip()}"
            ) from exc
        self.pool: ConnectionPool[psycopg.Connection[DictRow]] = ConnectionPool(
            url,
            connection_class=psycopg.Connection[DictRow],
            min_size=1,
            max_size=max(1, max_connections),
            kwargs={"autocommit": True, "row_factory": dict_row, **CONNECT_OPTIONS,
                    "connect_timeout": max(1, int(connect_timeout))},
            # While the database is down a call fails after this long (StoreUnavailable: the
            # loops back off, the API answers 503) instead of holding its thread for 30 s.
            timeout=POOL_WAIT_SECONDS,
            configure=_configure,
            open=False,
            name="herder",
        )
        self.pool.open(wait=True, timeout=connect_timeout)

    def close(self) -> None:
        self.pool.close()

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[DictRow]]:
        """A pooled connection; a database failure (down, restarting, a dropped connection)
        surfaces as StoreUnavailable. After a restart every idle pooled connection is dead:
        the first one found dead has the pool check them all, so callers see one error per
        outage instead of one per pooled connection."""
        conn: psycopg.Connection[DictRow] | None = None
        try:
            with self.pool.connection() as conn:
                yield conn
        except lost_session_errors(psycopg) as exc:
            if conn is not None and (conn.closed or conn.broken):
                with contextlib.suppress(psycopg.Error):
                    self.pool.check()
            unavailable = as_unavailable(exc)
            assert unavailable is not None
            raise unavailable from exc

    def read(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        with self.connection() as conn:
            return _PostgresTransaction(conn).fetch(name, params)

    def write(self, name: str, params: Mapping[str, Any] | None = None) -> list[Row]:
        return self.read(name, params)  # autocommit: the statement is its own transaction

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        with self.connection() as conn, conn.transaction():
            yield _PostgresTransaction(conn)

    def notify(self, topic: str) -> None:
        with self.connection() as conn:
            _PostgresTransaction(conn).notify(topic)

    def listen(self) -> Waker:
        return PostgresWaker(self.url)

    @contextlib.contextmanager
    def migration(self) -> Iterator[Transaction]:
        with self.connection() as conn, conn.transaction():
            transaction = _PostgresTransaction(conn)
            transaction.fetch("migration_unlimited")
            transaction.fetch("migration_lock", {"lock": _MIGRATION_LOCK})
            yield transaction

    def job_insert(self, specs: Sequence[Mapping[str, Any]], release: Sequence[str],
                   now: datetime) -> list[InsertResult]:
        if len(specs) == 1 and not release:
            # The common case is one statement in autocommit: one round trip, and the
            # NOTIFY that wakes idle runners rides along in it.
            with self.connection() as conn:
                return _PostgresTransaction(conn).job_insert(specs, release, now)
        return super().job_insert(specs, release, now)

    def job_claim(self, params: Mapping[str, Any]) -> dict[str, Sequence[Any]] | None:
        with self.connection() as conn:
            cursor = conn.cursor(row_factory=tuple_row)
            rows = cursor.execute(_claim_query(params["limit"]), _adapt(params)).fetchall()
            names = [column.name for column in cursor.description or ()]
        if not rows:
            return None
        return dict(zip(names, zip(*rows, strict=True), strict=True))

    def attempt_finish(self, groups: Sequence[Mapping[str, Any]]
                       ) -> list[list[tuple[int, int, str]]]:
        with self.connection() as conn:
            cursor = conn.cursor(row_factory=tuple_row)
            # One group is one statement; several are applied together, as on SQLite.
            with conn.transaction() if len(groups) > 1 else contextlib.nullcontext():
                return [[(row[0], row[1], row[2]) for row in cursor.execute(
                    Q["attempt_finish"], {**_adapt(params),
                                          "job_ids": list(params["tokens"].value)}).fetchall()]
                        for params in groups]

    def leader_lease(self) -> Lease:
        return PostgresLease(self.url)


def _configure(conn: psycopg.Connection[Any]) -> None:
    """JSON columns read as SQLite's are (an empty object skips the parser); the session
    limits."""
    set_json_loads(object_from_json, conn)
    apply_session_limits(conn)


def _adapt(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """JSON parameters as jsonb; psycopg adapts the rest (times are timestamptz)."""
    return {key: Jsonb(value.value) if isinstance(value, Json) else value
            for key, value in (params or {}).items()}


def postgres_store(url: str, max_connections: int = 8, connect_timeout: float = 5.0
                   ) -> Store:
    """The store on the PostgreSQL database the URL names (not migrated)."""
    return Store(url, PostgresDriver(url, max_connections, connect_timeout))


class PostgresLease(Lease):
    """A session advisory lock on a dedicated connection: held while the session lives, so a
    crashed or partitioned leader loses it when PostgreSQL drops its connection."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.Connection[Any] | None = None

    def try_acquire(self) -> bool:
        """True while held, False while another session holds it; StoreUnavailable when the
        database cannot be asked (the lease is then not held)."""
        if self._conn is not None:
            try:
                self._conn.execute(Q["leader_lease_check"])
                return True
            except psycopg.Error:
                self._drop()
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = connect(self._url)
            row = conn.execute(Q["leader_lease"], {"lock": _LEADER_LOCK}).fetchone()
        except psycopg.Error as exc:
            if conn is not None:
                _close_quietly(conn)
            raise StoreUnavailable(
                f"cannot check the leader lease: {' '.join(str(exc).split())}") from exc
        if row is None or not row[0]:
            _close_quietly(conn)
            return False
        self._conn = conn
        return True

    def _drop(self) -> None:
        if self._conn is not None:
            _close_quietly(self._conn)
            self._conn = None

    def release(self) -> None:
        self._drop()
