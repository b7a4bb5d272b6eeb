"""`herder simulate` against the real thing: a small trace, its time scaled down to seconds,
run through the simulator and through a real `herder server` (SQLite) with one real
`herder agent` per host, each job submitted at its arrival with a command that sleeps its
duration and ends as its trace says. Per job, the hosts its attempts ran on (and at which
weight), each attempt's outcome, its final status and failure reason must agree.

Real attempts take longer than the trace says (a spawn, a poll, a finish report), so only
what no such delay can change is compared, and the trace is made so that every placement
is decided by the fleet's rules, not by a race:

    big    24 GB (19.2 bookable), 3 workers: the only host for heavy and orchestrator
    small   8 GB (6.4 bookable), 2 workers: best fit for light and playwright when empty
    ci     16 GB, 1 worker, takes only `flaky`, which runs only there

    job  arrives  type   weight      seconds  trace says     attempts: host/weight outcome
    1    0        work   light       2        done           small/light ok
    2    0        flaky  light       1        fail           ci failed, ci failed (max 2)
    3    1        work   heavy       2        done           big/heavy ok
    4    3        work   playwright  4        needs_heavier  small/playwright needs_heavier,
                                                             big/orchestrator ok
    5    4        work   light       1        oom            big/light oom (small is full),
                                                             big/heavy ok
    6    10       work   light       2        usage_limit    small usage_blocked, 2 s later
                                                             big ok (it avoids the host)
    7    11       flaky  light       1        transient      ci transient (a 429), ci ok
    8    13       work   light       2        done           small/light ok
    9    14       work   orchestrator 1       needs_heavier  big needs_heavier: failed, no
                                                             heavier weight

Before a job is submitted, the real fleet must have reached what the simulator had at its
arrival: every attempt that had ended there has ended, every attempt that had started has
been placed (polled with a deadline). The one placement that depends on another job still
running (job 5 finds small full of job 4) has seconds to spare: job 4 runs 4 s after it
was placed, job 5 is submitted as soon as it was. When jobs wait for the same host (job 4
at orchestrator and job 5 at heavy, both only on big) their order may differ, their hosts
cannot.
"""

from __future__ import annotations

import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import pytest
from support.fleet import FleetHarness
from support.waits import wait_for

from herder.core.fleet import Fleet
from herder.core.model import JobStatus
from herder.core.settings.loading import load_config
from herder.core.simulation.report import Report
from herder.services import fleet_file, simulation, workload

HOSTS = {  # label: (GB, workers, `host add` options beyond them)
    "big": (24, 3, ()),
    "ci": (16, 1, ("--job-types", "flaky")),
    "small": (8, 2, ()),
}

FLEET_FILE = """start = "2026-01-05T00:00:00Z"
""" + "".join(
    f'\n[[hosts]]\nlabel = "{label}"\nram_gb = {ram}\nprime_workers = {workers}\n'
    f"night_workers = {workers}\n" + ('job_types = ["flaky"]\n' if options else "")
    for label, (ram, workers, options) in HOSTS.items())

TRACE = """arrival,job_type,weight,priority,duration,peak_gb,outcome
0,work,light,100,2,2,done
0,flaky,light,100,1,2,fail
1,work,heavy,100,2,6,done
3,work,playwright,100,4,7,needs_heavier
4,work,light,100,1,2,oom
10,work,light,100,2,2,usage_limit
11,flaky,light,100,1,2,transient
13,work,light,100,2,2,done
14,work,orchestrator,100,1,20,needs_heavier
"""

# The trace's outcome as the job type's rules read it: its default exit codes (2 oom,
# 4 needs_heavier, 5 usage_blocked), a 429 in the log for a transient ending, and any
# other non-zero exit for a failure. Every outcome but `fail` is the first attempt's only
# (the trace's peaks fit the weight each escalates to).
JOB_SCRIPT = """echo "$HERDER_JOB_ID $HERDER_ATTEMPT $HERDER_HOST $HERDER_WEIGHT" >> '{ran}'
sleep "$1"
[ "$2" = fail ] && exit 1
[ "$HERDER_ATTEMPT" = 1 ] || exit 0
case "$2" in
  oom) exit 2 ;;
  needs_heavier) exit 4 ;;
  usage_limit) exit 5 ;;
  transient) echo "error: 429 Too Many Requests"; exit 1 ;;
esac
exit 0
"""


def job_types(script: Path) -> str:
    command = f'["/bin/sh", "{script}", "{{duration}}", "{{outcome}}"]'
    return f"""
[job_types.work]
command = {command}
preflight = false
weight = "light"
policy = {{ usage_blocked = {{ delay = "2s" }} }}

[job_types.flaky]
command = {command}
preflight = false
weight = "light"
hosts = ["ci"]
max_attempts = 2
backoff_base = "1s"
backoff_max = "1s"
policy = {{ transient = {{ delay = "1s", delay_max = "1s" }} }}
"""


Attempts = list[tuple[str, str, str]]
"""(host, weight, outcome) of each attempt in order."""


def simulated(report: Report, weight_of: dict[float, str]
              ) -> dict[int, tuple[Attempts, str, str | None]]:
    by_job: dict[int, list[tuple[float, str, float]]] = defaultdict(list)
    for job_id, host, start, _end, booked in report.attempt_log:
        by_job[job_id].append((start, host, booked))
    found = {}
    for ending in report.job_log:
        spans = sorted(by_job[ending.job_id])
        assert len(spans) == len(ending.outcomes)
        found[ending.job_id] = ([(host, weight_of[booked], outcome) for (_, host, booked), outcome
                                 in zip(spans, ending.outcomes, strict=True)],
                                ending.status, ending.failure_reason)
    return found


@pytest.mark.slow
def test_a_real_server_and_agents_place_and_end_a_trace_as_the_simulator_does(
        make_fleet: type[FleetHarness], tmp_path: Path, sqlite_url: str) -> None:
    ran = tmp_path / "ran"
    script = tmp_path / "job.sh"
    script.write_text(JOB_SCRIPT.format(ran=ran))
    fleet: FleetHarness = make_fleet(
        tmp_path, sqlite_url, extra=job_types(script),
        fleet={"night_start": "00:00", "night_end": "00:00"})

    # (a) the simulator, through the service API, on the same herder.toml
    settings = load_config(fleet.config).settings
    (tmp_path / "fleet.toml").write_text(FLEET_FILE)
    (tmp_path / "trace.csv").write_text(TRACE)
    trace = workload.load_trace(tmp_path / "trace.csv", settings)
    report = simulation.run(fleet_file.load_fleet(tmp_path / "fleet.toml", settings),
                            settings, trace, keep_attempts=True)
    weights = Fleet.from_settings(settings).weights
    weight_of = {weights.budget(name): name for name in settings.weights}
    assert len(weight_of) == len(settings.weights)
    expected = simulated(report, weight_of)
    # The trace does what its table says (a change to herder's rules shows here first).
    assert {job: [host for host, _, _ in attempts]
            for job, (attempts, _, _) in expected.items()} == {
        1: ["small"], 2: ["ci", "ci"], 3: ["big"], 4: ["small", "big"], 5: ["big", "big"],
        6: ["small", "big"], 7: ["ci", "ci"], 8: ["small"], 9: ["big"]}

    # (b) the real server and agents
    fleet.add_hosts({label: ("--ram", str(ram), "--prime-workers", str(workers),
                             "--night-workers", str(workers), *options)
                     for label, (ram, workers, options) in HOSTS.items()})
    fleet.start_server()
    fleet.start_agents(*HOSTS)
    wait_for(lambda: all(view["health"] == "healthy" for view in fleet.hosts_api().values()),
             60, "every host to be healthy", fleet.describe)

    real_id: dict[int, int] = {}  # trace id -> the server's job id
    started_and_ended: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for job_id, _host, start, end, _booked in report.attempt_log:
        started_and_ended[job_id].append((start, end))

    def reached(arrival: float) -> bool:
        """The real fleet has done what the simulator had done by `arrival`."""
        for job_id, spans in started_and_ended.items():
            starts = sum(1 for start, _ in spans if start < arrival)
            ends = sum(1 for _, end in spans if end <= arrival)
            if not starts and not ends:
                continue
            attempts = fleet.attempts(real_id[job_id])
            if len(attempts) < starts or sum(
                    1 for attempt in attempts if attempt.ended_at is not None) < ends:
                return False
        return True

    began = time.monotonic()

    def due(arrival: float) -> bool:
        return time.monotonic() - began >= arrival and reached(arrival)

    for entry in trace:
        wait_for(partial(due, entry.arrival), 60, f"the fleet to reach second {entry.arrival:g}",
                 fleet.describe)
        real_id[entry.id] = fleet.submit(
            job_type=entry.job_type, weight=entry.weight, priority=entry.priority,
            payload={"duration": f"{entry.duration:g}", "outcome": entry.outcome.value})
    for job_id in real_id.values():
        fleet.wait_status(job_id, (JobStatus.DONE, JobStatus.FAILED), timeout=60)

    ran_weights: dict[tuple[int, int], tuple[str, str]] = {}
    for line in ran.read_text().splitlines():
        job_text, attempt_text, host, weight = line.split()
        ran_weights[(int(job_text), int(attempt_text))] = (host, weight)
    actual = {}
    for trace_id, job_id in real_id.items():
        job = fleet.job(job_id)
        attempts = fleet.attempts(job_id)
        for attempt in attempts:
            assert ran_weights[(job_id, attempt.attempt)][0] == attempt.host
        actual[trace_id] = ([(attempt.host, ran_weights[(job_id, attempt.attempt)][1],
                              str(attempt.outcome)) for attempt in attempts],
                            str(job.status), job.failure_reason)
    assert actual == expected, fleet.describe()
