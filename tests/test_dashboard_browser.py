"""The dashboard end to end, in a real headless browser (Debian's chromium, driven by
Playwright) against a real `herder server` and real `herder agent` processes: sign in, watch
a job go from queued to done with its log appearing live, cancel a running job, drain a host,
and a read token that sees no actions. Skipped only when chromium is not installed
(`.ci/run` installs it).

`HERDER_DASHBOARD_SCREENSHOT=docs/dashboard-fleet.png` makes the fleet test write its
screenshot there (the picture in docs/monitoring.md); otherwise it goes to the test's folder."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright
from support.fleet import FleetHarness
from support.local import open_harness
from support.ports import free_port
from support.waits import wait_for

from herder.core.access import new_token, token_hash
from herder.core.model import JobStatus, Scope

CHROMIUM = Path("/usr/bin/chromium")
WAIT = 45_000  # ms: generous, for a loaded 2-core machine
expect.set_options(timeout=WAIT)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not CHROMIUM.exists(),
                                 reason="chromium is not installed (apt-get install chromium)")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    opened = context.new_page()
    opened.set_default_timeout(WAIT)
    try:
        yield opened
    finally:
        context.close()


def started_fleet(make_fleet, tmp_path: Path, sqlite_url: str, *labels: str) -> FleetHarness:
    fleet: FleetHarness = make_fleet(tmp_path, sqlite_url)
    fleet.add_hosts(dict.fromkeys(labels, ("--ram", "16", "--prime-workers", "2",
                                           "--night-workers", "2")))
    fleet.start_server(wait=False)
    fleet.start_agents(*labels)
    wait_for(lambda: all(view["health"] == "healthy" for view in fleet.hosts_api().values()),
             30, "every host to be healthy", fleet.describe)
    return fleet


def token(fleet: FleetHarness, scope: Scope) -> str:
    secret = new_token()
    fleet.store.token_insert(f"browser-{scope}", scope, token_hash(secret), datetime.now(UTC))
    return secret


def sign_in(page: Page, fleet: FleetHarness, secret: str, scope: str) -> None:
    page.goto(f"{fleet.url}/ui/")
    expect(page).to_have_url(f"{fleet.url}/ui/login")
    page.fill("#token", secret)
    page.click("#sign-in")
    expect(page).to_have_url(f"{fleet.url}/ui/")
    expect(page.locator("#who")).to_contain_text(scope)


def test_an_admin_watches_a_job_run_live_cancels_another_and_drains_a_host(
        make_fleet, tmp_path, sqlite_url, page):
    fleet = started_fleet(make_fleet, tmp_path, sqlite_url, "alpha")
    page.goto(f"{fleet.url}/ui/login")
    page.fill("#token", "hdr_not-a-real-token-at-all")
    page.click("#sign-in")
    expect(page.locator("#error")).to_have_text("unknown token")
    sign_in(page, fleet, fleet.admin_token, "admin")

    # queued -> running -> done, its log growing on the page as the job prints
    assert fleet.api("POST", "/api/v1/hosts/alpha/drain").status_code == 200
    gate = tmp_path / "gate"
    # the log's header repeats the command: the lines it prints are computed, not in it
    job_id = fleet.submit(["/bin/sh", "-c", "echo first-$((6*7)); "
                           f"while [ ! -e '{gate}' ]; do sleep 0.05; done; echo second-$((6*9))"])
    page.goto(f"{fleet.url}/ui/jobs/{job_id}")
    status, log = page.locator("#status"), page.locator("#log")
    expect(status).to_have_text("queued")
    expect(page.locator("#why")).to_contain_text("alpha")
    expect(page.locator("#cancel")).to_be_visible()
    assert fleet.api("POST", "/api/v1/hosts/alpha/enable").status_code == 200
    expect(status).to_have_text("running")  # no reload: the live stream said it changed
    expect(log).to_contain_text("first-42")
    expect(log).not_to_contain_text("second-54")
    gate.touch()
    expect(log).to_contain_text("second-54")
    expect(status).to_have_text("done")
    expect(page.locator("#retry")).to_be_visible()
    expect(page.locator("#attempts tbody tr")).to_have_count(1)
    expect(page.locator("#events")).to_contain_text("started")

    # the jobs view lists it, filtered by status
    page.goto(f"{fleet.url}/ui/jobs?status=done")
    expect(page.locator(f'#jobs tr[data-job="{job_id}"]')).to_contain_text("done")

    # cancel a running job from its page
    sleeper = fleet.submit(["/bin/sh", "-c", "echo sleeping-$((2+2)); exec sleep 300"])
    page.goto(f"{fleet.url}/ui/jobs/{sleeper}")
    expect(status).to_have_text("running")
    expect(log).to_contain_text("sleeping-4")
    page.click("#cancel")
    expect(status).to_have_text("cancelled")
    fleet.wait_status(sleeper, JobStatus.CANCELLED)
    wait_for(lambda: not fleet.job_processes(sleeper), 30, "the cancelled job's process to end",
             fleet.describe)

    # drain the host from the fleet view
    page.goto(f"{fleet.url}/ui/")
    row = page.locator('#hosts tr[data-host="alpha"]')
    expect(row.locator(".state")).to_have_text("enabled")
    row.locator("button.drain").click()
    expect(row.locator(".state")).to_have_text("drained")
    expect(row.locator("button.enable")).to_be_visible()
    assert fleet.hosts_api()["alpha"]["enabled"] is False

    page.click("#logout")
    expect(page).to_have_url(f"{fleet.url}/ui/login")
    page.goto(f"{fleet.url}/ui/jobs")
    expect(page).to_have_url(f"{fleet.url}/ui/login")


def test_a_read_token_sees_no_actions_and_is_refused_if_it_posts(
        make_fleet, tmp_path, sqlite_url, page):
    fleet = started_fleet(make_fleet, tmp_path, sqlite_url, "alpha")
    job_id = fleet.submit(["/bin/sh", "-c", "echo hello-$((1+1)); exec sleep 300"])
    sign_in(page, fleet, token(fleet, Scope.READ), "read")
    row = page.locator('#hosts tr[data-host="alpha"]')
    expect(row).to_be_visible()
    expect(page.locator("#hosts button")).to_have_count(0)
    page.goto(f"{fleet.url}/ui/jobs/{job_id}")
    expect(page.locator("#status")).to_have_text("running")
    expect(page.locator("#log")).to_contain_text("hello-2")
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator("#retry")).to_be_hidden()
    statuses = page.evaluate("""async (id) => {
        const session = await (await fetch('/api/v1/dashboard/session')).json();
        const post = (path) => fetch(path, {method: 'POST',
            headers: {'X-Herder-CSRF': session.csrf}}).then((r) => r.status);
        return [await post(`/api/v1/jobs/${id}/cancel`), await post('/api/v1/hosts/alpha/drain')];
    }""", job_id)
    assert statuses == [403, 403]
    assert fleet.job(job_id).status is JobStatus.RUNNING
    assert fleet.hosts_api()["alpha"]["enabled"] is True


def test_the_fleet_view_shows_each_host_and_its_ram(make_fleet, tmp_path, sqlite_url, page):
    fleet = started_fleet(make_fleet, tmp_path, sqlite_url, "build-1", "build-2")
    fleet.add_host("laptop", "--ram", "8", "--prime-workers", "1", "--night-workers", "1")
    hold = tmp_path / "hold"
    busy = [fleet.submit(["/bin/sh", "-c", f"while [ ! -e '{hold}' ]; do sleep 0.1; done"],
                         weight=weight) for weight in ("heavy", "light", "heavy")]
    fleet.submit(["/bin/sh", "-c", "exit 3"], max_attempts=1)
    done = fleet.submit(["true"])
    fleet.wait_status(done, JobStatus.DONE)
    for job_id in busy:
        fleet.wait_status(job_id, JobStatus.RUNNING)
    assert fleet.api("POST", "/api/v1/hosts/laptop/drain").status_code == 200
    sign_in(page, fleet, fleet.admin_token, "admin")
    rows = page.locator("#hosts tbody tr")
    expect(rows).to_have_count(3)
    expect(page.locator('#hosts tr[data-host="laptop"] .state')).to_have_text("drained")
    expect(page.locator('.count[data-status="running"] b')).to_have_text("3")
    booked = page.locator('#hosts tr[data-host="build-1"] .bar .booked')
    assert float(booked.evaluate("(bar) => parseFloat(bar.style.width)")) > 0
    expect(page.locator('#hosts tr[data-host="build-1"] .bar-label')).to_contain_text(
        "measured free")
    shot = Path(os.environ.get("HERDER_DASHBOARD_SCREENSHOT") or tmp_path / "fleet.png")
    page.set_viewport_size({"width": 1360, "height": 400})  # the page's own height
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes().startswith(b"\x89PNG")

    # a count links to the jobs view; the filter form narrows it, pages of 50 on the server
    page.click('.count[data-status="running"]')
    expect(page.locator("#jobs tbody tr")).to_have_count(3)
    page.select_option("#f-status", "failed")
    page.click('#filters button[type="submit"]')
    expect(page).to_have_url(f"{fleet.url}/ui/jobs?status=failed")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    expect(page.locator("#jobs tbody")).to_contain_text("failed")
    expect(page.locator("#older")).to_be_disabled()
    hold.touch()


def test_the_link_herder_up_prints_signs_a_browser_in_once_and_never_reaches_its_log(
        tmp_path, sqlite_url, page, browser):
    """`herder up --ui` prints a one-time link on standard output: chromium opening it lands
    on the fleet view signed in, the code gone from the address bar, this machine a row of
    it; a second browser with
    the same link gets the login page saying so; the code is in no log line."""
    with open_harness(tmp_path, sqlite_url) as local:
        port = free_port()
        printed = tmp_path / "up.stdout"
        with open(printed, "wb") as stdout:
            process = local.spawn("up", "--host", local.host, "--ui", "--ui-listen",
                                  f"127.0.0.1:{port}", "--log-level", "debug", stdout=stdout)
        local.wait_ready(process)
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: "?login=" in printed.read_text(), 20, "the sign-in link",
                 local.describe)
        link = next(word for word in printed.read_text().split() if "?login=" in word)
        assert link.startswith(f"{base}/ui/?login=")
        code = link.rpartition("=")[2]
        job_id = local.submit(["/bin/sh", "-c", "echo from-the-link-$((6*7))"])
        local.wait_status(job_id, JobStatus.DONE)

        page.goto(link)
        expect(page).to_have_url(f"{base}/ui/")
        expect(page.locator("#who")).to_contain_text("sign-in link")
        expect(page.locator("#who")).to_contain_text("submit")
        machine = page.locator(f'#hosts tr[data-host="{local.host}"]')  # `herder up` is a host
        expect(machine).to_contain_text("herder up")
        expect(machine.locator(".slots")).to_have_text("0 / 4")
        expect(page.locator("#no-hosts")).to_be_hidden()
        page.goto(f"{base}/ui/jobs/{job_id}")  # this machine's job and its log
        expect(page.locator("#status")).to_have_text("done")
        expect(page.locator("#log")).to_contain_text("from-the-link-42")
        expect(page.locator("#retry")).to_be_visible()  # submit scope: its actions shown

        other = browser.new_context()
        try:
            replay = other.new_page()
            replay.set_default_timeout(WAIT)
            answer = replay.goto(link)
            assert answer is not None and answer.status == 410
            expect(replay.locator("#link-error")).to_contain_text("used already")
            replay.goto(f"{base}/ui/")
            expect(replay).to_have_url(f"{base}/ui/login")
        finally:
            other.close()
        log = local.stderr_of(process)
        assert f"dashboard on {base}/ui/" in log
        assert code not in log and code not in printed.read_text().replace(link, "")
