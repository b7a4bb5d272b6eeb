"""The embedded store: one SQLite file in WAL mode, safe for several processes on one machine.

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
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlsplit

from herder.errors import InputError, StoreUnavailable
from herder.model import (
    Attempt,
    AttemptResult,
    AttemptToken,
    Event,
    HeartbeatReply,
    HostRecord,
    HostUsage,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
    Reservation,
    ReservationKind,
    ReservationStatus,
    Scope,
    TokenRecord,
)
from herder.store.base import (
    Alert,
    DueJob,
    Lease,
    LiveAttempt,
    Store,
    Waker,
    alert_from_row,
    attempt_from_row,
    due_job_from_row,
    event_from_row,
    finish_groups,
    finish_params,
    host_from_row,
    host_params,
    job_from_row,
    live_attempt_from_row,
    load_migrations,
    load_queries,
    object_from_json,
    ram_fits,
    refuse_newer_schema,
    reservation_from_row,
    slots_that_fit,
    token_from_row,
)

Q = load_queries("sqlite")
_TIME_COLUMNS = frozenset(
    {
        "available_at", "created_at", "claimed_at", "started_at", "finished_at", "updated_at",
        "heartbeat_at", "ended_at", "at", "last_heartbeat", "expires_at", "opened_at",
        "cleared_at", "revoked_at",
    }
)
_JSON_COLUMNS = frozenset(
    {"command", "payload", "env", "detail", "allowed_job_types", "allowed_weights", "labels",
     "agent_info", "job_types"}
)
_SYNCHRONOUS = ("off", "normal", "full", "extra")
PAGE_SIZE = 2048
def to_epoch(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def from_epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


# How a column is stored here -> its Python value.
_DECODE: dict[str, Any] = {
    **dict.fromkeys(_TIME_COLUMNS, from_epoch), **dict.fromkeys(_JSON_COLUMNS, object_from_json)}


def _convert(row: sqlite3.Row) -> dict[str, Any]:
    """A row with its stored forms (epoch seconds, JSON text) as Python values."""
    converted = {}
    for key, value in zip(row.keys(), row, strict=True):
        decode = _DECODE.get(key)
        converted[key] = value if decode is None or value is None else decode(value)
    return converted


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


class SQLiteStore(Store):
    dialect = "sqlite"

    def __init__(self, url: str, busy_timeout: float = 30.0) -> None:
        self.url = url
        self.path, self.synchronous = parse_sqlite_url(url)
        self.busy_timeout = busy_timeout
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise StoreUnavailable(f"cannot open {self.path}: directory {directory} does not exist")
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._conn()

    def _conn(self) -> sqlite3.Connection:
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
                # same rows (batches of 1 and 10: 13-14% more jobs/s; see bench/README.md).
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
    def _write(self) -> Iterator[sqlite3.Connection]:
        conn = self._conn()
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

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        conn = self._conn()
        row = conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name='herder_schema'"
        ).fetchone()
        if row is None:
            return 0
        version = conn.execute("SELECT max(version) FROM herder_schema").fetchone()[0]
        return int(version or 0)

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._write() as conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS herder_schema ("
                " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            current = conn.execute("SELECT max(version) FROM herder_schema").fetchone()[0] or 0
            migrations = load_migrations("sqlite")
            refuse_newer_schema(current, migrations)
            for version, name, sql in migrations:
                if version <= current:
                    continue
                for statement in _split_statements(sql):
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO herder_schema (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
                applied.append(version)
        return applied

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(
        self, specs: Sequence[JobSpec], now: datetime, force: bool = False
    ) -> list[InsertResult]:
        stamp = now.timestamp()
        results: list[InsertResult] = []
        with self._write() as conn:
            for spec in specs:
                if force and spec.dedup_key is not None:
                    for row in conn.execute(
                        Q["job_dedup_release"], {"dedup_key": spec.dedup_key, "now": stamp}
                    ).fetchall():
                        _event(conn, row[0], stamp, "dedup_released", None, None, None,
                               {"reason": "forced rerun"})
                params = _spec_params(spec, stamp)
                row = conn.execute(Q["job_insert"], params).fetchone()
                if row is not None:
                    params["job_id"] = row[0]
                    conn.execute(Q["job_spec_insert"], params)
                    _event(conn, row[0], stamp, "submitted", None, JobStatus.QUEUED, None, {})
                    results.append(InsertResult(int(row[0]), True, JobStatus.QUEUED))
                    continue
                assert spec.dedup_key is not None, "insert without a dedup key cannot conflict"
                holder = conn.execute(
                    Q["job_dedup_holder"], {"dedup_key": spec.dedup_key}
                ).fetchone()
                results.append(InsertResult(int(holder[0]), False, JobStatus(holder[1])))
        return results

    def job_dedup_holder(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        row = self._conn().execute(Q["job_dedup_holder"], {"dedup_key": dedup_key}).fetchone()
        return None if row is None else (int(row[0]), JobStatus(row[1]))

    def job_get(self, job_id: int) -> Job | None:
        row = self._conn().execute(Q["job_get"], {"job_id": job_id}).fetchone()
        return None if row is None else job_from_row(_convert(row))

    def job_list(
        self, statuses: Sequence[JobStatus] | None = None, limit: int = 100
    ) -> list[Job]:
        params = {
            "statuses": None if statuses is None else json.dumps([str(s) for s in statuses]),
            "limit": limit,
        }
        rows = self._conn().execute(Q["job_list"], params).fetchall()
        return [job_from_row(_convert(row)) for row in rows]

    def job_counts(self) -> dict[JobStatus, int]:
        rows = self._conn().execute(Q["job_counts"]).fetchall()
        return {JobStatus(row[0]): int(row[1]) for row in rows}

    def job_claim(self, host: str, worker: str, limit: int, now: datetime) -> list[Job]:
        stamp = now.timestamp()
        with self._write() as conn:
            claimed = [_convert(row) for row in conn.execute(
                Q["job_claim"], {"host": host, "worker": worker, "limit": limit, "now": stamp})]
            if not claimed:
                return []
            conn.execute(Q["job_claim_events"], {
                "tokens": json.dumps({row["id"]: row["attempt"] for row in claimed}),
                "now": stamp, "detail": json.dumps({"host": host, "worker": worker})})
        # The specs are read after COMMIT: the write lock is held only for the statements,
        # and a job's spec never changes once it is submitted.
        claimed.sort(key=lambda row: (row["priority"], row["id"]))
        ids = [row["id"] for row in claimed]
        specs = {row["id"]: _convert(row) for row in self._conn().execute(
            Q["job_claim_specs"], {"job_ids": json.dumps(ids)})}
        missing = [job_id for job_id in ids if job_id not in specs]
        if missing:
            raise StoreUnavailable(
                f"claimed jobs {missing} have no spec row: the database is damaged")
        return [job_from_row({**specs[row["id"]], **row}) for row in claimed]

    def attempt_start(
        self, token: AttemptToken, pid: int, log_path: str | None, now: datetime
    ) -> bool:
        stamp = now.timestamp()
        params = {"job_id": token.job_id, "attempt": token.attempt, "pid": pid,
                  "log_path": log_path, "now": stamp}
        with self._write() as conn:
            if conn.execute(Q["attempt_start"], params).fetchone() is None:
                return False
            _event(conn, token.job_id, stamp, "started", JobStatus.CLAIMED, JobStatus.RUNNING,
                   token.attempt, {"pid": pid, "log_path": log_path})
        return True

    def attempt_heartbeat(
        self, tokens: Sequence[AttemptToken], now: datetime
    ) -> HeartbeatReply:
        stamp = now.timestamp()
        live: set[AttemptToken] = set()
        cancel: set[AttemptToken] = set()
        with self._write() as conn:
            for token in tokens:
                row = conn.execute(
                    Q["attempt_heartbeat"],
                    {"job_id": token.job_id, "attempt": token.attempt, "now": stamp},
                ).fetchone()
                if row is not None:
                    live.add(token)
                    if row[2]:
                        cancel.add(token)
        return HeartbeatReply(frozenset(live), frozenset(cancel))

    def attempt_finish(
        self, results: Sequence[AttemptResult], now: datetime
    ) -> list[tuple[AttemptToken, JobStatus]]:
        stamp = now.timestamp()
        applied: list[tuple[AttemptToken, JobStatus]] = []
        if not results:
            return applied
        with self._write() as conn:
            for (outcome, exit_code, decision), tokens, held in finish_groups(results):
                params = {
                    **finish_params(outcome, exit_code, decision), "now": stamp,
                    "available_at": to_epoch(decision.available_at), "tokens": json.dumps(tokens)}
                rows = conn.execute(Q["attempt_finish"], params).fetchall()
                if not rows:
                    continue
                params["applied"] = json.dumps([row["id"] for row in rows])
                params["detail"] = json.dumps({"outcome": outcome.value, "exit_code": exit_code})
                conn.execute(Q["attempt_finish_events"], params)
                applied.extend((held[row["id"]], JobStatus(row["status"])) for row in rows)
        return applied

    def job_cancel(self, job_id: int, now: datetime) -> JobStatus | None:
        stamp = now.timestamp()
        with self._write() as conn:
            row = conn.execute(Q["job_cancel"], {"job_id": job_id, "now": stamp}).fetchone()
            if row is None:
                return None
            status = JobStatus(row[1])
            requested = bool(row[3])
            _event(conn, job_id, stamp, "cancel_requested" if requested else "cancelled",
                   status if requested else JobStatus.QUEUED, status, row[2], {})
        return status

    def job_cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        if not job_ids:
            return set()
        rows = self._conn().execute(
            Q["job_cancel_requested"], {"job_ids": json.dumps(list(job_ids))}
        ).fetchall()
        return {AttemptToken(int(row[0]), int(row[1])) for row in rows}

    def job_retry(self, job_id: int, now: datetime) -> bool:
        stamp = now.timestamp()
        with self._write() as conn:
            old = conn.execute(Q["job_get"], {"job_id": job_id}).fetchone()
            if old is None:
                return False
            try:
                row = conn.execute(Q["job_retry"], {"job_id": job_id, "now": stamp}).fetchone()
            except sqlite3.IntegrityError as exc:
                raise _dedup_conflict(old["dedup_key"]) from exc
            if row is None:
                return False
            _event(conn, job_id, stamp, "retried", JobStatus(old["status"]), JobStatus.QUEUED,
                   row[1], {})
        return True

    # -- attempts and events ------------------------------------------------------------------

    def attempt_list(self, job_id: int) -> list[Attempt]:
        rows = self._conn().execute(Q["attempt_list"], {"job_id": job_id}).fetchall()
        return [attempt_from_row(_convert(row)) for row in rows]

    def attempt_list_live(self, host: str | None = None) -> list[LiveAttempt]:
        rows = self._conn().execute(Q["attempt_list_live"], {"host": host}).fetchall()
        return [live_attempt_from_row(_convert(row)) for row in rows]

    def event_list(self, job_id: int) -> list[Event]:
        rows = self._conn().execute(Q["event_list"], {"job_id": job_id}).fetchall()
        return [event_from_row(_convert(row)) for row in rows]

    # -- fleet ------------------------------------------------------------------------------

    def host_insert(self, host: HostRecord, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["host_insert"], _host_params(host, now)).fetchone()
        return row is not None

    def host_update(self, host: HostRecord, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["host_update"], _host_params(host, now)).fetchone()
        return row is not None

    def host_get(self, label: str) -> HostRecord | None:
        row = self._conn().execute(Q["host_get"], {"label": label}).fetchone()
        return None if row is None else host_from_row(_convert(row))

    def host_list(self) -> list[HostRecord]:
        return [host_from_row(_convert(r)) for r in self._conn().execute(Q["host_list"])]

    def host_remove(self, label: str) -> bool:
        with self._write() as conn:
            return conn.execute(Q["host_remove"], {"label": label}).fetchone() is not None

    def host_heartbeat(self, label: str, now: datetime, agent_info: Mapping[str, Any]) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["host_heartbeat"], {
                "label": label, "now": now.timestamp(),
                "agent_info": json.dumps(dict(agent_info))}).fetchone()
        return row is not None

    def host_agent_gone(self, label: str, worker: str) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["host_agent_gone"], {"label": label, "worker": worker}
                               ).fetchone()
        return row is not None

    def host_usage(self, now: datetime) -> dict[str, HostUsage]:
        rows = self._conn().execute(Q["host_usage"], {"now": now.timestamp()}).fetchall()
        return {row[0]: HostUsage(row[0], int(row[1]), float(row[2]), float(row[3]))
                for row in rows}

    def job_list_due(self, now: datetime, limit: int) -> list[DueJob]:
        rows = self._conn().execute(
            Q["job_list_due"], {"now": now.timestamp(), "limit": limit}).fetchall()
        return [due_job_from_row(_convert(row)) for row in rows]

    def job_assign(
        self,
        host: str,
        items: Sequence[tuple[int, float]],
        max_workers: int,
        bookable_gb: float,
        now: datetime,
    ) -> list[AttemptToken]:
        stamp = now.timestamp()
        placed: list[AttemptToken] = []
        with self._write() as conn:
            if conn.execute(Q["host_lock"], {"label": host}).fetchone() is None:
                return []
            booked = conn.execute(Q["host_booked"], {"label": host, "now": stamp}).fetchone()
            workers, booked_gb = int(booked[0]), float(booked[1])
            for job_id, ram_gb in items:
                if workers + 1 > max_workers:
                    break
                if not ram_fits(booked_gb, ram_gb, bookable_gb):
                    continue
                row = conn.execute(Q["job_assign"], {"job_id": job_id, "host": host,
                                                     "ram_gb": ram_gb, "now": stamp}).fetchone()
                if row is None:
                    continue
                token = AttemptToken(int(row[0]), int(row[1]))
                _event(conn, token.job_id, stamp, "placed", JobStatus.QUEUED, JobStatus.CLAIMED,
                       token.attempt, {"host": host, "ram_gb": ram_gb})
                workers += 1
                booked_gb += ram_gb
                placed.append(token)
        return placed

    def attempt_list_assigned(self, host: str, limit: int) -> list[Job]:
        rows = self._conn().execute(
            Q["attempt_list_assigned"], {"host": host, "limit": limit}).fetchall()
        return [job_from_row(_convert(row)) for row in rows]

    def attempt_set_worker(self, token: AttemptToken, worker: str, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["attempt_set_worker"], {
                "job_id": token.job_id, "attempt": token.attempt, "worker": worker,
                "now": now.timestamp()}).fetchone()
        return row is not None

    def reservation_create(
        self,
        kind: ReservationKind,
        owner: str,
        host: str,
        weight: str,
        ram_gb: float,
        count: int,
        expires_at: datetime,
        bookable_gb: float | None,
        now: datetime,
    ) -> list[Reservation]:
        stamp = now.timestamp()
        created: list[Reservation] = []
        with self._write() as conn:
            if conn.execute(Q["host_lock"], {"label": host}).fetchone() is None:
                return []
            if kind is ReservationKind.CI:
                existing = conn.execute(Q["reservation_active_ci"], {"owner": owner}).fetchone()
                if existing is not None:
                    return [reservation_from_row(_convert(existing))]
            booked = conn.execute(Q["host_booked"], {"label": host, "now": stamp}).fetchone()
            fit = slots_that_fit(count, ram_gb, float(booked[1]), bookable_gb)
            for _ in range(fit):
                row = conn.execute(Q["reservation_insert"], {
                    "kind": str(kind), "owner": owner, "host": host, "weight": weight,
                    "ram_gb": ram_gb, "detail": "{}", "now": stamp,
                    "expires_at": expires_at.timestamp()}).fetchone()
                if row is not None:
                    created.append(reservation_from_row(_convert(row)))
        return created

    def reservation_end(
        self, reservation_id: int, status: ReservationStatus, now: datetime
    ) -> Reservation | None:
        with self._write() as conn:
            row = conn.execute(Q["reservation_end"], {
                "id": reservation_id, "status": str(status), "now": now.timestamp(),
                "detail": "{}"}).fetchone()
        return None if row is None else reservation_from_row(_convert(row))

    def reservation_get(self, reservation_id: int) -> Reservation | None:
        row = self._conn().execute(Q["reservation_get"], {"id": reservation_id}).fetchone()
        return None if row is None else reservation_from_row(_convert(row))

    def reservation_release_ci(self, owner: str, now: datetime) -> Reservation | None:
        with self._write() as conn:
            row = conn.execute(Q["reservation_release_ci"],
                               {"owner": owner, "now": now.timestamp()}).fetchone()
        return None if row is None else reservation_from_row(_convert(row))

    def reservation_list(self, host: str | None = None) -> list[Reservation]:
        rows = self._conn().execute(Q["reservation_list"], {"host": host}).fetchall()
        return [reservation_from_row(_convert(row)) for row in rows]

    def reservation_expire(self, now: datetime) -> int:
        with self._write() as conn:
            return len(conn.execute(Q["reservation_expire"],
                                    {"now": now.timestamp()}).fetchall())

    def token_insert(self, name: str, scope: Scope, token_hash: str, now: datetime,
                     host: str | None = None, job_types: frozenset[str] | None = None,
                     priority_floor: int | None = None) -> int:
        with self._write() as conn:
            row = conn.execute(Q["token_insert"], {
                "name": name, "scope": str(scope), "token_hash": token_hash, "host": host,
                "job_types": None if job_types is None else json.dumps(sorted(job_types)),
                "priority_floor": priority_floor, "now": now.timestamp()}).fetchone()
        return int(row[0])

    def token_get(self, token_hash: str) -> TokenRecord | None:
        row = self._conn().execute(Q["token_get"], {"token_hash": token_hash}).fetchone()
        return None if row is None else token_from_row(_convert(row))

    def token_list(self) -> list[TokenRecord]:
        return [token_from_row(_convert(r)) for r in self._conn().execute(Q["token_list"])]

    def token_revoke(self, token_id: int, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["token_revoke"], {"id": token_id,
                                                   "now": now.timestamp()}).fetchone()
        return row is not None

    def token_revoke_host(self, host: str, now: datetime) -> int:
        with self._write() as conn:
            rows = conn.execute(Q["token_revoke_host"], {"host": host,
                                                         "now": now.timestamp()}).fetchall()
        return len(rows)

    def alert_open(self, key: str, message: str, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["alert_open"], {"key": key, "message": message,
                                                 "now": now.timestamp()}).fetchone()
        return row is not None

    def alert_clear(self, key: str, now: datetime) -> bool:
        with self._write() as conn:
            row = conn.execute(Q["alert_clear"], {"key": key, "now": now.timestamp()}).fetchone()
        return row is not None

    def alert_list(self, open_only: bool = True, limit: int = 100) -> list[Alert]:
        rows = self._conn().execute(Q["alert_list"], {"open_only": int(open_only),
                                                      "limit": limit}).fetchall()
        return [alert_from_row(_convert(row)) for row in rows]

    def leader_lease(self) -> Lease:
        return SQLiteLease(self.path + ".leader")

    def statistics_refresh(self) -> bool:
        """SQLite's own advice: `PRAGMA optimize` now and then analyzes what needs it. It may
        write, so it runs in `BEGIN IMMEDIATE` like every write: in autocommit it would start
        as a reader and fail at once ("database is locked", no busy wait) whenever another
        process committed in between."""
        with self._write() as conn:
            conn.execute("PRAGMA optimize")
        return True

    def notify(self, topic: str) -> None:
        """Nothing to send: every commit already moves `data_version` for the wakers."""

    def listen(self) -> Waker:
        return SQLiteWaker(self.path)


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


def _host_params(host: HostRecord, now: datetime) -> dict[str, Any]:
    params = host_params(host)
    for key in ("allowed_job_types", "allowed_weights", "labels"):
        params[key] = None if params[key] is None else json.dumps(params[key])
    params["enabled"] = int(params["enabled"])
    params["now"] = now.timestamp()
    return params


def _dedup_conflict(dedup_key: str | None) -> InputError:
    return InputError(
        "dedup_key",
        f"another active or done job holds dedup key {dedup_key!r}",
        "cancel that job first, or submit a new job with --force",
    )


def _event(
    conn: sqlite3.Connection,
    job_id: int,
    stamp: float,
    kind: str,
    from_status: JobStatus | None,
    to_status: JobStatus | None,
    attempt: int | None,
    detail: Mapping[str, Any],
) -> None:
    conn.execute(
        Q["event_insert"],
        {"job_id": job_id, "now": stamp, "kind": kind,
         "from_status": None if from_status is None else str(from_status),
         "to_status": None if to_status is None else str(to_status),
         "attempt": attempt, "detail": json.dumps(dict(detail))},
    )


def _spec_params(spec: JobSpec, stamp: float) -> dict[str, Any]:
    return {
        "job_type": spec.job_type,
        "command": json.dumps(list(spec.command)),
        "shell": int(spec.shell),
        "payload": json.dumps(dict(spec.payload)),
        "priority": spec.priority,
        "weight": spec.weight,
        "dedup_key": spec.dedup_key,
        "affinity": spec.affinity,
        "available_at": stamp if spec.available_at is None else spec.available_at.timestamp(),
        "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds,
        "env": json.dumps(dict(spec.env)),
        "workdir": spec.workdir,
        "backoff_base_seconds": spec.backoff_base_seconds,
        "backoff_max_seconds": spec.backoff_max_seconds,
        "now": stamp,
    }


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
