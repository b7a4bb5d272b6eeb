"""The chaos suite: a fleet under random faults keeps its promises.

`test_fleet_under_chaos` runs a `herder server` on a private PostgreSQL cluster, three agents
(three "hosts" on this machine, each in its own process group, each behind its own cuttable
TCP proxy) and a stream of jobs that write start / tick / end marks (mark_job.py). A seeded
fault loop meanwhile kills whole hosts, agents alone and the server, restarts PostgreSQL with
`-m immediate`, stops agents past the lease and cuts agents off the network, and undoes each
fault after a random delay as a supervisor would. Then everything settles and the marks and
the store must show: every job done, no two attempts of a job alive at once, no job started
more often than its budget, and jobs of a dead host running again within a bound of the
heartbeat and the lease.

    HERDER_CHAOS_SECONDS=600 HERDER_CHAOS_SEED=1234 .venv/bin/pytest -q -s tests/chaos

HERDER_CHAOS_FAULTS=host_dies,network_cut limits the kinds. The default (90 s of faults)
takes about three minutes. The other tests here check the analysis and the proxy alone.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import msgspec
import pytest
from chaos_fleet import (
    HEARTBEAT,
    KINDS,
    LEASE,
    LIMITS,
    MARK_JOB,
    RECOVERY_TARGET,
    SECONDS_ENV,
    ChaosFleet,
    ChaosSettings,
    JobStream,
    config_sections,
)
from chaos_marks import (
    Fault,
    Invariant,
    Limits,
    Run,
    check,
    fault_counts,
    near_misses,
    overlaps,
    parse_mark,
    percentile_50,
    read_marks,
    recoveries,
    runs_of,
)
from chaos_proxy import ProxyLoop
from support.fleet import FleetHarness
from support.postgres import PostgresCluster
from support.waits import wait_for

from herder.core.model import Job, JobSpec, JobStatus
from herder.store import open_store

SETTLE_SECONDS = 90.0  # after the faults: everything restarted, every job finishes
RECOVERY_P50_BOUND = 3 * RECOVERY_TARGET
RECOVERY_MAX_BOUND = 6 * RECOVERY_TARGET
REPORT_ENV = "HERDER_CHAOS_REPORT"  # a path: the run's figures are written there as JSON


def chaos_timeout() -> float:
    """pytest-timeout for the chaos run: its fault window plus set-up, settling and slack."""
    try:
        return ChaosSettings.from_environment().seconds + 300
    except ValueError:
        return 300


def figures_of(settings: ChaosSettings, submitted: list[int], jobs: dict[int, Job],
               faults: list[Fault], runs: dict[int, list[Run]], invariants: list[Invariant],
               host_seconds: list[float], agent_seconds: list[float],
               host_unrecovered: int) -> dict[str, object]:
    """The run's figures as JSON values, for bench/run.sh's RESULTS.md."""
    def spread(values: list[float]) -> dict[str, object]:
        return {"n": len(values), "p50_s": percentile_50(values),
                "max_s": max(values) if values else None}

    done = sum(1 for job in submitted if job in jobs and jobs[job].status is JobStatus.DONE)
    return {
        "seed": settings.seed, "seconds": settings.seconds, "heartbeat_s": HEARTBEAT,
        "lease_s": LEASE, "jobs_submitted": len(submitted), "jobs_done": done,
        "jobs_lost": len(submitted) - done,
        "faults": len(faults), "faults_by_kind": dict(fault_counts(faults)),
        "attempts_started": sum(len(job_runs) for job_runs in runs.values()),
        "overlaps": sum(len(overlaps(job_runs)) for job_runs in runs.values()),
        "host_dies_recovery": {**spread(host_seconds), "never": host_unrecovered},
        "agent_dies_recovery": spread(agent_seconds),
        "recovery_target_s": RECOVERY_TARGET,
        "invariants": {item.name: item.passed for item in invariants},
    }


def settles(predicate: Callable[[], object], deadline: float) -> bool:
    """Whether `predicate` came true by `deadline` (monotonic); a False is reported by the
    invariants, not raised here, so every invariant gets checked."""
    try:
        wait_for(predicate, max(0.0, deadline - time.monotonic()), "the fleet to settle",
                 interval=0.5)
    except AssertionError:
        return False
    return True


def summary(settings: ChaosSettings, stream: JobStream, chaos: ChaosFleet,
            statuses: dict[int, JobStatus], runs: dict[int, list[Run]],
            invariants: list[Invariant], host_seconds: list[float],
            agent_seconds: list[float], host_unrecovered: int) -> str:
    def figures(values: list[float]) -> str:
        middle = percentile_50(values)
        if middle is None:
            return "n=0"
        return f"n={len(values)} p50 {middle:.1f}s max {max(values):.1f}s"

    counts = fault_counts(chaos.faults)
    started = sum(len(job_runs) for job_runs in runs.values())
    completed = sum(1 for job_runs in runs.values() for run in job_runs if run.ended)
    twice = sum(1 for job_runs in runs.values() if sum(run.ended for run in job_runs) > 1)
    near = sum(len(near_misses(job_runs)) for job_runs in runs.values())
    by_status: dict[str, int] = {}
    for status in statuses.values():
        by_status[str(status)] = by_status.get(str(status), 0) + 1
    lines = [
        f"chaos seed {settings.seed}, {settings.seconds:.0f}s of faults "
        f"(heartbeat {HEARTBEAT}s, lease {LEASE}s)",
        f"  jobs          {len(stream.submitted)} submitted ({stream.retries} submit retries); "
        + ", ".join(f"{name} {count}" for name, count in sorted(by_status.items())),
        f"  faults        {sum(counts.values())}: "
        + ", ".join(f"{kind} {counts.get(kind, 0)}" for kind in KINDS),
        f"  attempts      {started} started, {completed} ran to the end, {twice} jobs ran to "
        f"the end more than once; most for one job "
        f"{max((len(job_runs) for job_runs in runs.values()), default=0)} "
        f"(budget {LIMITS.budget})",
        f"  overlaps      {sum(len(overlaps(job_runs)) for job_runs in runs.values())} "
        f"(near misses within one tick: {near})",
        f"  recovery      host dies: {figures(host_seconds)}, never {host_unrecovered} "
        f"(bounds p50 {RECOVERY_P50_BOUND:.0f}s, max {RECOVERY_MAX_BOUND:.0f}s); "
        f"agent dies: {figures(agent_seconds)}",
    ]
    lines += [f"  {'PASS' if item.passed else 'FAIL'}  {item.name}"
              + ("" if item.passed else f" ({len(item.violations)})") for item in invariants]
    lines += [f"  harness: {error}" for error in chaos.errors + stream.errors]
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(chaos_timeout())
def test_fleet_under_chaos(private_postgres: PostgresCluster, make_fleet, tmp_path: Path
                           ) -> None:
    settings = ChaosSettings.from_environment()
    print(f"\nchaos seed {settings.seed} (rerun with HERDER_CHAOS_SEED={settings.seed}), "
          f"{settings.seconds:.0f}s, faults {','.join(settings.kinds)}", flush=True)
    sections = config_sections()
    fleet: FleetHarness = make_fleet(tmp_path, private_postgres.url, **sections)
    chaos = ChaosFleet(fleet, private_postgres, settings)
    stream = JobStream(fleet.url, fleet.admin_token, chaos.marks, tmp_path, settings.seed)
    try:
        chaos.start()
        stream.start()
        chaos.start_faults()
        wait_for(chaos.faults_over, settings.seconds + 120, "the fault window to end",
                 interval=0.5)
        stream.join(timeout=150)
        chaos.stop_faults()
        submitted = [item.job for item in stream.submitted]
        # Settle, bounded: whatever is not done by then is reported below, not waited for.
        deadline = time.monotonic() + SETTLE_SECONDS
        healthy = settles(chaos.server_answers, deadline)
        settles(lambda: not chaos.unfinished(submitted), deadline)
        settles(lambda: not fleet.job_processes(), time.monotonic() + 15)
        strays = fleet.job_processes()

        with open_store(private_postgres.url) as store:
            jobs = {job.id: job for job in store.job_list(None, 100_000)}
        marks = read_marks(chaos.marks)
        runs = {job: runs_of(job_marks) for job, job_marks in marks.items()}
        recovered = recoveries([f for f in chaos.faults if f.kind == "host_dies"], runs)
        agent_recovered = recoveries([f for f in chaos.faults if f.kind == "agent_dies"], runs)
        invariants = check(submitted, jobs, runs, recovered, LIMITS, RECOVERY_P50_BOUND,
                           RECOVERY_MAX_BOUND)
        invariants.append(Invariant("no job process outlives the run", tuple(
            f"pid {proc.pid} {proc.marker} still runs after every job settled"
            for proc in strays)))
        # A thread that dies leaves its process up but half-dead (a scheduler that places
        # nothing, an outbox that reports nothing); it must retry or take the process down.
        invariants.append(Invariant("no herder thread died of an exception",
                                    tuple(chaos.thread_deaths())))
        invariants.append(Invariant("the server is healthy after the faults", () if healthy
                                    else (f"/healthz did not answer 200 within "
                                          f"{SETTLE_SECONDS:.0f}s of the last fault",)))
        invariants.append(Invariant("the harness worked", tuple(
            chaos.errors + stream.errors
            + (["no job was submitted"] if not submitted else [])
            + (["no fault was injected"] if not chaos.faults else []))))
        text = summary(
            settings, stream, chaos, {job: jobs[job].status for job in submitted if job in jobs},
            runs, invariants, [r.seconds for r in recovered if r.seconds is not None],
            [r.seconds for r in agent_recovered if r.seconds is not None],
            sum(1 for r in recovered if r.seconds is None))
        print(text, flush=True)
        failed = [item for item in invariants if not item.passed]
        details = "\n".join(
            f"--- {item.name}: {len(item.violations)} violation(s) ---\n"
            + "\n".join(item.violations[:8])
            + (f"\n... and {len(item.violations) - 8} more" if len(item.violations) > 8 else "")
            for item in failed)
        faults = "\n".join(
            f"  t={fault.at:.3f} {fault.kind} {fault.target} victims={list(fault.victims)} "
            f"ended={'-' if fault.ended is None else f'{fault.ended:.3f}'} {fault.note}"
            for fault in chaos.faults)
        report = f"{text}\n{details}\n--- faults ---\n{faults}\n"
        (tmp_path / "chaos-summary.txt").write_text(report)
        if os.environ.get(REPORT_ENV):  # bench/run.sh collects the figures from here
            Path(os.environ[REPORT_ENV]).write_text(json.dumps(figures_of(
                settings, submitted, jobs, chaos.faults, runs, invariants,
                [r.seconds for r in recovered if r.seconds is not None],
                [r.seconds for r in agent_recovered if r.seconds is not None],
                sum(1 for r in recovered if r.seconds is None)), indent=2))
        assert not failed, (
            f"{len(failed)} chaos invariant(s) broken (seed {settings.seed}; rerun with "
            f"HERDER_CHAOS_SEED={settings.seed})\n{text}\n{details}\n--- faults ---\n{faults}")
    finally:
        stream.stop.set()
        chaos.close()


# -- the analysis, on made-up marks ------------------------------------------------------------


def run(attempt: int, started: float, last: float, ended: bool = False, held: bool = False,
        host: str = "alpha", job: int = 7) -> Run:
    return Run(job, attempt, host, 1000 + attempt, started, last, ended, held)


def test_marks_become_runs_per_process_and_torn_lines_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "7").write_text(
        "start 7 1 alpha 10.0 1.0 501\n"
        "tick 7 1 alpha 10.2 1.2 501\n"
        "start 7 2 beta 10.3 1.3 502\n"
        "tick 7 1 alpha 10.4 1.4 501\n"
        "tick 7 2 be\n"  # torn by a kill mid-write
        "held 7 2 beta 10.31 1.31 502\n"
        "end 7 2 beta 11.0 2.0 502\n"
        "start 7 3 gamma 12.0 3.0 503\n"
        "term 7 3 gamma 12.1 3.1 503\n")
    (tmp_path / "7.lock").write_text("")
    runs = runs_of(read_marks(tmp_path)[7])
    assert runs == [Run(7, 1, "alpha", 501, 10.0, 10.4, False, False),
                    Run(7, 2, "beta", 502, 10.3, 11.0, True, True),
                    Run(7, 3, "gamma", 503, 12.0, 12.1, False, False, terminated=True)]
    assert parse_mark("tick 7 x alpha 1 2 3") is None


def test_the_job_marks_its_run_and_finds_the_lock_of_a_second_attempt_held(tmp_path: Path
                                                                          ) -> None:
    """The real job script: two attempts at once; the second one finds the lock held, the
    first one is stopped with SIGTERM and marks it; both runs overlap, provably."""
    def attempt(number: int, duration: str) -> subprocess.Popen[bytes]:
        env = {"HERDER_JOB_ID": "7", "HERDER_ATTEMPT": str(number), "HERDER_HOST": "alpha"}
        return subprocess.Popen([sys.executable, str(MARK_JOB), str(tmp_path), duration],
                                env=env)

    first = attempt(1, "30")
    wait_for(lambda: "tick 7 1" in read_text(tmp_path / "7"), 20, "attempt 1 to tick")
    second = attempt(2, "0.3")
    assert second.wait(timeout=20) == 0
    first.terminate()
    assert first.wait(timeout=20) == -signal.SIGTERM
    runs = runs_of(read_marks(tmp_path)[7])
    assert [(run.attempt, run.ended, run.held, run.terminated) for run in runs] == [
        (1, False, False, True), (2, True, True, False)], runs
    assert [(o.first.attempt, o.second.attempt) for o in overlaps(runs)] == [(1, 2)]


def read_text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_an_overlap_needs_proof_and_a_near_miss_is_only_counted() -> None:
    killed = run(1, 10.0, 12.0)
    assert overlaps([killed, run(2, 11.9, 14.0, ended=True)]), "started before the last tick"
    after = run(2, 12.1, 14.0, ended=True)
    assert not overlaps([killed, after])
    assert near_misses([killed, after]) and not near_misses([killed, run(2, 12.5, 13.0)])
    terminated = msgspec.structs.replace(killed, terminated=True)
    assert not near_misses([terminated, after]), "SIGTERM marks the moment of death"
    # A held lock is proof even when the ticks do not show it.
    assert overlaps([killed, run(2, 12.1, 14.0, ended=True, held=True)])
    assert not overlaps([run(1, 10.0, 12.0, ended=True), run(2, 12.0, 13.0, ended=True)])


def test_recovery_is_fault_to_next_start_and_a_finished_victim_needs_none() -> None:
    fault = Fault("host_dies", "alpha", 100.0, victims=((7, 1), (8, 1), (9, 2)))
    runs = {7: [run(1, 90.0, 100.0), run(2, 104.5, 108.0, ended=True, host="beta")],
            8: [run(1, 95.0, 100.1, ended=True, job=8)],
            9: [run(2, 99.0, 99.9, job=9)]}
    found = {item.job: (item.seconds, item.host) for item in recoveries([fault], runs)}
    assert found == {7: (4.5, "beta"), 9: (None, None)}
    verdict = check([], {}, runs, recoveries([fault], runs), LIMITS, 1.0, 4.0)
    slow = next(item for item in verdict if item.name == "recovery after a host dies")
    assert [line.splitlines()[0] for line in slow.violations] == [
        "job 9 attempt 2 on alpha (host_dies at t=100.000) never ran again",
        "recovery p50 4.5s > bound 1.0s",
        "job 7 attempt 1 on alpha (host_dies at t=100.000) ran again after 4.5s > bound 4.0s "
        "on beta"]


def test_check_names_the_broken_invariant_the_job_and_its_marks(sqlite_url: str) -> None:
    """Job rows from a real store, so they are the rows the suite reads."""
    with open_store(sqlite_url) as store:
        results = store.job_insert([JobSpec(command=("true",)) for _ in range(2)],
                                   datetime.now(UTC))
        ids = [result.job_id for result in results]
        jobs = {job.id: job for job in store.job_list(None, 10)}
    runs = {ids[0]: [run(1, 10.0, 12.0, job=ids[0]), run(2, 11.0, 13.0, job=ids[0])]}
    limits = Limits(max_attempts=1, max_lost=0, max_spawn_failures=0)
    result = {item.name: item for item in check(ids, jobs, runs, [], limits, 1.0, 1.0)}
    lost = result["every job done"].violations
    assert len(lost) == 2 and f"job {ids[0]} is queued, not done" in lost[0]
    assert "attempt 1 on alpha" in lost[0], lost[0]
    overlap = result["no overlapping attempts"].violations
    assert len(overlap) == 1 and f"job {ids[0]}: attempts 1 (alpha) and 2 (alpha)" in overlap[0]
    assert "1.00s" in overlap[0]
    assert len(result["attempts within budget"].violations) == 1
    assert result["every started attempt counted by the store"].passed, "only finished jobs"
    done = {ids[0]: msgspec.structs.replace(jobs[ids[0]], status=JobStatus.DONE, lost=1)}
    runs[ids[0]].append(run(3, 14.0, 15.0, ended=True, job=ids[0]))
    counted = check(ids[:1], done, runs, [], limits, 1.0, 1.0)
    unaccounted = next(item for item in counted if "counted" in item.name).violations
    assert len(unaccounted) == 1 and "3 attempts started, but the store counts 2" in unaccounted[0]
    assert result["recovery after a host dies"].passed


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HERDER_CHAOS_SEED", "42")
    monkeypatch.setenv(SECONDS_ENV, "600")
    monkeypatch.setenv("HERDER_CHAOS_FAULTS", "host_dies, network_cut")
    assert ChaosSettings.from_environment() == ChaosSettings(42, 600.0,
                                                             ("host_dies", "network_cut"))
    monkeypatch.setenv("HERDER_CHAOS_FAULTS", "meteor")
    with pytest.raises(ValueError, match="unknown kinds"):
        ChaosSettings.from_environment()
    monkeypatch.setenv("HERDER_CHAOS_FAULTS", "")
    monkeypatch.setenv(SECONDS_ENV, "soon")
    with pytest.raises(ValueError, match=SECONDS_ENV):
        ChaosSettings.from_environment()


def test_config_is_valid_and_writes_only_keys_this_herder_knows(tmp_path: Path) -> None:
    from herder.core.settings.loading import load_config

    fleet = FleetHarness(tmp_path, f"sqlite:///{tmp_path / 'herder.db'}", **config_sections())
    try:
        runtime = load_config(str(fleet.config)).settings.runtime
    finally:
        fleet.close()
    assert (runtime.heartbeat_interval, runtime.attempt_lease) == (HEARTBEAT, LEASE)
    margin = getattr(runtime, "fence_margin", None)
    assert margin is None or runtime.kill_grace < margin < runtime.attempt_lease, runtime


# -- the proxy -------------------------------------------------------------------------------


def test_proxy_forwards_and_a_cut_drops_and_refuses_until_restored() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        loop = ProxyLoop()
        try:
            proxy = loop.add(listener.getsockname()[1])
            client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
            server, _ = listener.accept()
            client.sendall(b"ping")
            assert server.recv(4) == b"ping"
            server.sendall(b"pong")
            assert client.recv(4) == b"pong"

            loop.cut(proxy)
            with pytest.raises(OSError):  # reset, or EOF turned into an error below
                if client.recv(4) == b"":
                    raise ConnectionResetError("closed")
            # A new connection is reset: at connect or at the first read, whichever the
            # reset reaches first.
            with (pytest.raises(OSError),
                  socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as refused):
                if refused.recv(4) == b"":
                    raise ConnectionResetError("closed")
            client.close()
            server.close()

            loop.restore(proxy)
            assert round_trip(listener, proxy.port) == b"back"
        finally:
            loop.close()


def round_trip(listener: socket.socket, port: int) -> bytes:
    """One round trip through the proxy: connect, send, read what the upstream got."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
        server, _ = listener.accept()
        with server:
            client.sendall(b"back")
            return server.recv(4)

