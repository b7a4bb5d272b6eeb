"""The one-time sign-in link of a local dashboard (issue 26, item 2): the code book alone
(clock passed in), the route over the real app, and the access log's redaction."""

from __future__ import annotations

import html
import logging
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st
from support.cli import run_herder
from support.local import open_harness
from support.ports import free_port
from support.waits import wait_for

from herder.api.app import Access, create_app
from herder.api.sessions import COOKIE, CSRF_HEADER
from herder.api.signin import OFF_LOOPBACK, RedactLogin, offer_link
from herder.core.access import new_token, token_hash
from herder.core.model import JobSpec, JobStatus, Scope
from herder.core.settings.loading import Config
from herder.core.settings.sections import ServerSection, Settings
from herder.core.signin import CODE_SECONDS, CodeBook, Redeemed, code_hash
from herder.runtime.coordinator import Coordinator
from herder.store import Store, open_store

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
LOCAL = "http://127.0.0.1:8471"


# -- the code book ---------------------------------------------------------------------------------


def test_a_code_signs_in_once_then_says_it_was_used():
    book = CodeBook()
    code = book.issue(NOW)
    assert book.redeem(code, NOW + timedelta(seconds=1)) is Redeemed.SIGNED_IN
    assert book.redeem(code, NOW + timedelta(seconds=2)) is Redeemed.USED
    assert book.redeem(code, NOW + timedelta(seconds=3)) is Redeemed.USED


def test_a_code_expires_after_its_lifetime_and_stays_unspent():
    book = CodeBook(lifetime=60)
    code = book.issue(NOW)
    assert book.redeem(code, NOW + timedelta(seconds=60)) is Redeemed.EXPIRED
    assert book.redeem(code, NOW + timedelta(days=1)) is Redeemed.EXPIRED
    fresh = book.issue(NOW)
    assert book.redeem(fresh, NOW + timedelta(seconds=59)) is Redeemed.SIGNED_IN
    assert CODE_SECONDS == 300  # the docs say five minutes


def test_unknown_and_malformed_codes_are_unknown_and_spend_nothing():
    book = CodeBook()
    code = book.issue(NOW)
    for other in ("", "x", code[:-1], code + "x", "a b c d e f g h", "é" * 40, "z" * 10_000):
        assert book.redeem(other, NOW) is Redeemed.UNKNOWN, other
    assert CodeBook().redeem(code, NOW) is Redeemed.UNKNOWN  # another process's book
    assert book.redeem(code, NOW) is Redeemed.SIGNED_IN


def test_the_book_keeps_only_hashes_and_each_code_is_new():
    book = CodeBook()
    codes = [book.issue(NOW) for _ in range(20)]
    assert len(set(codes)) == 20 and all(len(code) >= 40 for code in codes)
    kept = repr(vars(book))
    assert not any(code in kept for code in codes)
    assert all(code_hash(code) in kept for code in codes)
    assert CodeBook().secret != book.secret


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(-10, 400)), max_size=25))
def test_no_sequence_of_tries_signs_in_twice_or_late(tries):
    """Whatever codes are tried in whatever order and at whatever times, each signs in at
    most once, and only before it expires."""
    book = CodeBook(lifetime=CODE_SECONDS)
    codes = [book.issue(NOW) for _ in range(3)]
    signed: list[int] = []
    for index, seconds in tries:
        at = NOW + timedelta(seconds=seconds)
        outcome = book.redeem(codes[index], at)
        if outcome is Redeemed.SIGNED_IN:
            assert seconds < CODE_SECONDS and index not in signed
            signed.append(index)
        elif outcome is Redeemed.USED:
            assert index in signed
        else:
            assert outcome is Redeemed.EXPIRED and seconds >= CODE_SECONDS


# -- the route, over the real app -----------------------------------------------------------------


@dataclass
class Local:
    store: Store
    app: FastAPI

    def client(self, base_url: str = LOCAL, address: str = "127.0.0.1") -> TestClient:
        return TestClient(self.app, base_url=base_url, raise_server_exceptions=False,
                          follow_redirects=False, client=(address, 50000))

    def code(self) -> str:
        link = offer_link(self.app, LOCAL)
        assert link.startswith(f"{LOCAL}/ui/?login=")
        return link.rpartition("=")[2]


def local_app(store: Store, access: Access) -> FastAPI:
    settings = Settings(server=ServerSection(long_poll=0.5))
    return create_app(Coordinator(store, Config(settings, None), host="server"), access)


@pytest.fixture
def local(sqlite_url, tmp_path, monkeypatch) -> Iterator[Local]:
    """The app as `herder up --ui` serves it on loopback (edge_access's loopback names)."""
    monkeypatch.chdir(tmp_path)
    with open_store(sqlite_url) as store:
        yield Local(store, local_app(store, Access(loopback_names=())))


HINT = ("Started with <code>herder up --ui</code> or <code>herder demo --ui</code>?\n"
        "    Open the link it printed.")


def shown(page: str, element: str) -> str:
    """The text of the login page's paragraph `element` (html-escaped, as sent)."""
    found = re.search(rf'id="{element}"[^>]*>(.*?)</p>', page, re.DOTALL)
    assert found is not None, page
    return found.group(1)


def test_the_login_page_points_to_the_printed_link(local):
    page = local.client().get("/ui/login")
    assert page.status_code == 200 and HINT in page.text
    assert shown(page.text, "link-error") == "" and shown(page.text, "error") == ""


@pytest.mark.parametrize(("outcome", "status", "words"), [
    (Redeemed.USED, 410, "this sign-in link was used already (a link signs in once)"),
    (Redeemed.EXPIRED, 410, "this sign-in link expired (a link lasts 5 minutes)"),
    (Redeemed.UNKNOWN, 403, "this sign-in link is not valid here"),
])
def test_a_refused_link_is_said_above_the_form_with_the_hint(local, outcome, status, words):
    """Used, expired or unknown: the page says which, on its own line above the token form
    (whose error stays empty), and still says where a new link comes from."""
    codes: CodeBook = CodeBook(lifetime=0 if outcome is Redeemed.EXPIRED else 300)
    local.app.state.sign_in_codes = codes
    code = codes.issue(datetime.now(UTC)) if outcome is not Redeemed.UNKNOWN else new_token()
    if outcome is Redeemed.USED:
        assert local.client().get(f"/ui/?login={code}").status_code == 303
    response = local.client().get(f"/ui/?login={code}")
    assert response.status_code == status
    said = shown(response.text, "link-error")
    assert said.startswith(words) and said == html.escape(outcome.reason), said
    assert shown(response.text, "error") == "" and HINT in response.text
    assert code not in response.text


def test_a_link_sets_the_session_cookie_and_redirects_without_the_code(local):
    client = local.client()
    code = local.code()
    response = client.get(f"/ui/?login={code}")
    assert response.status_code == 303 and response.headers["location"] == "/ui/"
    assert COOKIE in client.cookies and code not in client.cookies[COOKIE]
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert client.get("/ui/").status_code == 200  # signed in: the fleet view itself
    session = client.get("/api/v1/dashboard/session").json()
    assert session["scope"] == "submit" and session["can_submit"] and not session["can_admin"]
    job_id = local.store.job_insert([JobSpec(command=("true",))], NOW)[0].job_id
    cancelled = client.post(f"/api/v1/jobs/{job_id}/cancel",
                            headers={CSRF_HEADER: session["csrf"]})
    assert cancelled.status_code == 200, cancelled.text
    assert local.store.job_get(job_id).status is JobStatus.CANCELLED
    drained = client.post("/api/v1/hosts/alpha/drain", headers={CSRF_HEADER: session["csrf"]})
    assert drained.status_code == 403  # admin routes need an admin token


def test_a_link_another_site_led_to_signs_in_by_a_page_refreshing_to_the_dashboard(local):
    """From another site (herder demo's redirect page, a file://) a browser would not send
    the SameSite=Strict cookie on a redirect: a page that refreshes to /ui/ instead."""
    client = local.client()
    code = local.code()
    response = client.get(f"/ui/?login={code}", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status_code == 200
    assert '<meta http-equiv="refresh" content="0;url=/ui/">' in response.text
    assert code not in response.text and response.headers["cache-control"] == "no-store"
    assert "samesite=strict" in response.headers["set-cookie"].lower()
    assert client.get("/ui/").status_code == 200


def test_a_replayed_code_is_refused_plainly_with_no_session(local):
    code = local.code()
    assert local.client().get(f"/ui/?login={code}").status_code == 303
    replay = local.client()
    response = replay.get(f"/ui/?login={code}")
    assert response.status_code == 410 and "was used already" in response.text
    assert code not in response.text and COOKIE not in replay.cookies
    assert replay.get("/ui/").headers["location"] == "/ui/login"


def test_an_expired_code_is_refused(local):
    codes: CodeBook = CodeBook(lifetime=0)  # expired as soon as issued
    local.app.state.sign_in_codes = codes
    code = codes.issue(datetime.now(UTC))
    client = local.client()
    response = client.get(f"/ui/?login={code}")
    assert response.status_code == 410 and "expired" in response.text
    assert code not in response.text and COOKIE not in client.cookies


def test_an_unknown_code_is_refused(local):
    local.code()
    client = local.client()
    response = client.get(f"/ui/?login={new_token()}")
    assert response.status_code == 403 and "not valid here" in response.text
    assert COOKIE not in client.cookies


def test_a_code_is_refused_off_a_loopback_listener_or_from_another_address(sqlite_url, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(sqlite_url) as store:
        # Bound off loopback (0.0.0.0: edge_access sets no loopback names), even reached
        # at 127.0.0.1 from 127.0.0.1.
        wide = Local(store, local_app(store, Access()))
        code = wide.code()
        client = wide.client()
        response = client.get(f"/ui/?login={code}")
        assert response.status_code == 403
        assert shown(response.text, "link-error") == html.escape(OFF_LOOPBACK)
        assert COOKIE not in client.cookies
        # A loopback listener, a request from another address (a proxy's forwarded one).
        narrow = Local(store, local_app(store, Access(loopback_names=())))
        code = narrow.code()
        client = narrow.client(address="203.0.113.7")
        assert client.get(f"/ui/?login={code}").status_code == 403
        assert COOKIE not in client.cookies
        # Through a proxy on this machine (the browser may be anywhere), or for a proxy's name.
        client = narrow.client()
        for headers in ({"X-Forwarded-For": "203.0.113.7"}, {"Forwarded": "for=203.0.113.7"},
                        {"Host": "herder.example.org"}):
            response = client.get(f"/ui/?login={code}", headers=headers)
            assert response.status_code in (400, 403), headers
            assert COOKIE not in client.cookies
        # The refusals spent nothing: from this machine the code still signs in once.
        assert narrow.client().get(f"/ui/?login={code}").status_code == 303


def test_a_server_that_offered_no_link_accepts_none(local):
    """`herder server` offers a link only with --sign-in-link: without, a code is refused
    even on loopback."""
    client = local.client()
    response = client.get(f"/ui/?login={new_token()}")
    assert response.status_code == 403 and COOKIE not in client.cookies


def test_a_link_session_ends_with_the_process_that_issued_it(local, sqlite_url):
    client = local.client()
    assert client.get(f"/ui/?login={local.code()}").status_code == 303
    cookie = client.cookies[COOKIE]
    restarted = Local(local.store, local_app(local.store, Access(loopback_names=())))
    restarted.code()  # the new process's book, with its own secret
    later = restarted.client()
    later.cookies.set(COOKIE, cookie)
    assert later.get("/api/v1/dashboard/session").status_code == 401
    assert later.get("/ui/").headers["location"] == "/ui/login"


def test_the_password_form_still_signs_in_beside_links(local):
    secret = new_token()
    local.store.token_insert("ops", Scope.ADMIN, token_hash(secret), NOW)
    local.code()
    client = local.client()
    assert client.post("/ui/login", data={"token": secret}).status_code == 303
    assert client.get("/api/v1/dashboard/session").json()["scope"] == "admin"


def test_offering_a_link_makes_uvicorns_access_log_redact_it(local, caplog):
    link = offer_link(local.app, LOCAL)
    offer_link(local.app, LOCAL)  # a second link adds no second filter
    access_log = logging.getLogger("uvicorn.access")
    assert sum(isinstance(found, RedactLogin) for found in access_log.filters) == 1
    path = link.removeprefix(LOCAL)
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        access_log.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5", "GET", path, "1.1", 303)
    assert link.rpartition("=")[2] not in caplog.text
    assert '"GET /ui/?login=[redacted] HTTP/1.1" 303' in caplog.text


def test_a_proxy_name_from_public_url_gets_no_link(sqlite_url, tmp_path, monkeypatch):
    """On loopback behind a proxy ([server] public_url): the proxy's Host is refused."""
    monkeypatch.chdir(tmp_path)
    with open_store(sqlite_url) as store:
        proxied = Local(store, local_app(store, Access(loopback_names=("herder.example.org",))))
        code = proxied.code()
        client = proxied.client()
        response = client.get(f"/ui/?login={code}", headers={"Host": "herder.example.org"})
        assert response.status_code == 403 and COOKIE not in client.cookies
        assert client.get(f"/ui/?login={code}").status_code == 303


def test_the_access_log_redacts_the_code():
    record = logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1,
                               '%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET",
                               "/ui/?login=secretcode123&x=1", "1.1", 303), None)
    RedactLogin().filter(record)
    assert "secretcode123" not in record.getMessage()
    assert "/ui/?login=[redacted]&x=1" in record.getMessage()


# -- herder up --ui, the real process ------------------------------------------------------------


def ipv6_loopback() -> bool:
    """Whether this machine can bind ::1 (some containers have no IPv6 at all)."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize("name", [
    "localhost",
    pytest.param("[::1]", marks=pytest.mark.skipif(not ipv6_loopback(),
                                                   reason="no IPv6 loopback here")),
])
def test_up_with_ui_on_loopback_prints_a_link_that_signs_in(tmp_path, sqlite_url, name):
    """`herder up --ui --ui-listen localhost:PORT` (or `[::1]:PORT`) prints a link at that
    name; following it gets 303 to /ui/ and a session cookie that opens the fleet view."""
    with open_harness(tmp_path, sqlite_url) as local:
        port = free_port()
        printed = tmp_path / "up.stdout"
        with open(printed, "wb") as stdout:
            process = local.spawn("up", "--host", local.host, "--ui", "--ui-listen",
                                  f"{name}:{port}", stdout=stdout)
        local.wait_ready(process)
        wait_for(lambda: "?login=" in printed.read_text(), 20, "the sign-in link",
                 local.describe)
        link = next(word for word in printed.read_text().split() if "?login=" in word)
        base = f"http://{name}:{port}"
        assert link.startswith(f"{base}/ui/?login=")
        assert f"dashboard on {base}/ui/" in local.stderr_of(process)
        with httpx.Client(timeout=10, follow_redirects=False) as http:
            signed = http.get(link)
            assert signed.status_code == 303 and signed.headers["location"] == "/ui/"
            assert signed.cookies.get(COOKIE), signed.headers
            fleet = http.get(f"{base}/ui/")  # with the cookie
            assert fleet.status_code == 200 and 'id="who"' in fleet.text
        with httpx.Client(timeout=10, follow_redirects=False) as stranger:
            assert stranger.get(f"{base}/ui/").headers["location"] == "/ui/login"


# -- herder up --ui off loopback ------------------------------------------------------------------


def test_up_with_ui_off_loopback_prints_no_link(tmp_path, sqlite_url):
    """Listening on every address (with --allow-plaintext and an admin token), `herder up
    --ui` offers no link: sign-in is the token form's."""
    with open_harness(tmp_path, sqlite_url) as local:
        local.store.token_insert("ops", Scope.ADMIN, token_hash(new_token()), NOW)
        port = free_port()
        printed = tmp_path / "up.stdout"
        with open(printed, "wb") as stdout:
            process = local.spawn("up", "--host", local.host, "--ui", "--ui-listen",
                                  f"0.0.0.0:{port}", "--allow-plaintext", stdout=stdout)
        local.wait_ready(process)  # after the dashboard started, and any link was printed
        assert f"dashboard on http://0.0.0.0:{port}/ui/\n" in local.stderr_of(process)
        assert "login=" not in printed.read_text()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            refused = http.get(f"/ui/?login={new_token()}")
            assert refused.status_code == 403 and COOKIE not in http.cookies


def test_server_sign_in_link_is_loopback_only(tmp_path, sqlite_url):
    """`herder server --sign-in-link` (what `herder demo --ui` starts) off loopback: exit 2
    naming the option, before anything listens. On loopback it is tested end to end by the
    demo's tests (tests/test_demo.py, tests/test_demo_browser.py)."""
    result = run_herder("server", "--listen", f"0.0.0.0:{free_port()}", "--sign-in-link",
                        "--allow-plaintext", cwd=tmp_path, db=sqlite_url)
    assert result.returncode == 2, result
    assert "--sign-in-link" in result.stderr and "loopback" in result.stderr
    assert "login=" not in result.stdout
