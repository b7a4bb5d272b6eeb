"""Open a store from its URL: `sqlite:///path` (default `./herder.db`) or `postgresql://...`."""

from __future__ import annotations

from herder.errors import InputError
from herder.store.base import LiveAttempt, Store, Waker

__all__ = ["LiveAttempt", "Store", "Waker", "open_store"]


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
