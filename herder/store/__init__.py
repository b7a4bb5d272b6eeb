"""Open a store from its URL: `sqlite:///path` (default `./herder.db`) or `postgresql://...`."""

from __future__ import annotations

from herder.core.errors import InputError
from herder.store.base import Store
from herder.store.driver import Waker, as_unavailable, lost_session_errors
from herder.store.records import LiveAttempt

__all__ = ["LiveAttempt", "Store", "Waker", "as_unavailable", "lost_session_errors",
           "open_store"]


def open_store(url: str, migrate: bool = True) -> Store:
    """Open and (by default) migrate the store the URL names."""
    store: Store
    if url.startswith("sqlite:"):
        from herder.store.sqlite import sqlite_store

        store = sqlite_store(url)
    elif url.startswith(("postgresql:", "postgres:")):
        from herder.store.postgres import postgres_store

        store = postgres_store(url)
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
