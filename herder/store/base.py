"""The store interface both backends implement, and the pieces they share.

A store method and its SQL query share one name in both dialects (`job_claim`, ...), so one
grep finds the Python call and its SQL (shared, or one version per dialect).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from msgspec.structs import fields

from herder.core.errors import Conflict, InputError, StoreUnavailable
from herder.core.model import (
    RAM_TOLERANCE_GB,
    Account,
    AccountHealth,
    AccountRecord,
    Attempt,
    AttemptResult,
    AttemptToken,
    Decision,
    Enforcement,
    Event,
    HeartbeatReply,
    HostRecord,
    HostUsage,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
    MemoryUse,
    Outcome,
    Reservation,
    ReservationKind,
    ReservationStatus,
    Scope,
    TokenRecord,
    Transport,
    Usage,
)
from herder.store.driver import SQL, Driver, Json, Lease, Transaction, Waker


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


ASSIGNED = "assigned:"
"""The topic a placement notifies (`job_assign`), followed by its host: it wakes the replicas
that are not the leader (their agents' long-polls, their ssh launchers)."""


class LiveAttempt(msgspec.Struct, frozen=True):
    """An attempt that has not ended, with the job counters its rescue decision needs."""

    attempt: Attempt
    job_status: JobStatus
    failures: int
    lost: int
    max_attempts: int
    backoff_base_seconds: float
    backoff_max_seconds: float


class DueJob(msgspec.Struct, frozen=True):
    """A queued job that may run now: what placement needs to know about it."""

    id: int
    priority: int
    weight: str
    job_type: str
    affinity: str | None
    created_at: datetime
    available_at: datetime
    avoid_host: str | None = None
    """The last host that failed to start it (placement prefers any other that fits)."""


class Alert(msgspec.Struct, frozen=True):
    id: int
    key: str
    message: str
    opened_at: datetime
    cleared_at: datetime | None
    sent_at: datetime | None = None
    """When its opening was handed to the delivery queue (None: not sent, or held back)."""
    resolved_sent_at: datetime | None = None
    """When its clearing was handed to the delivery queue."""
    sent_count: int = 0


class FleetSetting(msgspec.Struct, frozen=True):
    """A fleet setting an operator changed at run time (`herder fleet cap`): it overrides
    herder.toml for every replica; `value` None is "lifted"."""

    name: str
    value: int | None
    updated_at: datetime
    updated_by: str


class DeliveryRecord(msgspec.Struct, frozen=True):
    """What recording a webhook delivery did: `first` is False for a delivery seen before
    (nothing inserted; `job_ids` are what it enqueued then); `created` are the new jobs
    (the others were already held by their dedup keys)."""

    first: bool
    job_ids: tuple[int, ...]
    created: tuple[int, ...]

    @classmethod
    def of(cls, results: Sequence[InsertResult]) -> DeliveryRecord:
        return cls(True, tuple(result.job_id for result in results),
                   tuple(result.job_id for result in results if result.created))


class Store:
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

    def job_insert(
        self, specs: Sequence[JobSpec], now: datetime, force: bool = False
    ) -> list[InsertResult]:
        """Insert jobs in one transaction; a dedup conflict returns the holder instead.

        `force` releases the key from a `done` job first (a deliberate rerun); it never
        releases a key held by a queued, claimed or running job.
        """
        return self.driver.job_insert([spec_params(spec, now) for spec in specs],
                                      sorted(dedup_keys(specs)) if force else [], now)

    def delivery_record(self, source: str, delivery_id: str, event: str,
                        specs: Sequence[JobSpec], now: datetime) -> DeliveryRecord:
        """Record a webhook delivery and insert its jobs in one transaction; a delivery
        seen before (its source and id) inserts nothing. A crash loses both, so the
        forge's redelivery enqueues; a replay never enqueues twice."""
        key = {"source": source, "delivery_id": delivery_id}
        with self.driver.transaction() as transaction:
            # A concurrent replay waits here on the key until this one commits (then it
            # inserts nothing) or rolls back (then it enqueues in its place).
            if not transaction.fetch("delivery_record", {**key, "event": event, "now": now}):
                seen = transaction.fetch("delivery_get", key)
                # (None only if the sweep forgot it in between: still a replay.)
                return DeliveryRecord(False, tuple(seen[0]["job_ids"]) if seen else (), ())
            results = transaction.job_insert([spec_params(spec, now) for spec in specs], [],
                                             now)
            transaction.fetch("delivery_set_jobs", {
                **key, "job_ids": Json([result.job_id for result in results])})
        return DeliveryRecord.of(results)

    def delivery_expire(self, before: datetime) -> int:
        """Forget deliveries received before `before`; how many."""
        return len(self.driver.write("delivery_expire", {"before": before}))

    def job_claim(self, host: str, worker: str, limit: int, now: datetime,
                  blocked_job_types: Collection[str] = ()) -> list[Job]:
        """Atomically move up to `limit` due queued jobs to claimed, each with a new attempt;
        none of `blocked_job_types` (their preflight failed on this host)."""
        if limit < 1:
            return []
        columns = self.driver.job_claim({
            "host": host, "worker": worker, "limit": limit, "now": now,
            "detail": Json({"host": host, "worker": worker}),
            "blocked": Json(sorted(blocked_job_types))})
        return claimed_jobs(columns, host, now) if columns else []

    def attempt_heartbeat(
        self, host: str, tokens: Sequence[AttemptToken], now: datetime
    ) -> HeartbeatReply:
        """Mark `host`'s live attempts as seen; which of the tokens are live there, and which
        of those must stop (another host's attempt is not live here, and is not renewed).
        All tokens are one statement: their job ids and attempts as two arrays."""
        if not tokens:
            return HeartbeatReply(frozenset(), frozenset())
        rows = self.driver.write("attempt_heartbeat", {
            "job_ids": [token.job_id for token in tokens],
            "attempts": [token.attempt for token in tokens], "host": host, "now": now})
        live = {AttemptToken(int(row["job_id"]), int(row["attempt"])): bool(row["cancel_requested"])
                for row in rows}
        return HeartbeatReply(frozenset(live),
                              frozenset(token for token, cancel in live.items() if cancel))

    def attempt_finish(
        self, results: Sequence[AttemptResult], now: datetime
    ) -> list[tuple[AttemptToken, JobStatus]]:
        """Apply ended attempts; only live attempts are applied and returned."""
        if not results:
            return []
        # Each group's parameters are ready before the driver takes a lock or a connection.
        groups = finish_groups(results)
        applied = self.driver.attempt_finish([
            {**finish_params(outcome, exit_code, decision, memory), "now": now,
             "available_at": decision.available_at, "tokens": Json(tokens),
             "detail": Json(finish_detail(outcome, exit_code, report))}
            for (outcome, exit_code, decision, report, memory), tokens, _ in groups])
        return [(held[job_id], STATUSES[status])
                for (_, _, held), rows in zip(groups, applied, strict=True)
                for job_id, _, status in rows]

    def job_cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        """Current attempts of these jobs whose cancellation was requested (read-only)."""
        if not job_ids:
            return set()
        return {AttemptToken(int(row["job_id"]), int(row["attempt"])) for row in
                self.driver.read("job_cancel_requested", {"job_ids": list(job_ids)})}

    # -- fleet ------------------------------------------------------------------------------

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

    def close(self) -> None:
        self.driver.close()

    # -- written once, over the driver ----------------------------------------------------

    def job_dedup_holder(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        """The job that currently holds a dedup key, if any."""
        rows = self.driver.read("job_dedup_holder", {"dedup_key": dedup_key})
        return (int(rows[0]["id"]), JobStatus(rows[0]["status"])) if rows else None

    def job_get(self, job_id: int) -> Job | None:
        rows = self.driver.read("job_get", {"job_id": job_id})
        return job_from_row(rows[0]) if rows else None

    def job_list(
        self, statuses: Sequence[JobStatus] | None = None, limit: int = 100
    ) -> list[Job]:
        return [job_from_row(row) for row in self.driver.read("job_list", {
            "statuses": None if statuses is None else Json([str(s) for s in statuses]),
            "limit": limit})]

    def job_list_page(self, status: JobStatus | None = None, job_type: str | None = None,
                      host: str | None = None, dedup_key: str | None = None,
                      before: int | None = None, limit: int = 50) -> list[Job]:
        """Newest first, ids below `before`: one page of the dashboard's jobs view, its cost
        the page's size whatever the table's (keyset paging, no OFFSET)."""
        return [job_from_row(row) for row in self.driver.read("job_list_page", {
            "status": None if status is None else str(status), "job_type": job_type,
            "host": host, "dedup_key": dedup_key, "before": before, "limit": limit})]

    def job_list_due(self, now: datetime, limit: int) -> list[DueJob]:
        return [due_job_from_row(row)
                for row in self.driver.read("job_list_due", {"now": now, "limit": limit})]

    def attempt_list_recent_outcomes(self, since: datetime, per_group: int
                                     ) -> dict[tuple[str, str], list[tuple[Outcome, datetime]]]:
        """(host, job type) -> its newest ended attempts since `since` (newest first, at
        most `per_group`): what the circuit breakers are judged from."""
        found: dict[tuple[str, str], list[tuple[Outcome, datetime]]] = {}
        for row in self.driver.read("attempt_list_recent_outcomes",
                                    {"since": since, "per_group": per_group}):
            found.setdefault((row["host"], row["job_type"]), []).append(
                (Outcome(row["outcome"]), row["ended_at"]))
        return found

    def job_list_running_types(self) -> dict[tuple[str, str], datetime]:
        """(host, job type) -> when its newest live attempt was claimed."""
        return {(row["host"], row["job_type"]): row["claimed_at"]
                for row in self.driver.read("job_list_running_types")}

    def attempt_list_live(self, host: str | None = None) -> list[LiveAttempt]:
        return [live_attempt_from_row(row)
                for row in self.driver.read("attempt_list_live", {"host": host})]

    def attempt_list_assigned(self, host: str, limit: int) -> list[Job]:
        """Claimed jobs placed on a host whose attempt has not started yet."""
        return [job_from_row(row) for row in self.driver.read(
            "attempt_list_assigned", {"host": host, "limit": limit})]

    def host_preflight_record(self, label: str, failed: Mapping[str, str]) -> bool:
        """The job types whose preflight fails on this (ssh) host, with why; its
        heartbeat untouched. False when there is no such host."""
        return bool(self.driver.write("host_preflight_record", {
            "label": label, "preflight_failed": Json(dict(failed))}))

    def host_heartbeat_push(self, label: str, now: datetime, via: str) -> bool:
        """A push host's heartbeat: its last preflight (`host_preflight_record`) stands."""
        return bool(self.driver.write("host_heartbeat_push", {
            "label": label, "now": now, "via": via}))

    def host_agent_gone(self, label: str, worker: str) -> bool:
        """Mark the host's agent gone (stopped) while `worker` is the last one that
        heartbeated; False when another agent has heartbeated since, the agent stopped
        cleanly, or there is no such host."""
        return bool(self.driver.write("host_agent_gone", {"label": label, "worker": worker}))

    def attempt_start(
        self, token: AttemptToken, pid: int, log_path: str | None, now: datetime
    ) -> bool:
        """claimed -> running; False when the attempt was fenced out meanwhile."""
        with self.driver.transaction() as transaction:
            if not transaction.fetch("attempt_start", {
                    "job_id": token.job_id, "attempt": token.attempt, "pid": pid,
                    "log_path": log_path, "now": now}):
                return False
            insert_event(transaction, token.job_id, now, "started", JobStatus.CLAIMED,
                          JobStatus.RUNNING, token.attempt, {"pid": pid, "log_path": log_path})
        return True

    def job_cancel(self, job_id: int, now: datetime) -> JobStatus | None:
        """Cancel a queued job, or ask a claimed/running one to stop; None if not active."""
        with self.driver.transaction() as transaction:
            rows = transaction.fetch("job_cancel", {"job_id": job_id, "now": now})
            if not rows:
                return None
            status = JobStatus(rows[0]["status"])
            requested = bool(rows[0]["cancel_requested"])
            insert_event(transaction, job_id, now,
                          "cancel_requested" if requested else "cancelled",
                          status if requested else JobStatus.QUEUED, status,
                          int(rows[0]["attempt"]), {})
            transaction.notify(f"cancel:{job_id}")
        return status

    def job_retry(self, job_id: int, now: datetime) -> bool:
        """Queue an ended job again with a fresh failure budget."""
        with self.driver.transaction() as transaction:
            old = transaction.fetch("job_get", {"job_id": job_id})
            if not old:
                return False
            try:
                rows = transaction.fetch("job_retry", {"job_id": job_id, "now": now})
            except self.driver.conflict as exc:
                raise InputError(
                    "dedup_key",
                    f"another active or done job holds dedup key {old[0]['dedup_key']!r}",
                    "cancel that job first, or submit a new job with --force",
                ) from exc
            if not rows:
                return False
            insert_event(transaction, job_id, now, "retried", JobStatus(old[0]["status"]),
                         JobStatus.QUEUED, int(rows[0]["attempt"]), {})
            transaction.notify("job")
        return True

    def notify(self, topic: str) -> None:
        """Wake listeners in other processes (PostgreSQL); SQLite's waker needs nothing."""
        self.driver.notify(topic)

    def listen(self) -> Waker:
        """A waker that returns early when jobs are submitted, requeued or cancelled."""
        return self.driver.listen()

    def job_counts(self) -> dict[JobStatus, int]:
        """Counts of active jobs (queued, claimed, running)."""
        return {JobStatus(row["status"]): int(row["count"])
                for row in self.driver.read("job_counts")}

    def job_status_counts(self) -> dict[JobStatus, int]:
        """Counts of jobs in every status, ended ones too (`/queue`, `/metrics`)."""
        return {JobStatus(row["status"]): int(row["count"])
                for row in self.driver.read("job_status_counts")}

    def job_queue_depth(self) -> dict[tuple[str, int], int]:
        """(weight, priority) -> how many jobs are queued with them."""
        return {(row["weight"], int(row["priority"])): int(row["count"])
                for row in self.driver.read("job_queue_depth")}

    def job_failure_counts(self) -> dict[tuple[str, bool], int]:
        """(failure reason, actionable) -> how many jobs ended failed with them."""
        counts: dict[tuple[str, bool], int] = {}
        for row in self.driver.read("job_failure_counts"):
            key = (str(row["reason"]), bool(row["actionable"]))
            counts[key] = counts.get(key, 0) + int(row["count"])
        return counts

    def attempt_outcome_counts(self, since: datetime) -> dict[tuple[str, Outcome], int]:
        """(host, outcome) -> attempts that ended with it on the host since `since`."""
        counts: dict[tuple[str, Outcome], int] = {}
        for row in self.driver.read("attempt_outcome_counts", {"since": since}):
            try:
                outcome = Outcome(row["outcome"])
            except ValueError:  # an outcome a newer herder wrote
                continue
            counts[(str(row["host"]), outcome)] = int(row["count"])
        return counts

    def attempt_list(self, job_id: int) -> list[Attempt]:
        return [attempt_from_row(row)
                for row in self.driver.read("attempt_list", {"job_id": job_id})]

    def event_latest_id(self) -> int:
        """The newest event's id (0 with none): it moves whenever a job changes."""
        return int(self.driver.read("event_latest_id")[0]["id"] or 0)

    def event_list(self, job_id: int) -> list[Event]:
        return [event_from_row(row) for row in self.driver.read("event_list", {"job_id": job_id})]

    def host_insert(self, host: HostRecord, now: datetime) -> bool:
        """False when the label exists already."""
        return bool(self.driver.write("host_insert", _host_params(host, now)))

    def host_update(self, host: HostRecord, now: datetime) -> bool:
        return bool(self.driver.write("host_update", _host_params(host, now)))

    def host_get(self, label: str) -> HostRecord | None:
        rows = self.driver.read("host_get", {"label": label})
        return host_from_row(rows[0]) if rows else None

    def host_list(self) -> list[HostRecord]:
        return [host_from_row(row) for row in self.driver.read("host_list")]

    def host_remove(self, label: str) -> bool:
        """False when the host is unknown or still has claimed or running jobs."""
        return bool(self.driver.write("host_remove", {"label": label}))

    def host_heartbeat(self, label: str, now: datetime, agent_info: Mapping[str, Any]) -> bool:
        return bool(self.driver.write("host_heartbeat", {
            "label": label, "now": now, "agent_info": Json(dict(agent_info))}))

    def host_usage(self, now: datetime) -> dict[str, HostUsage]:
        return {row["label"]: HostUsage(row["label"], int(row["workers"]), float(row["jobs_gb"]),
                                        float(row["reserved_gb"]))
                for row in self.driver.read("host_usage", {"now": now})}

    def job_assign(
        self,
        host: str,
        items: Sequence[tuple[int, float]],
        max_workers: int,
        bookable_gb: float,
        now: datetime,
    ) -> list[AttemptToken]:
        """Place (job id, RAM GB) pairs on a host, re-checking its capacity in SQL under a
        host lock, so two schedulers can never overbook it. Returns what was placed."""
        placed: list[AttemptToken] = []
        with self.driver.transaction() as transaction:
            # The host lock serialises every assigner of this host; capacity is then re-read
            # inside the lock, so a stale plan can never overbook it.
            if not transaction.fetch("host_lock", {"label": host}):
                return []
            [booked] = transaction.fetch("host_booked", {"label": host, "now": now})
            workers, booked_gb = int(booked["workers"]), float(booked["booked_gb"])
            for job_id, ram_gb in items:
                if workers + 1 > max_workers:
                    break
                if not ram_fits(booked_gb, ram_gb, bookable_gb):
                    continue
                rows = transaction.fetch("job_assign", {"job_id": job_id, "host": host,
                                                        "ram_gb": ram_gb, "now": now})
                if not rows:
                    continue
                token = AttemptToken(int(rows[0]["id"]), int(rows[0]["attempt"]))
                insert_event(transaction, token.job_id, now, "placed", JobStatus.QUEUED,
                              JobStatus.CLAIMED, token.attempt, {"host": host, "ram_gb": ram_gb})
                workers += 1
                booked_gb += ram_gb
                placed.append(token)
            if placed:
                transaction.notify(ASSIGNED + host)
        return placed

    def attempt_adopt(self, host: str, token: AttemptToken, previous: str, worker: str,
                      now: datetime) -> bool:
        """Hand a live attempt of `host` from its dead worker `previous` to `worker`;
        False when it is not live there or not `previous`'s (fenced out: kill it)."""
        return bool(self.driver.write("attempt_adopt", {
            "job_id": token.job_id, "attempt": token.attempt, "host": host,
            "previous": previous, "worker": worker, "now": now}))

    def attempt_set_worker(self, token: AttemptToken, worker: str, now: datetime) -> bool:
        """Take a placed attempt for one runner; False when another runner has it. Its
        lease starts again at `now`."""
        return bool(self.driver.write("attempt_set_worker", {
            "job_id": token.job_id, "attempt": token.attempt, "worker": worker, "now": now}))

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
        created_by: int | None = None,
        max_held: int | None = None,
        job_id: int | None = None,
        job_cap: int | None = None,
    ) -> list[Reservation]:
        """Book up to `count` slots; with `bookable_gb` only as many as fit, with `max_held`
        only as many as keep token `created_by` within that many active ones. A CI slot is
        idempotent per owner: claiming it again returns the live one (whoever made it).
        With `job_cap`, JobCapReached (nothing booked) when job `job_id` would hold more
        than that many live subagent slots on the host."""
        created: list[Reservation] = []
        with self.driver.transaction() as transaction:
            if not transaction.fetch("host_lock", {"label": host}):
                return []
            if kind is ReservationKind.CI:
                existing = transaction.fetch("reservation_active_ci", {"owner": owner})
                if existing:
                    return [reservation_from_row(existing[0])]
            if job_cap is not None and job_id is not None:
                [row] = transaction.fetch("reservation_count_for_job", {
                    "job_id": job_id, "host": host, "now": now})
                if int(row["held"]) + count > job_cap:
                    raise JobCapReached(int(row["held"]))
            if max_held is not None and created_by is not None:
                [held] = transaction.fetch("reservation_count_by", {"created_by": created_by})
                count = min(count, max(0, max_held - int(held["held"])))
            [booked] = transaction.fetch("host_booked", {"label": host, "now": now})
            fit = slots_that_fit(count, ram_gb, float(booked["booked_gb"]), bookable_gb)
            for _ in range(fit):
                created.extend(reservation_from_row(row) for row in transaction.fetch(
                    "reservation_insert", {
                        "kind": str(kind), "owner": owner, "host": host, "weight": weight,
                        "ram_gb": ram_gb, "detail": Json({}), "now": now,
                        "expires_at": expires_at, "created_by": created_by,
                        "job_id": job_id}))
        return created

    def reservation_end(
        self, reservation_id: int, status: ReservationStatus, now: datetime,
        by: int | None = None,
    ) -> Reservation | None:
        """End an active reservation; with `by`, only one that token made."""
        rows = self.driver.write("reservation_end", {
            "id": reservation_id, "status": str(status), "now": now, "detail": Json({}),
            "by": by})
        return reservation_from_row(rows[0]) if rows else None

    def reservation_active_ci(self, owner: str) -> Reservation | None:
        """A run's active CI slot, if it holds one."""
        rows = self.driver.read("reservation_active_ci", {"owner": owner})
        return reservation_from_row(rows[0]) if rows else None

    def reservation_get(self, reservation_id: int) -> Reservation | None:
        rows = self.driver.read("reservation_get", {"id": reservation_id})
        return reservation_from_row(rows[0]) if rows else None

    def reservation_release_ci(self, owner: str, now: datetime,
                               by: int | None = None) -> Reservation | None:
        """Release a run's active CI slot; with `by`, only one that token made."""
        rows = self.driver.write("reservation_release_ci", {"owner": owner, "now": now,
                                                            "by": by})
        return reservation_from_row(rows[0]) if rows else None

    def reservation_list(self, host: str | None = None) -> list[Reservation]:
        return [reservation_from_row(row)
                for row in self.driver.read("reservation_list", {"host": host})]

    def reservation_expire(self, now: datetime) -> int:
        return len(self.driver.write("reservation_expire", {"now": now}))

    def token_insert(self, name: str, scope: Scope, token_hash: str, now: datetime,
                     host: str | None = None, job_types: frozenset[str] | None = None,
                     priority_floor: int | None = None, allow_adhoc: bool = False) -> int:
        """The new token's id; the hash is unique (a duplicate raises)."""
        [row] = self.driver.write("token_insert", {
            "name": name, "scope": str(scope), "token_hash": token_hash, "host": host,
            "job_types": None if job_types is None else Json(sorted(job_types)),
            "priority_floor": priority_floor, "allow_adhoc": allow_adhoc, "now": now})
        return int(row["id"])

    def token_get(self, token_hash: str) -> TokenRecord | None:
        """The token with this hash, revoked or not (so a caller can be told which)."""
        rows = self.driver.read("token_get", {"token_hash": token_hash})
        return token_from_row(rows[0]) if rows else None

    def token_list(self) -> list[TokenRecord]:
        return [token_from_row(row) for row in self.driver.read("token_list")]

    def token_revoke(self, token_id: int, now: datetime) -> bool:
        """False when there is no such live token."""
        return bool(self.driver.write("token_revoke", {"id": token_id, "now": now}))

    def token_revoke_host(self, host: str, now: datetime) -> int:
        """Revoke every live token bound to `host`; how many."""
        return len(self.driver.write("token_revoke_host", {"host": host, "now": now}))

    def session_open(self, id_hash: str, token_key: str, csrf: str,
                     expires_at: datetime) -> None:
        self.driver.write("session_open", {"id_hash": id_hash, "token_key": token_key,
                                           "csrf": csrf, "expires_at": expires_at})

    def session_get(self, id_hash: str, now: datetime) -> tuple[str, str] | None:
        """(token key, CSRF value) of a live session; None when unknown or expired."""
        rows = self.driver.read("session_get", {"id_hash": id_hash, "now": now})
        return (str(rows[0]["token_key"]), str(rows[0]["csrf"])) if rows else None

    def session_close(self, id_hash: str) -> bool:
        return bool(self.driver.write("session_close", {"id_hash": id_hash}))

    def session_expire(self, now: datetime) -> int:
        """Forget the sessions expired by `now`; how many."""
        return len(self.driver.write("session_expire", {"now": now}))

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

    # -- accounts (herder.core.scheduling.accounts) ----------------------------------------------

    def account_upsert(self, account: Account, now: datetime) -> None:
        """Create or update an account's declaration; its health is kept."""
        self.driver.write("account_upsert", {
            "host": account.host, "name": account.name, "env": Json(dict(account.env)),
            "max_sessions": account.max_sessions,
            "job_types": None if account.job_types is None else Json(sorted(account.job_types)),
            "probe": None if account.probe is None else Json(list(account.probe)),
            "source": account.source, "now": now})

    def account_delete(self, host: str, name: str) -> bool:
        return bool(self.driver.write("account_delete", {"host": host, "name": name}))

    def account_list(self, host: str | None = None) -> list[AccountRecord]:
        """Every account (of `host`), with its health and sessions; never its env."""
        return [account_from_row(row)
                for row in self.driver.read("account_list", {"host": host})]

    def account_env(self, host: str, name: str) -> dict[str, str] | None:
        """What the account gives a job (may hold secrets: never log it)."""
        rows = self.driver.read("account_env", {"host": host, "name": name})
        return {str(k): str(v) for k, v in rows[0]["env"].items()} if rows else None

    def account_mark_depleted(self, host: str, name: str, until: datetime,
                              now: datetime) -> bool:
        return bool(self.driver.write("account_mark_depleted", {
            "host": host, "name": name, "until": until, "now": now}))

    def account_mark_revoked(self, host: str, name: str, now: datetime) -> bool:
        return bool(self.driver.write("account_mark_revoked",
                                      {"host": host, "name": name, "now": now}))

    def account_clear(self, host: str, name: str, now: datetime) -> bool:
        """Clear `depleted` and `auth_revoked`; False when neither was set."""
        return bool(self.driver.write("account_clear",
                                      {"host": host, "name": name, "now": now}))

    def account_record_probe(self, host: str, name: str, dead_token: bool | None,
                             now: datetime, usage: Usage | None = None) -> bool:
        """What the account's probe said: its token's verdict and its quota (unknown
        fields None)."""
        usage = usage or Usage()
        return bool(self.driver.write("account_record_probe", {
            "host": host, "name": name, "dead_token": dead_token, "now": now,
            "usage_percent": usage.percent, "usage_resets_at": usage.resets_at}))

    def attempt_bind_account(self, token: AttemptToken, host: str, account: str,
                             max_sessions: int, now: datetime) -> bool:
        """Run the live attempt under `account` while the account has a free session; the
        job's history records it (an `account` event). False when it is full or the attempt
        is no longer live."""
        with self.driver.transaction() as transaction:
            if not transaction.fetch("attempt_bind_account", {
                    "job_id": token.job_id, "attempt": token.attempt, "host": host,
                    "account": account, "max_sessions": max_sessions}):
                return False
            insert_event(transaction, token.job_id, now, "account", None, None, token.attempt,
                         {"account": account, "host": host})
        return True

    def attempt_get_account(self, token: AttemptToken) -> tuple[str, str] | None:
        """(host, account) the attempt runs under, while it is the job's latest."""
        rows = self.driver.read("attempt_get_account",
                                {"job_id": token.job_id, "attempt": token.attempt})
        if not rows or rows[0]["account"] is None or rows[0]["host"] is None:
            return None
        return rows[0]["host"], rows[0]["account"]

    def job_clear_account(self, job_id: int) -> bool:
        """Forget the account of a job whose attempt has ended."""
        return bool(self.driver.write("job_clear_account", {"job_id": job_id}))

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def object_from_json(value: str | bytes | None) -> Any:
    """A JSON column's value, from SQLite's text or psycopg's bytes. `{}`, the usual payload
    and env, skips the parser: a claim decodes both for every job (a new dict each time, as
    the caller may keep it)."""
    if value is None:
        return None
    if value in ("{}", b"{}"):
        return {}
    return json.loads(value)


DEDUP_RELEASED_DETAIL = {"reason": "forced rerun"}
"""The `dedup_released` event's detail: a forced submit is the only release."""


def spec_params(spec: JobSpec, now: datetime) -> dict[str, Any]:
    """A submitted job's column values, as job_insert takes them (each driver adapts the
    times and JSON to its dialect)."""
    return {
        "job_type": spec.job_type,
        "command": Json(list(spec.command)),
        "shell": spec.shell,
        "payload": Json(dict(spec.payload)),
        "priority": spec.priority,
        "weight": spec.weight,
        "dedup_key": spec.dedup_key,
        "affinity": spec.affinity,
        "available_at": now if spec.available_at is None else spec.available_at,
        "max_attempts": spec.max_attempts,
        "timeout_seconds": spec.timeout_seconds,
        "silence_timeout_seconds": spec.silence_timeout_seconds,
        "env": Json(dict(spec.env)),
        "workdir": spec.workdir,
        "backoff_base_seconds": spec.backoff_base_seconds,
        "backoff_max_seconds": spec.backoff_max_seconds,
        "now": now,
    }


def dedup_keys(specs: Sequence[JobSpec]) -> set[str]:
    """The dedup keys a forced submit releases from `done` jobs before inserting."""
    return {spec.dedup_key for spec in specs if spec.dedup_key is not None}


FinishKey = tuple[Outcome, int | None, Decision, str | None, MemoryUse | None]
"""What a finish group shares: outcome, exit code, decision, report and memory."""
FinishGroup = tuple[FinishKey, dict[int, int], dict[int, AttemptToken]]
_Shelf = tuple[dict[int, int], dict[int, AttemptToken]]


def finish_groups(results: Sequence[AttemptResult]) -> list[FinishGroup]:
    """Results that share outcome, exit code and decision, each group's tokens as
    {job_id: attempt}: both stores finish a group with one statement, its decision passed
    once (a batch is usually one group), and find each job's attempt by key. Each group also
    keeps the callers' token objects by job, so a store reports the applied ones without
    building new tokens. Two tokens of one job go to separate groups (only the live one can
    apply); a repeated token keeps its first result."""
    groups: dict[FinishKey, list[_Shelf]] = {}
    seen: set[tuple[int, int]] = set()  # plain tuples: they hash in C
    last: FinishKey | None = None
    shelves: list[_Shelf] = []
    for result in results:
        token = result.token
        job_id, attempt = token.job_id, token.attempt
        if (job_id, attempt) in seen:
            continue
        seen.add((job_id, attempt))
        # A batch's results usually share one outcome and decision object: only a change
        # pays for hashing the decision (a dataclass hashes in Python).
        if (last is None or result.decision is not last[2] or result.outcome is not last[0]
                or result.exit_code != last[1] or result.report is not last[3]
                or result.memory is not last[4]):
            last = (result.outcome, result.exit_code, result.decision, result.report,
                    result.memory)
            shelves = groups.setdefault(last, [])
        for shelf in shelves:
            if job_id not in shelf[0]:
                break
        else:
            shelf = ({}, {})
            shelves.append(shelf)
        tokens, held = shelf
        tokens[job_id] = attempt
        held[job_id] = token
    return [(key, tokens, held) for key, shelves in groups.items() for tokens, held in shelves]


def finish_params(outcome: Outcome, exit_code: int | None, decision: Decision,
                  memory: MemoryUse | None = None) -> dict[str, Any]:
    """A finish group's shared parameters, named as both dialects' attempt_finish statements
    read them; each store adds the tokens, `now` and `available_at` in its own time form."""
    return {"outcome": outcome.value, "exit_code": exit_code,
            "next_status": decision.status.value, "failure_reason": decision.failure_reason,
            "spend_failure": int(decision.spend_failure), "spend_lost": int(decision.spend_lost),
            "spend_spawn_failure": int(decision.spend_spawn_failure),
            "spend_transient": int(decision.spend_transient), "weight": decision.weight,
            "avoid_host": int(decision.avoid_host),
            "actionable": int(decision.actionable),
            "human_action": int(decision.human_action),
            "peak_rss_bytes": memory.peak_rss_bytes if memory else None,
            "memory_budget_bytes": memory.budget_bytes if memory else None,
            "memory_enforcement": memory.enforcement.value if memory else None}


def finish_detail(outcome: Outcome, exit_code: int | None, report: str | None
                  ) -> dict[str, Any]:
    """The `finished` event's detail: the outcome and exit code, and what the attempt's
    report adds (it cannot override those two)."""
    extra = json.loads(report) if report else {}
    return {**(extra if isinstance(extra, dict) else {}), "outcome": outcome.value,
            "exit_code": exit_code}


# A status's stored text -> the member; `JobStatus(text)` costs a microsecond a job in a claim.
STATUSES: dict[str, JobStatus] = {status.value: status for status in JobStatus}


_JOB_FIELDS = tuple(field.name for field in fields(Job))
_FLAGS = ("shell", "cancel_requested", "actionable", "human_action")
"""Job fields SQLite stores as integers."""


def claimed_jobs(columns: dict[str, Sequence[Any]], host: str, now: datetime) -> list[Job]:
    """The Jobs a claim took, from its values column by column (`columns`: each column's
    values in claim order, JSON and times decoded). What the claim set (status, host, its
    times) is filled in from what it wrote, not read back. A job is one constructor call
    and no dict: at batch 100 dicts per row and `job_from_row` were a fifth of a claim's
    client time."""
    count = len(columns["id"])
    columns = {**columns, "status": [JobStatus.CLAIMED] * count, "host": [host] * count,
               "claimed_at": [now] * count, "started_at": [None] * count,
               "updated_at": [now] * count,
               "command": [tuple(command) for command in columns["command"]]}
    for flag in _FLAGS:
        columns[flag] = [bool(value) for value in columns[flag]]
    return [Job(*values) for values in zip(*(columns[name] for name in _JOB_FIELDS),
                                            strict=True)]


def job_from_row(row: Mapping[str, Any]) -> Job:
    """Build a Job from a row whose values are already Python types (JSON decoded, times
    as datetimes; SQLite's flags still integers); rows written before the fleet columns
    existed lack `ram_gb` and `spawn_failures`."""
    return Job(
        row["id"], row["job_type"], tuple(row["command"]), bool(row["shell"]), row["payload"],
        row["priority"], row["weight"], row["dedup_key"], row["affinity"], row["available_at"],
        row["max_attempts"], row["timeout_seconds"], row["env"], row["workdir"],
        row["backoff_base_seconds"], row["backoff_max_seconds"], STATUSES[row["status"]],
        row["attempt"], row["failures"], row["lost"], row["host"], row["exit_code"],
        row["failure_reason"], bool(row["cancel_requested"]), row["created_at"],
        row["claimed_at"], row["started_at"], row["finished_at"], row["updated_at"],
        row.get("ram_gb", 0.0), row.get("spawn_failures", 0), row.get("transient_attempts", 0),
        row.get("escalations", 0), bool(row.get("actionable", False)),
        bool(row.get("human_action", False)), row.get("silence_timeout_seconds"))


def attempt_from_row(row: Mapping[str, Any]) -> Attempt:
    return Attempt(
        job_id=int(row["job_id"]),
        attempt=int(row["attempt"]),
        host=row["host"],
        worker=row["worker"],
        pid=row["pid"],
        log_path=row["log_path"],
        claimed_at=row["claimed_at"],
        started_at=row["started_at"],
        heartbeat_at=row["heartbeat_at"],
        ended_at=row["ended_at"],
        exit_code=row["exit_code"],
        outcome=Outcome(row["outcome"]) if row["outcome"] else None,
        memory=memory_from_row(row),
    )


def memory_from_row(row: Mapping[str, Any]) -> MemoryUse | None:
    """None for an attempt not measured (live, never ran, or from before schema v9)."""
    enforcement = row.get("memory_enforcement")
    if not enforcement:
        return None
    peak, budget = row.get("peak_rss_bytes"), row.get("memory_budget_bytes")
    return MemoryUse(None if peak is None else int(peak),
                     None if budget is None else int(budget), Enforcement(enforcement))


def live_attempt_from_row(row: Mapping[str, Any]) -> LiveAttempt:
    return LiveAttempt(
        attempt=attempt_from_row(row),
        job_status=JobStatus(row["job_status"]),
        failures=int(row["failures"]),
        lost=int(row["lost"]),
        max_attempts=int(row["max_attempts"]),
        backoff_base_seconds=float(row["backoff_base_seconds"]),
        backoff_max_seconds=float(row["backoff_max_seconds"]),
    )


def event_from_row(row: Mapping[str, Any]) -> Event:
    return Event(
        id=int(row["id"]),
        job_id=int(row["job_id"]),
        at=row["at"],
        kind=row["kind"],
        from_status=JobStatus(row["from_status"]) if row["from_status"] else None,
        to_status=JobStatus(row["to_status"]) if row["to_status"] else None,
        attempt=row["attempt"],
        detail=row["detail"] or {},
    )


def host_from_row(row: Mapping[str, Any]) -> HostRecord:
    def names(value: Any) -> frozenset[str] | None:
        return None if value is None else frozenset(value)

    return HostRecord(
        label=row["label"],
        ram_total_gb=float(row["ram_total_gb"]),
        ram_reserved_gb=float(row["ram_reserved_gb"]),
        cpus=int(row["cpus"]),
        enabled=bool(row["enabled"]),
        transport=Transport(row["transport"]),
        ssh_target=row["ssh_target"],
        prime_max_workers=int(row["prime_max_workers"]),
        prime_max_weight=row["prime_max_weight"],
        night_max_workers=int(row["night_max_workers"]),
        night_max_weight=row["night_max_weight"],
        allowed_job_types=names(row["allowed_job_types"]),
        allowed_weights=names(row["allowed_weights"]),
        priority_floor=row["priority_floor"],
        labels=frozenset(row["labels"] or ()),
        last_heartbeat=row["last_heartbeat"],
        agent_info=row["agent_info"] or {},
        has_token=bool(row["has_token"]),
    )


def insert_event(
    transaction: Transaction,
    job_id: int,
    now: datetime,
    kind: str,
    from_status: JobStatus | None,
    to_status: JobStatus | None,
    attempt: int | None,
    detail: Mapping[str, Any],
) -> None:
    transaction.fetch("event_insert", {
        "job_id": job_id, "now": now, "kind": kind,
        "from_status": None if from_status is None else from_status.value,
        "to_status": None if to_status is None else to_status.value,
        "attempt": attempt, "detail": Json(dict(detail))})


def _host_params(host: HostRecord, now: datetime) -> dict[str, Any]:
    """Column values of a host, as host_insert and host_update take them."""
    return {
        "now": now,
        "label": host.label,
        "ram_total_gb": host.ram_total_gb,
        "ram_reserved_gb": host.ram_reserved_gb,
        "cpus": host.cpus,
        "enabled": host.enabled,
        "transport": str(host.transport),
        "ssh_target": host.ssh_target,
        "prime_max_workers": host.prime_max_workers,
        "prime_max_weight": host.prime_max_weight,
        "night_max_workers": host.night_max_workers,
        "night_max_weight": host.night_max_weight,
        "allowed_job_types": None if host.allowed_job_types is None
        else Json(sorted(host.allowed_job_types)),
        "allowed_weights": None if host.allowed_weights is None
        else Json(sorted(host.allowed_weights)),
        "priority_floor": host.priority_floor,
        "labels": Json(sorted(host.labels)),
    }


def token_from_row(row: Mapping[str, Any]) -> TokenRecord:
    job_types = row["job_types"]
    return TokenRecord(
        id=int(row["id"]), name=row["name"], scope=Scope(row["scope"]),
        created_at=row["created_at"], host=row["host"],
        job_types=None if job_types is None else frozenset(job_types),
        priority_floor=row["priority_floor"], revoked_at=row["revoked_at"],
        allow_adhoc=bool(row["allow_adhoc"]),
    )


class JobCapReached(Conflict):
    """A job's subagent slots on a host would pass its weight's cap; `held`: how many it
    holds there now."""

    def __init__(self, held: int) -> None:
        super().__init__(f"the job holds {held} subagent slot(s) on the host")
        self.held = held


def reservation_from_row(row: Mapping[str, Any]) -> Reservation:
    return Reservation(
        id=int(row["id"]),
        kind=ReservationKind(row["kind"]),
        owner=row["owner"],
        host=row["host"],
        weight=row["weight"],
        ram_gb=float(row["ram_gb"]),
        status=ReservationStatus(row["status"]),
        created_at=row["created_at"],
        expires_at=row["expires_at"],
        ended_at=row["ended_at"],
        created_by=None if row["created_by"] is None else int(row["created_by"]),
        job_id=None if row.get("job_id") is None else int(row["job_id"]),
    )


def account_from_row(row: Mapping[str, Any]) -> AccountRecord:
    job_types, probe = row["job_types"], row["probe"]
    account = Account(row["host"], row["name"], {}, int(row["max_sessions"]),
                      None if job_types is None else frozenset(job_types),
                      None if probe is None else tuple(probe), row["source"])
    dead = row["dead_token"]
    percent = row["usage_percent"]
    health = AccountHealth(row["depleted_until"], row["auth_revoked_at"],
                           None if dead is None else bool(dead), row["probed_at"],
                           Usage(None if percent is None else float(percent),
                                 row["usage_resets_at"]))
    return AccountRecord(account, health, int(row["sessions"]))


def alert_from_row(row: Mapping[str, Any]) -> Alert:
    return Alert(int(row["id"]), row["key"], row["message"], row["opened_at"],
                 row["cleared_at"], row.get("sent_at"), row.get("resolved_sent_at"),
                 int(row.get("sent_count") or 0))


def due_job_from_row(row: Mapping[str, Any]) -> DueJob:
    return DueJob(int(row["id"]), int(row["priority"]), row["weight"], row["job_type"],
                  row["affinity"], row["created_at"], row["available_at"], row["avoid_host"])


def ram_fits(booked_gb: float, ram_gb: float, bookable_gb: float) -> bool:
    """The capacity re-check both stores run under the host lock before placing a job."""
    return booked_gb + ram_gb <= bookable_gb + RAM_TOLERANCE_GB


def slots_that_fit(count: int, ram_gb: float, booked_gb: float,
                   bookable_gb: float | None) -> int:
    """How many of `count` reservations of `ram_gb` fit; all when unbounded or free."""
    if bookable_gb is None or ram_gb <= 0:
        return count
    free = bookable_gb - booked_gb + RAM_TOLERANCE_GB
    return max(0, min(count, math.floor(free / ram_gb)))
