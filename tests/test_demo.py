"""`herder demo` is what a newcomer runs first: it must work and tell the truth.

The test reads the demo's own database (kept with `--keep`) and checks what the demo did:
every job ended done, on a host that admits its weight, and no host ran more jobs at once
than its worker cap.
"""

from __future__ import annotations

import shutil
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path

from support.cli import ok, run_herder

from herder.core.model import JobStatus
from herder.store import open_store

# The demo's hosts (label: worker cap) and which of them admit each weight: mid-1 takes up to
# heavy, lap-1 light only, big-1 every weight (the escalation chain is light < heavy <
# playwright < orchestrator).
WORKERS = {"big-1": 3, "mid-1": 2, "lap-1": 1}
ADMITTED = {
    "light": {"big-1", "mid-1", "lap-1"},
    "heavy": {"big-1", "mid-1"},
    "playwright": {"big-1"},
    "orchestrator": {"big-1"},
}
SUBMITTED = {"light": 8, "heavy": 5, "playwright": 3, "orchestrator": 2}


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    points = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def test_demo_runs_every_job_on_a_host_that_admits_it_within_its_cap(tmp_path: Path):
    result = ok(run_herder("demo", "--keep", cwd=tmp_path, timeout=120))
    kept = [line for line in result.stdout.splitlines() if line.startswith("kept ")]
    assert len(kept) == 1, result.stdout
    folder = Path(kept[0].split()[1])
    try:
        with open_store(f"sqlite:///{folder}/herder.db") as store:
            jobs = store.job_list(None, 100)
            spans: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
            for job in jobs:
                for attempt in store.attempt_list(job.id):
                    assert attempt.started_at and attempt.ended_at, (job.id, attempt)
                    spans[attempt.host].append((attempt.started_at, attempt.ended_at))
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    assert Counter(job.weight for job in jobs) == SUBMITTED
    assert {job.id: job.status for job in jobs} == {job.id: JobStatus.DONE for job in jobs}
    misplaced = {job.id: (job.weight, job.host) for job in jobs
                 if job.host not in ADMITTED[job.weight]}
    assert not misplaced, misplaced
    assert set(spans) <= set(WORKERS), spans.keys()
    for host, host_spans in spans.items():
        assert most_at_once(host_spans) <= WORKERS[host], (host, sorted(host_spans))
    # What it printed agrees with its database.
    assert f"{len(jobs)} done" in result.stdout
    assert "every host stayed within its worker cap and RAM budget" in result.stdout
