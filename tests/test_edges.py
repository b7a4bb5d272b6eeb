"""The server's edges (issue 23 item 5): DNS rebinding on a loopback server, the API's
document behind a read token, plain http off loopback, the session cookie over TLS, the
legacy admin variable's length, failed token checks rate-limited per client, JSON bodies
only with a JSON content type. Pure rules first; then real `herder` processes."""

from __future__ import annotations

import ssl
import subprocess
from datetime import UTC, datetime

import httpx
import pytest
from fastapi.testclient import TestClient
from support.cli import herder_argv, run_herder
from support.environment import clean_environment
from support.ports import free_port
from support.waits import wait_for

from herder.api.app import Access, create_app
from herder.api.guard import FailureLimiter, host_name, proxy_options, rebinding_refusal
from herder.api.sessions import COOKIE, SECURE_COOKIE
from herder.core.access import new_token, token_hash
from herder.core.errors import InputError
from herder.core.model import AttemptToken, Scope
from herder.core.settings.loading import Config
from herder.core.settings.sections import Settings
from herder.runtime.agent_client import check_server_url
from herder.runtime.coordinator import Coordinator
from herder.runtime.ssh import remote_command
from herder.store import open_store

EVIL = "rebind.evil.example"
TRUST_LOCAL_PROXY = {"FORWARDED_ALLOW_IPS": "127.0.0.1"}
"""A proxy on this machine, trusted as an operator would name it."""

# -- pure ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("host", "name"), [
    ("127.0.0.1:8470", "127.0.0.1"), ("localhost", "localhost"), ("[::1]:8470", "::1"),
    ("LOCALHOST:1", "localhost"), ("::1", "::1"), ("evil.example:80", "evil.example")])
def test_a_host_value_without_its_port(host, name):
    assert host_name(host) == name


@pytest.mark.parametrize("host", ["127.0.0.1:8470", "127.0.0.1", "localhost:8470",
                                  "[::1]:8470", "127.9.9.9", "localhost.:1"])
def test_a_loopback_server_answers_loopback_names(host):
    assert rebinding_refusal(host, None) is None
    assert rebinding_refusal(host, f"http://{host}") is None


@pytest.mark.parametrize(("host", "origin"), [
    (EVIL, None), (f"{EVIL}:8470", None), ("", None), (None, None), ("10.0.0.1:8470", None),
    ("127.0.0.1.evil.example", None), ("localhost.evil.example:8470", None),
    ("127.0.0.1:8470", "https://evil.example"), ("127.0.0.1:8470", "null"),
    ("127.0.0.1:8470", "http://127.0.0.1:9999"), ("localhost:8470", "http://127.0.0.1:8470")])
def test_a_loopback_server_refuses_foreign_hosts_and_origins(host, origin):
    refusal = rebinding_refusal(host, origin)
    assert refusal is not None
    assert ("Host" in refusal) if origin is None else ("cross-origin" in refusal)


def test_a_proxys_name_is_answered_only_when_declared():
    assert rebinding_refusal("herder.example.org", None) is not None
    assert rebinding_refusal("herder.example.org", None, ("herder.example.org",)) is None
    assert rebinding_refusal(EVIL, None, ("herder.example.org",)) is not None
    # A proxy that passes its own loopback address as Host: the public name's pages are ours.
    assert rebinding_refusal("127.0.0.1:8470", "https://herder.example.org",
                             ("herder.example.org",)) is None
    assert rebinding_refusal("127.0.0.1:8470", f"https://{EVIL}",
                             ("herder.example.org",)) is not None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_refuses_a_client_after_its_failures_until_the_window_ends():
    clock = Clock()
    limiter = FailureLimiter(limit=3, window=60.0, clock=clock)
    for guess in ("g1", "g2"):
        limiter.failed("a", guess)
        assert limiter.wait("a") is None
    limiter.failed("a", "g3")
    assert limiter.wait("a") == 60
    assert limiter.wait("b") is None  # another client is not touched
    clock.now += 59.5
    assert limiter.wait("a") == 1
    clock.now += 0.5
    assert limiter.wait("a") is None and len(limiter) == 0  # forgotten once it ended
    limiter.failed("a", "g4")
    assert limiter.wait("a") is None  # a new window, counted from one


def test_one_token_retried_counts_once():
    """An agent whose token was revoked retries it from every thread: not a guesser, and
    the other agents at its address go on."""
    limiter = FailureLimiter(limit=3, window=60.0, clock=Clock())
    for _ in range(100):
        limiter.failed("a", "revoked")
    assert limiter.wait("a") is None
    limiter.failed("a", "g1")
    limiter.failed("a", "g2")
    assert limiter.wait("a") == 60


def test_a_failure_in_a_new_window_starts_the_count_again():
    clock = Clock()
    limiter = FailureLimiter(limit=2, window=10.0, clock=clock)
    limiter.failed("a", "g1")
    clock.now += 11
    limiter.failed("a", "g2")
    assert limiter.wait("a") is None
    limiter.failed("a", "g3")
    assert limiter.wait("a") == 10


def test_the_limiter_remembers_a_bounded_number_of_clients():
    clock = Clock()
    limiter = FailureLimiter(limit=1, window=60.0, max_clients=100, clock=clock)
    for index in range(1000):
        limiter.failed(f"10.0.{index // 256}.{index % 256}", f"g{index}")
    assert len(limiter) == 100
    assert limiter.wait("10.0.0.0") is None  # the oldest were forgotten first
    assert limiter.wait("10.0.3.231") == 60  # the newest are held


def test_a_token_that_checked_out_lately_passes_a_throttled_address():
    """An address is not an identity: whoever fails from it must not lock out the agents
    that share it; a token not seen lately still waits, and one that fails is forgotten."""
    clock = Clock()
    limiter = FailureLimiter(limit=2, window=600.0, clock=clock, verified_ttl=300.0)
    limiter.verified("good")
    for guess in ("g1", "g2"):
        limiter.failed("a", guess)
    assert limiter.wait("a") == 600 and limiter.wait("a", "unseen") == 600
    assert limiter.wait("a", "good") is None
    clock.now += 299
    assert limiter.wait("a", "good") is None
    clock.now += 1
    assert limiter.wait("a", "good") == 300 and not limiter.known("good")  # its TTL ended
    limiter.verified("good")
    limiter.failed("a", "good")  # revoked since: no longer known-good
    assert not limiter.known("good") and limiter.wait("a", "good") is not None


def test_the_limiter_remembers_a_bounded_number_of_verified_tokens():
    limiter = FailureLimiter(limit=1, window=60.0, clock=Clock(), max_verified=100)
    for index in range(1000):
        limiter.verified(f"t{index}")
    limiter.verified("t900")  # used again: the most recent
    assert not limiter.known("t0") and not limiter.known("t899")
    assert limiter.known("t900") and limiter.known("t999")
    limiter.verified("t1000")
    assert limiter.known("t900")  # the least recently used went first


@pytest.mark.parametrize("url", ["http://192.0.2.1:8470", "http://coordinator:8470",
                                 "http://[2001:db8::1]:8470", "http://127.0.0.1.nip.io"])
def test_a_client_refuses_plain_http_off_loopback(url):
    with pytest.raises(InputError) as refused:
        check_server_url(url)
    assert refused.value.field == "--server" and "--allow-plaintext" in str(refused.value)
    assert "https" in str(refused.value)
    assert check_server_url(url, allow_plaintext=True) == url


@pytest.mark.parametrize("url", ["http://127.0.0.1:8470", "http://localhost:8470",
                                 "http://[::1]:8470", "https://coordinator:8470"])
def test_a_client_takes_loopback_http_and_any_https(url):
    assert check_server_url(url) == url


def test_ssh_push_passes_the_servers_consent_to_plain_http():
    token = AttemptToken(7, 2)
    assert "--allow-plaintext" not in remote_command("herder", "http://q:8470", "h", token)
    assert remote_command("herder", "http://q:8470", "h", token, True).endswith(
        " --allow-plaintext")


# -- in process: the throttle does no store lookup, the cookie follows public_url ----------


@pytest.fixture
def app_of(store_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(store_url) as store:
        def make(access: Access) -> tuple[TestClient, Coordinator]:
            coordinator = Coordinator(store, Config(Settings(), None), host="server")
            return TestClient(create_app(coordinator, access),
                              raise_server_exceptions=False), coordinator
        yield make, store


def test_a_throttled_client_is_refused_before_any_store_lookup(app_of, monkeypatch):
    make, store = app_of
    client, _coordinator = make(Access(failure_limit=3))
    secret = new_token()
    store.token_insert("ops", Scope.READ, token_hash(secret), datetime.now(UTC))
    lookups: list[str] = []
    operations = client.app.state.operations
    original = operations.token
    monkeypatch.setattr(operations, "token", lambda key: lookups.append(key) or original(key))
    assert [client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {new_token()}"}
                       ).status_code for _ in range(3)] == [401, 401, 401]
    assert len(lookups) == 3
    throttled = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {secret}"})
    assert throttled.status_code == 429 and int(throttled.headers["Retry-After"]) >= 1
    assert "too many failed token checks" in throttled.json()["detail"]
    assert len(lookups) == 3  # refused before the store was asked
    login = client.post("/ui/login", data={"token": secret})
    assert login.status_code == 429 and len(lookups) == 3


def test_a_known_good_token_passes_a_throttled_client_and_its_lookup_decides(app_of,
                                                                             monkeypatch):
    make, store = app_of
    client, _coordinator = make(Access(failure_limit=3))
    known, unseen = new_token(), new_token()
    known_id = store.token_insert("ops", Scope.READ, token_hash(known), datetime.now(UTC))
    store.token_insert("ops", Scope.READ, token_hash(unseen), datetime.now(UTC))
    assert client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {known}"}
                      ).status_code == 200
    assert [client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {new_token()}"}
                       ).status_code for _ in range(3)] == [401, 401, 401]
    lookups: list[str] = []
    operations = client.app.state.operations
    original = operations.token
    monkeypatch.setattr(operations, "token", lambda key: lookups.append(key) or original(key))
    passed = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {known}"})
    assert passed.status_code == 200 and lookups == [token_hash(known)]
    held = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {unseen}"})
    assert held.status_code == 429 and len(lookups) == 1  # never seen: no lookup
    # Revoked since it checked out: the lookup decides (401), and it is known no more.
    assert store.token_revoke(known_id, datetime.now(UTC))
    revoked = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {known}"})
    assert revoked.status_code == 401 and len(lookups) == 2
    again = client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {known}"})
    assert again.status_code == 429 and len(lookups) == 2


def test_an_https_public_url_makes_the_cookie_secure_and_host_prefixed(app_of):
    make, store = app_of
    secret = new_token()
    store.token_insert("ops", Scope.READ, token_hash(secret), datetime.now(UTC))
    client, _ = make(Access(secure_cookie=True))
    signed = client.post("/ui/login", data={"token": secret}, follow_redirects=False)
    assert signed.status_code == 303
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{SECURE_COOKIE}=") and "Secure" in cookie
    assert "Path=/" in cookie and "Domain" not in cookie
    session = client.cookies[SECURE_COOKIE]
    # The browser sends it back over https only; the plain name is not read here.
    answered = TestClient(client.app, cookies={SECURE_COOKIE: session}).get(
        "/api/v1/dashboard/session")
    assert answered.status_code == 200
    plain = TestClient(client.app, cookies={COOKIE: session}).get("/api/v1/dashboard/session")
    assert plain.status_code == 401


# -- real servers ---------------------------------------------------------------------------------


def test_a_loopback_server_refuses_dns_rebinding(make_fleet, tmp_path, store_url):
    """--insecure-no-auth: a foreign Host or Origin changes nothing and gets no token."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server("--insecure-no-auth")
    body = {"label": "rebound", "ram_total_gb": 8}
    for headers in ({"Host": EVIL}, {"Host": f"{EVIL}:{fleet.port}"},
                    {"Origin": "https://evil.example"}, {"Origin": "null"}):
        refused = fleet.api("POST", "/api/v1/hosts", token="", json=body, headers=headers)
        assert refused.status_code == 403, (headers, refused.text)
        assert "hdr_" not in refused.text
        assert ("Host" in refused.json()["detail"]) == ("Host" in headers)
    assert fleet.store.host_list() == []
    for host in (f"localhost:{fleet.port}", f"[::1]:{fleet.port}"):
        answered = fleet.api("GET", "/api/v1/jobs", token="", headers={"Host": host})
        assert answered.status_code == 200, answered.text
    made = fleet.api("POST", "/api/v1/hosts", token="", json=body,
                     headers={"Origin": fleet.url})
    assert made.status_code == 201, made.text
    assert "refused (403)" in fleet.stderr_of(fleet.server)


def test_a_token_server_on_loopback_checks_host_but_answers_its_public_name(
        make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url,
                       extra='[server]\npublic_url = "https://herder.example.org"\n')
    fleet.start_server()
    assert fleet.api("GET", "/api/v1/jobs", headers={"Host": EVIL}).status_code == 403
    assert fleet.api("GET", "/api/v1/jobs",
                     headers={"Host": "herder.example.org"}).status_code == 200


def test_the_api_document_needs_a_read_token_and_no_page_loads_a_cdn(make_fleet, tmp_path,
                                                                     store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server()
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        response = fleet.api("GET", page)
        assert response.status_code == 404 and "cdn" not in response.text.lower(), page
    assert fleet.api("GET", "/openapi.json", token="").status_code == 401
    read = fleet.token_file(tmp_path, Scope.READ).read_text().strip()
    document = fleet.api("GET", "/openapi.json", token=read)
    assert document.status_code == 200 and "/api/v1/jobs" in document.json()["paths"]


def test_a_json_body_needs_a_json_content_type(make_fleet, tmp_path, store_url):
    """A cross-site "simple" request (text/plain, or no type) sends no preflight: it must
    not reach a route."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server()
    body = b'{"command": ["true"]}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        response = fleet.api("POST", "/api/v1/jobs", content=body, headers=headers)
        assert response.status_code == 422, (content_type, response.text)
    assert fleet.store.job_list() == []
    sent = fleet.api("POST", "/api/v1/jobs", content=body,
                     headers={"Content-Type": "application/json"})
    assert sent.status_code == 201, sent.text


def test_failed_token_checks_are_throttled_per_client(make_fleet, tmp_path, store_url):
    """From behind the local proxy uvicorn trusts (127.0.0.1), X-Forwarded-For names the
    client: one that guesses is held, with any token not seen lately; another client is
    not, nor one that retries its one revoked token, nor a known-good token."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server(env=TRUST_LOCAL_PROXY)
    revoked = {"X-Forwarded-For": "203.0.113.9"}
    bad = new_token()
    assert {fleet.api("GET", "/api/v1/jobs", token=bad, headers=revoked).status_code
            for _ in range(25)} == {401}
    guesser = {"X-Forwarded-For": "203.0.113.7"}
    statuses = [fleet.api("GET", "/api/v1/jobs", token=new_token(), headers=guesser).status_code
                for _ in range(21)]
    assert statuses == [401] * 20 + [429]
    unseen = fleet.token_file(tmp_path, Scope.READ).read_text().strip()
    held = fleet.api("GET", "/api/v1/jobs", token=unseen, headers=guesser)  # good, not seen
    assert held.status_code == 429 and 1 <= int(held.headers["Retry-After"]) <= 60
    other = fleet.api("GET", "/api/v1/jobs", headers={"X-Forwarded-For": "203.0.113.8"})
    assert other.status_code == 200
    # The admin token checked out just now: it passes the guesser's address (an agent that
    # shares an address with a guesser, or whose address a local process forged, goes on).
    assert fleet.api("GET", "/api/v1/jobs", headers=guesser).status_code == 200
    assert "refused (429)" in fleet.stderr_of(fleet.server)


def test_without_forwarded_allow_ips_no_forwarded_header_is_trusted(make_fleet, tmp_path,
                                                                      store_url):
    """uvicorn alone would trust 127.0.0.1: any process on this machine could name any
    client's address (and have it throttled) or claim TLS. herder trusts no proxy unless
    FORWARDED_ALLOW_IPS names it: the addresses below are all this test's own, 127.0.0.1."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server()
    read = fleet.token_file(tmp_path, Scope.READ).read_text().strip()
    claimed = fleet.api("POST", "/ui/login", token="", data={"token": read},
                        headers={"X-Forwarded-Proto": "https"})
    assert claimed.status_code == 303, claimed.text
    assert claimed.headers["set-cookie"].startswith(f"{COOKIE}=")
    assert "Secure" not in claimed.headers["set-cookie"]
    statuses = [fleet.api("GET", "/api/v1/jobs", token=new_token(),
                          headers={"X-Forwarded-For": f"203.0.113.{index}"}).status_code
                for index in range(21)]
    assert statuses == [401] * 20 + [429]  # one client, whatever address it names


def test_proxy_options_trust_only_what_forwarded_allow_ips_names():
    assert proxy_options({}) == {"proxy_headers": False}
    assert proxy_options({"FORWARDED_ALLOW_IPS": " "}) == {"proxy_headers": False}
    assert proxy_options({"FORWARDED_ALLOW_IPS": "10.0.0.5"}) == {
        "proxy_headers": True, "forwarded_allow_ips": "10.0.0.5"}


def test_a_session_cookie_over_a_tls_proxy_is_secure(make_fleet, tmp_path, store_url):
    """A TLS proxy on this machine says X-Forwarded-Proto: https, trusted from the
    addresses FORWARDED_ALLOW_IPS names."""
    fleet = make_fleet(tmp_path, store_url)
    fleet.start_server(env=TRUST_LOCAL_PROXY)
    read = fleet.token_file(tmp_path, Scope.READ).read_text().strip()
    proxied = {"X-Forwarded-Proto": "https"}
    signed = fleet.api("POST", "/ui/login", token="", data={"token": read}, headers=proxied)
    assert signed.status_code == 303, signed.text
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{SECURE_COOKIE}=") and "; Secure" in cookie
    plain = fleet.api("POST", "/ui/login", token="", data={"token": read})
    assert plain.headers["set-cookie"].startswith(f"{COOKIE}=")
    assert "Secure" not in plain.headers["set-cookie"]


def test_a_tls_server_sets_the_host_prefixed_cookie(tmp_path, sqlite_url):
    from test_tls import make_certificate

    cert, key = make_certificate(tmp_path)
    secret = new_token()
    with open_store(sqlite_url) as store:
        store.token_insert("ops", Scope.READ, token_hash(secret), datetime.now(UTC))
    port = free_port()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 (closed below)
    process = subprocess.Popen(
        herder_argv("server", "--listen", f"127.0.0.1:{port}", "--tls-cert", str(cert),
                    "--tls-key", str(key), db=sqlite_url), cwd=tmp_path, stdout=log,
        stderr=log, env=clean_environment(None), start_new_session=True)
    trust = ssl.create_default_context(cafile=str(cert))
    try:
        base = f"https://127.0.0.1:{port}"

        def answers() -> bool:
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            try:
                return httpx.get(f"{base}/healthz", verify=trust, timeout=1).is_success
            except httpx.HTTPError:
                return False

        wait_for(answers, 30, "the TLS server", (tmp_path / "server.log").read_text)
        with httpx.Client(base_url=base, verify=trust) as client:
            signed = client.post("/ui/login", data={"token": secret})
            assert signed.status_code == 303
            assert signed.headers["set-cookie"].startswith(f"{SECURE_COOKIE}=")
            assert "; Secure" in signed.headers["set-cookie"]
            assert client.get("/api/v1/dashboard/session").json()["name"] == "ops"
    finally:
        process.terminate()
        process.wait(20)
        log.close()


def test_the_server_refuses_plain_http_off_loopback(tmp_path, sqlite_url):
    with open_store(sqlite_url) as store:
            store.token_insert("ops", Scope.ADMIN, token_hash(new_token()), datetime.now(UTC))
    refused = run_herder("server", "--listen", f"0.0.0.0:{free_port()}", cwd=tmp_path,
                         db=sqlite_url)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert line.startswith("herder: error: --listen: ") and "--allow-plaintext" in line
    assert "--tls-cert" in line
    ui = run_herder("up", "--ui", "--ui-listen", f"0.0.0.0:{free_port()}", "--exit-when-idle",
                    cwd=tmp_path, db=sqlite_url)
    assert ui.returncode == 2 and "--ui-listen" in ui.stderr and "--allow-plaintext" in ui.stderr


def test_the_server_listens_off_loopback_with_allow_plaintext(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url)
    fleet.admin_token  # noqa: B018 (off loopback, a server needs an admin token first)
    process = fleet.start("server", "server", "--listen", f"0.0.0.0:{fleet.port}",
                          "--allow-plaintext")
    fleet.server = process
    fleet.wait_server()
    # Off loopback there is no Host check: TLS (or the network) and tokens guard it.
    assert fleet.api("GET", "/api/v1/jobs", headers={"Host": EVIL}).status_code == 200


@pytest.mark.parametrize("command", [
    ("agent", "--host", "h1"),
    ("heartbeat", "--host", "h1"),
    ("jobs",),
])
def test_clients_refuse_plain_http_off_loopback(tmp_path, command):
    server = "http://192.0.2.1:8470"
    env = {"HERDER_AGENT_TOKEN": "hdr_" + "x" * 43, "HERDER_TOKEN": "hdr_" + "y" * 43}
    if command[0] == "jobs":
        args: tuple[str, ...] = ("--server", server, *command)
    else:
        args = (*command, "--server", server)
    result = run_herder(*args, cwd=tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert "--allow-plaintext" in line and "https" in line
    assert "x" * 43 not in line and "y" * 43 not in line


def test_run_attempt_refuses_plain_http_off_loopback(tmp_path):
    """run-attempt's own exit codes: 1 for a setup that cannot work (2 means unreachable)."""
    result = run_herder("run-attempt", "--server", "http://192.0.2.1:8470", "--host", "h1",
                        "--job", "1", "--attempt", "1", cwd=tmp_path,
                        env={"HERDER_AGENT_TOKEN": "hdr_" + "x" * 43})
    assert result.returncode == 1, result.stderr
    assert "--allow-plaintext" in result.stderr


def test_a_short_legacy_admin_token_stops_the_server(tmp_path, sqlite_url):
    short = "legacy-operator-token-1234"
    result = run_herder("server", "--listen", f"127.0.0.1:{free_port()}", cwd=tmp_path,
                        db=sqlite_url, env={"HERDER_API_TOKEN": short})
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("herder: error: HERDER_API_TOKEN: is shorter than 32 characters")
    assert "openssl rand" in line and short not in result.stderr
