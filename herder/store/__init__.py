"""Open a store from its URL: `sqlite:///path` (default `./herder.db`) or `postgresql://...`."""

from __future__ import annotations

import sqlite3
import sys
from types import ModuleType

from herder.errors import InputError, StoreUnavailable
from herder.store.base import LiveAttempt, Store
from herder.store.driver import Waker

__all__ = ["LiveAttempt", "Store", "Waker", "as_unavailable", "open_store"]


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


def open_store(url: str, migrate: bool = True) -> Store:
    """Open and (by default) migrate the store the URL names."""
    store: Store
    if url.startswith("sqlite:"):
        from herder.store.sqlite import SQLiteStore

        store = SQLiteStore(url)
    elif url.startswith(("postgresql:", "postgres:")):
        from herder.store.postgres import PostgresStore

        store = PostgresStore(url)
    else:
        raise InputError(
            "db",
            f"unsupported database URL {url.split(':', maxsplit=1)[0]!r}",
            "use sqlite:///path/herder.db or postgresql://user@host/db",
        )
    if migrate:
        try:
            store.migrate()
        except BaseException:
            store.close()
            raise
    return store
