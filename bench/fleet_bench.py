"""Fleet benchmarks: submit→start latency through a real agent, and idle long-poll load.

    python bench/fleet_bench.py                      # latency and idle, both backends
    PARTS=latency BACKENDS=sqlite python bench/fleet_bench.py
    PARTS=replica BACKENDS=postgres python bench/fleet_bench.py

latency : a `herder server` and one `herder agent` (real processes); jobs are submitted one
          at a time through the Python API while the agent is idle (long-polling), and each
          job's first instruction writes a timestamp. Latency = that stamp − submit time.
replica : the same on PostgreSQL with two `herder server` replicas, the agent long-polling
          the one that is not the leader (the leader places; the follower must hear of it).
idle    : N hosts (default 1000), each with its own token; one asyncio process keeps one
          long-poll open per host (re-polling when it returns) and heartbeats every 10 s, as
          idle agents do. Measured: the server process's CPU over the window, in cores.

Prints a markdown table; with BENCH_JSON set also writes the rows there as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from herder.client import Client  # noqa: E402
from herder.core.access import new_token, token_hash  # noqa: E402
from herder.core.model import HostRecord, Scope  # noqa: E402
from herder.store import open_store  # noqa: E402

PARTS = os.environ.get("PARTS", "latency idle").split()
BACKENDS = os.environ.get("BACKENDS", "sqlite postgres").split()
SAMPLES = int(os.environ.get("LATENCY_SAMPLES", "200"))
IDLE_AGENTS = int(os.environ.get("IDLE_AGENTS", "1000"))
IDLE_SECONDS = float(os.environ.get("IDLE_SECONDS", "30"))
PG_BASE = os.environ.get("HERDER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
CONFIG = """\
[herder]
db = "{db}"
log_dir = "{folder}/logs"
[runtime]
heartbeat_interval = "10s"
[fleet]
scheduler_interval = "1s"
[server]
long_poll = "25s"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def database(backend: str, folder: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{folder}/herder.db"
    name = f"herder_fleet_bench_{os.getpid()}"
    with psycopg.connect(PG_BASE, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return PG_BASE.rsplit("/", 1)[0] + f"/{name}"


def drop(backend: str, url: str) -> None:
    if backend == "postgres":
        with psycopg.connect(PG_BASE, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {url.rsplit('/', 1)[1]} WITH (FORCE)")


def herder(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "herder.cli", "--config", str(folder / "herder.toml"), *args]


def start(
    command: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as output:
        return subprocess.Popen(command, stdout=output, stderr=output, start_new_session=True,
                                env={**os.environ, **(env or {})})


def stop(process: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(process.pid, signal.SIGKILL)


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"server at {url} did not come up")


def leader_of(urls: list[str]) -> str | None:
    """The replica whose /healthz says it leads, once one does."""
    for url in urls:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).json().get("leader"):
                return url
        except (httpx.HTTPError, ValueError):
            pass
    return None


def latency(backend: str, replicas: int = 1) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="herder-fleet-bench-"))
    url = database(backend, folder)
    (folder / "herder.toml").write_text(CONFIG.format(db=url, folder=folder))
    store = open_store(url)
    token = new_token()
    store.host_insert(HostRecord("bench-1", 64, prime_max_workers=4, night_max_workers=4),
                      datetime_now())
    store.token_insert("host:bench-1", Scope.AGENT, token_hash(token), datetime_now(),
                       host="bench-1")
    servers: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    agent = None
    stamps = folder / "stamps"
    samples: list[float] = []
    try:
        for index in range(replicas):
            port = free_port()
            servers.append(start(herder(folder, "server", "--listen", f"127.0.0.1:{port}"),
                                 folder / f"s{index}.log"))
            urls.append(f"http://127.0.0.1:{port}")
            wait_http(urls[-1])
        deadline = time.monotonic() + 30
        while (leader := leader_of(urls)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if leader is None:
            raise SystemExit("no replica leads")
        # One replica: the agent talks to it; several: to one that does not lead.
        target = next((url for url in urls if url != leader), leader)
        agent = start(herder(folder, "agent", "--server", target,
                             "--host", "bench-1", "--no-ram-check"), folder / "a.log",
                      {"HERDER_AGENT_TOKEN": token})
        with Client(url, folder / "herder.toml") as client:
            for index in range(SAMPLES + 5):
                submitted_at = time.time()
                job = client.submit(command=["/bin/sh", "-c", f"date +%s.%N >> {stamps}"],
                                    workdir=str(folder), check_command=False).job_id
                done = client.wait(job, timeout=90)
                if index >= 5:  # warm-up
                    lines = stamps.read_text().split()
                    samples.append((float(lines[-1]) - submitted_at) * 1000)
                assert done.status.value == "done"
    finally:
        if agent is not None:
            stop(agent)
        for server in servers:
            stop(server)
        store.close()
        drop(backend, url)
    samples.sort()
    return {"backend": backend, "replicas": replicas, "n": len(samples),
            "p50_ms": statistics.median(samples),
            "p99_ms": samples[max(0, int(len(samples) * 0.99) - 1)], "max_ms": samples[-1]}


def datetime_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


def cpu_seconds(pid: int) -> float:
    total = 0.0
    for child in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            pass
    return total


def children(pid: int) -> list[int]:
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    result = [int(p) for p in found]
    for child in list(result):
        result.extend(children(child))
    return result


async def idle_agents(base: str, tokens: dict[str, str], seconds: float) -> dict[str, int]:
    counts = {"polls": 0, "heartbeats": 0, "errors": 0}
    limits = httpx.Limits(max_connections=len(tokens) + 10, max_keepalive_connections=len(tokens))
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:
        stop_at = asyncio.get_running_loop().time() + seconds

        async def one(label: str, token: str) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            worker = f"{label}/1/1"
            next_beat = 0.0
            while asyncio.get_running_loop().time() < stop_at:
                try:
                    if asyncio.get_running_loop().time() >= next_beat:
                        next_beat = asyncio.get_running_loop().time() + 10
                        await http.post(f"/api/v1/agent/{label}/heartbeat", headers=headers,
                                        json={"worker": worker, "running": []})
                        counts["heartbeats"] += 1
                    await http.get(f"/api/v1/agent/{label}/assignments", headers=headers,
                                   params={"worker": worker, "free": 1, "wait": 25})
                    counts["polls"] += 1
                except httpx.HTTPError:
                    counts["errors"] += 1
                    await asyncio.sleep(1)

        await asyncio.gather(*(one(label, token) for label, token in tokens.items()))
    return counts


def idle(backend: str) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="herder-idle-bench-"))
    url = database(backend, folder)
    (folder / "herder.toml").write_text(CONFIG.format(db=url, folder=folder))
    store = open_store(url)
    tokens: dict[str, str] = {}
    now = datetime_now()
    for index in range(IDLE_AGENTS):
        label = f"idle-{index:04d}"
        tokens[label] = new_token()
        store.host_insert(HostRecord(label, 16), now)
        store.token_insert(f"host:{label}", Scope.AGENT, token_hash(tokens[label]), now,
                           host=label)
    store.close()
    port = free_port()
    server = start(herder(folder, "server", "--listen", f"127.0.0.1:{port}",
                          "--log-level", "warning"), folder / "s.log")
    try:
        wait_http(f"http://127.0.0.1:{port}")
        base = f"http://127.0.0.1:{port}"

        async def run() -> tuple[dict[str, int], float, float]:
            agents = asyncio.create_task(idle_agents(base, tokens, IDLE_SECONDS + 15))
            await asyncio.sleep(15)  # every agent connected and past its first heartbeat
            before, started = cpu_seconds(server.pid), time.monotonic()
            await asyncio.sleep(IDLE_SECONDS)
            used, elapsed = cpu_seconds(server.pid) - before, time.monotonic() - started
            return await agents, used, elapsed

        counts, used, elapsed = asyncio.run(run())
    finally:
        stop(server)
        drop(backend, url)
    return {"backend": backend, "agents": IDLE_AGENTS, "cores": used / elapsed, **counts}


def main() -> None:
    rows: list[dict[str, Any]] = []
    for backend in BACKENDS:
        if "latency" in PARTS:
            row = latency(backend)
            rows.append({"part": "latency", **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
        if "replica" in PARTS and backend == "postgres":
            row = latency(backend, replicas=2)
            rows.append({"part": "latency", **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
        if "idle" in PARTS:
            row = idle(backend)
            rows.append({"part": "idle", **row})
            print(json.dumps(rows[-1]), file=sys.stderr)
    if os.environ.get("BENCH_JSON"):  # bench/run.sh reads the rows from here
        Path(os.environ["BENCH_JSON"]).write_text(json.dumps(rows, indent=2))
    print("| part | backend | result | target |")
    print("|---|---|---|---|")
    for row in rows:
        if row["part"] == "latency":
            via = "agent" if row["replicas"] == 1 else "agent on a follower replica"
            print(f"| submit→start via {via} | {row['backend']} | p50 {row['p50_ms']:.0f} ms, "
                  f"p99 {row['p99_ms']:.0f} ms, max {row['max_ms']:.0f} ms (n={row['n']}) "
                  "| ~100 ms |")
        else:
            print(f"| idle long-polling agents | {row['backend']} | {row['agents']} agents, "
                  f"server {row['cores']:.2f} cores ({row['polls']} polls, "
                  f"{row['errors']} errors) | ≥ 1,000 at < 1 core |")


if __name__ == "__main__":
    main()
