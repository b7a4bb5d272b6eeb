"""The store's attempts: start, heartbeat, finish, adopt, their accounts; and each job's events."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from herder.core.model import (
    Attempt,
    AttemptResult,
    AttemptToken,
    Event,
    HeartbeatReply,
    Job,
    JobStatus,
    Outcome,
)
from herder.store.driver import Driver, Json
from herder.store.parameters import finish_detail, finish_groups, finish_params, insert_event
from herder.store.records import LiveAttempt
from herder.store.rows import (
    STATUSES,
    attempt_from_row,
    event_from_row,
    job_from_row,
    live_attempt_from_row,
)


class AttemptStore:
    """Attempt operations of `Store` (a mixin over its driver)."""

    driver: Driver

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

    def attempt_take(self, host: str, token: AttemptToken, worker: str, now: datetime) -> bool:
        """Take a placement on `host` for its agent `worker`; False when another runner has
        it, or `worker` is not the host's live agent (its last heartbeat is another
        worker's, or said it stopped): a dead agent's late request binds nothing."""
        return bool(self.driver.write("attempt_take", {
            "job_id": token.job_id, "attempt": token.attempt, "host": host, "worker": worker,
            "now": now}))

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

    def attempt_list(self, job_id: int) -> list[Attempt]:
        return [attempt_from_row(row)
                for row in self.driver.read("attempt_list", {"job_id": job_id})]

    def attempt_list_live(self, host: str | None = None) -> list[LiveAttempt]:
        return [live_attempt_from_row(row)
                for row in self.driver.read("attempt_list_live", {"host": host})]

    def attempt_list_assigned(self, host: str, limit: int) -> list[Job]:
        """Claimed jobs placed on a host whose attempt has not started yet."""
        return [job_from_row(row) for row in self.driver.read(
            "attempt_list_assigned", {"host": host, "limit": limit})]

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

    def event_latest_id(self) -> int:
        """The newest event's id (0 with none): it moves whenever a job changes."""
        return int(self.driver.read("event_latest_id")[0]["id"] or 0)

    def event_list(self, job_id: int) -> list[Event]:
        return [event_from_row(row) for row in self.driver.read("event_list", {"job_id": job_id})]
