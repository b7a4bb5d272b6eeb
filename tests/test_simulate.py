"""`herder simulate`: the engine drives herder's own placement and policy on a virtual clock
(properties over random fleets and traces), a fixed trace's figures, and bad input refused
at the CLI with its line and field."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from datetime import UTC, datetime, time, timedelta
from itertools import pairwise
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from herder.core.model import RAM_TOLERANCE_GB
from herder.core.scheduling.capacity import WindowCaps, WindowSchedule, bookable_gb
from herder.core.scheduling.placement import HostSpec
from herder.core.settings.loading import load_config
from herder.core.simulation.engine import StuckError, simulate
from herder.core.simulation.report import summary_text
from herder.core.simulation.scenario import (
    Outage,
    Scenario,
    SimAccount,
    TraceJob,
    TraceOutcome,
)
from herder.services import fleet_file, simulation, workload

DATA = Path(__file__).parent / "data" / "simulate"
START = datetime(2026, 1, 5, tzinfo=UTC)
SETTINGS = load_config(DATA / "herder.toml").settings


def fixed_report():
    fleet = fleet_file.load_fleet(DATA / "fleet.toml", SETTINGS)
    jobs = workload.load_trace(DATA / "trace.csv", SETTINGS)
    return simulation.run(fleet, SETTINGS, jobs)


def test_the_fixed_trace_gives_its_known_figures() -> None:
    """One host of two workers and 12.8 GB bookable. Jobs 1 and 2 start at once; job 4
    (priority 50) goes before job 3 when job 1 ends at 600; job 3 waits for job 4 (900);
    job 5 ends oom on light at 1800 and runs again on heavy until 2400; job 6 fails three
    times (backoff 10 s, then 20 s) and fails at 1630."""
    report = fixed_report()
    assert (report.jobs, report.done, report.failed) == (6, 5, 1)
    assert report.attempts == 9
    assert report.makespan == 2400
    assert report.escalated == 1
    assert (report.shed, report.rotated, report.lost_attempts) == (0, 0, 0)
    assert report.booked_gb_seconds == pytest.approx(20700)
    assert report.work_gb_seconds == pytest.approx(15300)
    assert report.capacity_gb_seconds == pytest.approx(12.8 * 2400)
    assert report.lower_bound == pytest.approx(15300 / 30720)
    assert report.utilization == pytest.approx(20700 / 30720)
    light = report.wait_by_weight["light"]
    assert (light.jobs, light.p50, light.p95, light.p99) == (5, 500, 1000, 1000)
    assert report.wait_by_weight["heavy"].p99 == 0
    assert report.wait_by_priority["50"].p50 == 500
    (host,) = report.hosts
    assert (host.label, host.bookable_gb, host.peak_booked_gb) == ("a", 12.8, 11)


def test_kept_attempts_say_how_each_job_ended() -> None:
    fleet = fleet_file.load_fleet(DATA / "fleet.toml", SETTINGS)
    jobs = workload.load_trace(DATA / "trace.csv", SETTINGS)
    report = simulation.run(fleet, SETTINGS, jobs, keep_attempts=True)
    endings = {ending.job_id: ending for ending in report.job_log}
    assert (endings[5].status, endings[5].weight, endings[5].outcomes) == (
        "done", "heavy", ("oom", "ok"))
    assert (endings[6].status, endings[6].failure_reason, endings[6].outcomes) == (
        "failed", "implementation_error", ("failed",) * 3)
    assert "job_log" not in report.summary()
    assert simulation.run(fleet, SETTINGS, jobs).job_log == ()


def test_an_outage_loses_the_attempts_running_there_and_they_run_again() -> None:
    hosts = (HostSpec("a", 32, prime=WindowCaps(2), night=WindowCaps(2)),
             HostSpec("b", 32, prime=WindowCaps(2), night=WindowCaps(2)))
    jobs = (TraceJob(1, 0, "tests", "light", 100, 600, 2),)
    rules = simulation.rules_from(SETTINGS)
    report = simulate(Scenario(START, hosts, jobs, rules, (Outage("a", 100, 200),)),
                      keep_attempts=True)
    assert report.lost_attempts == 1
    assert report.done == 1
    assert [(host, start, end) for _, host, start, end, _ in report.attempt_log] == [
        ("a", 0, 100), ("b", 100, 700)]


def test_a_usage_limit_rotates_to_another_account_and_the_quota_resets(
        tmp_path: Path) -> None:
    config = tmp_path / "herder.toml"
    config.write_text((DATA / "herder.toml").read_text().replace(
        'weight = "heavy"', 'weight = "heavy"\naccounts = true'))
    rules = simulation.rules_from(load_config(config).settings)
    hosts = (HostSpec("a", 32, prime=WindowCaps(2), night=WindowCaps(2)),)
    accounts = (SimAccount("a", "one", reset_every=3600, first_reset=3600),
                SimAccount("a", "two", reset_every=3600, first_reset=3600))
    jobs = (TraceJob(1, 0, "agent", "heavy", 100, 60, 4, TraceOutcome.USAGE_LIMIT),
            TraceJob(2, 0, "agent", "heavy", 100, 60, 4, TraceOutcome.USAGE_LIMIT))
    report = simulate(Scenario(START, hosts, jobs, rules, accounts=accounts),
                      keep_attempts=True)
    assert report.usage_limits == 2
    assert report.rotated == 1  # the second account was spent by then too
    assert report.done == 2
    # Both accounts were depleted at 60 s; the job without one waits for the reset.
    assert max(end for *_, end, _ in report.attempt_log) == 3660


def test_a_heavy_job_out_of_memory_escalates_past_the_smaller_playwright() -> None:
    """A heavy (8 GB) job peaking at 10 GB runs again at orchestrator (12 GB) and is done;
    the chain's next step, playwright, books 6 GB and would only run out again."""
    hosts = (HostSpec("a", 64, prime=WindowCaps(2), night=WindowCaps(2)),)
    jobs = (TraceJob(1, 0, "agent", "heavy", 100, 600, 10, TraceOutcome.OOM),)
    report = simulate(Scenario(START, hosts, jobs, simulation.rules_from(SETTINGS)),
                      keep_attempts=True)
    assert (report.done, report.failed, report.escalated) == (1, 0, 1)
    assert [booked for *_, booked in report.attempt_log] == [8.0, 12.0]


def test_work_that_fits_no_host_is_named() -> None:
    hosts = (HostSpec("small", 4, prime=WindowCaps(1), night=WindowCaps(1)),)
    jobs = (TraceJob(1, 0, "tests", "light", 100, 60, 1),
            TraceJob(2, 0, "agent", "heavy", 100, 60, 1))
    with pytest.raises(StuckError) as caught:
        simulate(Scenario(START, hosts, jobs, simulation.rules_from(SETTINGS)))
    assert [item.job_id for item in caught.value.unplaced] == [2]


# --- properties -------------------------------------------------------------------

HOSTS = st.lists(st.tuples(st.sampled_from([12.0, 16.0, 24.0, 64.0]),
                           st.integers(1, 4), st.integers(0, 4)),
                 min_size=1, max_size=4)
JOBS = st.lists(st.tuples(st.integers(0, 3000), st.sampled_from(["tests", "agent"]),
                          st.sampled_from(["light", "heavy"]), st.sampled_from([50, 100]),
                          st.integers(1, 1500), st.floats(0.5, 10),
                          st.sampled_from(list(TraceOutcome))),
                min_size=1, max_size=25)
OUTAGES = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3000), st.integers(1, 2000)),
                   max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HOSTS, JOBS, OUTAGES, st.sampled_from([None, time(1), time(0, 30)]),
       st.sampled_from([0.0, 0.3, 0.97]), st.sampled_from([0, 2500]))
def test_no_host_is_overbooked_and_no_job_runs_twice_at_once(hosts, jobs, outages, night,
                                                             spawn_failure, late):
    """`late` delays every arrival, so that outages may fall before the first one; a spawn
    failure rate of 0.97 leaves jobs that never ran (neither counts in the figures)."""
    specs = tuple(HostSpec(f"h{index}", ram, prime=WindowCaps(prime), night=WindowCaps(
        night_workers)) for index, (ram, prime, night_workers) in enumerate(hosts))
    trace = tuple(TraceJob(number, float(arrival + late), job_type, weight, priority,
                           float(duration), peak, outcome)
                  for number, (arrival, job_type, weight, priority, duration, peak, outcome)
                  in enumerate(sorted(jobs), 1))
    down = tuple(Outage(specs[index % len(specs)].label, float(at), float(at + length))
                 for index, at, length in outages)
    rules = simulation.rules_from(SETTINGS)
    schedule = WindowSchedule("UTC", time(0), night or time(0))
    rules = msgspec.structs.replace(rules, policy=msgspec.structs.replace(
        rules.policy, schedule=schedule))
    try:
        report = simulate(Scenario(START, specs, trace, rules, down,
                                   spawn_failure={specs[0].label: spawn_failure}),
                          keep_attempts=True)
    except StuckError:
        return  # work that fits no host (a night without workers, a host too small)
    by_spec = {spec.label: spec for spec in specs}
    for job_id in {entry[0] for entry in report.attempt_log}:
        spans = sorted((start, end) for job, _, start, end, _ in report.attempt_log
                       if job == job_id)
        for (_, end), (start, _) in pairwise(spans):
            assert start >= end, f"job {job_id} ran twice at once"
    for _, host, start, _, _ in report.attempt_log:
        spec = by_spec[host]
        running = [entry for entry in report.attempt_log
                   if entry[1] == host and entry[2] <= start < entry[3]]
        window = schedule.window_at(START + timedelta(seconds=start))
        assert len(running) <= spec.caps(window).max_workers
        booked = sum(entry[4] for entry in running)
        assert booked <= bookable_gb(spec.ram_total_gb, 0.0) + RAM_TOLERANCE_GB
    assert report.lower_bound <= report.utilization + 1e-9
    assert report.utilization <= 1 + 1e-9
    assert report.done + report.failed == report.jobs


# --- the CLI ----------------------------------------------------------------------


def herder(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HERDER_CONFIG": str(DATA / "herder.toml")}
    return subprocess.run([sys.executable, "-m", "herder.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=120, check=False)


def test_the_cli_prints_the_summary_and_writes_json(tmp_path: Path) -> None:
    result = herder("simulate", "--fleet", str(DATA / "fleet.toml"), "--trace",
                    str(DATA / "trace.csv"), "--json", str(tmp_path / "out.json"),
                    cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "makespan              40m00s" in result.stdout
    assert '"makespan": 2400.0' in (tmp_path / "out.json").read_text()


BAD_LINES = [
    ("5,tests,light,100,-3,2,done", "trace.csv:3: duration", "negative"),
    ("5,builds,light,100,30,2,done", "trace.csv:3: job_type", "unknown job type 'builds'"),
    ("5,tests,giant,100,30,2,done", "trace.csv:3: weight", "unknown weight 'giant'"),
    ("0,tests,light,100,30,2,done", "trace.csv:3: arrival", "sort the trace"),
]


@pytest.mark.parametrize(("line", "where", "problem"), BAD_LINES)
def test_a_bad_trace_line_is_refused_with_its_line_and_field(
        tmp_path: Path, line: str, where: str, problem: str) -> None:
    (tmp_path / "trace.csv").write_text("arrival,job_type,weight,priority,duration,peak_gb,"
                                        f"outcome\n1,tests,light,100,30,2,done\n{line}\n")
    # One process for the lot would hide which refused what; each is one short run.
    result = herder("simulate", "--fleet", str(DATA / "fleet.toml"), "--trace",
                    str(tmp_path / "trace.csv"), cwd=tmp_path)
    assert result.returncode == 2
    assert where in result.stderr and problem in result.stderr, result.stderr


def test_a_bad_fleet_file_and_unplaceable_work_are_refused(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_text('[[hosts]]\nlabel = "a"\nram_gb = 16\n\n'
                                         '[[hosts]]\nlabel = "b"\nram_gb = 4\n'
                                         'prime_max_weight = "huge"\n')
    result = herder("simulate", "--fleet", str(tmp_path / "fleet.toml"), "--trace",
                    str(DATA / "trace.csv"), cwd=tmp_path)
    assert result.returncode == 2
    assert "fleet.toml:8: hosts[2].prime_max_weight: unknown weight 'huge'" in result.stderr

    (tmp_path / "fleet.toml").write_text('[[hosts]]\nlabel = "a"\nram_gb = 6\n')
    result = herder("simulate", "--fleet", str(tmp_path / "fleet.toml"), "--trace",
                    str(DATA / "trace.csv"), cwd=tmp_path)
    assert result.returncode == 2
    assert "1 job(s) fit no host: 2 (agent, heavy, priority 100)" in result.stderr


def test_charts_without_matplotlib_say_how_to_get_it(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "HERDER_CONFIG": str(DATA / "herder.toml"),
           "PYTHONPATH": str(tmp_path / "shadow")}
    result = subprocess.run([sys.executable, "-m", "herder.cli", "simulate", "--fleet",
                             str(DATA / "fleet.toml"), "--trace", str(DATA / "trace.csv"),
                             "--charts", str(tmp_path / "charts")], capture_output=True,
                            text=True, env=env, timeout=120, check=False)
    assert result.returncode == 2
    assert "pip install 'herder[charts]'" in result.stderr
    assert not (tmp_path / "charts").exists()


def test_compare_runs_the_same_trace_under_a_second_config_side_by_side(
        tmp_path: Path) -> None:
    config = tmp_path / "tight.toml"
    config.write_text((DATA / "herder.toml").read_text().replace(
        'night_end = "00:00"', 'night_end = "00:00"\nbookable_fraction = 0.7'))
    tight = load_config(config).settings
    fleet = fleet_file.load_fleet(DATA / "fleet.toml", SETTINGS)
    jobs = workload.load_trace(DATA / "trace.csv", SETTINGS)
    other = simulation.run(fleet, tight, jobs)
    # 0.7 x 16 = 11.2 GB: heavy (8) and light (3) still fit together, so only the
    # capacity, not the schedule, changes.
    assert other.makespan == 2400
    assert other.capacity_gb_seconds == pytest.approx(11.2 * 2400)
    text = summary_text(fixed_report(), other, ("herder.toml", "tight.toml"))
    header, *rows = text.splitlines()
    assert header.split() == ["herder.toml", "tight.toml"]
    assert any(row.split()[:2] == ["lower", "bound"] and row.split()[2:] == ["49.8%", "56.9%"]
               for row in rows)


def test_the_server_s_scheduler_and_endings_place_the_fixed_trace_as_the_simulator_does(
        tmp_path: Path) -> None:
    """The same trace driven through the real store, `Scheduler.run_once` and
    `record_ending` on a stepped clock (a fake agent that runs each placed attempt for its
    duration): every attempt starts and ends on the same host at the same second."""
    from herder.core.fleet import Fleet
    from herder.core.model import HostRecord, JobSpec, JobStatus, Outcome
    from herder.runtime.endings import PolicyLimits, record_ending
    from herder.runtime.scheduler import Scheduler
    from herder.store import open_store

    loaded = fleet_file.load_fleet(DATA / "fleet.toml", SETTINGS)
    trace = workload.load_trace(DATA / "trace.csv", SETTINGS)
    expected = sorted((job, host, start, end) for job, host, start, end, _ in simulate(
        Scenario(loaded.start, loaded.hosts, trace, simulation.rules_from(SETTINGS)),
        keep_attempts=True).attempt_log)

    start = loaded.start
    limits = PolicyLimits.from_settings(SETTINGS)
    weights = Fleet.from_settings(SETTINGS).weights
    seen: list[tuple[int, str, float, float]] = []
    with open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        for spec in loaded.hosts:
            store.host_insert(HostRecord(spec.label, spec.ram_total_gb,
                                         prime_max_workers=spec.prime.max_workers,
                                         night_max_workers=spec.night.max_workers), start)
        scheduler = Scheduler(store, Fleet.from_settings(SETTINGS))
        trace_of: dict[int, TraceJob] = {}
        running: dict[int, tuple[float, int, str, Outcome]] = {}  # store id -> its attempt
        tried: dict[int, int] = {}
        pending = list(trace)
        now = 0.0
        while pending or running or store.job_list([JobStatus.QUEUED], 10):
            moment = start + timedelta(seconds=now)
            for spec in loaded.hosts:
                store.host_heartbeat(spec.label, moment, {})
            for job_id, (end, attempt, host, outcome) in sorted(running.items()):
                if end <= now:
                    del running[job_id]
                    job = store.job_get(job_id)
                    assert job is not None and job.attempt == attempt
                    record_ending(store, job, outcome, moment, limits)
                    seen.append((trace_of[job_id].id, host, end - trace_of[job_id].duration,
                                 end))
            arrived = [job for job in pending if job.arrival <= now]
            pending = pending[len(arrived):]
            for job in arrived:
                [inserted] = store.job_insert([JobSpec(
                    command=("true",), job_type=job.job_type, weight=job.weight,
                    priority=job.priority)], moment)
                trace_of[inserted.job_id] = job
            scheduler.run_once(moment)
            for job in store.job_list([JobStatus.CLAIMED], 100):
                if job.id in running:
                    continue
                origin = trace_of[job.id]
                first = tried.get(job.id, 0) == 0
                tried[job.id] = tried.get(job.id, 0) + 1
                if origin.outcome is TraceOutcome.FAIL:
                    outcome = Outcome.FAILED
                elif origin.outcome is TraceOutcome.OOM and (
                        first or weights.budget(job.weight) < origin.peak_gb):
                    outcome = Outcome.OOM
                else:
                    outcome = Outcome.OK
                assert job.host is not None
                running[job.id] = (now + origin.duration, job.attempt, job.host, outcome)
            now += 1.0
            assert now < 10_000, "the replay did not finish"
    assert len(seen) == 9
    assert sorted(seen) == expected


def test_a_json_lines_trace_reads_as_its_csv_and_a_generated_trace_replays(
        tmp_path: Path) -> None:
    jobs = workload.load_trace(DATA / "trace.csv", SETTINGS)
    lines = tmp_path / "trace.jsonl"
    lines.write_text("".join(msgspec.json.encode({
        "arrival": job.arrival, "job_type": job.job_type, "weight": job.weight,
        "priority": job.priority, "duration": job.duration, "peak_gb": job.peak_gb,
        "outcome": job.outcome.value}).decode() + "\n" for job in jobs))
    assert workload.load_trace(lines, SETTINGS) == jobs
    made = workload.generate_trace(
        SETTINGS, 50, 120, workload.parse_mix("agent:heavy=1,tests:light:50=2", SETTINGS),
        workload.parse_durations("uniform:1m:10m"),
        workload.parse_outcomes("done=3,fail=1"), seed=3)
    workload.write_trace(made, tmp_path / "made.csv")
    assert workload.load_trace(tmp_path / "made.csv", SETTINGS) == made


def test_spawn_failures_are_drawn_from_the_seed_and_spend_the_spawn_budget() -> None:
    hosts = (HostSpec("flaky", 32, prime=WindowCaps(2), night=WindowCaps(2)),
             HostSpec("solid", 32, prime=WindowCaps(2), night=WindowCaps(2)))
    jobs = tuple(TraceJob(number, number * 60.0, "tests", "light", 100, 300, 2)
                 for number in range(1, 21))
    rules = simulation.rules_from(SETTINGS)

    def run(seed: int):
        return simulate(Scenario(START, hosts, jobs, rules, spawn_failure={"flaky": 0.5},
                                 seed=seed), keep_attempts=True)

    first = run(7)
    assert first == run(7)
    assert first.spawn_failures > 0
    assert first.done == 20  # each went elsewhere (avoid_host) or started on a later try
    assert first.attempts == len(first.attempt_log) == 20  # a failed spawn ran nothing


def test_the_documented_example_is_what_the_fixed_trace_prints() -> None:
    page = (Path(__file__).parents[1] / "docs" / "simulate.md").read_text()
    assert summary_text(fixed_report()) in page


# --- hardening: no input loops for ever, crashes, or skews a figure ----------------------


def test_an_outage_before_the_first_arrival_takes_nothing_from_capacity() -> None:
    """Host a is down from 0 to 1000 s; the only job arrives at 2000 and runs 600 s alone:
    the fleet was up the whole measured span, so it booked 3 of 12.8 GB all along."""
    hosts = (HostSpec("a", 16, prime=WindowCaps(1), night=WindowCaps(1)),)
    jobs = (TraceJob(1, 2000, "tests", "light", 100, 600, 2),)
    report = simulate(Scenario(START, hosts, jobs, simulation.rules_from(SETTINGS),
                               (Outage("a", 0, 1000), Outage("a", 2500, 2700),
                                Outage("a", 9000, 9500))))
    # The outage at 2500 cuts the attempt (lost) and its 200 s count; the others do not.
    assert report.lost_attempts == 1
    assert report.makespan == 2700 + 600 - 2000
    assert report.capacity_gb_seconds == pytest.approx(12.8 * (1300 - 200))
    assert report.utilization <= 1


def test_the_lower_bound_counts_only_work_that_ran_to_its_end() -> None:
    """Nearly every placement fails to start: the jobs that never ran add no work, so the
    lower bound stays below what was booked."""
    hosts = (HostSpec("a", 32, prime=WindowCaps(2), night=WindowCaps(2)),)
    jobs = tuple(TraceJob(number, number * 60.0, "tests", "light", 100, 300, 2)
                 for number in range(1, 11))
    report = simulate(Scenario(START, hosts, jobs, simulation.rules_from(SETTINGS),
                               spawn_failure={"a": 0.9}, seed=3), keep_attempts=True)
    ran = {job for job, _, start, end, _ in report.attempt_log if end - start == 300}
    assert report.failed > 0 and ran
    assert report.work_gb_seconds == pytest.approx(3 * 300 * len(ran))
    assert report.lower_bound <= report.utilization


def test_a_quota_that_lets_nothing_through_stops_the_run_instead_of_looping(
        tmp_path: Path) -> None:
    config = tmp_path / "herder.toml"
    config.write_text((DATA / "herder.toml").read_text().replace(
        'weight = "heavy"', 'weight = "heavy"\naccounts = true'))
    rules = simulation.rules_from(load_config(config).settings)
    hosts = (HostSpec("a", 32, prime=WindowCaps(1), night=WindowCaps(1)),)
    accounts = (SimAccount("a", "one", quota_jobs=0, reset_every=30 * 86400,
                           first_reset=30 * 86400),)
    jobs = (TraceJob(1, 0, "agent", "heavy", 100, 60, 4),)
    with pytest.raises(StuckError) as caught:
        simulate(Scenario(START, hosts, jobs, rules, accounts=accounts))
    assert "cannot finish" in str(caught.value)
    assert [item.job_id for item in caught.value.unplaced] == [1]


def test_an_event_at_a_time_that_is_not_finite_is_refused() -> None:
    hosts = (HostSpec("a", 32, prime=WindowCaps(1), night=WindowCaps(1)),)
    jobs = (TraceJob(1, 0, "tests", "light", 100, math.nan, 2),)
    with pytest.raises(ValueError, match="not finite"):
        simulate(Scenario(START, hosts, jobs, simulation.rules_from(SETTINGS)))


@pytest.mark.parametrize("cycle", [math.inf, math.nan, -1.0])
def test_the_engine_refuses_a_cycle_that_would_never_tick(cycle: float) -> None:
    hosts = (HostSpec("a", 32, prime=WindowCaps(1), night=WindowCaps(1)),)
    jobs = (TraceJob(1, 0, "tests", "light", 100, 60, 2),)
    rules = msgspec.structs.replace(simulation.rules_from(SETTINGS), cycle=cycle)
    with pytest.raises(ValueError, match="cycle"):
        simulate(Scenario(START, hosts, jobs, rules))


def test_generated_durations_are_cut_to_a_year() -> None:
    made = workload.generate_trace(
        SETTINGS, 200, 60, workload.parse_mix("tests:light=1", SETTINGS),
        workload.parse_durations("lognormal:8000h:5"), workload.parse_outcomes("done=1"), 1)
    assert max(job.duration for job in made) == workload.MAX_GENERATED_DURATION


def test_a_cycle_of_zero_places_as_events_come() -> None:
    fleet = fleet_file.load_fleet(DATA / "fleet.toml", SETTINGS)
    jobs = workload.load_trace(DATA / "trace.csv", SETTINGS)
    assert simulation.run(fleet, SETTINGS, jobs, cycle=0).makespan == 2400


def _simulate(tmp_path: Path, *args: str, fleet: str | None = None,
              trace: str | None = None, raw_trace: bytes | None = None,
              suffix: str = ".csv") -> subprocess.CompletedProcess[str]:
    """`herder simulate` on the fixed data, or on the fleet file and trace given."""
    fleet_path = DATA / "fleet.toml"
    if fleet is not None:
        fleet_path = tmp_path / "fleet.toml"
        fleet_path.write_text(fleet)
    trace_args: tuple[str, ...] = ("--trace", str(DATA / "trace.csv"))
    if trace is not None or raw_trace is not None:
        trace_path = tmp_path / f"trace{suffix}"
        trace_path.write_bytes(raw_trace if raw_trace is not None else trace.encode())
        trace_args = ("--trace", str(trace_path))
    if "--jobs" in args or "--durations" in args:
        trace_args = ()
    return herder("simulate", "--fleet", str(fleet_path), *trace_args, *args, cwd=tmp_path)


@pytest.mark.parametrize("value", ["inf", "nan", "1e-300", "100000"])
def test_a_cycle_that_is_not_finite_or_out_of_range_is_refused(tmp_path: Path,
                                                                value: str) -> None:
    result = _simulate(tmp_path, "--cycle", value)
    assert result.returncode == 2, result.stderr
    assert "--cycle:" in result.stderr and "0.001 to 86400" in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "where"), [
    (("--durations", "lognormal:20m:nan"), "--durations"),
    (("--durations", "lognormal:20m:1000"), "--durations"),
    (("--jobs", "10000001"), "--jobs"),
])
def test_generator_options_out_of_range_are_refused(tmp_path: Path, args: tuple[str, ...],
                                                    where: str) -> None:
    result = _simulate(tmp_path, *args, "--cycle", "0")
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and "Traceback" not in result.stderr, result.stderr


HEADER = "arrival,job_type,weight,priority,duration,peak_gb,outcome\n"
GOOD_JSON = ('{"arrival": 0, "job_type": "tests", "weight": "light", "priority": 100, '
             '"duration": 30, "peak_gb": 2, "outcome": "done"}')


def _json(**changes: object) -> str:
    row = msgspec.json.decode(GOOD_JSON)
    row.update(changes)
    return GOOD_JSON + "\n" + msgspec.json.encode(row).decode().replace(
        '"PRIORITY"', "1e400") + "\n"


BAD_TRACES = [
    (_json(priority="PRIORITY"), "trace.jsonl:2: priority", "not a whole number"),
    (_json(priority=1.5), "trace.jsonl:2: priority", "not a whole number"),
    (_json(id=1.5), "trace.jsonl:2: id", "not a whole number"),
    (_json(job_type=["tests"]), "trace.jsonl:2: job_type", "unknown job type"),
    (_json(weight=["light"]), "trace.jsonl:2: weight", "unknown weight"),
    (_json(arrival=1e12), "trace.jsonl:2: arrival", "above the most"),
    (_json(duration=1e12), "trace.jsonl:2: duration", "above the most"),
    (_json(outcome=["done"]), "trace.jsonl:2: outcome", "unknown outcome"),
]


@pytest.mark.parametrize(("text", "where", "problem"), BAD_TRACES)
def test_a_bad_json_lines_value_is_refused_with_its_line_and_field(
        tmp_path: Path, text: str, where: str, problem: str) -> None:
    result = _simulate(tmp_path, trace=text, suffix=".jsonl")
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and problem in result.stderr, result.stderr


@pytest.mark.parametrize(("raw", "where", "problem"), [
    ((HEADER + "0,tests,light,100,30,2,done,extra\n").encode(), "trace.csv:2",
     "more columns than the header"),
    ((HEADER + '0,tests,light,100,30,2,"' + "x" * 140_000 + '"\n').encode(), "trace.csv:2",
     "not CSV"),
    ((HEADER + "0,tests,light,100,30,2,done\n0,t\xe9sts,light\n").encode("latin-1"),
     "trace.csv:3", "not UTF-8"),
])
def test_a_bad_csv_trace_is_refused_with_its_line(tmp_path: Path, raw: bytes, where: str,
                                                  problem: str) -> None:
    result = _simulate(tmp_path, raw_trace=raw)
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and problem in result.stderr, result.stderr


HOST = '[[hosts]]\nlabel = "a"\nram_gb = 16\n'
AGENTS = HOST + '\n[[accounts]]\nhost = "a"\nname = "one"\n'


@pytest.mark.parametrize(("fleet", "where", "problem"), [
    (AGENTS + "quota_jobs = 0\n", "fleet.toml:8: accounts[1].quota_jobs", ">= 1"),
    (HOST + "count = 100000000\n", "fleet.toml:4: hosts[1].count", "from 1 to 100000"),
    (HOST + "count = 60000\n\n[[hosts]]\nlabel = \"b\"\nram_gb = 16\ncount = 60000\n",
     "fleet.toml:9: hosts[2].count", "more than 100000 hosts"),
    (HOST + 'prime_max_weight = ["x"]\n', "fleet.toml:4: hosts[1].prime_max_weight",
     "a weight's name"),
    (HOST + '\n[[outages]]\nhost = ["a"]\nstart = 0\nend = 10\n',
     "fleet.toml:6: outages[1].host", "a host's label"),
    (HOST + "ram_gb_typo = 1\n", "fleet.toml:4: hosts[1].ram_gb_typo", "unknown key"),
    ('start = "9999-12-31T00:00:00Z"\n' + HOST, "fleet.toml:1: start", "in the years"),
])
def test_a_bad_fleet_value_is_refused_with_its_line_and_field(
        tmp_path: Path, fleet: str, where: str, problem: str) -> None:
    result = _simulate(tmp_path, fleet=fleet)
    assert result.returncode == 2, result.stderr
    assert where in result.stderr and problem in result.stderr, result.stderr


def test_a_fleet_file_that_is_not_utf8_is_refused_with_its_line(tmp_path: Path) -> None:
    (tmp_path / "fleet.toml").write_bytes(HOST.encode() + b"# caf\xe9\n")
    result = herder("simulate", "--fleet", str(tmp_path / "fleet.toml"), "--trace",
                    str(DATA / "trace.csv"), cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "fleet.toml:4: not UTF-8 text" in result.stderr, result.stderr


@pytest.mark.parametrize("option", ["--json", "--save-trace"])
def test_an_unwritable_output_path_names_its_option(tmp_path: Path, option: str) -> None:
    (tmp_path / "file").write_text("")
    result = _simulate(tmp_path, option, str(tmp_path / "file" / "out"))
    assert result.returncode == 2, result.stderr
    assert f"{option}: cannot write" in result.stderr, result.stderr


def test_without_a_fleet_file_the_hosts_herder_toml_declares_are_the_fleet(
        tmp_path: Path) -> None:
    """No --fleet: the fleet is herder.toml's [hosts.LABEL] (and with --compare, each
    config's own), as `herder server` would store it; none declared is refused, naming
    --fleet."""
    base = (DATA / "herder.toml").read_text()
    one = tmp_path / "one.toml"
    one.write_text(base + "\n[hosts.a]\nram_total_gb = 16\nprime = { max_workers = 2 }\n"
                   "night = { max_workers = 2 }\n")
    two = tmp_path / "two.toml"
    two.write_text(one.read_text() + "\n[hosts.b]\nram_total_gb = 16\n"
                   "prime = { max_workers = 2 }\nnight = { max_workers = 2 }\n")
    trace = str(DATA / "trace.csv")
    alone = herder("--config", str(one), "simulate", "--trace", trace, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr
    # The same fleet as tests/data/simulate/fleet.toml, so the same figures.
    assert "makespan              40m00s" in alone.stdout
    assert "host a " in alone.stdout and "host b" not in alone.stdout
    compared = herder("--config", str(one), "simulate", "--trace", trace, "--compare",
                      str(two), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr
    [row] = [line for line in compared.stdout.splitlines() if line.startswith("makespan")]
    first, second = row.split()[1:]
    assert first == "40m00s" and second < first, compared.stdout  # mm"ss" of one width
    [host_b] = [line for line in compared.stdout.splitlines() if line.startswith("host b")]
    assert host_b.split()[2] == "-" and "booked" in host_b.split(None, 3)[3], host_b
    none = herder("--config", str(DATA / "herder.toml"), "simulate", "--trace", trace,
                  cwd=tmp_path)
    assert none.returncode == 2
    assert "--fleet" in none.stderr and "declares no host" in none.stderr
