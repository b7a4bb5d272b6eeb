"""The README's picture: the dashboard of `herder demo --ui --keep` in the middle of its run.

Starts the demo (no browser of its own), signs a headless chromium in with the link the demo
prints, waits until the designed failure has happened (its alert shows) while the hosts
are busy, writes the fleet view to docs/images/demo-dashboard.png (or
the path given), then stops the demo with Ctrl-C's signal.

    .venv/bin/python bench/demo_screenshot.py [PATH]
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = "/usr/bin/chromium"
DEADLINE = 180.0


def wait_output(printed: Path, text: str, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline and process.poll() is None:
        output = printed.read_text(errors="replace")
        if text in output:
            return output
        time.sleep(0.2)
    raise SystemExit(f"the demo never printed {text!r}:\n{printed.read_text()}")


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs/images/demo-dashboard.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("HERDER_")}
    with tempfile.TemporaryDirectory() as folder:
        printed = Path(folder) / "demo.stdout"
        with open(printed, "wb") as stdout:
            demo = subprocess.Popen([sys.executable, "-m", "herder.cli", "demo", "--ui",
                                     "--keep", "--no-browser"], cwd=folder, env=environment,
                                    stdout=stdout, stderr=subprocess.STDOUT)
        try:
            output = wait_output(printed, "?login=", demo)
            link = next(word for word in output.split() if "?login=" in word)
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM)
                page = browser.new_page(viewport={"width": 1280, "height": 470})
                page.goto(link)
                wait_output(printed, "failed (as designed)", demo)
                page.locator("#alerts .alert").first.wait_for(timeout=30_000)
                time.sleep(1.5)  # the live view's next refresh: the counts catch up
                page.screenshot(path=str(target), full_page=True)
                browser.close()
        finally:
            demo.send_signal(signal.SIGINT)
            demo.wait(60)
    print(f"wrote {target} ({target.stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
