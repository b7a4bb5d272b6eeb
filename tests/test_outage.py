"""A database outage does not kill `herder up` or lose a result: PostgreSQL drops every
connection of the test database (as a restart would) while a job runs."""

from __future__ import annotations

import psycopg
import pytest
from runtime_helpers import Harness, shell, wait_for

from herder.store import open_store


def status(url: str, job_id: int) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT status FROM herder_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def drop_connections(url: str) -> int:
    """Terminate every backend of the test database except this one."""
    database = url.rsplit("/", 1)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()", (database,)).fetchall()
    return len(rows)


@pytest.mark.slow
def test_up_survives_dropped_connections_and_reports_the_result(tmp_path, postgres_url):
    harness = Harness(tmp_path, postgres_url)
    try:
        marker = tmp_path / "started"
        job_id = harness.submit(shell(f"touch {marker}; sleep 2; echo finished"))
        up = harness.up("--exit-when-idle")
        harness.wait_ready(up)
        wait_for(marker.exists, 30, "the job to start", harness.describe)
        # Every connection of `up` dies, twice, while its job runs (this test's own pooled
        # connections too, so it checks through fresh ones).
        assert drop_connections(postgres_url) >= 1
        assert status(postgres_url, job_id) == "running"
        drop_connections(postgres_url)
        assert harness.wait_exit(up, 60, "herder up") == 0, harness.stderr_of(up)
        assert status(postgres_url, job_id) == "done"
        assert "runner turn failed" in harness.stderr_of(up), "the outage was not noticed"
        with open_store(postgres_url) as store:
            assert [a.outcome for a in store.attempt_list(job_id)] == ["ok"]
        assert "finished" in (harness.log_dir / str(job_id) / "1.log").read_text()
    finally:
        drop_connections(postgres_url)  # the harness's pool must not hand out dead ones
        harness.close()
