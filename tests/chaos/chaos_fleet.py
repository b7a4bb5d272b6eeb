"""The chaos suite's moving parts: a fleet on a private PostgreSQL cluster, a stream of jobs,
and a seeded random fault loop that acts like bad luck followed by a supervisor.

Processes come from tests/support/fleet.py (`FleetHarness`: a real `herder server`, real
`herder agent`s posing as three hosts, each in its own process group). Each agent reaches
the server through its own cuttable TCP proxy (chaos_proxy.py). Faults only ever touch
processes this test started and only 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
from chaos_marks import Fault, Limits
from chaos_proxy import Proxy, ProxyLoop
from support.fleet import FleetHarness
from support.postgres import PostgresCluster
from support.processes import descendants, kill_group

from herder.core.backoff import Backoff
from herder.core.model import JobStatus
from herder.core.settings.fleet import FleetSection
from herder.core.settings.sections import RuntimeSection
from herder.store import open_store

MARK_JOB = Path(__file__).with_name("mark_job.py")
HOSTS = ("alpha", "beta", "gamma")
WORKERS = 3  # per host, prime and night

HEARTBEAT = 0.5
LEASE = 3.0
KILL_GRACE = 0.5  # well inside FENCE_MARGIN: a fenced attempt is dead before its lease ends
FENCE_MARGIN = 1.5
PICKUP_TIMEOUT = 3.0
# Every server death and every cut past the 1.5 s fence loses the attempts it reaches, and
# at a fault every ~3 s an unlucky job meets ten of them (seed 90161: a job lost 10 times in
# 50 s, failing "every job done" though herder did what its policy says). The budget is
# sized so that running out means a bug, not bad luck; "attempts within budget" checks it.
LIMITS = Limits(max_attempts=3, max_lost=25, max_spawn_failures=5)
RECOVERY_TARGET = 2 * HEARTBEAT + LEASE  # the target: two heartbeats plus the lease
QUIET_AFTER_HOST_DIES = 2 * RECOVERY_TARGET
"""No server or database fault for this long after a host dies: its recovery is timed
against the product, not against a pile-up of outages (a new leader waits a lease)."""
CONTROL_PLANE_KINDS = frozenset({"server_dies", "postgres_restart"})

KINDS = ("host_dies", "agent_dies", "server_dies", "postgres_restart", "agent_stops",
         "network_cut")
AGENT_KINDS = frozenset({"host_dies", "agent_dies", "agent_stops", "network_cut"})
DEFAULT_SECONDS = 90.0
SEED_ENV = "HERDER_CHAOS_SEED"
SECONDS_ENV = "HERDER_CHAOS_SECONDS"
KINDS_ENV = "HERDER_CHAOS_FAULTS"


class ChaosSettings(msgspec.Struct, frozen=True):
    seed: int
    seconds: float
    kinds: tuple[str, ...]

    @classmethod
    def from_environment(cls) -> ChaosSettings:
        """HERDER_CHAOS_SEED (default: a new one), HERDER_CHAOS_SECONDS (default 90) and
        HERDER_CHAOS_FAULTS (comma-separated kinds, default all); bad values name the fix."""
        seed_text = os.environ.get(SEED_ENV, "")
        if seed_text and not seed_text.isdigit():
            raise ValueError(f"{SEED_ENV}={seed_text!r}: use a non-negative integer")
        seed = int(seed_text) if seed_text else random.SystemRandom().randrange(1, 10**6)
        seconds_text = os.environ.get(SECONDS_ENV, "")
        try:
            seconds = float(seconds_text) if seconds_text else DEFAULT_SECONDS
        except ValueError:
            raise ValueError(f"{SECONDS_ENV}={seconds_text!r}: use seconds, e.g. 600") from None
        if not 10 <= seconds <= 86400:
            raise ValueError(f"{SECONDS_ENV}={seconds_text!r}: use 10 to 86400 seconds")
        kinds_text = os.environ.get(KINDS_ENV, "")
        kinds = tuple(k.strip() for k in kinds_text.split(",") if k.strip()) or KINDS
        unknown = sorted(set(kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"{KINDS_ENV}: unknown kinds {unknown}; choose from {list(KINDS)}")
        return cls(seed, seconds, kinds)


def knows(section: type, key: str) -> bool:
    """Whether this herder's settings section has `key` (dataclasses now, pydantic before)."""
    fields = getattr(section, "model_fields", None)
    if fields is None:
        fields = {item.name for item in msgspec.structs.fields(section)}
    return key in fields


def config_sections() -> dict[str, dict[str, Any]]:
    """Fast timings for herder.toml. Keys that only some versions of herder know
    (`fence_margin`, `pickup_timeout`) are written only when this herder.core.settings has them."""
    runtime: dict[str, Any] = {"heartbeat_interval": f"{HEARTBEAT}s",
                               "attempt_lease": f"{LEASE}s", "kill_grace": f"{KILL_GRACE}s",
                               "poll_interval": "0.2s", "max_lost": LIMITS.max_lost}
    if knows(RuntimeSection, "fence_margin"):
        runtime["fence_margin"] = f"{FENCE_MARGIN}s"
    fleet: dict[str, Any] = {"scheduler_interval": "0.2s", "missed_heartbeats": 3,
                             "spawn_backoff": "1s",
                             "max_spawn_failures": LIMITS.max_spawn_failures}
    if knows(FleetSection, "pickup_timeout"):
        fleet["pickup_timeout"] = f"{PICKUP_TIMEOUT}s"
    defaults = {"max_attempts": LIMITS.max_attempts, "backoff_base": "0s", "backoff_max": "1s"}
    return {"runtime": runtime, "fleet": fleet, "defaults": defaults}


class Submitted(msgspec.Struct, frozen=True):
    number: int
    job: int
    duration: float
    at: float


class JobStream:
    """Submits jobs over HTTP at random intervals until `stop`; each submit is retried with
    backoff through server and database outages under a dedup key, so a retry after a lost
    answer finds the job it already made instead of making a second one."""

    def __init__(self, url: str, token: str, marks: Path, workdir: Path, seed: int) -> None:
        self.random = random.Random(f"{seed}-jobs")
        self.marks = marks
        self.workdir = workdir
        self.submitted: list[Submitted] = []
        self.errors: list[str] = []
        self.retries = 0
        self.stop = threading.Event()
        self._http = httpx.Client(base_url=url, timeout=10.0,
                                  headers={"Authorization": f"Bearer {token}"})
        self._thread = threading.Thread(target=self._run, name="chaos-jobs", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        self.stop.set()
        self._thread.join(timeout)
        self._http.close()

    def _run(self) -> None:
        number = 0
        while not self.stop.wait(self.random.uniform(0.5, 2.5)):
            number += 1
            duration = round(self.random.uniform(1.0, 5.0), 2)
            job = self._submit(number, duration)
            if job is None:
                return
            self.submitted.append(Submitted(number, job, duration, time.monotonic()))

    def _submit(self, number: int, duration: float) -> int | None:
        body = {"command": [sys.executable, str(MARK_JOB), str(self.marks), str(duration)],
                "dedup_key": f"chaos-{number}", "workdir": str(self.workdir)}
        backoff = Backoff(base=0.2, cap=2.0)
        give_up = time.monotonic() + 120.0
        while True:
            try:
                response = self._http.post("/api/v1/jobs", json=body)
            except httpx.HTTPError as exc:
                problem = f"{type(exc).__name__}"
            else:
                if response.status_code in (200, 201):
                    return int(response.json()["id"])
                if response.status_code < 500:
                    self.errors.append(f"submit {number}: {response.status_code} "
                                       f"{response.text[:200]}")
                    return None
                problem = f"{response.status_code}"
            self.retries += 1
            if time.monotonic() > give_up:
                self.errors.append(f"submit {number}: still failing after 120s ({problem})")
                return None
            backoff.wait()


def raised(traceback: list[str]) -> str:
    """The exception line that ends a traceback printed by threading's excepthook."""
    return next((line.strip() for line in traceback
                 if line[:1] not in (" ", "") and not line.startswith("Traceback")), "?")


class ChaosFleet:
    """A server, three agents behind proxies, the database, and the faults done to them."""

    def __init__(self, fleet: FleetHarness, cluster: PostgresCluster, settings: ChaosSettings
                 ) -> None:
        self.fleet = fleet
        self.cluster = cluster
        self.settings = settings
        self.random = random.Random(f"{settings.seed}-faults")
        self.marks = fleet.root / "marks"
        self.marks.mkdir()
        self.proxy_loop = ProxyLoop()
        self.proxies: dict[str, Proxy] = {}
        self.state: dict[str, str] = {}  # host → up | dead | stopped | cut
        self.server_up = False
        self.quiet_until = 0.0  # monotonic; see QUIET_AFTER_HOST_DIES
        self.faults: list[Fault] = []
        self.pending: list[tuple[float, int, Callable[[], None]]] = []  # due, fault, undo
        self.errors: list[str] = []
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="chaos-faults", daemon=True)

    # -- the fleet ------------------------------------------------------------------------

    def start(self) -> None:
        self.fleet.add_hosts({label: ("--ram", "16", "--prime-workers", str(WORKERS),
                                      "--night-workers", str(WORKERS)) for label in HOSTS})
        assert self.fleet.admin_token
        self.fleet.start_server()
        self.server_up = True
        for label in HOSTS:
            self.proxies[label] = self.proxy_loop.add(self.fleet.port)
            self.fleet.agent_urls[label] = self.proxies[label].url
            self.state[label] = "up"
        self.fleet.start_agents(*HOSTS)

    def running_on(self, label: str) -> tuple[tuple[int, int], ...]:
        """(job, attempt) of the job processes of `label` now."""
        return tuple(sorted({(proc.job, proc.attempt) for proc in self.fleet.job_processes()
                             if proc.worker.partition("/")[0] == label}))

    # -- faults ---------------------------------------------------------------------------

    def start_faults(self) -> None:
        self._thread.start()

    def faults_over(self) -> bool:
        """True once the fault window has ended and its last fault was undone."""
        return not self._thread.is_alive()

    def stop_faults(self, timeout: float = 120.0) -> None:
        """Stop injecting, then undo every fault still in force (restart what is dead)."""
        self.stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the fault loop did not stop"
        for _due, index, undo in sorted(self.pending, key=lambda item: item[0]):
            self._undo(index, undo)
        self.pending.clear()

    def _loop(self) -> None:
        end = time.monotonic() + self.settings.seconds
        next_fault = time.monotonic() + self.random.uniform(1.0, 3.0)
        while not self.stop.is_set():
            now = time.monotonic()
            for item in sorted(self.pending, key=lambda item: item[0]):
                if item[0] <= now:
                    self.pending.remove(item)
                    self._undo(item[1], item[2])
            if now >= end:
                # The window is over but faults still in force end at their own time, so
                # the stream is not left facing a server that no one restarts.
                if not self.pending:
                    return
            elif now >= next_fault:
                try:
                    self._inject()
                except Exception as exc:  # record and carry on: the test reports it
                    self.errors.append(f"fault injection failed: {exc!r}")
                next_fault = time.monotonic() + self.random.uniform(1.5, 4.0)
            ahead = [next_fault, end] if now < end else []
            due = min([*ahead, *(item[0] for item in self.pending)], default=now + 0.5)
            self.stop.wait(max(0.0, min(due - time.monotonic(), 0.5)))

    def _undo(self, index: int, undo: Callable[[], None]) -> None:
        try:
            undo()
        except Exception as exc:
            self.errors.append(f"undoing {self.faults[index].kind} failed: {exc!r}")
        self.faults[index] = msgspec.structs.replace(self.faults[index], ended=time.monotonic())

    def _later(self, seconds: float, undo: Callable[[], None]) -> None:
        self.pending.append((time.monotonic() + seconds, len(self.faults) - 1, undo))

    def _inject(self) -> None:
        healthy = [label for label in HOSTS if self.state[label] == "up"]
        impaired = len(HOSTS) - len(healthy)
        kinds = [kind for kind in self.settings.kinds
                 if (kind not in AGENT_KINDS or (healthy and impaired < len(HOSTS) - 1))
                 and (kind != "server_dies" or self.server_up)
                 and (kind not in CONTROL_PLANE_KINDS or time.monotonic() >= self.quiet_until)]
        if not kinds:
            return
        kind = self.random.choice(kinds)
        # A host with jobs running makes the fault count (victims to recover, attempts that
        # could overlap); an idle one only when all are idle.
        busy = [label for label in healthy if self.running_on(label)]
        target = (self.random.choice(busy or healthy) if kind in AGENT_KINDS
                  else kind.split("_")[0])
        getattr(self, f"_{kind}")(target)

    def _record(self, kind: str, target: str, victims: tuple[tuple[int, int], ...] = (),
                note: str = "") -> None:
        self.faults.append(Fault(kind, target, time.monotonic(), None, victims, note))

    def _host_dies(self, label: str) -> None:
        """The machine is gone: its agent, its guardian and its jobs die at the same instant
        (all frozen first, so the guardian cannot act), and it comes back 10-25 s later."""
        agent = self.fleet.agents[label]
        victims = self.running_on(label)
        doomed = [agent.pid, *descendants(agent.pid)]
        doomed += [proc.pid for proc in self.fleet.job_processes()
                   if proc.worker.partition("/")[0] == label]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in doomed:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        self._record("host_dies", label, victims, f"{len(doomed)} processes")
        self.quiet_until = time.monotonic() + QUIET_AFTER_HOST_DIES
        kill_group(agent)
        self.state[label] = "dead"
        self._later(self.random.uniform(10.0, 25.0), lambda: self._restart_agent(label))

    def _agent_dies(self, label: str) -> None:
        """The agent process alone dies (its guardian and jobs survive it); a supervisor
        restarts it 0.5-5 s later."""
        victims = self.running_on(label)
        self._record("agent_dies", label, victims)
        kill_group(self.fleet.agents[label])
        self.state[label] = "dead"
        self._later(self.random.uniform(0.5, 5.0), lambda: self._restart_agent(label))

    def _restart_agent(self, label: str) -> None:
        self.fleet.start_agent(label, wait=False)
        self.state[label] = "up"

    def _agent_stops(self, label: str) -> None:
        """SIGSTOP of the agent's group past the lease (its jobs, in their own sessions, run
        on), then SIGCONT."""
        agent = self.fleet.agents[label]
        self._record("agent_stops", label, self.running_on(label))
        os.killpg(agent.pid, signal.SIGSTOP)
        self.state[label] = "stopped"

        def resume() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGCONT)
            self.state[label] = "up"

        self._later(LEASE + self.random.uniform(0.5, 3.0), resume)

    def _network_cut(self, label: str) -> None:
        """The agent cannot reach the server for 1 s to twice the lease."""
        proxy = self.proxies[label]
        self._record("network_cut", label, self.running_on(label))
        self.proxy_loop.cut(proxy)
        self.state[label] = "cut"

        def heal() -> None:
            self.proxy_loop.restore(proxy)
            self.state[label] = "up"

        self._later(self.random.uniform(1.0, 2 * LEASE), heal)

    def _server_dies(self, _target: str) -> None:
        """SIGKILL of the server; a supervisor starts it again 0.5-4 s later."""
        server = self.fleet.server
        assert server is not None
        self._record("server_dies", "server")
        kill_group(server)
        self.server_up = False

        def restart() -> None:
            self.fleet.start_server(wait=False)
            self.server_up = True

        self._later(self.random.uniform(0.5, 4.0), restart)

    def _postgres_restart(self, _target: str) -> None:
        """`pg_ctl restart -m immediate`: every connection dropped, crash recovery."""
        self._record("postgres_restart", "postgres")
        self.cluster.restart("immediate")
        self.faults[-1] = msgspec.structs.replace(self.faults[-1], ended=time.monotonic())

    # -- the end --------------------------------------------------------------------------

    def server_answers(self) -> bool:
        try:
            return httpx.get(f"{self.fleet.url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def unfinished(self, jobs: list[int]) -> list[int]:
        """Submitted jobs not yet done, failed or cancelled (all of them if the database
        cannot be read just now)."""
        final = {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}
        try:
            with open_store(self.fleet.db) as store:
                rows = {job.id: job for job in store.job_list(None, 100_000)}
        except Exception:
            return jobs
        return [job for job in jobs if job not in rows or rows[job].status not in final]

    def thread_deaths(self) -> list[str]:
        """Threads of herder processes that died of an exception, from their stderr: the
        usual cause when jobs stay queued or results go unreported."""
        found: list[str] = []
        for started in self.fleet.started:
            with contextlib.suppress(OSError):
                lines = started.stderr.read_text(errors="replace").splitlines()
                found += [f"{started.stderr.name}: {line.strip()} {raised(lines[index + 1:])}"
                          for index, line in enumerate(lines)
                          if line.startswith("Exception in thread")]
        return found

    def close(self) -> None:
        self.stop.set()
        self.proxy_loop.close()
