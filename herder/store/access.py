"""The store's API tokens and dashboard sessions."""

from __future__ import annotations

from datetime import datetime

from herder.core.model import Scope, TokenRecord
from herder.store.driver import Driver, Json
from herder.store.rows import token_from_row


class AccessStore:
    """Token and session operations of `Store` (a mixin over its driver)."""

    driver: Driver

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
