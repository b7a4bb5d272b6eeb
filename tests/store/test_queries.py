"""The named queries: one placeholder style, shared or per dialect under one name."""

from __future__ import annotations

import pytest


def test_shared_queries_take_each_dialects_placeholders():
    from herder.store.driver import load_queries, postgres_placeholders

    assert postgres_placeholders("SELECT :a::text, x FROM t WHERE y = :b_c AND z LIKE 'q%'") == (
        "SELECT %(a)s::text, x FROM t WHERE y = %(b_c)s AND z LIKE 'q%%'")
    sqlite, postgres = load_queries("sqlite"), load_queries("postgres")
    shared = {"host_insert", "reservation_insert", "alert_open", "job_retry", "event_insert"}
    assert shared <= sqlite.keys() & postgres.keys()
    assert ":label" in sqlite["host_get"] and "%(label)s" in postgres["host_get"]
    # A job with its spec is SQLite's view and PostgreSQL's table, under one query.
    assert "FROM herder_job_records WHERE" in sqlite["job_get"]
    assert "FROM herder_jobs WHERE" in postgres["job_get"]
    # What must differ keeps one version per dialect, under one name.
    for name in ("job_claim", "attempt_finish", "host_lock", "reservation_end"):
        assert sqlite[name] != postgres[name]
    # The event rows of the set-based writes are one INSERT for both (sql/events.sql):
    # inside PostgreSQL's statement, in SQLite's `_events` statement after it.
    for write, kind in (("job_insert", "submitted"), ("job_dedup_release", "dedup_released"),
                        ("job_claim", "claimed"), ("attempt_finish", "finished")):
        insert = f"SELECT id, :now, '{kind}'"
        assert insert in sqlite[f"{write}_events"] and f"FROM {kind}" in sqlite[f"{write}_events"]
        assert postgres_placeholders(insert) in postgres[write]


def test_a_query_written_with_psycopgs_placeholders_is_refused(tmp_path, monkeypatch):
    """Every query file takes `:name` only: a `%(name)s` left in one (say, from a branch
    written before) stops the load, naming the query, instead of reaching the database."""
    import shutil

    from herder.store import driver

    sql = tmp_path / "sql"
    shutil.copytree(driver.SQL, sql)
    with (sql / "postgres" / "queries.sql").open("a") as file:
        file.write("\n-- name: job_adopt\nSELECT id FROM herder_jobs WHERE id = %(job_id)s;\n")
    monkeypatch.setattr(driver, "SQL", sql)
    with pytest.raises(ValueError, match="'job_adopt' has a %\\(name\\)s parameter"):
        driver.load_queries("postgres")
    assert "job_adopt" not in driver.load_queries("sqlite")
