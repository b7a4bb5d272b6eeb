"""The distributed store: PostgreSQL through psycopg 3 and a connection pool.

Claims use `FOR UPDATE SKIP LOCKED`, so concurrent claimers never wait on each other's rows;
each claim, start and finish is one statement with data-modifying CTEs (job row, attempt row
and event row together), so a job costs two round trips from claim to finish. Submits and
cancels `NOTIFY herder`, which wakes idle runners at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from herder.errors import InputError, StoreUnavailable
from herder.model import (
    Attempt,
    AttemptResult,
    AttemptToken,
    Event,
    HeartbeatReply,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
)
from herder.store.base import (
    LiveAttempt,
    Store,
    Waker,
    attempt_from_row,
    event_from_row,
    job_from_row,
    live_attempt_from_row,
    load_migrations,
    load_queries,
)
from herder.urls import redact_url

Q = load_queries("postgres")
CHANNEL = "herder"
_MIGRATION_LOCK = 0x6865726465720001  # "herder" + 1: one migrator at a time


class PostgresWaker(Waker):
    """A dedicated LISTEN connection; woken by NOTIFY from submits, requeues and cancels."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True)
        self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(CHANNEL)))

    def wait(self, timeout: float) -> bool:
        woke = False
        for _ in self._conn.notifies(timeout=max(timeout, 0.0), stop_after=1):
            woke = True
        if woke:  # drain what else arrived, so the next wait blocks again
            for _ in self._conn.notifies(timeout=0.0):
                pass
        return woke

    def close(self) -> None:
        self._conn.close()


class PostgresStore(Store):
    dialect = "postgres"

    def __init__(self, url: str, max_connections: int = 8, connect_timeout: float = 5.0) -> None:
        self.url = url
        try:
            probe = psycopg.connect(url, connect_timeout=max(1, int(connect_timeout)))
            probe.close()
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to {redact_url(url)}: {str(exc).strip()}"
            ) from exc
        self._pool: ConnectionPool[psycopg.Connection[DictRow]] = ConnectionPool(
            url,
            connection_class=psycopg.Connection[DictRow],
            min_size=1,
            max_size=max(1, max_connections),
            kwargs={"autocommit": True, "row_factory": dict_row},
            open=False,
            name="herder",
        )
        self._pool.open(wait=True, timeout=connect_timeout)

    def close(self) -> None:
        self._pool.close()

    # -- schema ---------------------------------------------------------------------------

    def schema_version(self) -> int:
        with self._pool.connection() as conn:
            row = conn.execute("SELECT to_regclass('herder_schema') AS t").fetchone()
            if row is None or row["t"] is None:
                return 0
            row = conn.execute("SELECT max(version) AS v FROM herder_schema").fetchone()
            return int(row["v"] or 0) if row else 0

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS herder_schema (version integer PRIMARY KEY,"
                " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT max(version) AS v FROM herder_schema").fetchone()
            current = int(row["v"] or 0) if row else 0
            for version, name, text in load_migrations("postgres"):
                if version <= current:
                    continue
                conn.execute(text.encode())
                conn.execute(
                    "INSERT INTO herder_schema (version, name) VALUES (%s, %s)", (version, name)
                )
                applied.append(version)
        return applied

    # -- jobs -------------------------------------------------------------------------------

    def job_insert(
        self, specs: Sequence[JobSpec], now: datetime, force: bool = False
    ) -> list[InsertResult]:
        results: list[InsertResult] = []
        with self._pool.connection() as conn, conn.transaction():
            if force:
                for key in {spec.dedup_key for spec in specs if spec.dedup_key is not None}:
                    conn.execute(Q["job_dedup_release"], {"dedup_key": key, "now": now})
            with conn.pipeline():
                cursors = [conn.execute(Q["job_insert"], _spec_params(spec, now))
                           for spec in specs]
            created = False
            for spec, cursor in zip(specs, cursors, strict=True):
                row = cursor.fetchone()
                if row is not None:
                    created = True
                    results.append(InsertResult(int(row["id"]), True, JobStatus.QUEUED))
                    continue
                holder = conn.execute(
                    Q["job_dedup_holder"], {"dedup_key": spec.dedup_key}
                ).fetchone()
                if holder is None:  # the holder ended between our insert and this read
                    raise StoreUnavailable("dedup holder vanished; retry the submit")
                results.append(
                    InsertResult(int(holder["id"]), False, JobStatus(holder["status"]))
                )
            if created:
                conn.execute("SELECT pg_notify(%s, 'job')", (CHANNEL,))
        return results

    def job_dedup_holder(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        with self._pool.connection() as conn:
            row = conn.execute(Q["job_dedup_holder"], {"dedup_key": dedup_key}).fetchone()
        return None if row is None else (int(row["id"]), JobStatus(row["status"]))

    def job_get(self, job_id: int) -> Job | None:
        with self._pool.connection() as conn:
            row = conn.execute(Q["job_get"], {"job_id": job_id}).fetchone()
        return None if row is None else job_from_row(row)

    def job_list(
        self, statuses: Sequence[JobStatus] | None = None, limit: int = 100
    ) -> list[Job]:
        params = {
            "statuses": None if statuses is None else [str(s) for s in statuses],
            "limit": limit,
        }
        with self._pool.connection() as conn:
            rows = conn.execute(Q["job_list"], params).fetchall()
        return [job_from_row(row) for row in rows]

    def job_counts(self) -> dict[JobStatus, int]:
        with self._pool.connection() as conn:
            rows = conn.execute(Q["job_counts"]).fetchall()
        return {JobStatus(row["status"]): int(row["count"]) for row in rows}

    def job_claim(self, host: str, worker: str, limit: int, now: datetime) -> list[Job]:
        with self._pool.connection() as conn:
            rows = conn.execute(
                Q["job_claim"], {"host": host, "worker": worker, "limit": limit, "now": now}
            ).fetchall()
        return [job_from_row(row) for row in rows]

    def attempt_start(
        self, token: AttemptToken, pid: int, log_path: str | None, now: datetime
    ) -> bool:
        with self._pool.connection() as conn:
            row = conn.execute(
                Q["attempt_start"],
                {"job_id": token.job_id, "attempt": token.attempt, "pid": pid,
                 "log_path": log_path, "now": now},
            ).fetchone()
        return bool(row and row["count"])

    def attempt_heartbeat(
        self, tokens: Sequence[AttemptToken], now: datetime
    ) -> HeartbeatReply:
        if not tokens:
            return HeartbeatReply(frozenset(), frozenset())
        with self._pool.connection() as conn:
            rows = conn.execute(
                Q["attempt_heartbeat"],
                {"job_ids": [t.job_id for t in tokens], "attempts": [t.attempt for t in tokens],
                 "now": now},
            ).fetchall()
        live = {AttemptToken(int(r["job_id"]), int(r["attempt"])) for r in rows}
        cancel = {AttemptToken(int(r["job_id"]), int(r["attempt"]))
                  for r in rows if r["cancel_requested"]}
        return HeartbeatReply(frozenset(live), frozenset(cancel))

    def attempt_finish(
        self, results: Sequence[AttemptResult], now: datetime
    ) -> list[tuple[AttemptToken, JobStatus]]:
        if not results:
            return []
        params: dict[str, Any] = {
            "job_ids": [r.token.job_id for r in results],
            "attempts": [r.token.attempt for r in results],
            "outcomes": [str(r.outcome) for r in results],
            "exit_codes": [r.exit_code for r in results],
            "statuses": [str(r.decision.status) for r in results],
            "available_ats": [r.decision.available_at for r in results],
            "failure_reasons": [r.decision.failure_reason for r in results],
            "spend_failures": [int(r.decision.spend_failure) for r in results],
            "spend_losts": [int(r.decision.spend_lost) for r in results],
            "spend_spawn_failures": [int(r.decision.spend_spawn_failure) for r in results],
            "now": now,
        }
        requeued = False
        with self._pool.connection() as conn, conn.transaction():
            rows = conn.execute(Q["attempt_finish"], params).fetchall()
            applied = [
                (AttemptToken(int(r["id"]), int(r["attempt"])), JobStatus(r["status"]))
                for r in rows
            ]
            requeued = any(status is JobStatus.QUEUED for _, status in applied)
            if requeued:
                conn.execute("SELECT pg_notify(%s, 'job')", (CHANNEL,))
        return applied

    def job_cancel(self, job_id: int, now: datetime) -> JobStatus | None:
        with self._pool.connection() as conn, conn.transaction():
            row = conn.execute(Q["job_cancel"], {"job_id": job_id, "now": now}).fetchone()
            if row is None:
                return None
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, f"cancel:{job_id}"))
        return JobStatus(row["status"])

    def job_cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        if not job_ids:
            return set()
        with self._pool.connection() as conn:
            rows = conn.execute(Q["job_cancel_requested"], {"job_ids": list(job_ids)}).fetchall()
        return {AttemptToken(int(row["id"]), int(row["attempt"])) for row in rows}

    def job_retry(self, job_id: int, now: datetime) -> bool:
        with self._pool.connection() as conn:
            try:
                with conn.transaction():
                    row = conn.execute(Q["job_retry"], {"job_id": job_id, "now": now}).fetchone()
                    if row is not None:
                        conn.execute("SELECT pg_notify(%s, 'job')", (CHANNEL,))
            except psycopg.errors.UniqueViolation as exc:
                job = self.job_get(job_id)
                raise InputError(
                    "dedup_key",
                    f"another active or done job holds dedup key "
                    f"{job.dedup_key if job else None!r}",
                    "cancel that job first, or submit a new job with --force",
                ) from exc
        return row is not None

    # -- attempts and events ------------------------------------------------------------------

    def attempt_list(self, job_id: int) -> list[Attempt]:
        with self._pool.connection() as conn:
            rows = conn.execute(Q["attempt_list"], {"job_id": job_id}).fetchall()
        return [attempt_from_row(row) for row in rows]

    def attempt_list_live(self, host: str | None = None) -> list[LiveAttempt]:
        with self._pool.connection() as conn:
            rows = conn.execute(Q["attempt_list_live"], {"host": host}).fetchall()
        return [live_attempt_from_row(row) for row in rows]

    def event_list(self, job_id: int) -> list[Event]:
        with self._pool.connection() as conn:
            rows = conn.execute(Q["event_list"], {"job_id": job_id}).fetchall()
        return [event_from_row(row) for row in rows]

    def listen(self) -> Waker:
        return PostgresWaker(self.url)


def _spec_params(spec: JobSpec, now: datetime) -> dict[str, Any]:
    return {
        "job_type": spec.job_type,
        "command": Jsonb(list(spec.command)),
        "shell": spec.shell,
        "payload": Jsonb(dict(spec.payload)),
        "priority": spec.priority,
        "weight": spec.weight,
        "dedup_key": spec.dedup_key,
        "affinity": spec.affinity,
        "available_at": now if spec.available_at is None else spec.available_at,
        "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds,
        "env": Jsonb(dict(spec.env)),
        "workdir": spec.workdir,
        "backoff_base_seconds": spec.backoff_base_seconds,
        "backoff_max_seconds": spec.backoff_max_seconds,
        "now": now,
    }
