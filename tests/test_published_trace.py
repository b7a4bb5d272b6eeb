"""The trace the README and bench/RESULTS.md publish still loads and runs under both of its
configs: a change to the settings or the trace format that broke it would break the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from herder.core.settings.loading import load_config
from herder.services import fleet_file, simulation, workload

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "traces" / "week-10-hosts"


@pytest.mark.parametrize("config", ["herder.toml", "spread.toml"])
def test_the_published_week_runs_within_the_bound_it_is_set_against(config: str) -> None:
    settings = load_config(FOLDER / config).settings
    fleet = fleet_file.load_fleet(FOLDER / "fleet.toml", settings)
    jobs = workload.load_trace(FOLDER / "trace.csv", settings)
    report = simulation.run(fleet, settings, jobs)
    assert report.jobs == len(jobs) == 5000
    assert report.done + report.failed == report.jobs
    assert 0 < report.lower_bound <= report.utilization < 1
    assert report.makespan > 6 * 24 * 3600  # a week of arrivals, not a short burst
