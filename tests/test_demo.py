"""`herder demo` is what a newcomer runs first: it must work and tell the truth.

The first test reads the demo's own database (kept with `--keep-folder`) and checks what the
demo did: every job ended as designed (done, but one failed and one waiting for its fake usage
limit's reset), on a host that admits its weight, and no host ran more jobs at once than its
worker cap. The others run `--ui --keep`: the sign-in link is printed whatever happens to the
browser or the port, and a signal stops every process the demo started.
"""

from __future__ import annotations

import html
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

from support.cli import ok, run_herder
from support.demo import RunningDemo, headless, leftovers
from support.waits import wait_for

from herder.core.model import JobStatus, Outcome
from herder.store import open_store

# The demo's hosts (label: worker cap) and which of them admit each weight: mid-1 takes up to
# heavy, lap-1 light only, big-1 every weight (the escalation chain is light < heavy <
# playwright < orchestrator).
WORKERS = {"big-1": 3, "mid-1": 2, "lap-1": 1}
ADMITTED = {
    "light": {"big-1", "mid-1", "lap-1"},
    "heavy": {"big-1", "mid-1"},
    "playwright": {"big-1"},
    "orchestrator": {"big-1"},
}
SUBMITTED = {"light": 8, "heavy": 5, "playwright": 3, "orchestrator": 2}


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    points = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    return most


def test_demo_runs_every_job_on_a_host_that_admits_it_within_its_cap(tmp_path: Path) -> None:
    result = ok(run_herder("demo", "--keep-folder", cwd=tmp_path, timeout=120))
    kept = [line for line in result.stdout.splitlines() if line.startswith("kept ")]
    assert len(kept) == 1, result.stdout
    folder = Path(kept[0].split()[1])
    try:
        with open_store(f"sqlite:///{folder}/herder.db") as store:
            jobs = store.job_list(None, 100)
            spans: dict[str, list[tuple[datetime, datetime]]] = defaultdict(list)
            outcomes: dict[int, Outcome | None] = {}
            for job in jobs:
                for attempt in store.attempt_list(job.id):
                    assert attempt.started_at and attempt.ended_at, (job.id, attempt)
                    spans[attempt.host].append((attempt.started_at, attempt.ended_at))
                    outcomes[job.id] = attempt.outcome
            logs = {job.id: (folder / "logs" / str(job.id) / "1.log").read_text()
                    for job in jobs}
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    assert Counter(job.weight for job in jobs) == SUBMITTED
    # Each job printed its progress; one failed and one hit the fake account's usage limit
    # (queued again, for after its reset), as designed.
    assert all(log.count("step ") >= 3 for log in logs.values()), logs
    failed = [job for job in jobs if job.status is JobStatus.FAILED]
    waiting = [job for job in jobs if job.status is JobStatus.QUEUED]
    assert len(failed) == 1 and outcomes[failed[0].id] is Outcome.FAILED, failed
    assert len(waiting) == 1 and outcomes[waiting[0].id] is Outcome.USAGE_BLOCKED, waiting
    assert waiting[0].available_at > datetime.now(UTC)
    assert "usage limit reached" in logs[waiting[0].id]
    done = [job for job in jobs if job.status is JobStatus.DONE]
    assert len(done) == len(jobs) - 2
    misplaced = {job.id: (job.weight, job.host) for job in jobs
                 if job.host not in ADMITTED[job.weight]}
    assert not misplaced, misplaced
    assert set(spans) <= set(WORKERS), spans.keys()
    for host, host_spans in spans.items():
        assert most_at_once(host_spans) <= WORKERS[host], (host, sorted(host_spans))
    # What it printed agrees with its database.
    assert f"{len(done)} done, 1 failed, 1 waiting for a usage limit's reset" in result.stdout
    assert "every host stayed within its worker cap and RAM budget" in result.stdout
    assert "every job ended as designed" in result.stdout
    assert f"$ herder why {waiting[0].id}" in result.stdout
    assert result.stdout.splitlines()[-1] == "watch it in the dashboard: herder demo --ui"


def fake_browser(folder: Path, exit_code: int) -> Path:
    """A BROWSER command that writes its arguments to `opened`, one a line, and exits."""
    script = folder / "browser"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > '{folder}/opened'\n"
                      f"exit {exit_code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_ctrl_c_stops_a_kept_ui_demo_and_all_it_started_when_its_port_was_taken(
        tmp_path: Path) -> None:
    """--ui --keep --keep-folder on a taken --port with a browser at hand: another port,
    the link printed and opened through a private redirect page (the browser's command line
    names the page, never the code); Ctrl-C mid-run stops the server, agents and running
    jobs, and removes the page from the kept folder."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = RunningDemo(tmp_path, "--ui", "--keep", "--keep-folder", "--port", str(port),
                           env=headless(
            {"DISPLAY": ":99", "BROWSER": str(fake_browser(tmp_path, 0))}))
        try:
            link = demo.link()
            folder = demo.folder()
            assert f"port {port} is taken" in demo.output()
            assert f"127.0.0.1:{port}/" not in link
            demo.wait_output("opened in your browser")
            argv = (tmp_path / "opened").read_text().splitlines()
            assert len(argv) == 1 and "login=" not in argv[0], argv
            page = Path(urlparse(argv[0]).path)
            assert argv[0] == page.as_uri() and page.parent == Path(folder), argv
            assert stat.S_IMODE(page.stat().st_mode) == 0o600
            assert stat.S_IMODE(Path(folder).stat().st_mode) == 0o700
            assert f'<meta http-equiv="refresh" content="0;url={html.escape(link)}">' in \
                page.read_text()
            running = wait_for(lambda: [child for child in demo.descendants()
                                        if "agent.sh" in " ".join(child.cmdline())],
                               90, "a job running", demo.output)
            assert running
            before = demo.descendants()
            assert demo.stop(signal.SIGINT) == 130  # mid-run
        finally:
            if demo.process.poll() is None:
                demo.kill()
    assert "stopping the demo's fleet" in demo.output() and "stopped" in demo.output()
    assert not leftovers(folder, []), leftovers(folder, [])
    wait_for(lambda: not leftovers(folder, before), 15, "the demo's processes to end",
             lambda: leftovers(folder, before))
    assert Path(folder, "herder.db").exists() and not page.exists()
    shutil.rmtree(folder)


def test_a_kept_demo_runs_until_ctrl_c_then_stops_everything_and_keeps_its_verdict(
        tmp_path: Path) -> None:
    """--keep without --ui: after the workload the fleet stays up (its server answers) until
    Ctrl-C, which then ends it with the workload's verdict, 0; --keep-folder keeps the
    folder."""
    demo = RunningDemo(tmp_path, "--keep", "--keep-folder", env=headless())
    try:
        folder = demo.folder()
        demo.wait_output("Ctrl-C stops it.", timeout=120)
        assert "every job ended as designed" in demo.output()
        hosts = run_herder("--config", f"{folder}/herder.toml", "hosts", cwd=tmp_path)
        assert hosts.returncode == 0 and "lap-1" in hosts.stdout, hosts
        before = demo.descendants()
        assert len(before) >= 4  # the server and three agents, at least
        assert demo.stop(signal.SIGINT) == 0
    finally:
        if demo.process.poll() is None:
            demo.kill()
    assert not leftovers(folder, []), leftovers(folder, [])
    wait_for(lambda: not leftovers(folder, before), 15, "the demo's processes to end",
             lambda: leftovers(folder, before))
    assert Path(folder, "herder.db").exists()
    assert demo.output().splitlines()[-1] == "watch it in the dashboard: herder demo --ui"
    shutil.rmtree(folder)


def open_browser_in(environment: dict[str, str], folder: Path) -> str:
    """What the demo's `open_browser` says in a process with this environment (Python's
    webbrowser module reads its environment once per process), its redirect page in a new
    folder under `folder`."""
    return subprocess.run(
        [sys.executable, "-c", "import tempfile, pathlib; "
         "from herder.cli.demo import open_browser; "
         "print(open_browser('http://127.0.0.1:1/ui/?login=x', "
         f"pathlib.Path(tempfile.mkdtemp(dir={str(folder)!r}))))"],
        env=environment, capture_output=True, text=True, check=True, timeout=60).stdout


def test_without_a_display_or_a_working_browser_the_demo_says_to_open_the_link(
        tmp_path: Path) -> None:
    assert "no display here" in open_browser_in(headless(), tmp_path)
    failing = fake_browser(tmp_path, 1)
    assert "the browser did not start" in open_browser_in(
        headless({"DISPLAY": ":99", "BROWSER": str(failing)}), tmp_path)
    assert "the browser did not start" in open_browser_in(
        headless({"DISPLAY": ":99", "BROWSER": str(tmp_path / "missing")}), tmp_path)
    assert "no browser found" in open_browser_in(headless({"DISPLAY": ":99", "PATH": ""}),
                                                 tmp_path)
