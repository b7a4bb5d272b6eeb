"""Run every benchmark once, collect the figures, write bench/RESULTS.md.

Called by `bench/run.sh` (which sets up the peers' venv first); see bench/README.md.

    .venv/bin/python bench/run_results.py [--quick] [--only store,cancel] [--output PATH]
    .venv/bin/python bench/run_results.py --report-only bench/results/run-<stamp>.json

Each part runs as its own process with its knobs in the environment (QUICK and FULL below),
writes its figures to a file in a scratch folder, and is stopped if it outlives its time
limit; a part that fails or times out is reported as such in its section and the others go
on. The collected figures go to bench/results/run-<stamp>.json, from which `--report-only`
renders the page again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import results_report

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PYTHON = sys.executable
POSTGRES = os.environ.get("HERDER_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
PEERS_VENV = Path(os.environ.get("VENV", "/tmp/peers-venv"))
PEER_DATABASES = ("rawq", "pgqueuer", "procrastinate", "herder_bench")


def shared_bench() -> Path:
    """The peers' scripts: $SHARED_BENCH, or ../shared/bench next to the main checkout."""
    if os.environ.get("SHARED_BENCH"):
        return Path(os.environ["SHARED_BENCH"]).resolve()
    candidates = [REPO.parent / "shared" / "bench"]
    common = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute",
                             "--git-common-dir"], capture_output=True, text=True, check=False)
    if common.returncode == 0:
        candidates.append(Path(common.stdout.strip()).parent.parent / "shared" / "bench")
    return next((path for path in candidates if (path / "common.py").exists()), candidates[0])


SHARED = shared_bench()


@dataclass(frozen=True)
class Knobs:
    """One mode's settings: environment per part and time limits in seconds."""

    environment: dict[str, dict[str, str]]
    limits: dict[str, float]


QUICK = Knobs(
    environment={
        "store": {"BATCHES": "10", "CLAIM_CLIENTS": "1", "REPS": "3", "RAW_SECONDS": "3",
                  "ENQ_SECONDS": "1", "SQLITE_SYNCS": "full"},
        "pgbench": {"CLAIM_CLIENTS": "1", "ENQ_CLIENTS": "1", "REPS": "1", "RAW_SECONDS": "3",
                    "PRELOAD": "100000"},
        "pgqueuer": {"PGQ_PARTS": "process", "PGQ_CONFIGS": "0,4", "PGQ_N": "5000",
                     "REPS": "1"},
        "procrastinate": {"PROC_PARTS": "process", "PROC_CONFIGS": "1", "PROC_N": "300",
                          "REPS": "1"},
        "latency_local": {"LATENCY_SAMPLES": "30", "REPS": "1"},
        "fleet": {"LATENCY_SAMPLES": "30"},
        "idle": {"IDLE_AGENTS": "200", "IDLE_SECONDS": "10", "BACKENDS": "sqlite"},
        "cancel": {"SAMPLES": "5"},
        "recovery": {"HEARTBEAT": "1s", "LEASE": "6s", "REPS": "1", "BACKENDS": "sqlite"},
        "placement": {"SIZES": "100x1000,1000x10000,10000x100000", "REPS": "1",
                      "PER_HOST": "0", "STRATEGIES": "best_fit"},
        "cli": {"RUNS": "10", "WARMUP": "2"},
        "chaos": {"HERDER_CHAOS_SECONDS": "60"},
    },
    limits={"store": 300, "pgbench": 150, "pgqueuer": 150, "procrastinate": 150,
            "latency_local": 150, "fleet": 240, "idle": 150, "cancel": 90, "recovery": 240,
            "placement": 240, "cli": 150, "chaos": 420, "simulate": 300},
)
FULL = Knobs(
    environment={
        "store": {"BATCHES": "1,10,100", "CLAIM_CLIENTS": "1,4", "REPS": "3",
                  "RAW_SECONDS": "5", "ENQ_SECONDS": "5", "SQLITE_SYNCS": "full"},
        "pgbench": {"CLAIM_CLIENTS": "1,4", "ENQ_CLIENTS": "1", "REPS": "3",
                    "RAW_SECONDS": "5", "PRELOAD": "600000"},
        "pgqueuer": {"PGQ_PARTS": "process", "PGQ_CONFIGS": "0,4,6", "PGQ_N": "20000",
                     "REPS": "3"},
        "procrastinate": {"PROC_PARTS": "process", "PROC_CONFIGS": "0,1,3", "PROC_N": "1500",
                          "REPS": "3"},
        "latency_local": {"LATENCY_SAMPLES": "200", "REPS": "1"},
        "fleet": {"LATENCY_SAMPLES": "200"},
        "idle": {"IDLE_AGENTS": "1000", "IDLE_SECONDS": "30", "BACKENDS": "sqlite postgres"},
        "cancel": {"SAMPLES": "20"},
        "recovery": {"REPS": "3", "BACKENDS": "sqlite postgres"},
        "placement": {"SIZES": "100x1000,1000x10000,10000x10000,10000x100000", "REPS": "3"},
        "cli": {"RUNS": "30", "WARMUP": "3"},
        "chaos": {"HERDER_CHAOS_SECONDS": "300"},
    },
    limits={"store": 3600, "pgbench": 1200, "pgqueuer": 1200, "procrastinate": 1200,
            "latency_local": 600, "fleet": 1200, "idle": 600, "cancel": 300,
            "recovery": 3600, "placement": 900, "cli": 600, "chaos": 1200, "simulate": 1800},
)


class PartFailed(Exception):
    """A part did not produce its figures; the message says why, for its section."""


@dataclass
class Context:
    scratch: Path
    knobs: Knobs
    name: str = ""

    @property
    def limit(self) -> float:
        return self.knobs.limits.get(self.name, 600)

    def environment(self, **extra: str) -> dict[str, str]:
        url = urlsplit(POSTGRES)
        return {**os.environ, "PGPORT": str(url.port or 5432),
                "PGHOST_BENCH": url.hostname or "127.0.0.1", "SHARED_BENCH": str(SHARED),
                "HERDER_BENCH_POSTGRES": POSTGRES, "VENV": str(PEERS_VENV),
                "HERDER_BENCH_PG_URL": POSTGRES.rsplit("/", 1)[0] + "/herder_bench",
                **self.knobs.environment.get(self.name, {}), **extra}

    def run(self, argv: list[str], cwd: Path = REPO, **extra: str) -> int:
        """Run one command, its output to <part>.log; stopped (its whole group) at the limit."""
        log_path = self.scratch / f"{self.name}.log"
        with open(log_path, "ab") as log:
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            process = subprocess.Popen(argv, cwd=cwd, env=self.environment(**extra),
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            try:
                return process.wait(self.limit)
            except subprocess.TimeoutExpired:
                stop_group(process)
                raise PartFailed(f"stopped after its time limit of {self.limit:.0f} s "
                                 f"(log: {log_path})") from None
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the part's own session goes too
                stop_group(process)
                raise

    def checked(self, argv: list[str], cwd: Path = REPO, **extra: str) -> None:
        code = self.run(argv, cwd, **extra)
        if code != 0:
            raise PartFailed(f"exited {code}: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = (self.scratch / f"{self.name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        last = [line.strip() for line in lines if line.strip()][-1:] or ["(empty log)"]
        return last[0][:300]

    def file(self, suffix: str) -> Path:
        return self.scratch / f"{self.name}.{suffix}"


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the part's process group, SIGKILL if it is still there after 20 s."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def interrupted(*_: object) -> None:
    raise KeyboardInterrupt


def jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise PartFailed("wrote no rows")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def json_file(path: Path) -> Any:
    if not path.exists():
        raise PartFailed("wrote no figures")
    return json.loads(path.read_text())


# -- the parts ---------------------------------------------------------------------------------


def store(context: Context) -> Any:
    rows = context.file("jsonl")
    context.checked([PYTHON, str(BENCH / "herder_bench.py")], HERDER_PARTS="claim raw",
                    PARTS="claim raw", RESULTS=str(rows))
    return [row for row in jsonl(rows) if row["variant"].startswith("claim")]


def peer(script: str, python: Callable[[], str]) -> Callable[[Context], Any]:
    def measure(context: Context) -> Any:
        if not (SHARED / script).exists():
            raise PartFailed(f"no {script} in the shared bench folder {SHARED}")
        rows = context.file("jsonl")
        context.checked([python(), script], SHARED, RESULTS=str(rows))
        return jsonl(rows)
    return measure


def peers_python() -> str:
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        raise PartFailed(f"no peers' venv at {PEERS_VENV} (bench/run.sh creates it)")
    return str(python)


def latency_local(context: Context) -> Any:
    rows = context.file("jsonl")
    context.checked([PYTHON, str(BENCH / "herder_bench.py")], HERDER_PARTS="latency",
                    PARTS="latency", RESULTS=str(rows))
    return [row for row in jsonl(rows) if row["variant"].startswith("latency")]


def bench_json(script: str, **extra: str) -> Callable[[Context], Any]:
    def measure(context: Context) -> Any:
        output = context.file("json")
        context.checked([PYTHON, str(BENCH / script)], BENCH_JSON=str(output), **extra)
        return json_file(output)
    return measure


def chaos(context: Context) -> Any:
    output = context.file("json")
    code = context.run([PYTHON, "-m", "pytest", "-q", "-s", "-p", "no:randomly", "-p",
                        "no:cacheprovider", "tests/chaos/test_chaos.py::test_fleet_under_chaos"],
                       HERDER_CHAOS_REPORT=str(output))
    if not output.exists():
        raise PartFailed(f"pytest exited {code} without figures: {context.log_tail()}")
    return json_file(output)


# -- SIMULATOR SECTION (herder simulate) -------------------------------------------------------
def simulate(context: Context) -> Any:
    """Every published trace (a folder of bench/traces/ holding herder.toml, fleet.toml and
    trace.csv; only $SIMULATE_TRACE if set) through `herder simulate --json`, timed."""
    traces_dir = BENCH / "traces"
    wanted = os.environ.get("SIMULATE_TRACE")
    traces = sorted(path for path in traces_dir.glob("*") if (path / "trace.csv").is_file()
                    and (not wanted or path.name == wanted)) if traces_dir.is_dir() else []
    if not traces:
        raise PartFailed(f"no trace in {traces_dir.relative_to(REPO)}")
    found: dict[str, Any] = {}
    for trace in traces:
        output = context.scratch / f"simulate-{trace.name}.json"
        started = time.perf_counter()
        code = subprocess.run(
            [PYTHON, "-m", "herder.cli", "--config", "herder.toml", "simulate", "--fleet",
             "fleet.toml", "--trace", "trace.csv", "--json", str(output)],
            cwd=trace, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            timeout=context.limit, check=False).returncode
        if code != 0:
            raise PartFailed(f"`herder simulate` on {trace.name} exited {code}")
        figures = json.loads(output.read_text())["herder.toml"]
        figures.pop("fleet_timeline", None)  # the page reads the totals, not the curves
        figures.pop("hosts", None)
        found[trace.name] = {"figures": figures, "wall_s": time.perf_counter() - started}
    return found
# -- end of SIMULATOR SECTION ------------------------------------------------------------------


PARTS: dict[str, Callable[[Context], Any]] = {
    "store": store,
    "pgbench": peer("raw_pg.py", lambda: "python3"),
    "pgqueuer": peer("bench_pgqueuer.py", peers_python),
    "procrastinate": peer("bench_procrastinate.py", peers_python),
    "latency_local": latency_local,
    "fleet": bench_json("fleet_bench.py", PARTS="latency replica",
                        BACKENDS="sqlite postgres"),
    "idle": bench_json("fleet_bench.py", PARTS="idle"),
    "cancel": bench_json("cancel_bench.py"),
    "recovery": bench_json("recovery_bench.py"),
    "placement": bench_json("placement_bench.py"),
    "cli": bench_json("cli_bench.py", BREAKDOWN="0"),
    "chaos": chaos,
    "simulate": simulate,
}
"""Every part, in the order they run: the throughput parts first, on a box not yet warmed by
the fleets."""


# -- the header --------------------------------------------------------------------------------


def output_of(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def machine() -> str:
    model = ""
    try:
        model = next((line.split(":", 1)[1].strip() for line in
                      Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
        memory = next(int(line.split()[1]) for line in
                      Path("/proc/meminfo").read_text().splitlines()
                      if line.startswith("MemTotal"))
    except (OSError, StopIteration, ValueError):
        memory = 0
    return (f"{os.cpu_count()} cores{f' ({model})' if model else ''}, "
            f"{memory / 2**20:.0f} GiB RAM, {platform.system()} {platform.release()}")


def versions() -> dict[str, str]:
    found = {
        "herder": output_of(["git", "-C", str(REPO), "describe", "--always", "--dirty"])
        or "unknown",
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
    }
    try:
        import psycopg

        found["psycopg"] = psycopg.__version__
        with psycopg.connect(POSTGRES, connect_timeout=5) as connection:
            row = connection.execute("SHOW server_version").fetchone()
            found["postgresql"] = str(row[0]) if row else "?"
    except Exception as error:  # the header says so; the parts report their own failures
        found["postgresql"] = f"unreachable ({type(error).__name__})"
    pgbench = output_of(["pgbench", "--version"])
    if pgbench:
        found["pgbench"] = pgbench.split()[2] if len(pgbench.split()) > 2 else pgbench
    freeze = output_of([str(PEERS_VENV / "bin" / "python"), "-m", "pip", "freeze"])
    for line in freeze.splitlines():
        name, _, version = line.partition("==")
        if name.lower() in ("pgqueuer", "procrastinate", "asyncpg"):
            found[name.lower()] = version
    return found


def prepare_postgres() -> None:
    """The peers' databases on the benchmark server, created when missing."""
    import psycopg

    with psycopg.connect(POSTGRES, autocommit=True, connect_timeout=5) as connection:
        for name in PEER_DATABASES:
            if not connection.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                      (name,)).fetchone():
                connection.execute(f"CREATE DATABASE {name}".encode())


# -- main --------------------------------------------------------------------------------------


def run_all(knobs: Knobs, names: list[str], scratch: Path,
            checkpoint: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every part in turn; the figures so far go to `checkpoint` after each, so a run cut
    short (a timeout, Ctrl-C) keeps what it measured (`--report-only` renders it)."""
    parts: dict[str, Any] = {}
    for name in names:
        started = time.monotonic()
        say(f"== {name} (limit {knobs.limits.get(name, 600):.0f} s)")
        try:
            data = PARTS[name](Context(scratch, knobs, name))
            parts[name] = {"ok": True, "data": data}
        except PartFailed as failure:
            parts[name] = {"ok": False, "error": str(failure)}
        except Exception as error:  # one broken part must not cost the others their figures
            parts[name] = {"ok": False, "error": f"{type(error).__name__}: {error}"}
        parts[name]["seconds"] = round(time.monotonic() - started, 1)
        state = "ok" if parts[name]["ok"] else f"FAILED: {parts[name]['error']}"
        say(f"   {name}: {state} ({parts[name]['seconds']:.0f} s)")
        checkpoint(parts)
    return parts


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, ~10 minutes")
    parser.add_argument("--only", default="", help=f"comma-separated parts of {list(PARTS)}")
    parser.add_argument("--output", default=str(BENCH / "RESULTS.md"))
    parser.add_argument("--report-only", metavar="MEASUREMENTS",
                        help="render the page again from a run's saved figures")
    arguments = parser.parse_args()
    signal.signal(signal.SIGTERM, interrupted)
    if arguments.report_only:
        measurements = json.loads(Path(arguments.report_only).read_text())
        Path(arguments.output).write_text(results_report.render(measurements))
        say(f"wrote {arguments.output}")
        return
    names = [name for name in arguments.only.replace(" ", ",").split(",") if name] or list(PARTS)
    unknown = [name for name in names if name not in PARTS]
    if unknown:
        parser.error(f"unknown part(s) {unknown}; choose from {list(PARTS)}")
    knobs = QUICK if arguments.quick else FULL
    command = "bench/run.sh" + (" --quick" if arguments.quick else "") + (
        f" --only {','.join(names)}" if arguments.only else "")
    stamp = datetime.now(UTC)
    meta: dict[str, Any] = {"date": stamp.strftime("%Y-%m-%d %H:%M UTC"),
                            "mode": "quick" if arguments.quick else "full",
                            "command": command, "machine": machine(),
                            "cores": os.cpu_count(), "load_before": list(os.getloadavg()),
                            "versions": versions(), "shared_bench": str(SHARED)}
    try:
        prepare_postgres()
    except Exception as error:
        say(f"PostgreSQL at {POSTGRES} not ready ({error}); its parts will say so")
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="herder-bench-run-"))
    say(f"logs of the parts in {scratch}")
    saved = BENCH / "results" / f"run-{stamp.strftime('%Y%m%d-%H%M%S')}.json"
    saved.parent.mkdir(exist_ok=True)

    def checkpoint(parts: dict[str, Any]) -> None:
        meta.update(load_after=list(os.getloadavg()),
                    elapsed_s=round(time.monotonic() - started))
        partial = saved.with_suffix(".json.part")
        partial.write_text(json.dumps({"meta": meta, "parts": parts}, indent=1))
        partial.replace(saved)

    parts = run_all(knobs, names, scratch, checkpoint)
    measurements = {"meta": meta, "parts": parts}
    Path(arguments.output).write_text(results_report.render(measurements))
    say(f"figures in {saved}; wrote {arguments.output}")


if __name__ == "__main__":
    main()
