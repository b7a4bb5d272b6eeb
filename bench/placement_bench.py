"""How long one placement pass takes on big random fleets and queues.

The target is one `place()` under a second for 10k hosts × 100k queued jobs in CPython.
Fleets mix five host kinds (big bare-metal boxes, small VPSes, laptops closed at night,
light-only WSL boxes with a priority floor and a job-type allow-list, CI boxes), a few
hosts drained, down or never seen, and existing load. Queues mix the seed weights, job
types and priorities; 2 % of jobs are bound to a host, 10 % prefer one, and waiting times
up to an hour make most of a deep backlog starving (so reservations are exercised).

The `per-host` fleet gives every host its own allow-list, window max weight and floor
(about 2,300 distinct host classes at 10k hosts): the worst case for the class shortcut.

    .venv/bin/python bench/placement_bench.py            # all sizes, best of 3
    SIZES=10000x100000 REPS=5 .venv/bin/python bench/placement_bench.py
    BENCH_JSON=/tmp/placement.json ...                   # also the rows as JSON
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta

from msgspec.structs import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from herder.core.scheduling.capacity import WindowCaps
from herder.core.scheduling.explanation import explain
from herder.core.scheduling.health import HostHealth
from herder.core.scheduling.placement import (
    HostLoad,
    HostSpec,
    PendingJob,
    PlacementPolicy,
    Snapshot,
    place,
)

NOW = datetime(2026, 7, 1, 14, 0, tzinfo=UTC)  # prime time
DEV_TYPES = frozenset({"dev-issue", "continue-issue", "review-pr", "review-plan"})
BUDGET = {"light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0}


def pick(rng: random.Random, table: list[tuple[object, float]]) -> object:
    values, weights = zip(*table, strict=True)
    return rng.choices(values, weights)[0]


def host(rng: random.Random, index: int) -> HostSpec:
    kind = pick(rng, [("bms", 30), ("vps", 30), ("lap", 15), ("wsl", 15), ("ci", 10)])
    label = f"{kind}-{index:05d}"
    enabled = rng.random() > 0.05
    if kind == "bms":
        return HostSpec(label, rng.choice([32, 64, 128]), 4, 16, enabled,
                        prime=WindowCaps(rng.randint(4, 8)), night=WindowCaps(rng.randint(6, 10)))
    if kind == "vps":
        return HostSpec(label, rng.choice([8, 16]), 2, 2, enabled,
                        prime=WindowCaps(2, "heavy"), night=WindowCaps(2, "heavy"))
    if kind == "lap":
        return HostSpec(label, rng.choice([8, 16]), 3, 4, enabled,
                        prime=WindowCaps(2, "heavy"), night=WindowCaps(0, "light"))
    if kind == "wsl":
        return HostSpec(label, 16, 4, 8, enabled, prime=WindowCaps(1, "light"),
                        night=WindowCaps(1, "light"), allowed_job_types=DEV_TYPES,
                        allowed_weights=frozenset({"light"}), priority_floor=5)
    return HostSpec(label, 64, 4, 16, enabled, prime=WindowCaps(4, "playwright"),
                    night=WindowCaps(6, "playwright"),
                    allowed_job_types=frozenset({"ci-build", "playwright-e2e", "dev-issue"}))


def per_host(rng: random.Random, spec: HostSpec) -> HostSpec:
    """The same host with hand-made caps: a random allow-list, max weight and floor."""
    types = ["dev-issue", "continue-issue", "review-pr", "review-plan", "infra-task",
             "ci-build", "playwright-e2e"]
    return replace(
        spec,
        allowed_job_types=frozenset(name for name in types if rng.random() < 0.7),
        prime=WindowCaps(spec.prime.max_workers,
                         rng.choice([None, "light", "heavy", "playwright"])),
        priority_floor=rng.choice([None, 5, 12, 20]),
    )


def load(rng: random.Random, spec: HostSpec) -> HostLoad | None:
    health = pick(rng, [(HostHealth.HEALTHY, 85), (HostHealth.DEGRADED, 5),
                        (HostHealth.DOWN, 5), (HostHealth.UNKNOWN, 5)])
    if health is HostHealth.UNKNOWN:
        return None
    workers = rng.randint(0, spec.prime.max_workers)
    booked = sum(rng.choice([3.0, 3.0, 8.0, 6.0]) for _ in range(workers))
    return HostLoad(spec.label, health, workers, booked)  # type: ignore[arg-type]


def fleet(rng: random.Random, count: int) -> tuple[list[HostSpec], dict[str, HostLoad]]:
    hosts = [host(rng, index) for index in range(count)]
    loads = {spec.label: entry for spec in hosts if (entry := load(rng, spec)) is not None}
    return hosts, loads


def queue(rng: random.Random, count: int, hosts: list[HostSpec]) -> list[PendingJob]:
    labels = [spec.label for spec in hosts]
    weights = [("light", 55), ("heavy", 20), ("playwright", 10), ("orchestrator", 5),
               ("subagent", 10)]
    job_types = [("dev-issue", 40), ("continue-issue", 10), ("review-pr", 20),
                 ("review-plan", 5), ("infra-task", 5), ("ci-build", 10),
                 ("playwright-e2e", 10)]
    priorities = [(1, 3), (10, 50), (15, 25), (50, 22)]
    jobs = []
    for job_id in range(1, count + 1):
        roll = rng.random()
        jobs.append(PendingJob(
            id=job_id,
            priority=pick(rng, priorities),  # type: ignore[arg-type]
            weight=pick(rng, weights),  # type: ignore[arg-type]
            job_type=pick(rng, job_types),  # type: ignore[arg-type]
            affinity=rng.choice(labels) if roll < 0.02 else None,
            preferred_host=rng.choice(labels) if 0.02 <= roll < 0.12 else None,
            waiting_since=NOW - timedelta(seconds=rng.uniform(0, 3600)),
        ))
    return jobs


def best_of(reps: int, action):  # type: ignore[no-untyped-def]
    best, result = float("inf"), None
    for _ in range(reps):
        start = time.perf_counter()
        result = action()
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    reps = int(os.environ.get("REPS", "3"))
    sizes = [tuple(int(part) for part in size.split("x")) for size in
             os.environ.get("SIZES", "1000x10000,1000x100000,10000x10000,10000x100000").split(",")]
    strategies = os.environ.get("STRATEGIES", "best_fit,spread").split(",")
    runs = [(hosts, jobs, strategy, "templated") for hosts, jobs in sizes
            for strategy in strategies]
    if os.environ.get("PER_HOST", "1") == "1":
        runs.append((10_000, 100_000, strategies[0], "per-host"))
    print(f"python {sys.version.split()[0]}, best of {reps}\n")
    print("| hosts | jobs | fleet | strategy | placed | waiting | reserved hosts | place() s "
          "| target < 1 s for 10k × 100k |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---|")
    explain_rows = []
    figures: list[dict[str, object]] = []
    built: dict[tuple[int, int, str], tuple[list[HostSpec], dict[str, HostLoad], list[PendingJob]]]
    built = {}
    for host_count, job_count, strategy, kind in runs:
        if (host_count, job_count, kind) not in built:
            rng = random.Random(host_count * 1_000_003 + job_count)
            hosts, loads = fleet(rng, host_count)
            jobs = queue(rng, job_count, hosts)
            if kind == "per-host":
                hosts = [per_host(rng, spec) for spec in hosts]
            built[(host_count, job_count, kind)] = (hosts, loads, jobs)
        hosts, loads, jobs = built[(host_count, job_count, kind)]
        snapshot = Snapshot(NOW, jobs, hosts, loads, policy=PlacementPolicy(strategy=strategy))
        seconds, plan = best_of(reps, lambda snapshot=snapshot: place(snapshot))
        figures.append({"hosts": host_count, "jobs": job_count, "fleet": kind,
                        "strategy": strategy, "seconds": seconds,
                        "placed": len(plan.assignments)})
        target = ""
        if (host_count, job_count) == (10_000, 100_000):
            target = "yes" if seconds < 1.0 else "**no**"
        print(f"| {host_count:,} | {job_count:,} | {kind} | {strategy} "
              f"| {len(plan.assignments):,} | {len(plan.waiting):,} "
              f"| {len(plan.reservations):,} | {seconds:.3f} | {target} |")
        if strategy == strategies[0] and kind == "templated":
            # An unbound waiting job: its line folds thousands of refusals.
            bound = {pending.id for pending in jobs if pending.affinity is not None}
            job_id = next((job_id for job_id in plan.waiting if job_id not in bound),
                          next(iter(plan.waiting), None))
            if job_id is None:
                continue
            start = time.perf_counter()
            line = explain(job_id, plan, snapshot)
            cold = time.perf_counter() - start
            warm, _ = best_of(reps, lambda job_id=job_id, plan=plan, snapshot=snapshot:
                              explain(job_id, plan, snapshot))
            explain_rows.append((host_count, job_count, cold, warm, line))
    if os.environ.get("BENCH_JSON"):  # bench/run.sh reads the rows from here
        with open(os.environ["BENCH_JSON"], "w") as handle:
            json.dump(figures, handle, indent=2)
    print("\n| hosts | jobs | explain() first call s | explain() again s | line |")
    print("|---:|---:|---:|---:|---|")
    for host_count, job_count, cold, warm, line in explain_rows:
        print(f"| {host_count:,} | {job_count:,} | {cold:.4f} | {warm:.4f} | {line} |")


if __name__ == "__main__":
    main()
