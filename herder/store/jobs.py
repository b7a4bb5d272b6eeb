"""The store's jobs: submit, claim, place, cancel, retry, list and count; and the webhook deliveries
that submit them."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from herder.core.errors import InputError
from herder.core.model import AttemptToken, InsertResult, Job, JobSpec, JobStatus
from herder.store.driver import Driver, Json
from herder.store.parameters import dedup_keys, insert_event, ram_fits, spec_params
from herder.store.records import ASSIGNED, DeliveryRecord, DueJob
from herder.store.rows import claimed_jobs, due_job_from_row, job_from_row


class JobStore:
    """Job operations of `Store` (a mixin over its driver)."""

    driver: Driver

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

    def job_cancel_requested(self, job_ids: Sequence[int]) -> set[AttemptToken]:
        """Current attempts of these jobs whose cancellation was requested (read-only)."""
        if not job_ids:
            return set()
        return {AttemptToken(int(row["job_id"]), int(row["attempt"])) for row in
                self.driver.read("job_cancel_requested", {"job_ids": list(job_ids)})}

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

    def job_list_running_types(self) -> dict[tuple[str, str], datetime]:
        """(host, job type) -> when its newest live attempt was claimed."""
        return {(row["host"], row["job_type"]): row["claimed_at"]
                for row in self.driver.read("job_list_running_types")}

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

    def job_clear_account(self, job_id: int) -> bool:
        """Forget the account of a job whose attempt has ended."""
        return bool(self.driver.write("job_clear_account", {"job_id": job_id}))
