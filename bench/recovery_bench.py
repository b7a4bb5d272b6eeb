"""Recovery after a host dies: how soon its jobs run again elsewhere.

    python bench/recovery_bench.py                       # default timings, both backends
    HEARTBEAT=1s LEASE=6s REPS=3 BACKENDS=sqlite python bench/recovery_bench.py

Real `herder server` and two `herder agent` processes (alpha, the fuller host that best fit
prefers, and beta). Each repetition, on a fresh fleet:

crash : alpha's agent is killed with SIGKILL while a job runs there; its guardian lives,
        kills the job's processes and reports the agent gone. Measured: kill → the job's
        next attempt writes its start mark (on beta).
host  : alpha dies whole (guardian, agent and job processes, SIGKILL; nobody reports it)
        while a job runs there, and a second job is submitted right after the kill, which
        still goes to alpha (it has not missed its heartbeats yet). Measured: kill → each
        job's start on beta, against the bound of 2 heartbeats + the attempt lease; and
        whether anything was placed on alpha after it missed its heartbeats.

Prints a markdown table; with BENCH_JSON set also writes the figures there as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from fleet_bench import database, drop, free_port, herder, start, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from herder.client import Client  # noqa: E402
from herder.core.access import new_token, token_hash  # noqa: E402
from herder.core.model import HostRecord, Scope  # noqa: E402
from herder.core.settings.fields import parse_duration  # noqa: E402
from herder.store import open_store  # noqa: E402

T = TypeVar("T")
BACKENDS = os.environ.get("BACKENDS", "sqlite postgres").split()
REPS = int(os.environ.get("REPS", "1"))
HEARTBEAT = float(parse_duration(os.environ.get("HEARTBEAT", "10s")))
LEASE = float(parse_duration(os.environ.get("LEASE", "60s")))
MISSED = 3
ADOPT_GRACE = float(parse_duration(os.environ.get("ADOPT_GRACE", "0s")))
"""0: a crashed agent's guardian reports its jobs at once (the figure measures that path);
with the default 10 s it first waits that long for the host's next agent to adopt them."""
CONFIG = """\
[herder]
log_dir = "{folder}/server-logs"
[runtime]
heartbeat_interval = {heartbeat}
attempt_lease = {lease}
kill_grace = 2.0
adopt_grace = {adopt_grace}
[defaults]
backoff_base = 0.0
[fleet]
scheduler_interval = "1s"
missed_heartbeats = {missed}
"""
HANGS = 'if [ "$HERDER_ATTEMPT" = 1 ]; then sleep 600; fi'


def wait(predicate: Callable[[], T | None], timeout: float, what: str,
         interval: float = 0.02) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise SystemExit(f"timed out waiting for {what}")


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def pids(select: Callable[[int], bool]) -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and select(int(entry))]


class Fleet:
    """One fresh fleet: a server and the agents of alpha and beta."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.folder = Path(tempfile.mkdtemp(prefix="herder-recovery-bench-"))
        self.url = database(backend, self.folder)
        (self.folder / "herder.toml").write_text(CONFIG.format(
            folder=self.folder, heartbeat=HEARTBEAT, lease=LEASE, missed=MISSED,
            adopt_grace=ADOPT_GRACE))
        self.store = open_store(self.url)
        self.marks = self.folder / "marks"
        now = datetime.now(UTC)
        self.tokens: dict[str, str] = {}
        for label, ram in (("alpha", 16.0), ("beta", 32.0)):
            self.store.host_insert(HostRecord(label, ram, prime_max_workers=4,
                                              night_max_workers=4), now)
            self.tokens[label] = new_token()
            self.store.token_insert(f"host:{label}", Scope.AGENT, token_hash(self.tokens[label]),
                                    now, host=label)
        port = free_port()
        self.server_url = f"http://127.0.0.1:{port}"
        self.server = start(herder(self.folder, "--db", self.url, "server", "--listen",
                                   f"127.0.0.1:{port}"), self.folder / "server.log")
        wait_http(self.server_url)
        self.agents = {label: self.agent(label) for label in self.tokens}
        self.client = Client(self.url, self.folder / "herder.toml")

    def agent(self, label: str) -> Any:
        process = start(herder(self.folder, "agent", "--server", self.server_url, "--host",
                               label, "--no-ram-check", "--log-dir",
                               str(self.folder / label)), self.folder / f"{label}.log",
                        {"HERDER_AGENT_TOKEN": self.tokens[label]})
        wait(lambda: (host := self.store.host_get(label)) and host.agent_info.get(
            "worker", "").startswith(f"{label}/{process.pid}/"), 60, f"agent {label}")
        return process

    def submit(self, body: str) -> int:
        script = f'echo "$HERDER_JOB_ID $HERDER_ATTEMPT $HERDER_HOST $(date +%s.%N)" ' \
                 f'>> {self.marks}; {body}'
        return self.client.submit(command=["/bin/sh", "-c", script], workdir=str(self.folder),
                                  check_command=False, max_attempts=1).job_id

    def started(self, job_id: int, attempt: int) -> tuple[str, float] | None:
        for line in read(str(self.marks)).decode().splitlines():
            job, number, host, stamp = line.split()
            if (int(job), int(number)) == (job_id, attempt):
                return host, float(stamp)
        return None

    def rerun(self, job_id: int) -> tuple[str, float]:
        """Where and when the job's first attempt after attempt 1 started."""
        def found() -> tuple[str, float] | None:
            job = self.store.job_get(job_id)
            return self.started(job_id, job.attempt) if job and job.attempt > 1 else None
        return wait(found, 4 * (LEASE + 2 * HEARTBEAT) + 30, f"job {job_id} to run again")

    def kill_host(self, label: str) -> None:
        agent = self.agents[label]
        guardians = pids(lambda pid: parent_of(pid) == agent.pid
                         and read(f"/proc/{pid}/cmdline") == read(f"/proc/{agent.pid}/cmdline"))
        jobs = pids(lambda pid: f"HERDER_LOG={self.folder / label}".encode()
                    in read(f"/proc/{pid}/environ"))
        for pid in guardians:
            os.kill(pid, signal.SIGKILL)
        os.killpg(agent.pid, signal.SIGKILL)
        for pid in jobs:
            os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self.client.close()
        for process in [*self.agents.values(), self.server]:
            if process.poll() is None:
                stop(process)
        for pid in pids(lambda pid: f"HERDER_LOG={self.folder}".encode()
                        in read(f"/proc/{pid}/environ")):
            os.kill(pid, signal.SIGKILL)
        self.store.close()
        drop(self.backend, self.url)


def crash(backend: str) -> dict[str, Any]:
    fleet = Fleet(backend)
    try:
        job_id = fleet.submit(HANGS)
        wait(lambda: fleet.started(job_id, 1), 60, "the job to start")
        killed = time.time()
        os.killpg(fleet.agents["alpha"].pid, signal.SIGKILL)
        host, at = fleet.rerun(job_id)
        return {"seconds": at - killed, "host": host}
    finally:
        fleet.close()


def dead_host(backend: str) -> dict[str, Any]:
    fleet = Fleet(backend)
    try:
        running = fleet.submit(HANGS)
        wait(lambda: fleet.started(running, 1), 60, "the job to start")
        killed = time.time()
        fleet.kill_host("alpha")
        placed = fleet.submit("true")
        wait(lambda: (job := fleet.store.job_get(placed)) and job.host, 30, "placement")
        first_host = fleet.store.job_get(placed).host  # type: ignore[union-attr]
        placed_host, placed_at = fleet.rerun(placed) if first_host == "alpha" else (
            wait(lambda: fleet.started(placed, 1), 60, "the placed job"))
        running_host, running_at = fleet.rerun(running)
        alpha = fleet.store.host_get("alpha")
        assert alpha is not None and alpha.last_heartbeat is not None
        window = MISSED * HEARTBEAT
        late = [attempt for job_id in (running, placed)
                for attempt in fleet.store.attempt_list(job_id)
                if attempt.host == "alpha"
                and (attempt.claimed_at - alpha.last_heartbeat).total_seconds() > window + 1.5]
        return {"running": running_at - killed, "placed": placed_at - killed,
                "placed_first_on": first_host, "hosts": {running_host, placed_host},
                "late_placements": len(late)}
    finally:
        fleet.close()


def main() -> None:
    bound = 2 * HEARTBEAT + max(LEASE, MISSED * HEARTBEAT)
    print(f"heartbeat {HEARTBEAT:g}s, lease {LEASE:g}s, missed_heartbeats {MISSED}, "
          f"{REPS} repetition(s)", file=sys.stderr)
    rows: list[str] = []
    figures: dict[str, Any] = {"heartbeat_s": HEARTBEAT, "lease_s": LEASE, "missed": MISSED,
                               "bound_s": bound, "reps": REPS, "backends": {}}
    for backend in BACKENDS:
        crashes = [crash(backend) for _ in range(REPS)]
        hosts = [dead_host(backend) for _ in range(REPS)]
        figures["backends"][backend] = {
            "crash_s": [c["seconds"] for c in crashes],
            "host_running_s": [h["running"] for h in hosts],
            "host_placed_s": [h["placed"] for h in hosts],
            "late_placements": sum(h["late_placements"] for h in hosts)}
        for result in crashes + hosts:
            print(backend, result, file=sys.stderr)
        seconds = [c["seconds"] for c in crashes]
        rows.append(f"| crashed agent (guardian alive) → job running elsewhere | {backend} | "
                    f"p50 {statistics.median(seconds):.2f} s, max {max(seconds):.2f} s | "
                    f"~2 s |")
        for key, what in (("running", "its running job"), ("placed", "a job placed at the kill")):
            values = [h[key] for h in hosts]
            rows.append(f"| dead host → {what} running elsewhere | {backend} | "
                        f"p50 {statistics.median(values):.1f} s, max {max(values):.1f} s | "
                        f"≤ {bound:g} s (2 heartbeats + lease) |")
        late = sum(h["late_placements"] for h in hosts)
        first = sum(h["placed_first_on"] == "alpha" for h in hosts)
        rows.append(f"| dead host → placements after its missed heartbeats | {backend} | "
                    f"{late} ({first}/{len(hosts)} placed on it before) | 0 |")
    if os.environ.get("BENCH_JSON"):  # bench/run.sh reads the figures from here
        Path(os.environ["BENCH_JSON"]).write_text(json.dumps(figures, indent=2))
    print("| measurement | backend | result | target |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
