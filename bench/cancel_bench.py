"""Cancel → the job's whole process tree gone, against killing the same tree directly.

    .venv/bin/python bench/cancel_bench.py                 # SAMPLES=20, SQLite
    SAMPLES=5 BENCH_JSON=/tmp/cancel.json .venv/bin/python bench/cancel_bench.py

A `herder up` (the local executor) runs on a fresh SQLite file. Each sample submits a job
whose shell starts two `sleep 300` children and writes the three pids to a file; once all
three run, `Client.cancel` is called and the clock runs until none of the three is alive
(a zombie counts as gone). The limit is the same tree started here in its own process group
and stopped with one `killpg(SIGTERM)`: what the kernel needs, with no queue in between.

Prints a markdown table; with BENCH_JSON set also writes the figures there as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from recovery_bench import wait  # noqa: E402

from herder.client import Client  # noqa: E402

SAMPLES = int(os.environ.get("SAMPLES", "20"))
TREE = "sleep 300 & echo $! >> {pids}; sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def read_pids(path: Path) -> list[int]:
    try:
        return [int(word) for word in path.read_text().split()]
    except (OSError, ValueError):
        return []


def tree_started(path: Path) -> list[int] | None:
    pids = read_pids(path)
    return pids if len(pids) == 3 and all(alive(pid) for pid in pids) else None


def seconds_until_gone(pids: list[int], started: float) -> float:
    wait(lambda: not any(alive(pid) for pid in pids), 120, "the process tree to go", 0.001)
    return time.perf_counter() - started


def through_herder(folder: Path) -> list[float]:
    url = f"sqlite:///{folder / 'herder.db'}"
    log = open(folder / "up.log", "wb")  # noqa: SIM115 - closed after the runner stops
    runner = subprocess.Popen([sys.executable, "-m", "herder.cli", "--db", url, "up",
                               "--concurrency", "2"], cwd=folder, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)
    samples: list[float] = []
    try:
        with Client(url) as client:
            for index in range(SAMPLES):
                pids_file = folder / f"pids-{index}"
                job_id = client.submit(
                    command=["/bin/sh", "-c", TREE.format(pids=pids_file)],
                    workdir=str(folder), check_command=False).job_id
                pids = wait(lambda pids_file=pids_file: tree_started(pids_file), 60,
                                  f"job {job_id}'s tree to start", 0.001)
                started = time.perf_counter()
                client.cancel(job_id)
                samples.append(seconds_until_gone(pids, started))
                client.wait(job_id, timeout=60)
    finally:
        os.killpg(runner.pid, signal.SIGTERM)
        try:
            runner.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(10)
        log.close()
    return samples


def directly(folder: Path) -> list[float]:
    samples: list[float] = []
    for index in range(SAMPLES):
        pids_file = folder / f"direct-{index}"
        leader = subprocess.Popen(["/bin/sh", "-c", TREE.format(pids=pids_file)],
                                  start_new_session=True)
        pids = wait(lambda pids_file=pids_file: tree_started(pids_file), 60,
                          "the tree to start", 0.001)
        started = time.perf_counter()
        os.killpg(leader.pid, signal.SIGTERM)
        leader.wait(10)
        samples.append(seconds_until_gone(pids, started))
    return samples


def spread(samples: list[float]) -> dict[str, float]:
    return {"p50_s": statistics.median(samples), "max_s": max(samples)}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="herder-cancel-bench-") as temporary:
        folder = Path(temporary)
        herder = through_herder(folder)
        raw = directly(folder)
    result = {"samples": SAMPLES, "herder": spread(herder), "killpg": spread(raw)}
    print("| measurement | p50 | max |")
    print("|---|---|---|")
    for label, key in (("`herder cancel` → tree gone (herder up, SQLite)", "herder"),
                       ("killpg(SIGTERM) → tree gone (the limit)", "killpg")):
        figures = result[key]
        assert isinstance(figures, dict)
        print(f"| {label} | {figures['p50_s'] * 1000:.1f} ms | {figures['max_s'] * 1000:.1f} ms |")
    if os.environ.get("BENCH_JSON"):
        Path(os.environ["BENCH_JSON"]).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
