"""How fast the dashboard's views answer with 10,000 jobs and 100 hosts.

Builds a store (SQLite in a temp folder, or the PostgreSQL database of `DB`) with 100 hosts
(heartbeating, some drained) and 10,000 jobs in every status, then times the requests the
pages make, through the app in-process (FastAPI's TestClient: routing, auth, JSON, the store;
no network): the jobs view's first page, a status page (queued rows each say why they wait,
from a placement at most 2 s old: the last row makes one for every page), a page deep in
the table, filters by host, type and key, the fleet
view (`/queue?recent=0`) and the live stream's check. Target: each well under 100 ms.

    .venv/bin/python bench/dashboard_bench.py
    DB=postgresql://postgres@127.0.0.1:5432/bench .venv/bin/python bench/dashboard_bench.py
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastapi.testclient import TestClient

from herder.api.app import Access, create_app
from herder.core.access import new_token, token_hash
from herder.core.model import (
    AttemptResult,
    Decision,
    HostRecord,
    JobSpec,
    JobStatus,
    Outcome,
    Scope,
)
from herder.core.settings.loading import Config
from herder.core.settings.sections import Settings
from herder.runtime.coordinator import Coordinator
from herder.store import Store, open_store

HOSTS = int(os.environ.get("HOSTS", "100"))
JOBS = int(os.environ.get("JOBS", "10000"))
REPS = int(os.environ.get("REPS", "20"))
TYPES = ["dev-issue", "review-pr", "adhoc", "build"]
WEIGHTS = ["light", "light", "light", "heavy"]


def fill(store: Store, now: datetime) -> None:
    rng = random.Random(7)
    for index in range(HOSTS):
        label = f"host-{index:03d}"
        store.host_insert(HostRecord(label=label, ram_total_gb=rng.choice([16.0, 32.0, 64.0]),
                                     enabled=index % 17 != 0, prime_max_workers=4,
                                     night_max_workers=4), now)
        store.host_heartbeat(label, now, {"mem_available_gb": 10.0})
    specs = [JobSpec(command=("true",), job_type=TYPES[i % len(TYPES)],
                     weight=WEIGHTS[i % len(WEIGHTS)], priority=rng.randint(0, 200),
                     dedup_key=f"repo#{i}") for i in range(JOBS)]
    for start in range(0, JOBS, 1000):
        store.job_insert(specs[start:start + 1000], now)
    # 60 % end done or failed, 2 % run, the rest stay queued
    ended = int(JOBS * 0.6)
    for start in range(0, ended, 500):
        host = f"host-{(start // 500) % HOSTS:03d}"
        claimed = store.job_claim(host, f"{host}/1/1", 500, now)
        results = [AttemptResult(job.token, Outcome.OK, 0, Decision(JobStatus.DONE))
                   if job.id % 5 else
                   AttemptResult(job.token, Outcome.FAILED, 1,
                                 Decision(JobStatus.FAILED, failure_reason="exit_1"))
                   for job in claimed]
        store.attempt_finish(results, now + timedelta(seconds=1))
    for index in range(HOSTS):
        host = f"host-{index:03d}"
        for job in store.job_claim(host, f"{host}/1/1", max(1, JOBS // 5000), now):
            store.attempt_start(job.token, 1000 + job.id, None, now)


def timed(client: TestClient, path: str, token: str,
          before: Callable[[], None] = lambda: None) -> tuple[float, float]:
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get(path, headers=headers).status_code == 200, path  # warm
    runs = []
    for _ in range(REPS):
        before()
        began = time.perf_counter()
        response = client.get(path, headers=headers)
        runs.append((time.perf_counter() - began) * 1000)
        assert response.status_code == 200, (path, response.text[:200])
    runs.sort()
    return statistics.median(runs), runs[int(len(runs) * 0.95) - 1]


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="herder-dash-bench-"))
    os.chdir(folder)
    url = os.environ.get("DB") or f"sqlite:///{folder / 'bench.db'}"
    now = datetime.now(UTC)
    with open_store(url) as store:
        began = time.perf_counter()
        fill(store, now)
        print(f"{store.dialect}: {HOSTS} hosts, {JOBS} jobs filled in "
              f"{time.perf_counter() - began:.1f}s")
        token = new_token()
        store.token_insert("bench", Scope.READ, token_hash(token), now)
        coordinator = Coordinator(store, Config(Settings(), None), "bench")
        client = TestClient(create_app(coordinator, Access(), run_coordinator=False))

        def forget() -> None:  # the page pays for its own placement
            coordinator.reads._placement = None

        middle = JOBS // 2
        print(f"{'view':52} {'median ms':>10} {'p95 ms':>8}")
        for name, path in [
            ("jobs: first page (50)", "/api/v1/dashboard/jobs"),
            ("jobs: queued, why on each row", "/api/v1/dashboard/jobs?status=queued"),
            ("jobs: failed", "/api/v1/dashboard/jobs?status=failed"),
            ("jobs: a page in the middle", f"/api/v1/dashboard/jobs?before={middle}"),
            ("jobs: by host", "/api/v1/dashboard/jobs?host=host-042"),
            ("jobs: by type, 200 a page", "/api/v1/dashboard/jobs?job_type=build&limit=200"),
            ("jobs: by key", f"/api/v1/dashboard/jobs?dedup_key=repo%23{middle}"),
            ("fleet: /queue?recent=0", "/queue?recent=0"),
            ("live: one check of the change stream", "/api/v1/dashboard/changes"),
            ("jobs: first page, placing the queue for it (cold)", "/api/v1/dashboard/jobs"),
        ]:
            median, p95 = timed(client, path, token, forget if "cold" in name else lambda: None)
            print(f"{name:52} {median:10.1f} {p95:8.1f}")


if __name__ == "__main__":
    main()
