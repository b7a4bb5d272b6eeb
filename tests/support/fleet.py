"""The fleet harness: one test's server and agents (tests/test_fleet.py,
tests/test_fleet_faults.py, the chaos run and others).

A `FleetHarness` owns one test's fleet: a herder.toml with fast timings in tmp_path, a real
`herder server` on a free 127.0.0.1 port, real `herder agent` processes posing as different
hosts on this one machine, and `herder` CLI calls. Every process runs in its own process
group; job processes (which live in sessions of their own) are found by their attempt marker
and their log path under tmp_path, so `close()` kills exactly this test's processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from herder.core.access import new_token, token_hash
from herder.core.model import Scope
from herder.store import Store, open_store
from support.config import toml_value, write_config
from support.harness import HarnessBase
from support.ports import free_port
from support.processes import (
    Proc,
    children_like,
    kill_group,
    marked_processes,
)
from support.waits import wait_for

FAST_RUNTIME: dict[str, Any] = {
    "heartbeat_interval": "0.3s",
    "attempt_lease": "2s",
    "kill_grace": "1s",
    "poll_interval": "0.2s",
    # A dead agent's guardian kills its jobs at once (tests/test_adoption.py sets a grace).
    "adopt_grace": "0s",
}
FAST_DEFAULTS: dict[str, Any] = {"backoff_base": "0s", "backoff_max": "1s"}
FAST_FLEET: dict[str, Any] = {
    "scheduler_interval": "0.2s",
    "missed_heartbeats": 6,  # liveness: 1.8 s of silence (an idle agent beats every ~0.5 s)
    "spawn_backoff": "1s",
}
WEIGHTS = {"light": 3.0, "heavy": 8.0, "playwright": 6.0, "orchestrator": 12.0, "subagent": 0.0}


# -- budgets ------------------------------------------------------------------------------------


def bookable(ram_gb: float, reserved_gb: float = 0.0) -> float:
    return 0.8 * (ram_gb - reserved_gb)


# -- job scripts and what they record ----------------------------------------------------------


def recorder(events: Path, body: str = "sleep 0.5", lock: Path | None = None,
             overlap: Path | None = None) -> list[str]:
    """argv of an ad-hoc job that appends `start` and `end` lines (host, job, attempt,
    weight, time) to `events`. With `lock`, an flock taken for the whole run detects a second
    attempt of the same job running at once: it appends OVERLAP to `overlap` and exits 1."""
    line = '"$HERDER_HOST $HERDER_JOB_ID $HERDER_ATTEMPT $HERDER_WEIGHT'
    script = ""
    if lock is not None:
        assert overlap is not None
        script += (f"exec 9>>'{lock}'; flock -n 9 || "
                   f"{{ echo {line} OVERLAP $(date +%s.%N)\" >> '{overlap}'; exit 1; }}; ")
    script += (f"echo {line} start $(date +%s.%N)\" >> '{events}'; {body}; "
               f"echo {line} end $(date +%s.%N)\" >> '{events}'")
    return ["/bin/sh", "-c", script]


class Interval(msgspec.Struct, frozen=True):
    host: str
    job: int
    attempt: int
    weight: str
    start: float
    end: float | None


def read_intervals(events: Path) -> list[Interval]:
    """One interval per (job, attempt) from a recorder's file; `end` None while running."""
    starts: dict[tuple[int, int], tuple[str, str, float]] = {}
    ends: dict[tuple[int, int], float] = {}
    if not events.exists():
        return []
    for raw in events.read_text().splitlines():
        parts = raw.split()
        if len(parts) != 6:
            continue
        host, job, attempt, weight, kind, stamp = parts
        key = (int(job), int(attempt))
        if kind == "start":
            assert key not in starts, f"job {job} attempt {attempt} started twice"
            starts[key] = (host, weight, float(stamp))
        elif kind == "end":
            ends[key] = float(stamp)
    return [Interval(host, job, attempt, weight, start, ends.get((job, attempt)))
            for (job, attempt), (host, weight, start) in sorted(starts.items())]


def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


class Peak(msgspec.Struct, frozen=True):
    workers: int
    ram_gb: float
    at: float
    running: tuple[tuple[int, str], ...]


def peaks(intervals: Iterable[Interval],
          budgets: Mapping[str, float] = WEIGHTS) -> dict[str, tuple[Peak, Peak]]:
    """Per host: (the most jobs running at once, the most RAM booked at once) from the
    recorded intervals. At equal times an end comes before a start (capacity is freed when
    an attempt ends, and the next one can only start after that)."""
    by_host: dict[str, list[tuple[float, int, Interval]]] = defaultdict(list)
    for interval in intervals:
        assert interval.end is not None, f"{interval} never ended"
        by_host[interval.host].append((interval.start, 1, interval))
        by_host[interval.host].append((interval.end, 0, interval))
    result: dict[str, tuple[Peak, Peak]] = {}
    for host, points in by_host.items():
        points.sort(key=lambda point: (point[0], point[1]))
        running: dict[int, Interval] = {}
        most_workers = Peak(0, 0.0, 0.0, ())
        most_ram = Peak(0, 0.0, 0.0, ())
        for stamp, kind, interval in points:
            if kind == 0:
                running.pop(interval.job, None)
                continue
            running[interval.job] = interval
            ram = sum(budgets[item.weight] for item in running.values())
            now = Peak(len(running), ram, stamp,
                       tuple(sorted((item.job, item.weight) for item in running.values())))
            if now.workers > most_workers.workers:
                most_workers = now
            if now.ram_gb > most_ram.ram_gb:
                most_ram = now
        result[host] = (most_workers, most_ram)
    return result


# -- the harness ------------------------------------------------------------------------------


class FleetHarness(HarnessBase):
    def __init__(
        self,
        root: Path,
        db: str,
        runtime: Mapping[str, Any] | None = None,
        fleet: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        extra: str = "",
    ) -> None:
        super().__init__(root, db, root / "herder.toml")
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[Any] | None = None
        self.agents: dict[str, subprocess.Popen[Any]] = {}
        self.tokens: dict[str, str] = {}
        self.agent_urls: dict[str, str] = {}  # an agent's way to the server, if not self.url
        self._admin_token: str | None = None
        self._store: Store | None = None
        self._http = httpx.Client(base_url=self.url, timeout=10.0)
        self.write_config(runtime, fleet, defaults, extra)

    # -- configuration ------------------------------------------------------------------------

    def write_config(
        self,
        runtime: Mapping[str, Any] | None = None,
        fleet: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        extra: str = "",
    ) -> None:
        """(Re)write herder.toml: fast timings, overridden by the given sections."""
        sections = {
            "herder": {"log_dir": "server-logs"},
            "runtime": {**FAST_RUNTIME, **(runtime or {})},
            "defaults": {**FAST_DEFAULTS, **(defaults or {})},
            "fleet": {**FAST_FLEET, **(fleet or {})},
        }
        write_config(self.config, {name: {key: toml_value(value) for key, value in values.items()}
                                   for name, values in sections.items()}, extra)

    # -- store --------------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.db)
        return self._store

    # -- cli ----------------------------------------------------------------------------------

    def cli_many(self, *calls: Sequence[str], check: bool = True
                 ) -> list[subprocess.CompletedProcess[str]]:
        """Independent CLI calls at once (a Python start each); results in call order."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            return list(pool.map(lambda args: self.cli(*args, check=check), calls))

    def add_hosts(self, hosts: Mapping[str, Sequence[str]]) -> None:
        """Several `herder host add LABEL OPTIONS...` at once."""
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda item: self.add_host(item[0], *item[1]), hosts.items()))

    def add_host(self, label: str, *options: str) -> str:
        """`herder host add LABEL ...`; returns the agent token it printed on stdout."""
        result = self.cli("host", "add", label, *options)
        lines = result.stdout.split()
        assert len(lines) == 1 and lines[0].startswith("hdr_"), result.stdout
        self.tokens[label] = lines[0]
        return lines[0]

    def why(self, job_id: int) -> str:
        """`herder why JOB` (the CLI, straight from the store)."""
        return self.cli("why", str(job_id)).stdout.strip()

    def hosts(self) -> dict[str, dict[str, Any]]:
        """`herder hosts --json` by label."""
        views = json.loads(self.cli("hosts", "--json").stdout)
        return {view["label"]: view for view in views}

    def why_api(self, job_id: int) -> str:
        """The server's answer to why (cheap enough to poll; the CLI costs a Python start)."""
        response = self.api("GET", f"/api/v1/jobs/{job_id}/why")
        assert response.status_code == 200, response.text
        return str(response.json()["why"])

    def hosts_api(self) -> dict[str, dict[str, Any]]:
        response = self.api("GET", "/api/v1/hosts")
        assert response.status_code == 200, response.text
        return {view["label"]: view for view in response.json()}

    def submit_cli(self, *args: str) -> int:
        out = self.cli("submit", *args).stdout.split()
        assert len(out) == 1 and out[0].isdigit(), out
        return int(out[0])

    # -- processes ----------------------------------------------------------------------------

    def start_server(self, *extra: str, wait: bool = True,
                     env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
        """`herder server` on this fleet's port; with `wait`, until it answers /healthz
        (agents started meanwhile retry until it does)."""
        assert self.server is None or self.server.poll() is not None, "a server runs already"
        process = self.start("server", "server", "--listen", f"127.0.0.1:{self.port}", *extra,
                             env=env)
        self.server = process
        if wait:
            self.wait_server()
        return process

    def wait_server(self) -> None:
        process = self.server
        assert process is not None

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"herder server exited {process.returncode}\n"
                                     f"{self.describe()}")
            try:
                return self._http.get("/healthz", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 30, "herder server to answer /healthz", self.describe)

    def stop_server(self, sig: int = signal.SIGKILL, timeout: float = 20.0) -> None:
        """Kill the server's process group and wait until it is gone (the port is free)."""
        process = self.server
        assert process is not None
        kill_group(process, sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(process)
            raise AssertionError(f"herder server ignored signal {sig}") from None
        self.server = None

    def start_agent(self, label: str, *extra: str, token: str | None = None,
                    ram_check: bool = False, wait: bool = True,
                    env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
        """`herder agent` for `label` with its own log folder; waits until its runner loop is
        up (it has heartbeated and run its orphan recovery). The token goes in the
        environment, which the agent clears once read: on the command line every process of
        the user, jobs included, could read it from /proc."""
        args = ["agent", "--server", self.agent_urls.get(label, self.url), "--host", label,
                "--log-dir", str(self.root / "agents" / label), "--drain-timeout", "5s", *extra]
        if not ram_check:
            args.append("--no-ram-check")
        process = self.start(f"agent-{label}", *args,
                             env={**(env or {}),
                                  "HERDER_AGENT_TOKEN": token or self.tokens[label]})
        self.agents[label] = process
        if wait:
            self.wait_agent(label)
        return process

    def start_agents(self, *labels: str) -> None:
        """Several agents at once (each with default options); waits until all are up."""
        for label in labels:
            self.start_agent(label, wait=False)
        for label in labels:
            self.wait_agent(label)

    def wait_agent(self, label: str) -> None:
        process = self.agents[label]

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"agent {label} exited {process.returncode}\n"
                                     f"{self.describe()}")
            text = self.stderr_of(process)
            return f"runner {label}/" in text and " up: concurrency " in text

        wait_for(ready, 30, f"agent {label} to be up", self.describe)

    def kill_agent(self, label: str, sig: int = signal.SIGKILL) -> None:
        """Signal the agent's process group only (its jobs run in sessions of their own, and
        so does its guardian, which outlives it on purpose)."""
        kill_group(self.agents[label], sig)

    def guardian(self, label: str) -> Proc:
        """The agent's guardian: the child it forked first, in a session of its own, with
        the agent's own command line (job processes carry a marker instead)."""
        guardians = children_like(self.agents[label].pid)
        if guardians:
            return guardians[0]
        raise AssertionError(f"agent {label} has no guardian\n{self.describe()}")

    def kill_host(self, label: str) -> None:
        """The whole host dies at once: its guardian, its agent and its job processes, all
        with SIGKILL (the guardian first, so nothing is left to report it)."""
        guardian = self.guardian(label)
        os.kill(guardian.pid, signal.SIGKILL)
        kill_group(self.agents[label])
        for proc in marked_processes(log_under=self.root / "agents" / label):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        wait_for(lambda: not guardian.alive()
                 and not marked_processes(log_under=self.root / "agents" / label), 10,
                 f"everything of host {label} to be dead", self.describe)

    def job_processes(self, job_id: int | None = None) -> list[Proc]:
        """Live job processes whose log is under this fleet's folder, of one job or all."""
        found = marked_processes(log_under=self.root)
        return [proc for proc in found if job_id is None or proc.job == job_id]

    # -- http ---------------------------------------------------------------------------------

    @property
    def admin_token(self) -> str:
        """An admin API token, made on first use (the server needs none to start on
        loopback; operator routes need one)."""
        if self._admin_token is None:
            secret = new_token()
            self.store.token_insert("tests", Scope.ADMIN, token_hash(secret),
                                    datetime.now(UTC))
            self._admin_token = secret
        return self._admin_token

    def token_file(self, folder: Path, scope: Scope, allow_adhoc: bool = False) -> Path:
        """A new API token of `scope` in a mode-0600 file in `folder` (`allow_adhoc`: a
        submit token that may run ad-hoc commands)."""
        secret = new_token()
        self.store.token_insert(f"cli-{scope}", scope, token_hash(secret), datetime.now(UTC),
                                allow_adhoc=allow_adhoc)
        path = folder / f"{scope}-token"
        path.write_text(secret + "\n")
        path.chmod(0o600)
        return path

    def operator(self, folder: Path, scope: Scope = Scope.READ) -> dict[str, str]:
        """The environment of an operator's `herder` with no database: this server and a
        new token of `scope` (the folder is made for it to run in)."""
        folder.mkdir(parents=True, exist_ok=True)
        return {"HERDER_SERVER": self.url,
                "HERDER_TOKEN_FILE": str(self.token_file(folder, scope))}

    def api(self, method: str, path: str, token: str | None = None,
            **kwargs: Any) -> httpx.Response:
        """An HTTP call with `token` (default: the admin token; "" sends none)."""
        headers = dict(kwargs.pop("headers", {}))
        token = self.admin_token if token is None else token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self._http.request(method, path, headers=headers, **kwargs)

    def submit(self, command: Sequence[str] | None = None, **body: Any) -> int:
        """POST /api/v1/jobs (the server's intake); returns the job id."""
        if command is not None:
            body["command"] = list(command)
        response = self.api("POST", "/api/v1/jobs", json=body)
        assert response.status_code == 201, (response.status_code, response.text)
        return int(response.json()["id"])

    # -- diagnostics --------------------------------------------------------------------------

    def close(self) -> None:
        super().close()
        self._http.close()
        if self._store is not None:
            self._store.close()


@pytest.fixture
def make_fleet(tmp_path: Path) -> Iterator[type[FleetHarness]]:
    """Build harnesses with `make_fleet(tmp_path, db, ...)`; all are closed at teardown."""
    made: list[FleetHarness] = []

    class Tracked(FleetHarness):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    try:
        yield Tracked
    finally:
        for harness in made:
            harness.close()
