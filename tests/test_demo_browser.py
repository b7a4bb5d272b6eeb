"""`herder demo --ui --keep` in a real headless browser (Debian's chromium, driven by
Playwright): the redirect page the demo opens its browser on (a fake BROWSER hands its path
over) leads to the link, which signs in; the fleet view shows the demo's three hosts, a
running job's log grows on its page, and SIGTERM stops every process the demo started.
Skipped only when chromium is not installed (`.ci/run` installs it)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright
from support.demo import RunningDemo, headless, leftovers
from support.waits import wait_for
from test_demo import fake_browser

CHROMIUM = Path("/usr/bin/chromium")
WAIT = 45_000  # ms: generous, for a loaded 2-core machine
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(),
                                 reason="chromium is not installed (apt-get install chromium)")]


def steps_shown(page: Page) -> int:
    return int(page.locator("#log").inner_text().count("step "))


def watch_a_log_grow(page: Page, demo: RunningDemo, base: str) -> None:
    """Open the page of the job placed last and see its log gain a line without a reload;
    a job that ends before that (a loaded machine) hands over to the next one placed."""
    deadline = time.monotonic() + 120
    tried: set[int] = set()
    while time.monotonic() < deadline:
        placed = [job_id for job_id, _, _ in demo.placed() if job_id not in tried]
        if not placed:
            time.sleep(0.2)
            continue
        job_id = placed[-1]
        tried.add(job_id)
        page.goto(f"{base}/ui/jobs/{job_id}")
        expect(page.locator("#log")).to_contain_text("step 1 of")
        shown = steps_shown(page)
        while time.monotonic() < deadline and page.locator("#status").inner_text() == "running":
            if steps_shown(page) > shown:
                return
            time.sleep(0.1)
    raise AssertionError(f"no job's log grew on its page\n{demo.output()}")


def test_the_ui_demo_signs_in_with_its_link_shows_its_fleet_and_a_log_growing(
        tmp_path: Path) -> None:
    demo = RunningDemo(tmp_path, "--ui", "--keep", env=headless(
        {"DISPLAY": ":99", "BROWSER": str(fake_browser(tmp_path, 0))}))
    try:
        link = demo.link()
        folder = demo.folder()
        demo.wait_output("opened in your browser")
        redirect = (tmp_path / "opened").read_text().strip()  # a file:// page, no code
        base = link.partition("/ui/")[0]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
            try:
                page = browser.new_page(viewport={"width": 1360, "height": 860})
                page.set_default_timeout(WAIT)
                page.goto(redirect)
                expect(page).to_have_url(f"{base}/ui/")
                expect(page.locator("#who")).to_contain_text("sign-in link")
                for label in ("big-1", "mid-1", "lap-1"):
                    expect(page.locator(f'#hosts tr[data-host="{label}"]')).to_be_visible()
                watch_a_log_grow(page, demo, base)
            finally:
                browser.close()
        before = demo.descendants()
        assert demo.stop(signal.SIGTERM) in (0, 130)  # 0: the workload had ended
    finally:
        if demo.process.poll() is None:
            demo.kill()
    assert "stopping the demo's fleet" in demo.output()
    assert not leftovers(folder, []), leftovers(folder, [])
    wait_for(lambda: not leftovers(folder, before), 15, "the demo's processes to end",
             lambda: leftovers(folder, before))
    assert not Path(folder).exists()
