"""How fast `herder simulate` runs: a week of a 10-host fleet, and larger fleets up to 5,000
hosts and 200,000 jobs. Prints one markdown row per scenario (wall and CPU seconds, passes);
bench/README.md keeps the figures.

    .venv/bin/python bench/simulate_bench.py            # the small and middle scenarios
    .venv/bin/python bench/simulate_bench.py --large    # and 5,000 hosts x 200,000 jobs
    .venv/bin/python bench/simulate_bench.py --only-large --cycle 10
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from herder.core.settings.loading import load_config
from herder.services import simulation, workload

CONFIG = """
[job_types.agent]
command = ["agent"]
weight = "heavy"

[job_types.tests]
command = ["pytest"]
weight = "light"
"""

FLEET = """
[[hosts]]
label = "box"
count = {hosts}
ram_gb = 64
reserved_gb = 4
prime_workers = 4
night_workers = 6
"""

SCENARIOS = [
    # name, hosts, jobs, arrivals per hour
    ("a week, 10 hosts", 10, 3_000, 18),
    ("500 hosts, 20,000 jobs", 500, 20_000, 3_000),
]
LARGE = ("5,000 hosts, 200,000 jobs", 5_000, 200_000, 30_000)


def measure(directory: Path, name: str, hosts: int, jobs: int, rate: float,
            cycle: float | None) -> str:
    config = directory / "herder.toml"
    config.write_text(CONFIG)
    fleet_file = directory / f"fleet-{hosts}.toml"
    fleet_file.write_text(FLEET.format(hosts=hosts))
    settings = load_config(config).settings
    fleet = fleet_file.load_fleet(fleet_file, settings)
    trace = workload.generate_trace(
        settings, jobs, rate, workload.parse_mix("agent:heavy=3,tests:light=2", settings),
        workload.parse_durations("exp:30m"),
        workload.parse_outcomes("done=0.9,transient=0.04,oom=0.03,fail=0.03"), seed=1)
    wall, cpu = time.perf_counter(), time.process_time()
    report = simulation.run(fleet, settings, trace, cycle=cycle)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (f"| {name} | {cycle if cycle is not None else settings.fleet.scheduler_interval:g} s"
            f" | {report.makespan / 3600:.1f} h | {report.attempts:,} | "
            f"{report.placement_passes:,} | {wall:.1f} | {cpu:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", action="store_true", help="also 5,000 x 200,000")
    parser.add_argument("--only-large", action="store_true", help="only 5,000 x 200,000")
    parser.add_argument("--cycle", type=float, help="seconds between placement passes "
                        "[default: scheduler_interval, 1 s]")
    parser.add_argument("--dir", default="/tmp/herder-simulate-bench")
    arguments = parser.parse_args()
    directory = Path(arguments.dir)
    directory.mkdir(parents=True, exist_ok=True)
    print("| scenario | cycle | makespan | attempts | placement passes | wall s | CPU s |")
    print("|---|---|---|---|---|---|---|")
    scenarios = [] if arguments.only_large else list(SCENARIOS)
    if arguments.large or arguments.only_large:
        scenarios.append(LARGE)
    for scenario in scenarios:
        print(measure(directory, *scenario, arguments.cycle), flush=True)


if __name__ == "__main__":
    main()
