"""Wall time of the `herder` commands scripts call in loops, against `python -c pass`.

Every row runs its command RUNS times as a fresh process (after WARMUP unmeasured runs) and
reports the median, the 90th percentile and the minimum in milliseconds, and the median and
minimum CPU time (user + system) of the process, which a busy shared machine inflates less
than wall time. The database is a
temporary SQLite file holding JOBS jobs; the commands run in a temporary folder with the
sample herder.toml that `herder init` writes (CONFIG=none: no herder.toml, the defaults).
BEFORE=/path/to/checkout also runs every command with that checkout's `herder/` first on
PYTHONPATH, each of its runs next to one of this herder's, so a change in the machine's load
falls on both alike; a last table sets the two side by side.

    .venv/bin/python bench/cli_bench.py            # RUNS=30 WARMUP=3 JOBS=50 CONFIG=sample
    RUNS=100 CONFIG=none .venv/bin/python bench/cli_bench.py
    BEFORE=/tmp/base .venv/bin/python bench/cli_bench.py
    BENCH_JSON=/tmp/cli.json BREAKDOWN=0 ...             # medians as JSON; no breakdown

The last lines are the top-level modules of `python -X importtime -c "import herder.cli"`
that cost the most (cumulative, one run).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

RUNS = int(os.environ.get("RUNS", "30"))
WARMUP = int(os.environ.get("WARMUP", "3"))
JOBS = int(os.environ.get("JOBS", "50"))
CONFIG = os.environ.get("CONFIG", "sample")
BEFORE = os.environ.get("BEFORE")


def herder_argv() -> list[str]:
    """The installed console script next to this interpreter, as users run it."""
    script = Path(sys.executable).parent / "herder"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from herder.cli import main; main()"]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(argv: Sequence[str], folder: Path, environment: dict[str, str]) -> tuple[float, float]:
    """Seconds of wall time and of CPU time for one run; the command must succeed (or
    answer `skip`, 10)."""
    cpu = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, env=environment, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode not in (0, 10):
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()}")
    return elapsed, children_cpu() - cpu


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def measure(argv: Sequence[str], folder: Path,
            environments: Sequence[dict[str, str]]) -> list[list[tuple[float, float]]]:
    """RUNS (wall, CPU) samples in each environment, their runs taking turns."""
    for _ in range(WARMUP):
        for environment in environments:
            run(argv, folder, environment)
    samples: list[list[tuple[float, float]]] = [[] for _ in environments]
    for _ in range(RUNS):
        for index, environment in enumerate(environments):
            samples[index].append(run(argv, folder, environment))
    return samples


def medians(samples: Sequence[tuple[float, float]]) -> str:
    """`wall / CPU` medians in milliseconds."""
    wall = statistics.median(wall for wall, _ in samples)
    cpu = statistics.median(cpu for _, cpu in samples)
    return f"{wall * 1000:.0f} / {cpu * 1000:.0f}"


STEPS = [
    ("click", "import click"),
    ("herder.cli (root group, no command)", "import herder.cli"),
    ("herder.core.model (msgspec Structs, enums)", "import herder.core.model"),
    ("herder.core.settings (the settings Structs)", "import herder.core.settings.loading"),
    ("load_config() (validate herder.toml, with tomllib)",
     "herder.core.settings.loading.load_config()"),
    ("herder.store.sqlite", "import herder.store.sqlite"),
    ("herder.client, herder.cli.jobs", "import herder.client, herder.cli.jobs"),
    ("open_store() (connect, check the schema)",
     "herder.store.open_store(herder.core.settings.loading.load_config().db_url()).close()"),
    ("herder.services.intake (only submit: render and check the command)",
     "import herder.services.intake"),
    ("herder.services.views (pydantic; only --json)", "import herder.services.views"),
]
"""What the queue commands load, in order (then what only `submit` and --json add); each
step's time is on top of the steps before it."""

BREAKDOWN = """
import json, sys, time
times = []
for statement in json.loads(sys.argv[1]):
    start = time.perf_counter()
    exec(statement)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def breakdown(environment: dict[str, str], folder: Path) -> list[tuple[str, float]]:
    """Median milliseconds of each step of STEPS, over RUNS fresh interpreters."""
    statements = json.dumps([statement for _, statement in STEPS])
    samples = [json.loads(subprocess.run(
        [sys.executable, "-c", BREAKDOWN, statements], cwd=folder, env=environment,
        capture_output=True, text=True, check=True).stdout) for _ in range(RUNS)]
    return [(label, statistics.median(sample[index] for sample in samples) * 1000)
            for index, (label, _) in enumerate(STEPS)]


def import_costs(environment: dict[str, str], folder: Path, top: int = 8) -> list[str]:
    """The top-level imports of `import herder.cli` with the largest cumulative time."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import herder.cli"],
                          cwd=folder, env=environment, capture_output=True, text=True,
                          check=True)
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2]
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 1:
            rows.append((int(parts[1]), name.strip()))
    rows.sort(reverse=True)
    return [f"{micros / 1000:7.1f} ms  {name}" for micros, name in rows[:top]]


def main() -> None:
    herder = herder_argv()
    with tempfile.TemporaryDirectory(prefix="herder-cli-bench-") as temporary:
        folder = Path(temporary)
        # An installed herder runs from cached bytecode; without it every run compiles
        # every module again (~2x the time of herder's own imports). The warm-up runs
        # write the caches.
        environment = {key: value for key, value in os.environ.items()
                       if not key.startswith("HERDER_") and key != "PYTHONDONTWRITEBYTECODE"}
        environment["HERDER_DB"] = f"sqlite:///{folder / 'herder.db'}"
        if CONFIG == "sample":
            subprocess.run([*herder, "init"], cwd=folder, env=environment, check=True,
                           stdout=subprocess.DEVNULL)
        seed = ("import sys\nfrom herder.client import Client\n"
                "with Client() as client:\n"
                "    for number in range(int(sys.argv[1])):\n"
                "        client.submit(command=['true'], dedup_key=f'bench-{number}')\n")
        subprocess.run([sys.executable, "-c", seed, str(JOBS)], cwd=folder, env=environment,
                       check=True)
        rows: list[tuple[str, list[str]]] = [
            ("python -c pass", [sys.executable, "-c", "pass"]),
            ("python -c 'import herder.cli'", [sys.executable, "-c", "import herder.cli"]),
            ("herder --help", [*herder, "--help"]),
            ("herder submit -- true", [*herder, "submit", "--", "true"]),
            ("herder jobs", [*herder, "jobs"]),
            ("herder jobs --json", [*herder, "jobs", "--json"]),
            ("herder show 1", [*herder, "show", "1"]),
            ("herder should-dispatch bench-1", [*herder, "should-dispatch", "bench-1"]),
            ("herder should-dispatch free-key", [*herder, "should-dispatch", "free-key"]),
        ]
        environments = [environment]
        if BEFORE:
            environments.insert(0, {**environment, "PYTHONPATH": BEFORE})
        measured = [(label, measure(argv, folder, environments)) for label, argv in rows]
        results = [(label, samples[-1]) for label, samples in measured]
        baseline = statistics.median(wall for wall, _ in results[0][1])
        config = "sample herder.toml" if CONFIG == "sample" else "no herder.toml"
        print(f"CLI wall time, SQLite, {config}, {JOBS} jobs in the database, "
              f"{RUNS} runs after {WARMUP} warm-up runs (ms)\n")
        print("| command | median | p90 | min | median - python -c pass | CPU median | CPU min |")
        print("|---|---|---|---|---|---|---|")
        for label, samples in results:
            times = [wall for wall, _ in samples]
            median = statistics.median(times)
            cpus = [cpu for _, cpu in samples]
            print(f"| `{label}` | {median * 1000:.0f} | {percentile(times, 0.9) * 1000:.0f} | "
                  f"{min(times) * 1000:.0f} | {(median - baseline) * 1000:+.0f} | "
                  f"{statistics.median(cpus) * 1000:.0f} | {min(cpus) * 1000:.0f} |")
        if os.environ.get("BENCH_JSON"):  # bench/run.sh reads the medians from here
            Path(os.environ["BENCH_JSON"]).write_text(json.dumps({
                label: {"median_ms": statistics.median(wall for wall, _ in samples) * 1000,
                        "p90_ms": percentile([wall for wall, _ in samples], 0.9) * 1000,
                        "cpu_median_ms": statistics.median(cpu for _, cpu in samples) * 1000}
                for label, samples in results}, indent=2))
        if BEFORE:
            print(f"\nBefore ({BEFORE}) and after, runs taking turns: wall / CPU medians (ms)\n")
            print("| command | before | after |")
            print("|---|---|---|")
            for label, (before, after) in measured:
                print(f"| `{label}` | {medians(before)} | {medians(after)} |")
        if os.environ.get("BREAKDOWN", "1") == "0":
            return
        print("\nWhere the time goes: each step in a fresh interpreter, on top of the ones "
              f"before it (median of {RUNS}, ms)\n")
        print("| step | ms |")
        print("|---|---|")
        for label, milliseconds in breakdown(environment, folder):
            print(f"| {label} | {milliseconds:.1f} |")
        print("\n`python -X importtime -c 'import herder.cli'`, largest top-level imports "
              "(cumulative):")
        for line in import_costs(environment, folder):
            print("   ", line)


if __name__ == "__main__":
    main()
