"""`herder demo`: a fleet on one machine in under a minute.

A server on a throwaway SQLite database, three agents posing as hosts of different sizes,
and a mixed workload of short jobs of several weights. It prints each placement as it
happens and a summary per host, then stops everything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import msgspec

from herder.client import Client
from herder.core.model import RAM_TOLERANCE_GB, JobStatus
from herder.core.scheduling.capacity import bookable_gb
from herder.store import Store, open_store


class DemoHost(msgspec.Struct, frozen=True):
    label: str
    ram_gb: float
    workers: int
    max_weight: str | None
    note: str


HOSTS = (
    DemoHost("big-1", 40, 3, None, "big server: every weight"),
    DemoHost("mid-1", 16, 2, "heavy", "small VPS: up to heavy"),
    DemoHost("lap-1", 8, 1, "light", "laptop: light only"),
)
WORKLOAD = (  # (weight, seconds, count)
    ("light", 1.0, 8),
    ("heavy", 1.5, 5),
    ("playwright", 1.0, 3),
    ("orchestrator", 2.0, 2),
)
CONFIG = """\
[herder]
db = "sqlite:///{folder}/herder.db"
log_dir = "{folder}/logs"
[runtime]
heartbeat_interval = "0.5s"
attempt_lease = "5s"
kill_grace = "1s"
poll_interval = "0.2s"
[fleet]
scheduler_interval = "0.2s"
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _herder(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "herder.cli", "--config", str(folder / "herder.toml"), *args]


def run_demo(echo: Callable[[str], None], keep: bool = False, timeout: float = 50.0) -> int:
    folder = Path(tempfile.mkdtemp(prefix="herder-demo-"))
    (folder / "herder.toml").write_text(CONFIG.format(folder=folder))
    processes: list[subprocess.Popen[bytes]] = []
    logs = folder / "processes.log"
    started = time.monotonic()
    try:
        tokens: dict[str, str] = {}
        for host in HOSTS:
            args = ["host", "add", host.label, "--ram", str(host.ram_gb),
                    "--prime-workers", str(host.workers), "--night-workers", str(host.workers)]
            if host.max_weight:
                args += ["--prime-max-weight", host.max_weight,
                         "--night-max-weight", host.max_weight]
            result = subprocess.run(_herder(folder, *args), capture_output=True, text=True,
                                    check=True)
            tokens[host.label] = result.stdout.strip()
            bookable = bookable_gb(host.ram_gb, 0.0)
            echo(f"host {host.label:<6} {host.ram_gb:>4.0f} GB ({bookable:.1f} bookable), "
                 f"{host.workers} worker(s) — {host.note}")
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(logs, "ab") as output:
            processes.append(subprocess.Popen(
                _herder(folder, "server", "--listen", f"127.0.0.1:{port}"),
                stdout=output, stderr=output, start_new_session=True))
            for host in HOSTS:
                processes.append(subprocess.Popen(
                    _herder(folder, "agent", "--server", url, "--host", host.label,
                            "--no-ram-check", "--log-dir", str(folder / "agent-logs" / host.label)),
                    stdout=output, stderr=output, start_new_session=True,
                    env={**os.environ, "HERDER_AGENT_TOKEN": tokens[host.label]}))
        echo(f"server {url}, 3 agents; submitting {sum(c for _, _, c in WORKLOAD)} jobs\n")
        store = open_store(f"sqlite:///{folder}/herder.db")
        try:
            return _watch(store, folder, echo, started, timeout)
        finally:
            store.close()
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        if keep:
            echo(f"\nkept {folder} (herder --config {folder}/herder.toml jobs)")
        else:
            subprocess.run(["rm", "-rf", str(folder)], check=False)


def _watch(store: Store, folder: Path, echo: Callable[[str], None], started: float,
           timeout: float) -> int:
    ids: list[int] = []
    with Client(config=folder / "herder.toml") as client:
        for weight, seconds, count in WORKLOAD:
            for _ in range(count):
                submitted = client.submit(command=["sleep", str(seconds)], weight=weight,
                                          workdir=str(folder))
                ids.append(submitted.job_id)
    weights = {job.id: job.weight for job in map(store.job_get, ids) if job is not None}
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        jobs = [store.job_get(job_id) for job_id in ids]
        for job in jobs:
            if job is not None and job.host and job.id not in seen:
                seen.add(job.id)
                echo(f"  +{time.monotonic() - started:5.1f}s  job {job.id:>2} "
                     f"{weights[job.id]:<12} -> {job.host}")
        if all(job is not None and job.status.terminal for job in jobs):
            break
        time.sleep(0.1)
    return _summary(store, ids, echo, started)


def _summary(store: Store, ids: list[int], echo: Callable[[str], None],
             started: float) -> int:
    per_host: dict[str, list[tuple[datetime, datetime, float]]] = defaultdict(list)
    statuses: dict[JobStatus, int] = defaultdict(int)
    for job_id in ids:
        job = store.job_get(job_id)
        if job is None:
            continue
        statuses[job.status] += 1
        for attempt in store.attempt_list(job_id):
            if attempt.started_at and attempt.ended_at:
                per_host[attempt.host].append((attempt.started_at, attempt.ended_at,
                                               job.ram_gb))
    echo("\nhost    jobs  peak workers  peak booked")
    within = True
    for host in HOSTS:
        spans = per_host.get(host.label, [])
        peak_workers, peak_gb = _peaks(spans)
        bookable = bookable_gb(host.ram_gb, 0.0)
        within = within and peak_workers <= host.workers and peak_gb <= bookable + RAM_TOLERANCE_GB
        echo(f"{host.label:<7} {len(spans):>4}  {peak_workers:>5}/{host.workers:<6} "
             f"{peak_gb:>5.1f}/{bookable:.1f} GB")
    summary = ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    elapsed = time.monotonic() - started
    verdict = ("every host stayed within its worker cap and RAM budget" if within
               else "A HOST RAN PAST ITS CAP OR BUDGET")
    echo(f"\n{summary} in {elapsed:.1f}s; {verdict}")
    echo("(no dashboard yet: watch a fleet with `herder hosts` and `herder jobs`)")
    return 0 if within and statuses.get(JobStatus.DONE, 0) == len(ids) else 1


def _peaks(spans: list[tuple[datetime, datetime, float]]) -> tuple[int, float]:
    points: list[tuple[datetime, int, float]] = []
    for start, end, gb in spans:
        points.append((start, 1, gb))
        points.append((end, -1, -gb))
    points.sort(key=lambda p: (p[0], p[1]))
    workers, booked, peak_workers, peak_gb = 0, 0.0, 0, 0.0
    for _, delta, gb in points:
        workers += delta
        booked += gb
        peak_workers = max(peak_workers, workers)
        peak_gb = max(peak_gb, booked)
    return peak_workers, peak_gb

