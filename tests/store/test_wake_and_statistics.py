"""Waking other processes, and refreshing the planner's statistics."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from support.store import (
    submit,
)

from herder.core.model import (
    JobSpec,
)
from herder.store import open_store

# -- waking ---------------------------------------------------------------------------------


def test_waker_wakes_on_submit(store):
    waker = store.listen()
    try:
        assert waker.wait(0.0) is False
        with open_store(store.url) as other:
            submit(other)
        assert waker.wait(30.0) is True
    finally:
        waker.close()


def test_statistics_refresh_runs_when_many_rows_changed(store):
    now = datetime(2026, 6, 1, tzinfo=UTC)
    store.job_insert([JobSpec(command=("true",)) for _ in range(1500)], now)
    if store.dialect == "sqlite":
        assert store.statistics_refresh() is True  # PRAGMA optimize decides by itself
        return
    # PostgreSQL's activity counters reach pg_stat a moment after the writes.
    deadline = time.monotonic() + 15
    while not store.statistics_refresh():
        assert time.monotonic() < deadline, "1,500 inserts never made the statistics stale"
        time.sleep(0.1)
    assert store.statistics_refresh() is False, "right after ANALYZE nothing is stale"
