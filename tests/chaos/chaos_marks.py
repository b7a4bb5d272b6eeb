"""What the chaos run's marks and store say: pure functions from marks, faults and job rows
to the suite's invariants and figures (no processes, no clock), unit-tested on their own.

Times are CLOCK_MONOTONIC seconds, the same clock in the jobs and in the test process.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec

from herder.core.model import Job, JobStatus

TICK = 0.2  # mark_job.py's tick period
MARK_KINDS = ("start", "held", "tick", "end", "term")


class Mark(msgspec.Struct, frozen=True):
    kind: str
    job: int
    attempt: int
    host: str
    monotonic: float
    wall: float
    pid: int

    def __str__(self) -> str:
        return (f"{self.kind} job={self.job} attempt={self.attempt} host={self.host} "
                f"t={self.monotonic:.3f} pid={self.pid}")


class Run(msgspec.Struct, frozen=True):
    """One process of one attempt, from its `start` to its last mark."""

    job: int
    attempt: int
    host: str
    pid: int
    started: float
    last: float
    ended: bool
    held: bool
    terminated: bool = False  # marked SIGTERM: `last` is when it died

    def __str__(self) -> str:
        state = "end" if self.ended else "SIGTERM" if self.terminated else "no end"
        held = ", found the job's lock HELD" if self.held else ""
        return (f"attempt {self.attempt} on {self.host} pid {self.pid}: "
                f"{self.started:.3f} .. {self.last:.3f} ({state}{held})")


class Overlap(msgspec.Struct, frozen=True):
    job: int
    first: Run
    second: Run

    @property
    def seconds(self) -> float:
        return min(self.first.last, self.second.last) - max(self.first.started,
                                                             self.second.started)


class Fault(msgspec.Struct, frozen=True):
    """One injected fault. `victims` are the (job, attempt) running on the target when it hit
    (host and agent deaths only); `ended` is when it was undone (None: never)."""

    kind: str
    target: str
    at: float
    ended: float | None = None
    victims: tuple[tuple[int, int], ...] = ()
    note: str = ""


class Recovery(msgspec.Struct, frozen=True):
    fault: Fault
    job: int
    attempt: int
    seconds: float | None  # None: no later attempt of the job ever started
    host: str | None  # where the next attempt ran


class Limits(msgspec.Struct, frozen=True):
    max_attempts: int
    max_lost: int
    max_spawn_failures: int

    @property
    def budget(self) -> int:
        return self.max_attempts + self.max_lost + self.max_spawn_failures


class Invariant(msgspec.Struct, frozen=True):
    name: str
    violations: tuple[str, ...] = msgspec.field(default_factory=tuple)

    @property
    def passed(self) -> bool:
        return not self.violations


# -- reading ----------------------------------------------------------------------------------


def parse_mark(line: str) -> Mark | None:
    """A mark from one line; None for a torn or foreign line."""
    parts = line.split()
    if len(parts) != 7 or parts[0] not in MARK_KINDS:
        return None
    try:
        return Mark(parts[0], int(parts[1]), int(parts[2]), parts[3], float(parts[4]),
                    float(parts[5]), int(parts[6]))
    except ValueError:
        return None


def read_marks(directory: Path) -> dict[int, list[Mark]]:
    """Every job's marks, by job id, in file order."""
    marks: dict[int, list[Mark]] = {}
    if not directory.exists():
        return marks
    for path in directory.iterdir():
        if not path.name.isdigit():
            continue
        parsed = [parse_mark(line) for line in path.read_text(errors="replace").splitlines()]
        marks[int(path.name)] = [mark for mark in parsed if mark is not None]
    return marks


def runs_of(marks: Iterable[Mark]) -> list[Run]:
    """The runs in one job's marks (one per process that wrote `start`), by start time."""
    by_pid: dict[int, list[Mark]] = defaultdict(list)
    for mark in marks:
        by_pid[mark.pid].append(mark)
    runs: list[Run] = []
    for pid, own in by_pid.items():
        start = next((mark for mark in own if mark.kind == "start"), None)
        if start is None:
            continue
        runs.append(Run(start.job, start.attempt, start.host, pid, start.monotonic,
                        max(mark.monotonic for mark in own),
                        any(mark.kind == "end" for mark in own),
                        any(mark.kind == "held" for mark in own),
                        any(mark.kind == "term" for mark in own)))
    return sorted(runs, key=lambda run: run.started)


# -- invariants -------------------------------------------------------------------------------


def overlaps(runs: Sequence[Run]) -> list[Overlap]:
    """Pairs of runs of one job that were provably alive at the same time: the later one
    started before the earlier one's last mark, or found the job's lock held. A run killed
    with SIGKILL between ticks may have lived up to one TICK past its last mark; that is not
    counted (see `near_misses`), so every overlap reported here is certain."""
    found: list[Overlap] = []
    for index, second in enumerate(runs):
        earlier = runs[:index]
        proven = [first for first in earlier if second.started < first.last]
        if not proven and second.held and earlier:
            # The lock's holder was alive when `second` started: the latest-living run.
            proven = [max(earlier, key=lambda run: run.last)]
        found += [Overlap(second.job, first, second) for first in proven]
    return found


def near_misses(runs: Sequence[Run], slack: float = TICK) -> list[Overlap]:
    """Pairs where the later run started within `slack` after the earlier one's last mark
    (the earlier one had neither `end` nor `term`, so it died of SIGKILL some time after
    its last tick): not proof of an overlap, a figure to watch."""
    found: list[Overlap] = []
    for index, first in enumerate(runs):
        for second in runs[index + 1:]:
            if (not first.ended and not first.terminated
                    and first.last <= second.started < first.last + slack):
                found.append(Overlap(first.job, first, second))
    return found


def recoveries(faults: Iterable[Fault], runs: Mapping[int, Sequence[Run]]) -> list[Recovery]:
    """For each job running on a fault's target when it hit: seconds from the fault to the
    start of the job's next attempt. A victim that still wrote `end` needed no recovery."""
    found: list[Recovery] = []
    for fault in faults:
        for job, attempt in fault.victims:
            own = runs.get(job, [])
            if any(run.attempt == attempt and run.ended for run in own):
                continue
            later = [run for run in own if run.attempt > attempt and run.started >= fault.at]
            if later:
                first = min(later, key=lambda run: run.started)
                found.append(Recovery(fault, job, attempt, first.started - fault.at,
                                      first.host))
            else:
                found.append(Recovery(fault, job, attempt, None, None))
    return found


def percentile_50(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def describe_runs(job: int, runs: Sequence[Run]) -> str:
    return "\n".join([f"    job {job} runs from its marks:"]
                     + [f"      {run}" for run in runs] if runs
                     else [f"    job {job}: no marks at all"])


def describe_job(job: Job | None) -> str:
    if job is None:
        return "    store: no such job"
    return (f"    store: status={job.status} attempt={job.attempt} failures={job.failures} "
            f"lost={job.lost} spawn_failures={job.spawn_failures} host={job.host} "
            f"reason={job.failure_reason}")


def accounted(job: Job) -> int:
    """How many started attempts a finished job's counters explain."""
    return 1 + job.failures + job.lost + job.spawn_failures


def check(submitted: Sequence[int], jobs: Mapping[int, Job], runs: Mapping[int, Sequence[Run]],
          recovered: Sequence[Recovery], limits: Limits, recovery_p50_bound: float,
          recovery_max_bound: float) -> list[Invariant]:
    """The suite's invariants, each with one line (plus the evidence) per violation."""

    def evidence(job_id: int) -> str:
        return describe_job(jobs.get(job_id)) + "\n" + describe_runs(job_id, runs.get(job_id, []))

    lost = tuple(
        f"job {job_id} is {jobs[job_id].status if job_id in jobs else 'missing'}, not done\n"
        f"{evidence(job_id)}"
        for job_id in submitted if job_id not in jobs or jobs[job_id].status != JobStatus.DONE)
    unfinished = tuple(
        f"job {job_id} is done as attempt {jobs[job_id].attempt}, but that attempt never wrote "
        f"`end` (the store recorded a success the job did not have)\n{evidence(job_id)}"
        for job_id in submitted
        if job_id in jobs and jobs[job_id].status == JobStatus.DONE
        and not any(run.attempt == jobs[job_id].attempt and run.ended
                    for run in runs.get(job_id, [])))
    overlapping = tuple(
        f"job {overlap.job}: attempts {overlap.first.attempt} ({overlap.first.host}) and "
        f"{overlap.second.attempt} ({overlap.second.host}) ran at once for "
        f"{max(overlap.seconds, 0.0):.2f}s\n{evidence(overlap.job)}"
        for job_runs in runs.values() for overlap in overlaps(job_runs))
    over_budget = tuple(
        f"job {job_id}: {len(job_runs)} attempts started, budget {limits.budget} "
        f"(max_attempts {limits.max_attempts} + max_lost {limits.max_lost} + "
        f"max_spawn_failures {limits.max_spawn_failures})\n{evidence(job_id)}"
        for job_id, job_runs in sorted(runs.items()) if len(job_runs) > limits.budget)
    # Each attempt that started either ended the job or spent one of the counters the budget
    # limits; a run none accounts for is one the budget cannot stop (a result that never
    # arrived, an attempt the server never saw start).
    unaccounted = tuple(
        f"job {job_id}: {len(job_runs)} attempts started, but the store counts "
        f"{accounted(jobs[job_id])} (1 + failures {jobs[job_id].failures} + lost "
        f"{jobs[job_id].lost} + spawn failures {jobs[job_id].spawn_failures})\n"
        f"{evidence(job_id)}"
        for job_id, job_runs in sorted(runs.items())
        if job_id in jobs and jobs[job_id].status in (JobStatus.DONE, JobStatus.FAILED)
        and len(job_runs) > accounted(jobs[job_id]))
    seconds = [item.seconds for item in recovered if item.seconds is not None]
    slow: list[str] = [
        f"job {item.job} attempt {item.attempt} on {item.fault.target} "
        f"({item.fault.kind} at t={item.fault.at:.3f}) never ran again\n{evidence(item.job)}"
        for item in recovered if item.seconds is None]
    middle = percentile_50(seconds)
    if middle is not None and middle > recovery_p50_bound:
        slow.append(f"recovery p50 {middle:.1f}s > bound {recovery_p50_bound:.1f}s")
    slow += [
        f"job {item.job} attempt {item.attempt} on {item.fault.target} ({item.fault.kind} at "
        f"t={item.fault.at:.3f}) ran again after {item.seconds:.1f}s > bound "
        f"{recovery_max_bound:.1f}s on {item.host}\n{evidence(item.job)}"
        for item in recovered if item.seconds is not None and item.seconds > recovery_max_bound]
    return [
        Invariant("every job done", lost),
        Invariant("done means the recorded attempt ended", unfinished),
        Invariant("no overlapping attempts", overlapping),
        Invariant("attempts within budget", over_budget),
        Invariant("every started attempt counted by the store", unaccounted),
        Invariant("recovery after a host dies", tuple(slow)),
    ]


def fault_counts(faults: Iterable[Fault]) -> Counter[str]:
    return Counter(fault.kind for fault in faults)
