"""`herder demo` as a running process a test watches, signals, and checks for leftovers."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import psutil

from support.cli import herder_argv
from support.environment import clean_environment
from support.waits import wait_for

DISPLAY_VARIABLES = ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER")
PLACED = re.compile(r"job +(\d+) +(\w+) +-> +(\S+)")


def headless(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment without a display or a chosen browser, plus `extra`."""
    environment = {name: value for name, value in clean_environment().items()
                   if name not in DISPLAY_VARIABLES}
    environment.update(extra or {})
    return environment


class RunningDemo:
    """A `herder demo` process started in `folder` (its output in a file there)."""

    def __init__(self, folder: Path, *args: str, env: Mapping[str, str]) -> None:
        self.printed = folder / "demo.stdout"
        with open(self.printed, "wb") as stdout:
            self.process = subprocess.Popen(herder_argv("demo", *args), cwd=folder, env=env,
                                            stdout=stdout, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.printed.read_text(errors="replace")

    def wait_output(self, text: str, timeout: float = 90) -> str:
        wait_for(lambda: text in self.output() or self.process.poll() is not None, timeout,
                 f"{text!r} in the demo's output", self.output)
        assert text in self.output(), self.output()
        return self.output()

    def link(self) -> str:
        printed = self.wait_output("?login=")
        return next(word for word in printed.split() if "?login=" in word)

    def folder(self) -> str:
        return self.wait_output("demo folder ").split("demo folder ", 1)[1].split()[0]

    def placed(self) -> list[tuple[int, str, str]]:
        """(job id, weight, host) of each placement printed so far, in order."""
        return [(int(found[1]), found[2], found[3])
                for found in PLACED.finditer(self.output())]

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)

    def stop(self, number: signal.Signals, timeout: float = 90) -> int:
        """Signal the demo (as Ctrl-C or a service manager would) and wait for its exit."""
        os.kill(self.process.pid, number)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo did not stop\n{self.output()}") from None

    def kill(self) -> None:
        """For a failed test: the demo and everything it started."""
        for process in [*self.descendants(), psutil.Process(self.process.pid)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.process.wait()


def leftovers(folder: str, before: list[psutil.Process]) -> list[str]:
    """Processes still alive that the demo started (`before`, seen while it ran) or that
    name its folder (a server, an agent, a job's script)."""
    alive = [process for process in before if process.is_running()
             and process.status() != psutil.STATUS_ZOMBIE]
    for process in psutil.process_iter(["cmdline"]):
        if any(folder in part for part in process.info["cmdline"] or ()):
            alive.append(process)
    found: list[str] = []
    for process in alive:
        try:
            found.append(f"{process.pid} {' '.join(process.cmdline())}")
        except psutil.Error:
            continue
    return found
