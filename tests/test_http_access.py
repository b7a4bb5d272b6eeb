"""Who may call what on the HTTP API: every route × every role, generated from the app's own
routes so a new route cannot skip it; plus the edges (body size, malformed headers, the
deprecated admin variable, --insecure-no-auth, answers that never echo a secret)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from herder.api.app import (
    Access,
    api_routes,
    create_app,
    document_routes,
    page_routes,
    route_scope,
)
from herder.api.sessions import COOKIE, CSRF_HEADER
from herder.core.access import (
    Caller,
    SubmitterChoices,
    authorize,
    authorize_owner,
    authorize_reservation,
    authorize_submit,
    held_by,
    identify,
    new_token,
    token_hash,
)
from herder.core.env_policy import DENIED
from herder.core.errors import Refused
from herder.core.model import (
    AttemptToken,
    HostRecord,
    JobSpec,
    Reservation,
    ReservationKind,
    ReservationStatus,
    Scope,
    TokenRecord,
    Transport,
)
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config
from herder.core.settings.sections import ServerSection, Settings
from herder.core.submission import SubmitRequest
from herder.runtime.agent_service import LOG_GRACE, late_log_refusal, log_write_refusal
from herder.runtime.coordinator import Coordinator
from herder.runtime.log_shipper import LOG_GIVE_UP
from herder.runtime.sessions import LEGACY, id_hash
from herder.store import Store, open_store
from herder.wire.jobs import SubmitBody

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ROLES = ("none", "bogus", "revoked", "agent_here", "agent_elsewhere", "read", "restricted",
         "submit", "admin")


@dataclass
class Api:
    client: TestClient
    store: Store
    tokens: dict[str, str]


def make_tokens(store: Store) -> dict[str, str]:
    tokens: dict[str, str] = {"bogus": new_token()}
    for role, scope, host in [("read", Scope.READ, None), ("submit", Scope.SUBMIT, None),
                              ("admin", Scope.ADMIN, None), ("agent_here", Scope.AGENT, "alpha"),
                              ("agent_elsewhere", Scope.AGENT, "beta"),
                              ("revoked", Scope.READ, None)]:
        secret = new_token()
        token_id = store.token_insert(role, scope, token_hash(secret), NOW, host=host)
        if role == "revoked":
            store.token_revoke(token_id, NOW)
        tokens[role] = secret
    # a CI runner's token: submit, limited to one job type (issue 23)
    tokens["restricted"] = new_token()
    store.token_insert("restricted", Scope.SUBMIT, token_hash(tokens["restricted"]), NOW,
                       job_types=frozenset({"dev-issue"}), priority_floor=10)
    return tokens


@pytest.fixture
def api(store_url, tmp_path, monkeypatch) -> Iterator[Api]:
    monkeypatch.chdir(tmp_path)
    with open_store(store_url) as store:
        for label in ("alpha", "beta"):
            store.host_insert(HostRecord(label=label, ram_total_gb=16.0), NOW)
        tokens = make_tokens(store)
        app = create_app(Coordinator(store, Config(Settings(), None), host="server"),
                         Access(max_body_bytes=64 * 1024))
        yield Api(TestClient(app, raise_server_exceptions=False), store, tokens)


def headers(api: Api, role: str) -> dict[str, str]:
    return {} if role == "none" else {"Authorization": f"Bearer {api.tokens[role]}"}


def allowed(scope: Scope | None, role: str) -> bool:
    if scope is None:
        return True
    if scope is Scope.AGENT:
        return role == "agent_here"
    ranks = {"read": 1, "restricted": 2, "submit": 2, "admin": 3}
    needed = {Scope.READ: 1, Scope.SUBMIT: 2, Scope.ADMIN: 3}[scope]
    return ranks.get(role, 0) >= needed


def concrete(path: str, method: str = "GET") -> str:
    # Removing a host or issuing its new token revokes its agent tokens: not alpha's, which
    # the agent routes after these need.
    label = "gamma" if method == "DELETE" or path.endswith("/token") else "alpha"
    values = {"label": label, "job_id": "1", "attempt": "1", "reservation_id": "1",
              "source": "github", "name": "main"}
    return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)


def routes() -> list[tuple[str, str, Scope | None]]:
    found = []
    for route in api_routes():
        declared, scope = route_scope(route)
        assert declared, f"{route.path} declares no scope"
        for method in sorted(route.methods):
            found.append((method, route.path, scope))
    return found


def test_every_route_answers_every_role_as_its_scope_says(api):
    table = routes()
    assert {path for _method, path, _scope in table} == set(api.client.app.openapi()["paths"])
    assert len(table) >= 15, "the app's routes were not found"
    wrong = []
    for method, path, scope in table:
        for role in ROLES:
            response = api.client.request(method, concrete(path, method),
                                          headers=headers(api, role),
                                          json={}, params={"worker": "alpha/1/1"})
            denied = response.status_code in (401, 403)
            if allowed(scope, role) == denied or response.status_code >= 500:
                wrong.append(f"{method} {path} as {role}: {response.status_code} "
                             f"{response.text[:120]}")
            if denied:
                expected = 401 if role in ("none", "bogus", "revoked") else 403
                if response.status_code != expected:
                    wrong.append(f"{method} {path} as {role}: {response.status_code}, "
                                 f"expected {expected}")
                assert "detail" in response.json()
            assert api.tokens.get(role, "unused") not in response.text
    assert wrong == []


def test_every_route_answers_a_dashboard_session_as_its_scope_says(api):
    """The same matrix with the dashboard's session cookie (and its CSRF value) instead of a
    bearer token: operator routes by the token's scope, agent routes never."""
    wrong = []
    for role in ("read", "submit", "admin"):
        client = TestClient(api.client.app, raise_server_exceptions=False)
        signed = client.post("/ui/login", data={"token": api.tokens[role]},
                             follow_redirects=False)
        assert signed.status_code == 303, signed.text
        csrf = client.get("/api/v1/dashboard/session").json()["csrf"]
        for method, path, scope in routes():
            response = client.request(method, concrete(path), headers={CSRF_HEADER: csrf},
                                      json={}, params={"worker": "alpha/1/1"})
            denied = response.status_code in (401, 403)
            expected = allowed(scope, role) and scope is not Scope.AGENT
            if scope is None:
                continue  # public and signed routes take no token, so no cookie either
            if expected == denied or response.status_code >= 500:
                wrong.append(f"{method} {path} as a {role} session: {response.status_code} "
                             f"{response.text[:120]}")
            assert api.tokens[role] not in response.text
    assert wrong == []


def test_every_page_declares_a_scope_and_sends_strangers_to_sign_in(api):
    pages = page_routes()
    assert {route.path for route in pages} >= {"/ui/", "/ui/login", "/ui/jobs/{job_id}"}
    for route in pages:
        declared, scope = route_scope(route)
        assert declared and scope is None, route.path  # pages hold no data; the API does
        for method in route.methods:
            path = re.sub(r"\{(\w+)\}", lambda m: {"job_id": "1", "name": "dashboard.css"}[
                m.group(1)], route.path)
            for role in ("none", "bogus", "read"):
                response = api.client.request(method, path, headers=headers(api, role),
                                              follow_redirects=False)
                assert response.status_code < 500, (method, path, role)
                if method == "GET" and path in ("/ui/", "/ui/jobs", "/ui/jobs/1"):
                    # a bearer header is no session: pages want the cookie
                    assert response.headers["location"] == "/ui/login"


def test_the_openapi_document_is_for_readers_and_no_page_renders_it(api):
    [route] = document_routes()
    assert route_scope(route) == (True, Scope.READ)
    for role in ROLES:
        response = api.client.get("/openapi.json", headers=headers(api, role))
        expected = 200 if allowed(Scope.READ, role) else (
            401 if role in ("none", "bogus", "revoked") else 403)
        assert response.status_code == expected, (role, response.text)
    document = api.client.get("/openapi.json", headers=headers(api, "read")).json()
    assert "/api/v1/jobs" in document["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = api.client.get(page, headers=headers(api, "admin"))
        assert response.status_code == 404, page
        assert "cdn" not in response.text.lower()


def test_a_route_without_a_scope_is_refused_at_startup(store_url, tmp_path, monkeypatch):
    from fastapi import APIRouter

    from herder.api import app as app_module

    monkeypatch.chdir(tmp_path)
    sneaky = APIRouter()
    sneaky.post("/api/v1/unguarded")(lambda: {"ok": True})
    monkeypatch.setattr(app_module, "ROUTERS", (*app_module.ROUTERS, sneaky))
    with open_store(store_url) as store, pytest.raises(RuntimeError, match="unguarded"):
        create_app(Coordinator(store, Config(Settings(), None), host="server"))


def test_open_access_needs_no_operator_token_but_agents_still_do(store_url, tmp_path,
                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(store_url) as store:
        store.host_insert(HostRecord(label="alpha", ram_total_gb=16.0), NOW)
        app = create_app(Coordinator(store, Config(Settings(), None), host="server"),
                         Access(open_access=True))
        # Open access answers loopback names only (DNS rebinding; herder.api.guard).
        client = TestClient(app, base_url="http://127.0.0.1:8470")
        assert client.get("/api/v1/jobs").status_code == 200
        assert client.post("/api/v1/jobs", json={"command": ["true"]}).status_code == 201
        beat = client.post("/api/v1/agent/alpha/heartbeat", json={"worker": "alpha/1/1"})
        assert beat.status_code == 401
        # a token that is sent is still checked
        bogus = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {new_token()}"})
        assert bogus.status_code == 401


def test_the_deprecated_api_token_variable_is_an_admin_token(store_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    legacy = "legacy-operator-token-1234"
    with open_store(store_url) as store:
        app = create_app(Coordinator(store, Config(Settings(), None), host="server"),
                         Access(legacy_admin_token=legacy))
        client = TestClient(app)
        assert client.get("/api/v1/jobs").status_code == 401
        ok = client.post("/api/v1/jobs", json={"command": ["true"]},
                         headers={"Authorization": f"Bearer {legacy}"})
        assert ok.status_code == 201
        wrong = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {legacy}x"})
        assert wrong.status_code == 401
        # the dashboard's sign-in takes it too, and keeps no trace of it in the cookie
        assert client.post("/ui/login", data={"token": legacy},
                           follow_redirects=False).status_code == 303
        assert client.get("/api/v1/dashboard/session").json()["can_admin"] is True
        assert legacy not in str(client.cookies)
        # The store keeps a key of the token that only the cookie's id unlocks: nothing in
        # the table to guess an operator-chosen token from.
        stored = store.session_get(id_hash(client.cookies[COOKIE]), datetime.now(UTC))
        assert stored is not None and stored[0].startswith(LEGACY)
        assert token_hash(legacy) not in stored[0]
        # Sessions are in the store: a server whose variable was rotated refuses the old
        # token's session; one with the same token (a replica) takes it.
        for token, status in (("rotated-operator-token-5678", 401), (legacy, 200)):
            other = TestClient(create_app(
                Coordinator(store, Config(Settings(), None), host="server"),
                Access(legacy_admin_token=token)))
            other.cookies.set(COOKIE, client.cookies[COOKIE])
            assert other.get("/api/v1/dashboard/session").status_code == status, token


@pytest.mark.parametrize("value", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "token abc",
                                   "Bearer a b c d e f g h", "Bearer " + "x" * 5000,
                                   "Bearer ünïcode-token-value"])
def test_malformed_authorization_headers_are_401(api, value):
    before = api.store.job_list()
    response = api.client.post("/api/v1/jobs", json={"command": ["true"]},
                               headers={"Authorization": value.encode("utf-8")})
    assert response.status_code == 401, response.text
    assert response.headers.get("www-authenticate") == "Bearer"
    assert api.store.job_list() == before


def test_an_oversized_body_is_413_and_changes_nothing(api):
    big = {"command": ["true"], "payload": {"blob": "x" * 100_000}}
    response = api.client.post("/api/v1/jobs", json=big, headers=headers(api, "admin"))
    assert response.status_code == 413
    assert api.store.job_list() == []

    def chunks() -> Iterator[bytes]:
        yield b'{"command": ["true"], "payload": {"blob": "'
        for _ in range(20):
            yield b"x" * 8192
        yield b'"}}'

    streamed = api.client.post("/api/v1/jobs", content=chunks(),
                               headers={**headers(api, "admin"),
                                        "Content-Type": "application/json"})
    assert streamed.status_code == 413
    assert api.store.job_list() == []


def test_a_submit_token_is_held_to_its_job_types_and_priority_floor(api, tmp_path):
    secret = new_token()
    # issue 23: ad-hoc commands need --allow-adhoc, even for a token limited to "adhoc"
    api.store.token_insert("ci", Scope.SUBMIT, token_hash(secret), NOW,
                           job_types=frozenset({"adhoc"}), priority_floor=50, allow_adhoc=True)
    auth = {"Authorization": f"Bearer {secret}"}
    ok = api.client.post("/api/v1/jobs", json={"command": ["true"], "priority": 60}, headers=auth)
    assert ok.status_code == 201, ok.text
    urgent = api.client.post("/api/v1/jobs", json={"command": ["true"], "priority": 10},
                             headers=auth)
    assert urgent.status_code == 403 and "floor is 50" in urgent.json()["detail"]
    assert len(api.store.job_list()) == 1
    job_id = ok.json()["id"]
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=auth).status_code == 200


def test_validation_errors_never_echo_the_input(api):
    secret_value = "sk-live-very-secret-value"
    response = api.client.post("/api/v1/jobs", headers=headers(api, "admin"),
                               json={"command": ["true"], "env": {"KEY": secret_value},
                                     "priority": "high"})
    assert response.status_code == 422
    assert secret_value not in response.text


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/v1/jobs", {"command": ["true\x00"]}),
    ("POST", "/api/v1/jobs", b'{"command": ["true"], "delay_seconds": 1.8e308}'),
    ("POST", "/api/v1/jobs", b'{"command": ["true"], "payload": {"x": NaN}}'),
    # a lone surrogate: valid JSON, but no UTF-8 text (a server error on PostgreSQL once)
    ("POST", "/api/v1/jobs", b'{"command": ["true\\ud800"]}'),
    ("POST", "/api/v1/jobs", b'{"command": ["true"], "payload": {"\\udfff": 1}}'),
    ("POST", "/api/v1/jobs", {"command": ["true"], "env": {"A\x00": "b"}}),
    ("POST", "/api/v1/reservations", {"owner": "o\x00", "host": "alpha", "count": 1}),
    ("POST", "/api/v1/slots/release", {"run_id": "r\x00"}),
    ("POST", "/api/v1/slots/claim", {"run_id": "r", "host": "alpha", "weight": "li\x00ght"}),
])
def test_bodies_a_database_cannot_store_are_422(api, method, path, body):
    if isinstance(body, bytes):  # JSON that Python's encoder will not write (1.8e308, NaN, \ud800)
        response = api.client.request(method, path, content=body,
                                      headers={**headers(api, "admin"),
                                               "Content-Type": "application/json"})
    else:
        response = api.client.request(method, path, json=body, headers=headers(api, "admin"))
    assert response.status_code == 422, response.text
    assert api.store.job_list() == [] and api.store.reservation_list() == []


@pytest.mark.parametrize(("method", "path"), [
    ("GET", "/api/v1/jobs/4242/why"), ("GET", "/api/v1/jobs/4242"),
    ("POST", "/api/v1/jobs/4242/cancel"),
])
def test_unknown_ids_are_404(api, method, path):
    assert api.client.request(method, path, headers=headers(api, "admin")).status_code == 404


def test_completing_an_unknown_reservation_is_404(api):
    response = api.client.post("/api/v1/reservations/4242/complete", json={"status": "done"},
                               headers=headers(api, "admin"))
    assert response.status_code == 404


def test_stale_agent_reports_are_409_with_a_reason(api):
    auth = headers(api, "agent_here")
    job_id = api.client.post("/api/v1/jobs", json={"command": ["true"]},
                             headers=headers(api, "admin")).json()["id"]
    for kind, body in [("start", {"pid": 1}), ("finish", {"outcome": "ok", "exit_code": 0})]:
        response = api.client.post(f"/api/v1/agent/alpha/attempts/{job_id}/1/{kind}",
                                   json=body, headers=auth)
        assert response.status_code == 409, response.text
        assert "not live on host alpha" in response.json()["detail"]
    log = api.client.post(f"/api/v1/agent/alpha/attempts/{job_id}/1/log", content=b"late\n",
                          headers=auth)
    assert log.status_code == 409


# -- the policy itself, as a pure function ----------------------------------------------------


def record(scope: Scope, **kwargs) -> TokenRecord:
    return TokenRecord(1, "t", scope, NOW, **kwargs)


def test_authorize_ranks_operator_scopes_and_binds_agents_to_their_host():
    for scope, allowed_scopes in [(Scope.READ, {Scope.READ, Scope.SUBMIT, Scope.ADMIN}),
                                  (Scope.SUBMIT, {Scope.SUBMIT, Scope.ADMIN}),
                                  (Scope.ADMIN, {Scope.ADMIN})]:
        for held in (Scope.READ, Scope.SUBMIT, Scope.ADMIN):
            caller = Caller("c", held)
            if held in allowed_scopes:
                authorize(caller, scope)
            else:
                with pytest.raises(Refused) as refused:
                    authorize(caller, scope)
                assert refused.value.status == 403
        with pytest.raises(Refused):
            authorize(Caller("a", Scope.AGENT, host="alpha"), scope)
    authorize(Caller("a", Scope.AGENT, host="alpha"), Scope.AGENT, "alpha")
    for caller in (Caller("a", Scope.AGENT, host="beta"), Caller("root", Scope.ADMIN)):
        with pytest.raises(Refused) as refused:
            authorize(caller, Scope.AGENT, "alpha")
        assert refused.value.status == 403


def test_identify_refuses_unknown_and_revoked_tokens():
    with pytest.raises(Refused, match="unknown"):
        identify(None)
    with pytest.raises(Refused, match="revoked"):
        identify(record(Scope.ADMIN, revoked_at=NOW))
    assert identify(record(Scope.READ)).scope is Scope.READ


def test_authorize_submit_limits():
    limited = Caller.of(record(Scope.SUBMIT, job_types=frozenset({"dev-issue"}),
                               priority_floor=10))
    job_type = JobTypeSection(command=["true"])

    def submit(caller: Caller, name: str, priority: int) -> None:
        spec = JobSpec(command=("true",), job_type=name, priority=priority)
        authorize_submit(caller, SubmitRequest(job_type=name), spec, job_type, {})

    submit(limited, "dev-issue", 10)
    with pytest.raises(Refused, match="job type"):
        submit(limited, "review-pr", 50)
    with pytest.raises(Refused, match="floor"):
        submit(limited, "dev-issue", 9)
    submit(Caller("free", Scope.SUBMIT), "anything", -5)


@pytest.mark.parametrize("build", [SubmitRequest, SubmitBody])
def test_authorize_submit_reads_a_request_and_a_body_alike(build):
    # The core cannot name the API's SubmitBody: it reads what a submitter chose through
    # SubmitterChoices, which a SubmitRequest and a SubmitBody both satisfy.
    limited = Caller.of(record(Scope.SUBMIT, job_types=frozenset({"dev-issue"})))
    job_type = JobTypeSection(command=["true"], submit_env=["MODE"])
    spec = JobSpec(command=("true",), job_type="dev-issue")
    chosen: SubmitterChoices = build(job_type="dev-issue", env={"MODE": "fast"})
    authorize_submit(limited, chosen, spec, job_type, {})
    for refused, match in (({"env": {"HOME": "/"}}, "env.HOME"), ({"workdir": "/tmp"}, "workdir"),
                           ({"affinity": "alpha"}, "affinity"), ({"weight": "heavy"}, "weight"),
                           ({"timeout_seconds": 5.0}, "timeout"), ({"max_attempts": 2},
                                                                   "max_attempts")):
        with pytest.raises(Refused, match=match):
            authorize_submit(limited, build(job_type="dev-issue", **refused), spec, job_type,
                             {"heavy": 8.0})


# -- what each token was given (issue 23) ------------------------------------------------------

FIXED = "agent-issue"
"""A job type whose argv is fixed and that lets a submitter set nothing else."""
OPEN = "open"
"""A job type that lets a submitter set some env, the workdir, the host and bounded values."""


@dataclass
class Grants:
    client: TestClient
    store: Store
    restricted: dict[str, str]
    """Restricted to FIXED and OPEN."""
    plain: dict[str, str]
    """An unrestricted submit token without --allow-adhoc."""
    adhoc: dict[str, str]
    """A submit token made with --allow-adhoc."""
    other: dict[str, str]
    """Another unrestricted submit token (for others' reservations)."""
    admin: dict[str, str]
    alpha: dict[str, str]
    """alpha's agent token."""
    log_dir: Path


def bearer(store: Store, name: str, scope: Scope, **limits: Any) -> dict[str, str]:
    secret = new_token()
    store.token_insert(name, scope, token_hash(secret), NOW, **limits)
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
def grants(store_url, tmp_path, monkeypatch) -> Iterator[Grants]:
    monkeypatch.chdir(tmp_path)
    settings = Settings(
        job_types={
            FIXED: JobTypeSection(command=["echo", "{issue}"]),
            OPEN: JobTypeSection(command=["echo", "{issue}"], submit_env=["MY_FLAG", "APP_*"],
                                 allow_workdir=True, allow_host=True, submit_max_weight="light",
                                 submit_max_timeout=600.0, submit_max_attempts=2)},
        server=ServerSection(max_log_bytes=1024 * 1024, max_reservations_per_token=3,
                             max_reservation_weight="heavy"))
    with open_store(store_url) as store:
        for label in ("alpha", "beta"):
            store.host_insert(HostRecord(label=label, ram_total_gb=64.0), NOW)
        coordinator = Coordinator(store, Config(settings, None), host="server")
        app = create_app(coordinator, Access(max_body_bytes=2 * 1024 * 1024))
        yield Grants(
            TestClient(app, raise_server_exceptions=False), store,
            restricted=bearer(store, "ci", Scope.SUBMIT, job_types=frozenset({FIXED, OPEN})),
            plain=bearer(store, "plain", Scope.SUBMIT),
            adhoc=bearer(store, "shell", Scope.SUBMIT, allow_adhoc=True),
            other=bearer(store, "other", Scope.SUBMIT),
            admin=bearer(store, "root", Scope.ADMIN),
            alpha=bearer(store, "host:alpha", Scope.AGENT, host="alpha"),
            log_dir=coordinator.log_dir)


def jobs_now(store: Store) -> list[Any]:
    return [(job, store.attempt_list(job.id)) for job in store.job_list()]


def refused(grants: Grants, auth: dict[str, str], body: dict[str, Any], status: int,
            field: str) -> str:
    """POST a submit that must be refused with `status`, naming `field`; nothing stored."""
    before = jobs_now(grants.store)
    response = grants.client.post("/api/v1/jobs", json=body, headers=auth)
    assert response.status_code == status, (body, response.text)
    text = response.json().get("detail") or response.json().get("error")
    assert text.startswith(field), (field, text)
    assert jobs_now(grants.store) == before
    return str(text)


@pytest.mark.parametrize("name", [example for example, _ in [
    (pattern.replace("*", "X"), why) for pattern, why in DENIED]])
def test_no_token_sets_a_denied_variable(grants, name):
    for auth in (grants.restricted, grants.admin):
        for body in ({"job_type": OPEN, "payload": {"issue": 1}, "env": {name: "x"}},
                     {"command": ["true"], "env": {name: "x"}}):
            if "command" in body and auth is grants.restricted:
                continue  # refused for the command first (below)
            refused(grants, auth, body, 422, f"env.{name}")


def test_a_restricted_token_sets_only_what_its_job_type_allows(grants):
    auth = grants.restricted
    fixed = {"job_type": FIXED, "payload": {"issue": 7}}
    for extra, field, fix in [
            ({"env": {"MY_FLAG": "1"}}, "env.MY_FLAG", "submit_env"),
            ({"workdir": "/tmp"}, "workdir", "allow_workdir"),
            ({"affinity": "alpha"}, "affinity", "allow_host"),
            ({"weight": "light"}, "weight", "submit_max_weight"),
            ({"timeout_seconds": 60}, "timeout", "submit_max_timeout"),
            ({"max_attempts": 1}, "max_attempts", "submit_max_attempts")]:
        text = refused(grants, auth, {**fixed, **extra}, 403, field)
        assert fix in text and f"[job_types.{FIXED}]" in text
    open_type = {"job_type": OPEN, "payload": {"issue": 7}}
    for extra, field in [({"env": {"OTHER": "1"}}, "env.OTHER"),
                         ({"weight": "heavy"}, "weight"),
                         ({"timeout_seconds": 601}, "timeout"),
                         ({"max_attempts": 3}, "max_attempts")]:
        refused(grants, auth, {**open_type, **extra}, 403, field)
    # what picks and orders the work is the submitter's
    ok = grants.client.post("/api/v1/jobs", headers=auth, json={
        **fixed, "dedup_key": "issue-7", "priority": 50, "delay_seconds": 5, "force": True})
    assert ok.status_code == 201, ok.text
    allowed_all = grants.client.post("/api/v1/jobs", headers=auth, json={
        **open_type, "env": {"MY_FLAG": "1", "APP_MODE": "x"}, "workdir": "/tmp",
        "affinity": "alpha", "weight": "light", "timeout_seconds": 600, "max_attempts": 2})
    assert allowed_all.status_code == 201, allowed_all.text
    job = grants.store.job_get(allowed_all.json()["id"])
    assert job is not None and (job.affinity, job.workdir, job.max_attempts) == (
        "alpha", "/tmp", 2)
    assert job.env == {"MY_FLAG": "1", "APP_MODE": "x"}
    # an unrestricted submit token is not held to the job type's lists
    free = grants.client.post("/api/v1/jobs", headers=grants.plain, json={
        **fixed, "env": {"MY_FLAG": "1"}, "affinity": "beta", "weight": "heavy"})
    assert free.status_code == 201, free.text


def test_ad_hoc_commands_need_admin_or_allow_adhoc(grants):
    body = {"command": ["true"]}
    refused(grants, grants.restricted, body, 403, "this token may not act on job type")
    text = refused(grants, grants.plain, body, 403, "command")
    assert "--allow-adhoc" in text and "shell on every host" in text
    for auth in (grants.adhoc, grants.admin):
        assert grants.client.post("/api/v1/jobs", json=body, headers=auth).status_code == 201


def test_a_token_ends_only_the_reservations_and_slots_it_made(grants):
    client, store = grants.client, grants.store
    made = client.post("/api/v1/reservations", headers=grants.restricted,
                       json={"owner": "sub", "host": "alpha", "count": 1})
    assert made.status_code == 201, made.text
    [mine] = made.json()["reserved"]
    slot = client.post("/api/v1/slots/claim", headers=grants.restricted,
                       json={"run_id": "run-1", "host": "alpha", "weight": "light"})
    assert slot.status_code == 201, slot.text
    before = store.reservation_list()
    complete = client.post(f"/api/v1/reservations/{mine}/complete", headers=grants.other,
                           json={"status": "done"})
    assert complete.status_code == 403 and "another token" in complete.json()["detail"]
    for path in ("/api/v1/slots/release", "/api/v1/slots/claim"):
        taken = client.post(path, headers=grants.other,
                            json={"run_id": "run-1", "host": "alpha", "weight": "light"})
        assert taken.status_code == 403, (path, taken.text)
    assert store.reservation_list() == before
    ended = client.post(f"/api/v1/reservations/{mine}/complete", headers=grants.restricted,
                        json={"status": "done"})
    assert ended.json()["status"] == "done"
    released = client.post("/api/v1/slots/release", headers=grants.admin,
                           json={"run_id": "run-1"})
    assert released.json() == {"released": True}
    assert store.reservation_list() == []


def test_a_token_limited_to_job_types_books_only_for_jobs_of_them(grants):
    """`job` on a reservation: a restricted token names only jobs of its types (else it
    would learn any job's state from the refusal), as for cancel and retry."""
    client, store = grants.client, grants.store
    foreign = store.job_insert([JobSpec(command=("true",))], NOW)[0].job_id
    for missing in (foreign, 999_999):
        response = client.post("/api/v1/reservations", headers=grants.restricted,
                               json={"owner": "sub", "host": "alpha", "count": 1,
                                     "job": missing})
        assert response.status_code in (403, 404), response.text
        assert "queued" not in response.text
    assert store.reservation_list() == []
    # An unrestricted token is told the job's state.
    told = client.post("/api/v1/reservations", headers=grants.other,
                       json={"owner": "sub", "host": "alpha", "count": 1, "job": foreign})
    assert told.status_code == 422 and "queued" in told.text, told.text


def test_non_admin_tokens_are_capped_on_reservations_and_slots(grants):
    client, store = grants.client, grants.store
    heavy = client.post("/api/v1/reservations", headers=grants.other,
                        json={"owner": "o", "host": "alpha", "count": 1,
                              "weight": "orchestrator"})
    assert heavy.status_code == 403 and heavy.json()["detail"].startswith("weight")
    assert store.reservation_list() == []
    many = client.post("/api/v1/reservations", headers=grants.other,
                       json={"owner": "o", "host": "alpha", "count": 10, "weight": "light"})
    assert many.status_code == 201 and len(many.json()["reserved"]) == 3
    full = client.post("/api/v1/slots/claim", headers=grants.other,
                       json={"run_id": "r", "host": "alpha", "weight": "light"})
    assert full.status_code == 409 and "max_reservations_per_token" in full.text
    assert len(store.reservation_list()) == 3
    admin = client.post("/api/v1/reservations", headers=grants.admin,
                        json={"owner": "o", "host": "alpha", "count": 4,
                              "weight": "orchestrator"})
    assert len(admin.json()["reserved"]) == 3  # as many as fit the host, not the cap


def on_beta(grants: Grants) -> AttemptToken:
    """An attempt claimed on host beta (what alpha's token must not touch)."""
    submitted = grants.client.post("/api/v1/jobs", headers=grants.admin,
                                   json={"command": ["true"], "affinity": "beta"})
    job_id = submitted.json()["id"]
    [job] = grants.store.job_claim("beta", "beta/1/1", 1, datetime.now(UTC))
    assert job.id == job_id
    return job.token


def test_a_host_token_touches_no_other_hosts_attempt(grants):
    client, store = grants.client, grants.store
    token = on_beta(grants)
    attempt = f"{token.job_id}/{token.attempt}"
    before = jobs_now(store)
    beat = client.post("/api/v1/agent/alpha/heartbeat", headers=grants.alpha,
                       json={"worker": "alpha/1/1", "running": [[token.job_id, token.attempt]]})
    assert beat.status_code == 200 and beat.json()["live"] == [], beat.text
    for kind, body in [("start", {"pid": 1}), ("finish", {"outcome": "ok", "exit_code": 0})]:
        answer = client.post(f"/api/v1/agent/alpha/attempts/{attempt}/{kind}", json=body,
                             headers=grants.alpha)
        assert answer.status_code == 409, (kind, answer.text)
    log = client.post(f"/api/v1/agent/alpha/attempts/{attempt}/log", content=b"x",
                      headers=grants.alpha)
    assert log.status_code == 409
    placed = client.get(f"/api/v1/agent/alpha/attempts/{attempt}", headers=grants.alpha)
    assert placed.json()["job"] is None
    assert jobs_now(store) == before  # heartbeat_at (in the attempt list) did not move
    assert client.post(f"/api/v1/jobs/{token.job_id}/cancel",
                       headers=grants.admin).status_code == 200
    cancel_state = jobs_now(store)
    cancels = client.get("/api/v1/agent/alpha/cancels", params={"jobs": str(token.job_id)},
                         headers=grants.alpha)
    assert cancels.json()["cancel"] == []
    gone = client.post("/api/v1/agent/alpha/gone", params={"worker": "beta/1/1"},
                       headers=grants.alpha)
    assert gone.status_code == 422
    for path, method in [(f"/api/v1/agent/beta/attempts/{attempt}/start", "POST"),
                         ("/api/v1/agent/beta/heartbeat", "POST"),
                         (f"/api/v1/agent/beta/attempts/{attempt}/log", "POST")]:
        assert client.request(method, path, headers=grants.alpha,
                              json={"worker": "beta/1/1", "pid": 1}).status_code == 403
    assert jobs_now(store) == cancel_state
    assert not (grants.log_dir / str(token.job_id)).exists()


def claimed_on_alpha(grants):
    """A job submitted over the API and claimed by alpha's agent worker."""
    submitted = grants.client.post("/api/v1/jobs", headers=grants.admin,
                                   json={"command": ["true"], "affinity": "alpha"})
    [job] = grants.store.job_claim("alpha", "alpha/1/1", 1, datetime.now(UTC))
    assert job.id == submitted.json()["id"]
    return job


def test_agent_log_writes_are_capped_and_never_sparse(grants):
    client = grants.client
    job = claimed_on_alpha(grants)
    path = f"/api/v1/agent/alpha/attempts/{job.id}/{job.attempt}/log"
    log_file = grants.log_dir / str(job.id) / f"{job.attempt}.log"
    first = client.post(path, params={"offset": 1}, content=b"x", headers=grants.alpha)
    assert first.status_code == 416 and not log_file.exists()  # nothing created
    assert client.post(path, content=b"hello\n", headers=grants.alpha).json()["size"] == 6
    sparse = client.post(path, params={"offset": 2**40}, content=b"x", headers=grants.alpha)
    assert sparse.status_code == 416 and "offset" in sparse.json()["detail"]
    assert log_file.stat().st_size == 6
    resent = client.post(path, params={"offset": 0}, content=b"hello\n", headers=grants.alpha)
    assert resent.status_code == 200  # a resent chunk is fine
    chunk = b"y" * (512 * 1024)
    assert client.post(path, params={"offset": 6}, content=chunk,
                       headers=grants.alpha).status_code == 200
    over = client.post(path, params={"offset": 6 + len(chunk)}, content=chunk,
                       headers=grants.alpha)
    assert over.status_code == 413 and "max_log_bytes" in over.json()["detail"]
    assert log_file.stat().st_size == 6 + len(chunk)


@pytest.mark.parametrize("transport", ["local"])
def test_no_api_route_makes_a_host_local(grants, transport):
    added = grants.client.post("/api/v1/hosts", headers=grants.admin,
                               json={"label": "gamma", "ram_total_gb": 8,
                                     "transport": transport})
    assert added.status_code == 422 and added.json()["field"] == "transport"
    assert "herder.toml" in added.json()["error"]
    changed = grants.client.patch("/api/v1/hosts/alpha", headers=grants.admin,
                                  json={"transport": transport})
    assert changed.status_code == 422 and changed.json()["field"] == "transport"
    assert grants.store.host_get("gamma") is None
    assert str(grants.store.host_get("alpha").transport) == "agent"


def test_a_local_host_stays_local_over_the_api(grants):
    grants.store.host_insert(HostRecord(label="here", ram_total_gb=8.0,
                                        transport=Transport.LOCAL), NOW)
    for transport in ("agent", "ssh"):
        changed = grants.client.patch("/api/v1/hosts/here", headers=grants.admin,
                                      json={"transport": transport, "ssh_target": "u@h"})
        assert changed.status_code == 422 and changed.json()["field"] == "transport"
    assert grants.store.host_get("here").transport is Transport.LOCAL
    same = grants.client.patch("/api/v1/hosts/here", headers=grants.admin,
                               json={"ram_total_gb": 16})
    assert same.status_code == 200


def test_an_ended_attempts_log_is_closed_after_a_grace(grants):
    """The agent ships the tail right after the finish: taken within the grace, refused
    (410, what the agent takes as "stop shipping") after it, the file unchanged."""
    client, store = grants.client, grants.store
    job = claimed_on_alpha(grants)
    attempt = f"/api/v1/agent/alpha/attempts/{job.id}/{job.attempt}"
    assert client.post(f"{attempt}/start", json={"pid": 1},
                       headers=grants.alpha).status_code == 200
    assert client.post(f"{attempt}/log", content=b"live\n",
                       headers=grants.alpha).json()["size"] == 5
    assert client.post(f"{attempt}/finish", json={"outcome": "ok", "exit_code": 0},
                       headers=grants.alpha).status_code == 200
    [ended] = store.attempt_list(job.id)
    assert ended.ended_at is not None
    tail = client.post(f"{attempt}/log", params={"offset": 5}, content=b"tail\n",
                       headers=grants.alpha)
    assert tail.status_code == 200 and tail.json()["size"] == 10  # within the grace
    coordinator = client.app.state.coordinator
    coordinator.agents.log_grace = timedelta(0)  # as if the grace had passed since it ended
    late = client.post(f"{attempt}/log", params={"offset": 10}, content=b"x" * 1000,
                       headers=grants.alpha)
    assert late.status_code == 410 and "ended" in late.json()["detail"]
    log_file = grants.log_dir / str(job.id) / f"{job.attempt}.log"
    assert log_file.read_bytes() == b"live\ntail\n"


def test_late_log_refusal_is_pure_arithmetic():
    ended = datetime(2026, 1, 1, tzinfo=UTC)
    grace = timedelta(minutes=15)
    assert late_log_refusal(None, ended + timedelta(days=9), grace) is None  # live
    assert late_log_refusal(ended, ended + grace, grace) is None
    assert late_log_refusal(ended, ended + grace + timedelta(seconds=1), grace)[0] == 410
    assert LOG_GRACE.total_seconds() > LOG_GIVE_UP  # past the agent's last retry of a tail


def test_log_write_refusal_is_pure_arithmetic():
    assert log_write_refusal(0, 10, 0, 100) is None
    assert log_write_refusal(5, 10, 20, 100) is None  # a resent chunk
    assert log_write_refusal(21, 1, 20, 100)[0] == 416
    assert log_write_refusal(95, 10, 95, 100)[0] == 413
    assert log_write_refusal(90, 10, 90, 100) is None  # exactly the cap


def test_authorize_owner_and_reservation_bounds():
    mine = Caller("ci", Scope.SUBMIT, id=7)
    other = Caller("other", Scope.SUBMIT, id=8)
    made = Reservation(1, ReservationKind.CI, "run-1", "alpha", "light", 3.0,
                       ReservationStatus.ACTIVE, NOW, NOW, None, created_by=7)
    authorize_owner(mine, made)
    authorize_owner(Caller("root", Scope.ADMIN), made)
    with pytest.raises(Refused, match="another token") as refused:
        authorize_owner(other, made)
    assert refused.value.status == 403
    budgets = {"light": 3.0, "heavy": 8.0}
    authorize_reservation(mine, "light", budgets, "light")
    authorize_reservation(Caller("root", Scope.ADMIN), "heavy", budgets, "light")
    authorize_reservation(mine, "unknown", budgets, "light")  # the 422 names it later
    with pytest.raises(Refused, match="max_reservation_weight"):
        authorize_reservation(mine, "heavy", budgets, "light")
    assert held_by(mine, 5) == (7, 5) and held_by(Caller("root", Scope.ADMIN, id=1), 5) == (
        1, None)
