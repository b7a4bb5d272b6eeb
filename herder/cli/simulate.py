"""`herder simulate`: herder's own placement and outcome policy on a virtual clock, over a
fleet file and a workload trace (docs/simulate.md)."""

from __future__ import annotations

import click

from herder.cli.root import State, edge, fail, pass_state


@click.command()
@click.option("--fleet", "fleet_path", type=click.Path(dir_okay=False),
              help="The fleet file (TOML): hosts, windows, outages, accounts. Without it, "
              "the hosts herder.toml declares ([hosts.LABEL]; with --compare, each config's).")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="The workload: CSV with a header, or JSON lines (.jsonl). Without it, "
              "one is generated from --jobs, --arrival-rate, --mix, --durations, --outcomes "
              "and --seed.")
@click.option("--jobs", "job_count", type=click.IntRange(min=1, max=10_000_000),
              default=1000,
              show_default=True, help="Generated trace: how many jobs.")
@click.option("--arrival-rate", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Generated trace: jobs per hour (Poisson arrivals).")
@click.option("--mix", help="Generated trace: TYPE:WEIGHT[:PRIORITY]=SHARE,... "
              "[default: each job type at its own weight, equal shares]")
@click.option("--durations", default="exp:30m", show_default=True,
              help="Generated trace: fixed:D, exp:MEAN, uniform:LOW:HIGH or "
              "lognormal:MEDIAN:SIGMA.")
@click.option("--outcomes", default="done=1", show_default=True,
              help="Generated trace: OUTCOME=SHARE,... of done, usage_limit, oom, "
              "needs_heavier, transient, fail.")
@click.option("--seed", type=int, default=1, show_default=True,
              help="The random seed of a generated trace and of spawn failures (same "
              "seed, same run).")
@click.option("--cycle", type=float, help="Seconds between placement passes, 0 (a pass at "
              "each change) or 0.001 to 86400 [default: [fleet] scheduler_interval]; longer "
              "is faster and coarser.")
@click.option("--save-trace", type=click.Path(dir_okay=False),
              help="Write the trace used as CSV, to replay or edit.")
@click.option("--compare", "compare_path", type=click.Path(dir_okay=False),
              help="A second herder.toml: run the same trace under it, side by side.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="Write the figures as JSON to this file.")
@click.option("--charts", "charts_dir", type=click.Path(file_okay=False),
              help="Write PNG charts to this directory (needs herder[charts]).")
@pass_state
def simulate(state: State, fleet_path: str, trace_path: str | None, job_count: int,
             arrival_rate: float, mix: str | None, durations: str, outcomes: str, seed: int,
             cycle: float | None, save_trace: str | None, compare_path: str | None,
             json_path: str | None,
             charts_dir: str | None) -> None:
    """Run a workload through herder's placement and outcome policy on a virtual clock,
    and print wait percentiles, makespan, RAM booked and used, and the gap to the lower
    bound. Exit 2 on bad input or work that fits no host."""
    import importlib
    from pathlib import Path

    from herder.core.settings.loading import load_config
    from herder.core.simulation.report import summary_text
    from herder.services import fleet_file, simulation, workload
    if charts_dir is not None:
        try:
            importlib.import_module("matplotlib")
        except ImportError:
            fail(simulation.CHARTS_MISSING)
    with edge():
        settings = state.config.settings
        fleet = (fleet_file.load_fleet(Path(fleet_path), settings) if fleet_path is not None
                 else fleet_file.fleet_of_settings(settings))
        if trace_path is not None:
            jobs = workload.load_trace(Path(trace_path), settings)
        else:
            shapes = (workload.parse_mix(mix, settings) if mix else [
                workload.Mix(name, job_type.weight or settings.defaults.weight,
                               job_type.priority if job_type.priority is not None
                               else settings.defaults.priority, 1.0)
                for name, job_type in sorted(settings.job_types.items())])
            if not shapes:
                fail("--mix: herder.toml has no [job_types] to generate jobs of (add one, "
                     "or pass --trace)")
            jobs = workload.generate_trace(
                settings, job_count, arrival_rate, shapes,
                workload.parse_durations(durations), workload.parse_outcomes(outcomes),
                seed)
        if save_trace is not None:
            workload.write_trace(jobs, Path(save_trace))
        keep = (charts_dir is not None or json_path is not None) and (
            len(fleet.hosts) <= simulation.TIMELINE_HOSTS)
        reports = {}
        this = state.config_path or "herder.toml"
        reports[this] = simulation.run(fleet, settings, jobs, keep, cycle, seed)
        if compare_path is not None:
            other = load_config(compare_path).settings
            simulation.check_trace(jobs, other, compare_path)
            name = compare_path if compare_path != this else f"{compare_path} (again)"
            other_fleet = fleet if fleet_path is not None else fleet_file.fleet_of_settings(other)
            reports[name] = simulation.run(other_fleet, other, jobs, keep, cycle, seed)
    runs = list(reports.values())
    if len(runs) == 2:
        first, second = reports
        click.echo(summary_text(runs[0], runs[1], (first, second)), nl=False)
    else:
        click.echo(summary_text(runs[0]), nl=False)
    with edge():
        if json_path is not None:
            simulation.write_json(Path(json_path), reports)
        if charts_dir is not None:
            for path in simulation.write_charts(Path(charts_dir), reports):
                click.echo(f"chart: {path}")
