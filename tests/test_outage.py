"""A database outage does not kill `herder up` or lose a result: PostgreSQL drops every
connection of the test database (as a restart would) while a job runs."""

from __future__ import annotations

from datetime import UTC, datetime

import psycopg
import pytest
from support.local import Harness, shell
from support.waits import wait_for

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
        # The runner records the start after the spawn: wait for the record, not the file.
        wait_for(lambda: status(postgres_url, job_id) == "running", 30,
                 "the start to be recorded", harness.describe)
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


def test_up_retries_its_first_maintenance_pass(tmp_path, store):
    """A store that is busy or unreachable when `herder up` starts (its first rescue pass)
    delays the runner instead of ending it; the queued job then runs."""
    from herder.core.errors import StoreUnavailable
    from herder.core.model import JobSpec, JobStatus
    from herder.core.settings.sections import RuntimeSection
    from herder.runtime.maintenance import Rescuer
    from herder.runtime.runner import Runner
    from herder.runtime.runner_options import RunnerOptions
    from herder.runtime.sources import ClaimSource

    class FlakySource(ClaimSource):
        failures = 2

        def maintain(self, now):  # type: ignore[no-untyped-def]
            if self.failures:
                self.failures -= 1
                raise StoreUnavailable("database is locked")
            super().maintain(now)

    [result] = store.job_insert([JobSpec(command=("true",))], datetime.now(UTC))
    options = RunnerOptions(host="flaky-start", log_dir=tmp_path / "logs",
                            runtime=RuntimeSection(poll_interval=0.05), exit_when_idle=True)
    runtime = options.runtime
    rescuer = Rescuer(store, options.host, runtime.attempt_lease, runtime.kill_grace,
                      runtime.max_lost)
    source = FlakySource(store, options.host, options.limits, rescuer)
    assert Runner(store, options, source=source).run(install_signals=False) == 0
    assert source.failures == 0
    job = store.job_get(result.job_id)
    assert job is not None and job.status is JobStatus.DONE
