"""The store's hosts, the slots reserved on them, the accounts they run jobs under, and the
machines `herder up` runs on (their presence, shown like hosts)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import msgspec

from herder.core.model import (
    Account,
    AccountRecord,
    HostRecord,
    HostUsage,
    Reservation,
    ReservationKind,
    ReservationStatus,
    RunnerPresence,
    Usage,
)
from herder.store.driver import Driver, Json
from herder.store.parameters import host_params, slots_that_fit
from herder.store.records import JobCapReached
from herder.store.rows import account_from_row, host_from_row, reservation_from_row


class HostStore:
    """Host, reservation and account operations of `Store` (a mixin over its driver)."""

    driver: Driver

    def host_insert(self, host: HostRecord, now: datetime) -> bool:
        """False when the label exists already."""
        return bool(self.driver.write("host_insert", host_params(host, now)))

    def host_update(self, host: HostRecord, now: datetime) -> bool:
        return bool(self.driver.write("host_update", host_params(host, now)))

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

    def host_heartbeat_push(self, label: str, now: datetime, via: str) -> bool:
        """A push host's heartbeat: its last preflight (`host_preflight_record`) stands."""
        return bool(self.driver.write("host_heartbeat_push", {
            "label": label, "now": now, "via": via}))

    def host_preflight_record(self, label: str, failed: Mapping[str, str]) -> bool:
        """The job types whose preflight fails on this (ssh) host, with why; its
        heartbeat untouched. False when there is no such host."""
        return bool(self.driver.write("host_preflight_record", {
            "label": label, "preflight_failed": Json(dict(failed))}))

    def host_agent_gone(self, label: str, worker: str) -> bool:
        """Mark the host's agent gone (stopped) while `worker` is the last one that
        heartbeated; False when another agent has heartbeated since, the agent stopped
        cleanly, or there is no such host."""
        return bool(self.driver.write("host_agent_gone", {"label": label, "worker": worker}))

    def host_usage(self, now: datetime) -> dict[str, HostUsage]:
        return {row["label"]: HostUsage(row["label"], int(row["workers"]), float(row["jobs_gb"]),
                                        float(row["reserved_gb"]))
                for row in self.driver.read("host_usage", {"now": now})}

    def runner_publish(self, presence: RunnerPresence) -> None:
        """`herder up`'s presence: its machine shows like a host (never placed on). The
        database stamps it (`last_turn_at`), not the runner's clock."""
        params = msgspec.structs.asdict(presence)
        del params["last_turn_at"]
        self.driver.write("runner_publish", params)

    def runner_list(self, now: datetime) -> list[RunnerPresence]:
        """Every `herder up` runner's presence as it last wrote it (old ones died), its
        `last_turn_at` moved onto the caller's clock (`now`): its age is the database's
        measure, whatever the two clocks disagree by."""
        found = []
        for row in self.driver.read("runner_list"):
            fields = dict(row)
            age = fields.pop("database_now") - fields["last_turn_at"]
            fields["last_turn_at"] = now - age
            found.append(msgspec.convert(fields, RunnerPresence, from_attributes=False,
                                         strict=False))
        return found

    def runner_remove(self, label: str, worker: str) -> bool:
        """A clean exit: the presence goes, unless a newer runner of the label wrote it."""
        return bool(self.driver.write("runner_remove", {"label": label, "worker": worker}))

    def runner_prune(self, idle: timedelta) -> int:
        """Forget the presences not written for `idle` by the database's clock (machines
        gone for good; a caller's clock that runs ahead forgets no live one); how many."""
        return len(self.driver.write("runner_prune", {"idle_seconds": idle.total_seconds()}))

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
