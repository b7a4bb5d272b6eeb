"""`herder demo`: a fleet on one machine in under a minute.

A server on a throwaway SQLite database, three agents posing as hosts of different sizes,
and a mixed workload of jobs of several weights that print their progress: one of them fails
and one hits a (fake) usage limit, as real work does. It prints each placement and ending as
it happens and a summary per host, then stops everything. With `ui` the server serves the
dashboard and prints a one-time sign-in link (`herder server --sign-in-link`), which the demo
passes on and opens in a browser where there is one (through a private redirect file, never
on a command line), and the jobs run slowly enough to watch; with `keep` the fleet stays up
until Ctrl-C (SIGINT or SIGTERM).
"""

from __future__ import annotations

import contextlib
import html
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import webbrowser
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import IO

import msgspec
import psutil

from herder.client import Client
from herder.core.model import RAM_TOLERANCE_GB, Job, JobStatus, Outcome
from herder.core.scheduling.capacity import bookable_gb
from herder.core.signin import CODE_SECONDS
from herder.store import Store, open_store

INTERRUPTED = 130
"""The exit status of a demo stopped by Ctrl-C or SIGTERM, as a shell reports SIGINT."""
LINK_WAIT = 60.0
"""How long the server may take to start listening and print its sign-in link."""


class DemoError(Exception):
    """The demo could not start its fleet (the reason is the message)."""


class DemoHost(msgspec.Struct, frozen=True):
    label: str
    ram_gb: float
    workers: int
    max_weight: str | None
    note: str


class Pace(msgspec.Struct, frozen=True):
    """How fast the jobs go: a progress line every `pause` seconds, `scale` times the
    workload's steps. Quick for the plain demo, slow enough to watch with --ui."""

    pause: float
    scale: int
    timeout: float


class DemoJob(msgspec.Struct, frozen=True):
    weight: str
    steps: int
    ending: str
    """ok, fail (exits 1: a failed job and its alert) or limit (prints a usage limit)."""


HOSTS = (
    DemoHost("big-1", 40, 3, None, "big server: every weight"),
    DemoHost("mid-1", 16, 2, "heavy", "small VPS: up to heavy"),
    DemoHost("lap-1", 8, 1, "light", "laptop: light only"),
)
WORKLOAD = (  # (weight, steps, count); the first job of a weight below may end otherwise
    ("light", 3, 8),
    ("heavy", 5, 5),
    ("playwright", 3, 3),
    ("orchestrator", 6, 2),
)
ENDINGS = {("light", 2): "fail", ("heavy", 1): "limit"}
"""(weight, index within it) -> how that job ends; every other job ends ok."""
QUICK = Pace(pause=0.3, scale=1, timeout=50.0)
WATCHABLE = Pace(pause=1.0, scale=2, timeout=240.0)
LIMIT_LINE = "demo account: usage limit reached, it resets in one hour"
CONFIG = """\
[herder]
db = "sqlite:///{folder}/herder.db"
log_dir = "{folder}/logs"
[runtime]
heartbeat_interval = "0.5s"
attempt_lease = "5s"
kill_grace = "1s"
poll_interval = "0.2s"
adopt_grace = "0s"  # a stopped agent's jobs end with it: no next agent comes to adopt them
[fleet]
scheduler_interval = "0.2s"

[job_types.agent]
description = "a stand-in for an AI coding agent: prints its progress, then ends as told"
command = ["sh", "{folder}/agent.sh", "{{steps}}", "{{pause}}", "{{ending}}"]
preflight = false
# The fake account's words: this line means a usage limit (a wait for its reset).
patterns = [{{outcome = "usage_blocked", regex = "demo account: usage limit reached"}}]
"""
AGENT_SCRIPT = f"""\
#!/bin/sh
# herder demo: a stand-in for an agent. Prints a progress line every $2 seconds, $1 times,
# then ends as $3 says: ok, fail (exit 1) or limit (a usage limit's words, exit 1).
steps=$1 pause=$2 ending=$3 step=1
echo "working on job $HERDER_JOB_ID (attempt $HERDER_ATTEMPT)"
while [ "$step" -le "$steps" ]; do
    echo "step $step of $steps: thinking, editing, testing"
    sleep "$pause"
    step=$((step + 1))
done
case "$ending" in
    fail) echo "error: the tests still fail after $steps steps; giving up" >&2; exit 1 ;;
    limit) echo "{LIMIT_LINE}" >&2; exit 1 ;;
esac
echo "done: every test passes"
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _herder(folder: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "herder.cli", "--config", str(folder / "herder.toml"), *args]


REDIRECT_FILE = "open-dashboard.html"
"""The page in the demo's folder that sends a browser on to the sign-in link."""
REDIRECT_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0;url={attribute}">
<title>herder demo: opening the dashboard</title>
</head>
<body><p>Opening <a href="{attribute}">the herder dashboard</a>.</p></body>
</html>
"""


def write_redirect(link: str, folder: Path) -> Path:
    """A page (mode 0600, in the demo's 0700 folder) that sends a browser on to `link`.
    The browser is started with this file's path: a command line is readable by every
    user of the machine (/proc/PID/cmdline), and the code in the link signs in once."""
    path = folder / REDIRECT_FILE
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w") as page:
        page.write(REDIRECT_PAGE.format(attribute=html.escape(link, quote=True)))
    return path


def open_browser(link: str, folder: Path, environ: Mapping[str, str] = os.environ,
                 platform: str = sys.platform) -> str:
    """Open `link` in this machine's browser where there is one, through a redirect page in
    `folder` (write_redirect: the link never goes on a command line); what happened, for
    the line the demo prints. Never raises: the demo goes on with the printed link. No
    display (and no BROWSER chosen) means no try, or Python would start a text browser in
    this terminal."""
    if not (platform == "darwin" or environ.get("DISPLAY") or environ.get("WAYLAND_DISPLAY")
            or environ.get("BROWSER")):
        return "no display here: open the link in a browser on this machine"
    try:
        page = write_redirect(link, folder)
        browser = webbrowser.get()
        opened = browser.open(page.as_uri())
    except (webbrowser.Error, OSError):
        return "no browser found: open the link in a browser on this machine"
    return ("opened in your browser" if opened
            else "the browser did not start: open the link in a browser on this machine")


def run_demo(echo: Callable[[str], None], keep: bool = False, keep_folder: bool = False,
             ui: bool = False, port: int = 0, browser: bool = True) -> int:
    """Run the demo; its exit status (0: everything behaved as designed)."""
    with _stopped_by_signals():
        try:
            status = _run(echo, keep, keep_folder, ui, port, browser)
        except KeyboardInterrupt:
            echo("stopped")
            return INTERRUPTED
        except DemoError as exc:
            echo(f"herder demo: {exc}")
            return 1
    echo("\n" + ("watch it in the dashboard: herder demo --ui" if not ui
                 else "the fleet stopped with the demo; herder demo --ui --keep keeps it "
                      "running until Ctrl-C" if not keep
                 else "the fleet stopped; herder demo --ui runs it again"))
    return status


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGINT (Ctrl-C) and SIGTERM end the demo through its cleanup (children stopped, the
    folder removed unless kept). Both handlers are set here: a shell starts a background
    job with SIGINT ignored, and Python then leaves it so."""
    def interrupt(_number: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, interrupt)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _run(echo: Callable[[str], None], keep: bool, keep_folder: bool, ui: bool, port: int,
         browser: bool) -> int:
    pace = WATCHABLE if ui else QUICK
    folder = Path(tempfile.mkdtemp(prefix="herder-demo-"))
    (folder / "herder.toml").write_text(CONFIG.format(folder=folder))
    (folder / "agent.sh").write_text(AGENT_SCRIPT)
    agents: list[subprocess.Popen[bytes]] = []
    servers: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    echo(f"demo folder {folder}")
    try:
        tokens = _add_hosts(folder, echo)
        if port and not _port_free(port):
            chosen = _free_port()
            echo(f"port {port} is taken: the demo's server listens on {chosen} instead")
            port = chosen
        port = port or _free_port()
        url = f"http://127.0.0.1:{port}"
        with open(folder / "processes.log", "ab") as output:
            server = _start_server(folder, port, ui, output)
            servers.append(server)
            link = _read_link(server, folder) if ui else None
            for host in HOSTS:
                agents.append(subprocess.Popen(
                    _herder(folder, "agent", "--server", url, "--host", host.label,
                            "--no-ram-check", "--log-dir", str(folder / "agent-logs" / host.label)),
                    stdout=output, stderr=output, start_new_session=True,
                    env={**os.environ, "HERDER_AGENT_TOKEN": tokens[host.label]}))
        if link is not None:
            echo(f"\ndashboard: {link}")
            opened = (open_browser(link, folder) if browser
                      else "open it in a browser on this machine")
            echo(f"  (this link signs in once, within {CODE_SECONDS // 60} minutes; {opened})")
        echo(f"server {url}, 3 agents; submitting {sum(c for _, _, c in WORKLOAD)} jobs\n")
        store = open_store(f"sqlite:///{folder}/herder.db")
        try:
            status = _watch(store, folder, echo, started, pace)
        finally:
            store.close()
        if keep:
            try:
                _stay(echo, folder, link, [*servers, *agents], keep_folder)
            except KeyboardInterrupt:  # the way a kept fleet ends: the workload's verdict
                echo("\nstopping the demo's fleet")
        return status
    except KeyboardInterrupt:
        echo("\nstopping the demo's fleet")
        raise
    finally:
        _stop_fleet(agents, servers, folder)
        (folder / REDIRECT_FILE).unlink(missing_ok=True)  # its code is dead with the server
        if keep_folder:
            echo(f"\nkept {folder} (herder --config {folder}/herder.toml jobs)")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _add_hosts(folder: Path, echo: Callable[[str], None]) -> dict[str, str]:
    tokens: dict[str, str] = {}
    for host in HOSTS:
        args = ["host", "add", host.label, "--ram", str(host.ram_gb),
                "--prime-workers", str(host.workers), "--night-workers", str(host.workers)]
        if host.max_weight:
            args += ["--prime-max-weight", host.max_weight, "--night-max-weight", host.max_weight]
        result = subprocess.run(_herder(folder, *args), capture_output=True, text=True,
                                check=True)
        tokens[host.label] = result.stdout.strip()
        bookable = bookable_gb(host.ram_gb, 0.0)
        echo(f"host {host.label:<6} {host.ram_gb:>4.0f} GB ({bookable:.1f} bookable), "
             f"{host.workers} worker(s) — {host.note}")
    return tokens


def _start_server(folder: Path, port: int, ui: bool, output: IO[bytes]
                  ) -> subprocess.Popen[bytes]:
    """The server; with `ui`, its standard output is a pipe the sign-in link comes through
    (never a file or an argument)."""
    args = ["server", "--listen", f"127.0.0.1:{port}"] + (["--sign-in-link"] if ui else [])
    return subprocess.Popen(_herder(folder, *args), stdout=subprocess.PIPE if ui else output,
                            stderr=output, start_new_session=True)


def _read_link(server: subprocess.Popen[bytes], folder: Path) -> str:
    """The link the server prints once listening. Its output is read to the end on a
    thread of its own, so the server never blocks on a full pipe."""
    assert server.stdout is not None
    lines: queue.Queue[str] = queue.Queue()

    def read(stream: IO[bytes]) -> None:
        for raw in stream:
            lines.put(raw.decode(errors="replace"))

    threading.Thread(target=read, args=(server.stdout,), name="herder-demo-server-output",
                     daemon=True).start()
    deadline = time.monotonic() + LINK_WAIT
    while time.monotonic() < deadline and server.poll() is None:
        with contextlib.suppress(queue.Empty):
            line = lines.get(timeout=0.2)
            link = next((word for word in line.split() if "?login=" in word), None)
            if link is not None:
                return link
    raise DemoError(f"its server did not start (see {folder}/processes.log)")


def _stay(echo: Callable[[str], None], folder: Path, link: str | None,
          children: list[subprocess.Popen[bytes]], keep_folder: bool) -> None:
    """Keep the fleet up until Ctrl-C or SIGTERM (a KeyboardInterrupt), or a child ends."""
    watch = (f"the dashboard ({link.partition('?')[0]})" if link is not None
             else f"herder --config {folder}/herder.toml jobs")
    echo(f"\nthe fleet keeps running; watch it with {watch}.")
    echo("Ctrl-C stops it" + ("." if keep_folder else
                              f" and removes {folder} (--keep-folder keeps it)."))
    while all(child.poll() is None for child in children):
        time.sleep(0.5)
    echo("a process of the demo's fleet ended on its own; stopping the rest")


def _stop_fleet(agents: list[subprocess.Popen[bytes]], servers: list[subprocess.Popen[bytes]],
                folder: Path) -> None:
    """Stop every process the demo started, and wait for each: the agents first, then what
    they leave behind a moment (their guardians, in sessions of their own, end the agents'
    jobs and report to the server), then the server; what is left after a while is killed.
    Ctrl-C again meanwhile is ignored, so nothing is left behind."""
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGINT, signal.SIGTERM):  # _stopped_by_signals restores them
            signal.signal(number, signal.SIG_IGN)
    family = _family(folder, [*agents, *servers])
    _signal_groups(agents, signal.SIGTERM)
    _wait(agents, 15)
    _wait([process for process in family if process.pid not in {server.pid for server in servers}],
          15)
    _signal_groups(servers, signal.SIGTERM)
    _wait(servers, 15)
    _signal_groups([*agents, *servers], signal.SIGKILL)
    left = [process for process in [*family, *_family(folder, [])] if _alive(process)]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    for popen in [*agents, *servers]:
        popen.wait()


def _family(folder: Path, started: list[subprocess.Popen[bytes]]) -> list[psutil.Process]:
    """The demo's processes and their descendants, and any process naming the demo's folder
    (a guardian whose agent has ended, a job's script). Not a browser the demo opened (its
    command line names the redirect page in the folder): it is the user's now."""
    found: dict[int, psutil.Process] = {}
    for popen in started:
        with contextlib.suppress(psutil.Error):
            process = psutil.Process(popen.pid)
            for member in [process, *process.children(recursive=True)]:
                found[member.pid] = member
    for process in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            named = " ".join(process.info["cmdline"] or ())
            if str(folder) in named and REDIRECT_FILE not in named:
                found.setdefault(process.pid, process)
    found.pop(os.getpid(), None)
    return list(found.values())


def _signal_groups(processes: list[subprocess.Popen[bytes]], number: signal.Signals) -> None:
    """`number` to each process's group (each started a session of its own)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, number)


def _wait(processes: list[subprocess.Popen[bytes]] | list[psutil.Process],
          seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for process in processes:
        while _alive(process) and time.monotonic() < deadline:
            time.sleep(0.05)


def _alive(process: subprocess.Popen[bytes] | psutil.Process) -> bool:
    if isinstance(process, subprocess.Popen):
        return process.poll() is None
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _jobs(pace: Pace) -> list[DemoJob]:
    return [DemoJob(weight, steps * pace.scale, ENDINGS.get((weight, index), "ok"))
            for weight, steps, count in WORKLOAD for index in range(count)]


def _watch(store: Store, folder: Path, echo: Callable[[str], None], started: float,
           pace: Pace) -> int:
    planned: dict[int, DemoJob] = {}
    with Client(config=folder / "herder.toml") as client:
        for job in _jobs(pace):
            submitted = client.submit(
                "agent", payload={"steps": str(job.steps), "pause": str(pace.pause),
                                  "ending": job.ending},
                weight=job.weight, max_attempts=1, workdir=str(folder))
            planned[submitted.job_id] = job
        placed: set[int] = set()
        ended: set[int] = set()
        deadline = time.monotonic() + pace.timeout
        while time.monotonic() < deadline:
            jobs = [found for found in map(store.job_get, planned) if found is not None]
            for found in jobs:
                elapsed = f"  +{time.monotonic() - started:5.1f}s  job {found.id:>2} "
                if found.host and found.id not in placed:
                    placed.add(found.id)
                    echo(f"{elapsed}{found.weight:<12} -> {found.host}")
                ending = _ending(store, found)
                if ending is not None and ending != "done" and found.id not in ended:
                    ended.add(found.id)
                    echo(f"{elapsed}{ending} (as designed)")
            if all(_ending(store, found) is not None for found in jobs):
                break
            time.sleep(0.1)
        return _summary(store, client, planned, echo, started)


def _ending(store: Store, job: Job) -> str | None:
    """How a job has ended so far: done, failed, or waiting for its usage limit's reset;
    None while it still runs or waits for a worker."""
    if job.status.terminal:
        return str(job.status)
    if job.status is JobStatus.QUEUED and job.attempt > 0 and any(
            attempt.outcome is Outcome.USAGE_BLOCKED for attempt in store.attempt_list(job.id)):
        return "hit a usage limit: waits for its reset"
    return None


def _summary(store: Store, client: Client, planned: dict[int, DemoJob],
             echo: Callable[[str], None], started: float) -> int:
    per_host: dict[str, list[tuple[datetime, datetime, float]]] = defaultdict(list)
    endings: dict[str, int] = defaultdict(int)
    as_designed = True
    limited: int | None = None
    for job_id, plan in planned.items():
        job = store.job_get(job_id)
        if job is None:
            continue
        ending = _ending(store, job) or str(job.status)
        endings["waiting for a usage limit's reset" if ending.startswith("hit") else ending] += 1
        expected = {"ok": "done", "fail": "failed"}.get(plan.ending, "hit")
        as_designed = as_designed and ending.startswith(expected)
        if plan.ending == "limit":
            limited = job_id
        for attempt in store.attempt_list(job_id):
            if attempt.started_at and attempt.ended_at:
                per_host[attempt.host].append((attempt.started_at, attempt.ended_at,
                                               job.ram_gb))
    echo("\nhost    jobs  peak workers  peak booked")
    within = True
    for host in HOSTS:
        spans = per_host.get(host.label, [])
        peak_workers, peak_gb = _peaks(spans)
        bookable = bookable_gb(host.ram_gb, 0.0)
        within = within and peak_workers <= host.workers and peak_gb <= bookable + RAM_TOLERANCE_GB
        echo(f"{host.label:<7} {len(spans):>4}  {peak_workers:>5}/{host.workers:<6} "
             f"{peak_gb:>5.1f}/{bookable:.1f} GB")
    summary = ", ".join(f"{count} {ending}" for ending, count in sorted(endings.items()))
    elapsed = time.monotonic() - started
    echo(f"\n{summary} in {elapsed:.1f}s")
    echo("every host stayed within its worker cap and RAM budget" if within
         else "A HOST RAN PAST ITS CAP OR BUDGET")
    echo("every job ended as designed (one fails, one hits a fake usage limit)" if as_designed
         else "A JOB DID NOT END AS DESIGNED")
    if limited is not None:
        echo(f"\n$ herder why {limited}")
        echo("\n".join(f"  {line}" for line in client.why(limited).splitlines()))
    return 0 if within and as_designed else 1


def _peaks(spans: list[tuple[datetime, datetime, float]]) -> tuple[int, float]:
    points: list[tuple[datetime, int, float]] = []
    for start, end, gb in spans:
        points.append((start, 1, gb))
        points.append((end, -1, -gb))
    points.sort(key=lambda p: (p[0], p[1]))
    workers, booked, peak_workers, peak_gb = 0, 0.0, 0, 0.0
    for _, delta, gb in points:
        workers += delta
        booked += gb
        peak_workers = max(peak_workers, workers)
        peak_gb = max(peak_gb, booked)
    return peak_workers, peak_gb
