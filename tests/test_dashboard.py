"""The dashboard over HTTP (FastAPI's TestClient over a real store, both backends): sign-in
turns a token into a session cookie, the cookie works on the API with a CSRF guard and the
token's scope, the jobs view pages on the server, and the live stream signals changes.
The browser itself is driven in tests/test_dashboard_browser.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi.testclient import TestClient
from support.local import open_harness
from support.ports import free_port

from herder.api.app import Access, create_app
from herder.api.sessions import COOKIE, CSRF_HEADER, csrf_refusal
from herder.core.access import new_token, token_hash
from herder.core.fleet import Fleet
from herder.core.model import HostRecord, JobSpec, JobStatus, Scope
from herder.core.settings.loading import Config
from herder.core.settings.sections import ServerSection, Settings
from herder.runtime import read_models
from herder.runtime.coordinator import Coordinator
from herder.runtime.sessions import Session, SessionBook
from herder.services.why import why, why_of
from herder.store import Store, open_store

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@dataclass
class Dashboard:
    store: Store
    app: object
    tokens: dict[str, str]

    def client(self, base_url: str = "http://testserver") -> TestClient:
        return TestClient(self.app, base_url=base_url, raise_server_exceptions=False)

    def signed_in(self, role: str) -> tuple[TestClient, str]:
        """A browser signed in with the role's token, and its CSRF value."""
        client = self.client()
        response = client.post("/ui/login", data={"token": self.tokens[role]},
                               follow_redirects=False)
        assert response.status_code == 303, response.text
        csrf = client.get("/api/v1/dashboard/session").json()["csrf"]
        assert csrf
        return client, csrf


@pytest.fixture
def dashboard(store_url, tmp_path, monkeypatch) -> Iterator[Dashboard]:
    monkeypatch.chdir(tmp_path)
    with open_store(store_url) as store:
        store.host_insert(HostRecord(label="alpha", ram_total_gb=16.0), NOW)
        tokens = {}
        for role, scope, host in [("read", Scope.READ, None), ("submit", Scope.SUBMIT, None),
                                  ("admin", Scope.ADMIN, None),
                                  ("agent", Scope.AGENT, "alpha")]:
            tokens[role] = new_token()
            store.token_insert(role, scope, token_hash(tokens[role]), NOW, host=host)
        settings = Settings(server=ServerSection(long_poll=0.5))
        app = create_app(Coordinator(store, Config(settings, None), host="server"), Access())
        yield Dashboard(store, app, tokens)


def submit(store: Store, count: int = 1, **fields) -> list[int]:
    return [result.job_id for result in store.job_insert(
        [JobSpec(command=("true",), **fields) for _ in range(count)], NOW)]


# -- sign-in --------------------------------------------------------------------------------


def test_pages_send_a_browser_without_a_session_to_the_login_page(dashboard):
    client = dashboard.client()
    for path in ("/ui/", "/ui/jobs", "/ui/jobs/1"):
        response = client.get(path, follow_redirects=False)
        assert (response.status_code, response.headers["location"]) == (303, "/ui/login"), path
    login = client.get("/ui/login")
    assert login.status_code == 200 and 'name="token"' in login.text
    assert "frame-ancestors 'none'" in login.headers["content-security-policy"]
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"


@pytest.mark.parametrize(("token", "status", "says"), [
    ("", 401, "paste a read, submit or admin token"),
    ("hdr_" + "x" * 40, 401, "unknown token"),
    ("not a token", 401, "unknown token"),
    ("\u00fcnicode-token-value", 401, "unknown token"),
])
def test_a_bad_token_is_an_error_on_the_login_page(dashboard, token, status, says):
    response = dashboard.client().post("/ui/login", data={"token": token},
                                       follow_redirects=False)
    assert response.status_code == status
    assert says in response.text and 'name="token"' in response.text
    assert COOKIE not in response.headers.get("set-cookie", "")


def test_revoked_and_agent_tokens_cannot_sign_in(dashboard):
    revoked = new_token()
    token_id = dashboard.store.token_insert("gone", Scope.ADMIN, token_hash(revoked), NOW)
    dashboard.store.token_revoke(token_id, NOW)
    client = dashboard.client()
    answer = client.post("/ui/login", data={"token": revoked}, follow_redirects=False)
    assert answer.status_code == 401 and "revoked" in answer.text
    agent = client.post("/ui/login", data={"token": dashboard.tokens["agent"]},
                        follow_redirects=False)
    assert agent.status_code == 403 and "agent token" in agent.text
    assert COOKIE not in client.cookies


def test_a_malformed_login_body_is_refused_without_an_error(dashboard):
    client = dashboard.client()
    for body in (b"\xff\xfe\x00", b"token=%ZZ&token=x&a=b&c=d&e=f&g=h", b"=" * 5000):
        response = client.post("/ui/login", content=body, follow_redirects=False,
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert response.status_code in (401, 403), (body, response.status_code)


def test_signing_in_sets_an_httponly_strict_session_cookie_without_the_token(dashboard):
    client = dashboard.client()
    token = dashboard.tokens["admin"]
    response = client.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert (response.status_code, response.headers["location"]) == (303, "/ui/")
    cookie = response.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    assert "Secure" not in cookie  # plain HTTP here: a Secure cookie would never come back
    assert token not in cookie and token_hash(token) not in cookie
    page = client.get("/ui/")
    assert page.status_code == 200 and 'data-page="fleet"' in page.text
    assert client.get("/ui/jobs/7").status_code == 200


def test_over_tls_the_cookie_is_secure(dashboard):
    response = dashboard.client("https://testserver").post(
        "/ui/login", data={"token": dashboard.tokens["read"]}, follow_redirects=False)
    assert "Secure" in response.headers["set-cookie"]


def test_a_cross_site_login_form_is_refused(dashboard):
    response = dashboard.client().post("/ui/login", data={"token": dashboard.tokens["admin"]},
                                       headers={"Origin": "https://evil.example"},
                                       follow_redirects=False)
    assert response.status_code == 403
    assert COOKIE not in response.headers.get("set-cookie", "")


# -- the session on the API: scope and CSRF -----------------------------------------------------


def test_the_session_says_who_signed_in_and_what_they_may_do(dashboard):
    for role, submit_, admin in [("read", False, False), ("submit", True, False),
                                 ("admin", True, True)]:
        client, _csrf = dashboard.signed_in(role)
        view = client.get("/api/v1/dashboard/session").json()
        assert (view["scope"], view["can_submit"], view["can_admin"]) == (role, submit_, admin)
    bearer = dashboard.client().get("/api/v1/dashboard/session", headers={
        "Authorization": f"Bearer {dashboard.tokens['read']}"})
    assert bearer.json()["csrf"] is None


def test_a_state_change_with_the_cookie_needs_the_csrf_header_and_this_origin(dashboard):
    client, csrf = dashboard.signed_in("admin")
    [job_id] = submit(dashboard.store)
    assert client.get("/api/v1/jobs").status_code == 200  # reads need no CSRF value
    for headers in ({}, {CSRF_HEADER: "wrong"},
                    {CSRF_HEADER: csrf, "Origin": "https://evil.example"},
                    {CSRF_HEADER: csrf, "Origin": "null"}):
        refused = client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers)
        assert refused.status_code == 403, (headers, refused.text)
        drained = client.post("/api/v1/hosts/alpha/drain", headers=headers)
        assert drained.status_code == 403
    assert dashboard.store.job_get(job_id).status is JobStatus.QUEUED
    assert dashboard.store.host_get("alpha").enabled
    ok = client.post(f"/api/v1/jobs/{job_id}/cancel",
                     headers={CSRF_HEADER: csrf, "Origin": "http://testserver"})
    assert ok.status_code == 200, ok.text
    assert dashboard.store.job_get(job_id).status is JobStatus.CANCELLED
    assert client.post("/api/v1/hosts/alpha/drain", headers={CSRF_HEADER: csrf}).json() == {
        "label": "alpha", "enabled": False}
    assert not dashboard.store.host_get("alpha").enabled


def test_a_read_session_may_look_but_not_act(dashboard):
    client, csrf = dashboard.signed_in("read")
    [job_id] = submit(dashboard.store)
    assert client.get(f"/api/v1/jobs/{job_id}").status_code == 200
    assert client.get("/queue").status_code == 200
    for path in (f"/api/v1/jobs/{job_id}/cancel", f"/api/v1/jobs/{job_id}/retry",
                 "/api/v1/hosts/alpha/drain", "/api/v1/hosts/alpha/enable"):
        response = client.post(path, headers={CSRF_HEADER: csrf})
        assert response.status_code == 403, (path, response.text)
        assert "needs a" in response.json()["detail"]
    assert dashboard.store.job_get(job_id).status is JobStatus.QUEUED


def test_a_submit_session_cancels_and_retries_but_does_not_drain(dashboard):
    client, csrf = dashboard.signed_in("submit")
    [job_id] = submit(dashboard.store)
    headers = {CSRF_HEADER: csrf}
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=headers).status_code == 200
    retried = client.post(f"/api/v1/jobs/{job_id}/retry", headers=headers)
    assert retried.json() == {"id": job_id, "retried": True, "status": "queued"}
    assert client.post("/api/v1/hosts/alpha/drain", headers=headers).status_code == 403


def test_agent_routes_never_take_a_session_cookie(dashboard):
    client, csrf = dashboard.signed_in("admin")
    response = client.post("/api/v1/agent/alpha/heartbeat", json={"worker": "alpha/1/1"},
                           headers={CSRF_HEADER: csrf})
    assert response.status_code == 401


def test_revoking_the_token_ends_its_sessions(dashboard):
    secret = new_token()
    token_id = dashboard.store.token_insert("laptop", Scope.READ, token_hash(secret), NOW)
    client = dashboard.client()
    client.post("/ui/login", data={"token": secret}, follow_redirects=False)
    assert client.get("/api/v1/jobs").status_code == 200
    dashboard.store.token_revoke(token_id, NOW)
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/login"


def test_signing_out_needs_the_csrf_value_and_ends_the_session(dashboard):
    client, csrf = dashboard.signed_in("read")
    assert client.post("/ui/logout", follow_redirects=False).status_code == 403
    assert client.get("/api/v1/jobs").status_code == 200
    out = client.post("/ui/logout", headers={CSRF_HEADER: csrf}, follow_redirects=False)
    assert (out.status_code, out.headers["location"]) == (303, "/ui/login")
    assert client.get("/api/v1/jobs").status_code == 401


def test_a_stale_cookie_is_no_session(dashboard):
    client = dashboard.client()
    client.cookies.set(COOKIE, "made-up-session-id")
    assert client.get("/api/v1/jobs").status_code == 401
    assert client.get("/ui/", follow_redirects=False).status_code == 303


def test_open_access_shows_the_pages_without_a_sign_in(store_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(store_url) as store:
        app = create_app(Coordinator(store, Config(Settings(), None), host="server"),
                         Access(open_access=True))
        client = TestClient(app, base_url="http://localhost:8470")  # a loopback name
        assert client.get("/ui/", follow_redirects=False).status_code == 200
        assert client.get("/api/v1/dashboard/session").json()["can_admin"] is True


def test_a_session_is_known_to_every_replica_and_outlives_a_restart(dashboard):
    """Sessions are in the store: another server over the same database (a replica behind
    a balancer, or this one after a restart) takes the cookie and its CSRF value."""
    client, csrf = dashboard.signed_in("submit")
    [job_id] = submit(dashboard.store)
    replica = create_app(Coordinator(dashboard.store, Config(Settings(), None), host="other"),
                         Access())
    other = TestClient(replica, raise_server_exceptions=False)
    other.cookies.set(COOKIE, client.cookies[COOKIE])
    assert other.get("/ui/", follow_redirects=False).status_code == 200
    assert other.post(f"/api/v1/jobs/{job_id}/cancel", headers={CSRF_HEADER: csrf}
                      ).status_code == 200
    assert other.post("/ui/logout", headers={CSRF_HEADER: csrf},
                      follow_redirects=False).status_code == 303
    assert client.get("/api/v1/jobs").status_code == 401  # signed out everywhere


# -- sessions and CSRF --------------------------------------------------------------------------


def test_sessions_are_stored_by_hash_expire_and_are_swept(store):
    clock = [NOW]
    book = SessionBook(store, clock=lambda: clock[0], lifetime=10.0)
    first = book.open("hash-1")
    assert book.get(first.id) == first
    assert SessionBook(store, clock=lambda: clock[0]).get(first.id) == first  # a replica
    assert store.session_get(first.id, NOW) is None  # the table holds the id's hash only
    clock[0] = NOW + timedelta(seconds=10)
    assert book.get(first.id) is None
    second = book.open("hash-2")  # sweeps the expired first
    assert store.session_expire(NOW + timedelta(seconds=10)) == 0
    assert book.get(second.id) == second
    book.close(second.id)
    assert book.get(second.id) is None
    assert book.get(None) is None and book.get("x" * 500) is None
    assert first.id != second.id and first.csrf != second.csrf


def test_csrf_refusal_reads_the_method_the_header_and_the_origin():
    session = Session("id", "hash", "csrf-value")
    assert csrf_refusal(session, "GET", None, "https://evil.example", "h") is None
    assert "X-Herder-CSRF" in csrf_refusal(session, "POST", None, None, "h:1")
    assert "X-Herder-CSRF" in csrf_refusal(session, "POST", "nope", None, "h:1")
    assert csrf_refusal(session, "POST", session.csrf, None, "h:1") is None
    assert csrf_refusal(session, "POST", session.csrf, "http://h:1", "h:1") is None
    assert "cross-origin" in csrf_refusal(session, "POST", session.csrf, "http://h:2", "h:1")


# -- the jobs view and the live stream --------------------------------------------------------


def test_the_jobs_view_pages_newest_first_and_says_why_queued_jobs_wait(dashboard):
    client, _csrf = dashboard.signed_in("read")
    ids = submit(dashboard.store, 7)
    keyed = submit(dashboard.store, job_type="review", dedup_key="repo#9")
    dashboard.store.job_cancel(ids[0], NOW)
    walked, before = [], None
    while True:
        params = {"limit": 3} if before is None else {"limit": 3, "before": before}
        page = client.get("/api/v1/dashboard/jobs", params=params).json()
        walked += [row["id"] for row in page["jobs"]]
        before = page["next_before"]
        if before is None:
            break
    assert walked == sorted([*ids, *keyed], reverse=True)
    queued = client.get("/api/v1/dashboard/jobs", params={"status": "queued"}).json()["jobs"]
    assert [row["id"] for row in queued] == sorted([*ids[1:], *keyed], reverse=True)
    for row in queued[:2]:
        why = client.get(f"/api/v1/jobs/{row['id']}/why").json()["why"]
        assert row["why"] == why and row["why"]
    # a job newer than the placement the page reused is explained too (a fresh placement)
    [newer] = submit(dashboard.store)
    first = client.get("/api/v1/dashboard/jobs", params={"limit": 1}).json()["jobs"][0]
    assert first["id"] == newer
    assert first["why"] == client.get(f"/api/v1/jobs/{newer}/why").json()["why"]
    assert "not queued" not in first["why"]
    cancelled = client.get("/api/v1/dashboard/jobs", params={"status": "cancelled"}).json()
    assert [(row["id"], row["why"]) for row in cancelled["jobs"]] == [(ids[0], None)]
    for params in ({"job_type": "review"}, {"dedup_key": "repo#9"}):
        rows = client.get("/api/v1/dashboard/jobs", params=params).json()["jobs"]
        assert [(row["id"], row["dedup_key"], row["job_type"]) for row in rows] == [
            (keyed[0], "repo#9", "review")]
    assert client.get("/api/v1/dashboard/jobs", params={"host": "alpha"}).json() == {
        "jobs": [], "next_before": None}


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 201}, {"status": "lost"},
                                    {"before": 0}, {"job_type": "a\x00b"},
                                    {"host": "bad label!"}])
def test_bad_jobs_view_filters_are_422(dashboard, params):
    client, _csrf = dashboard.signed_in("read")
    assert client.get("/api/v1/dashboard/jobs", params=params).status_code == 422


def events(text: str) -> list[str]:
    return [line.removeprefix("id: ") for line in text.splitlines() if line.startswith("id: ")]


def test_the_live_stream_signals_a_change_since_the_last_event_it_sent(dashboard):
    client, _csrf = dashboard.signed_in("read")
    [job_id] = submit(dashboard.store)
    first = client.get("/api/v1/dashboard/changes")
    assert first.headers["content-type"].startswith("text/event-stream")
    assert "retry: " in first.text and "event: changed" in first.text
    [seen] = events(first.text)
    quiet = client.get("/api/v1/dashboard/changes", headers={"Last-Event-ID": seen})
    assert events(quiet.text) == []
    for odd in ("\u00b2", "-1", "x" * 20, ""):  # not an id: the stream starts afresh
        fresh = client.get("/api/v1/dashboard/changes",
                           headers={"Last-Event-ID": odd.encode("latin-1")})
        assert events(fresh.text) == [seen]
    dashboard.store.job_cancel(job_id, NOW)
    moved = client.get("/api/v1/dashboard/changes", headers={"Last-Event-ID": seen})
    assert [int(event) for event in events(moved.text)] == [dashboard.store.event_latest_id()]
    assert int(events(moved.text)[0]) > int(seen)


def test_the_live_stream_holds_the_connection_up_to_the_long_poll(dashboard):
    client, _csrf = dashboard.signed_in("read")
    submit(dashboard.store)
    seen = str(dashboard.store.event_latest_id())
    # wait asks for an hour; the server holds it at most [server] long_poll (0.5 s here)
    response = client.get("/api/v1/dashboard/changes", params={"wait": 3600},
                          headers={"Last-Event-ID": seen})
    assert response.status_code == 200 and events(response.text) == []


def test_assets_ship_in_the_package_and_nothing_else_is_served(dashboard):
    client = dashboard.client()
    script = client.get("/ui/static/dashboard.js")
    assert script.status_code == 200 and "EventSource" in script.text
    assert client.get("/ui/static/dashboard.css").headers["content-type"].startswith("text/css")
    icon = client.get("/ui/static/favicon.svg")  # same origin, so the pages' CSP allows it
    assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
    for name in ("frame.html", "login.html", "..%2Fapp.py", "nothing.js"):
        assert client.get(f"/ui/static/{name}").status_code == 404, name


# -- herder up --ui ------------------------------------------------------------------------------


def test_up_with_ui_serves_the_dashboard_over_its_own_store(tmp_path, sqlite_url):
    with open_harness(tmp_path, sqlite_url) as local:
        secret = new_token()
        local.store.token_insert("ops", Scope.ADMIN, token_hash(secret), NOW)
        port = free_port()
        process = local.up("--ui", "--ui-listen", f"127.0.0.1:{port}")
        local.wait_ready(process)  # the dashboard listens before the runner's loop starts
        assert f"dashboard on http://127.0.0.1:{port}/ui/" in local.stderr_of(process)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            assert http.get("/ui/").headers["location"] == "/ui/login"
            # A loopback dashboard answers loopback names only (DNS rebinding).
            rebound = http.post("/ui/login", data={"token": secret},
                                headers={"Host": "rebind.evil.example"})
            assert rebound.status_code == 403 and COOKIE not in http.cookies
            signed = http.post("/ui/login", data={"token": secret})
            assert signed.status_code == 303 and COOKIE in http.cookies
            job_id = local.submit(["/bin/sh", "-c", "echo from-up"])
            local.wait_status(job_id, JobStatus.DONE)
            rows = http.get("/api/v1/dashboard/jobs").json()["jobs"]
            assert [(row["id"], row["status"]) for row in rows] == [(job_id, "done")]
            assert b"\nfrom-up\n" in http.get(f"/api/v1/jobs/{job_id}/log").content
            csrf = http.get("/api/v1/dashboard/session").json()["csrf"]
            retried = http.post(f"/api/v1/jobs/{job_id}/retry", headers={CSRF_HEADER: csrf})
            assert retried.json()["retried"] is True
            local.wait_status(job_id, JobStatus.DONE)


def test_up_refuses_a_dashboard_address_it_cannot_use(tmp_path, sqlite_url):
    with open_harness(tmp_path, sqlite_url) as local:
        result = local.cli("up", "--ui", "--ui-listen", "0.0.0.0:8471", "--exit-when-idle",
                           check=False)
        assert result.returncode == 2
        assert "--ui-listen" in result.stderr and "no admin token" in result.stderr
        result = local.cli("up", "--ui", "--ui-listen", "nowhere", "--exit-when-idle",
                           check=False)
        assert result.returncode == 2 and "is not HOST:PORT" in result.stderr
        result = local.cli("up", "--ui", "--ui-listen", "::1:8471", "--exit-when-idle",
                           check=False)
        assert result.returncode == 2 and "write [::1]:8471" in result.stderr



def test_a_page_without_hosts_counts_the_jobs_ahead_as_why_does(store):
    ids = [result.job_id for result in store.job_insert(
        [JobSpec(command=("true",), priority=priority) for priority in (50, 10, 50)], NOW)]
    fleet = Fleet.from_settings(Settings())
    texts = why_of(store, fleet, [store.job_get(job_id) for job_id in ids], NOW)
    assert [texts[job_id].split("herder up` runs it (")[1] for job_id in ids] == [
        "1 job(s) ahead of it)", "0 job(s) ahead of it)", "2 job(s) ahead of it)"]
    assert all(texts[job_id] == why(store, fleet, job_id, NOW) for job_id in ids)


def test_the_leader_explains_a_page_from_its_own_latest_cycle(dashboard, monkeypatch):
    ids = submit(dashboard.store, 3)
    coordinator = dashboard.app.state.coordinator
    coordinator.scheduler.run_once(datetime.now(UTC))
    coordinator.is_leader = True
    fleet = Fleet.from_settings(coordinator.settings)
    expected = [why(dashboard.store, fleet, job_id, datetime.now(UTC))
                for job_id in sorted(ids, reverse=True)]

    def no_placement(*_args):
        raise AssertionError("placed the queue again")

    monkeypatch.setattr(read_models, "placed", no_placement)
    operations = dashboard.app.state.operations
    page = operations.job_page(JobStatus.QUEUED, None, None, None, None, 50)
    assert [row.id for row in page.jobs] == sorted(ids, reverse=True)
    assert [row.why for row in page.jobs] == expected
    submit(dashboard.store)  # newer than the cycle: the page needs a placement of its own
    with pytest.raises(AssertionError, match="placed the queue again"):
        operations.job_page(JobStatus.QUEUED, None, None, None, None, 50)
