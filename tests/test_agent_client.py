"""The agent's side of the wire (`herder/runtime/agent_client.py`) against a scripted server.

`FakeServer` answers the agent routes through `httpx.MockTransport`: scripted answers per
route and attempt first (statuses, network errors, a request that hangs), then success. It
records every request, so a test asserts what arrived, how often and in which order. Backoff
is tiny (1-10 ms) so retries cost nothing; synchronisation is on recorded requests with
deadlines. The setup checks run against real local servers (plain HTTP and TLS).
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import re
import shlex
import ssl
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any, ClassVar

import httpx
import msgspec
import pytest
from support.cli import run_herder
from support.environment import clean_environment
from support.ports import free_port
from support.waits import wait_for
from test_tls import make_certificate

from herder.core.errors import InputError
from herder.core.model import AttemptToken, Job, Outcome
from herder.runtime.agent import HttpSource, job_from_assignment
from herder.runtime.agent_client import (
    ServerClient,
    ServerUnavailable,
    Verdict,
    check_server_url,
    classify,
    read_token_file,
    retry_after_seconds,
)
from herder.runtime.local_gate import LocalGate
from herder.runtime.log_shipper import backlog_skip, drop_marker

LABEL = "h1"
TOKEN = "hdr_unit-test-token"

Step = httpx.Response | Exception | Callable[[httpx.Request], "httpx.Response | None"] | None


class Seen(msgspec.Struct, frozen=True):
    key: str
    at: float
    answer: str  # the status code, or the exception's class name
    request: httpx.Request


class FakeServer:
    """The agent routes, as a MockTransport handler. `script(key, ...)` queues answers for a
    route key ("start 7.1", "finish 7.1", "log 7.1", "heartbeat"); unscripted requests
    succeed (logs are written at their offset, like the real server)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.steps: dict[str, list[Step]] = defaultdict(list)
        self.standing: dict[str, Step] = {}
        self.seen: list[Seen] = []
        self.logs: dict[str, bytearray] = defaultdict(bytearray)

    def script(self, key: str, *steps: Step) -> None:
        with self.lock:
            self.steps[key].extend(steps)

    def always(self, key: str, step: Step) -> None:
        """Answer `key` with `step` (after its script) until `clear(key)`."""
        with self.lock:
            self.standing[key] = step

    def clear(self, key: str) -> None:
        with self.lock:
            self.standing.pop(key, None)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        key = route_key(request.url.path)
        with self.lock:
            step = self.steps[key].pop(0) if self.steps[key] else self.standing.get(key)
        if callable(step) and not isinstance(step, httpx.Response):
            step = step(request)
        if isinstance(step, Exception):
            self._record(key, type(step).__name__, request)
            raise step
        response = step if isinstance(step, httpx.Response) else self.succeed(key, request)
        self._record(key, str(response.status_code), request)
        return response

    def succeed(self, key: str, request: httpx.Request) -> httpx.Response:
        kind, _, token = key.partition(" ")
        if kind == "log":
            offset = int(request.url.params["offset"])
            with self.lock:
                log = self.logs[token]
                data = request.read()
                if len(log) < offset + len(data):
                    log.extend(b"\0" * (offset + len(data) - len(log)))
                log[offset:offset + len(data)] = data
                return httpx.Response(200, json={"size": len(log)})
        if kind == "heartbeat":
            return httpx.Response(200, json={"live": [], "cancel": [], "host": None,
                                             "attempts": []})
        if kind == "finish":
            return httpx.Response(200, json={"accepted": True, "status": "done"})
        if kind == "cancels":
            return httpx.Response(200, json={"cancel": []})
        return httpx.Response(200, json={"accepted": True})

    def _record(self, key: str, answer: str, request: httpx.Request) -> None:
        with self.lock:
            self.seen.append(Seen(key, time.monotonic(), answer, request))

    def requests(self, key: str) -> list[Seen]:
        with self.lock:
            return [seen for seen in self.seen if seen.key == key]

    def delivered(self, key: str) -> int:
        return sum(1 for seen in self.requests(key) if seen.answer == "200")

    def log_of(self, token: str) -> bytes:
        with self.lock:
            return bytes(self.logs[token])

    def describe(self) -> str:
        with self.lock:
            return "\n".join(f"{seen.key}: {seen.answer}" for seen in self.seen)


def route_key(path: str) -> str:
    match = re.fullmatch(r"/api/v1/agent/[^/]+/attempts/(\d+)/(\d+)/(\w+)", path)
    if match:
        return f"{match[3]} {match[1]}.{match[2]}"
    return path.rsplit("/", 1)[-1]


def status(code: int, headers: dict[str, str] | None = None, **body: Any) -> httpx.Response:
    return httpx.Response(code, json=body or {"detail": f"scripted {code}"}, headers=headers)


class Hang:
    """A step that hangs until released (a request the server does not answer), then 500."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self, _request: httpx.Request) -> httpx.Response:
        self.entered.set()
        self.released.wait(60)
        return status(500)


def make_job(job_id: int, attempt: int = 1) -> Job:
    return job_from_assignment({
        "id": job_id, "attempt": attempt, "job_type": "adhoc", "command": ["true"],
        "shell": False, "payload": {}, "priority": 0, "weight": "light", "max_attempts": 3,
        "timeout_seconds": None, "env": {}, "workdir": None, "backoff_base_seconds": 1,
        "backoff_max_seconds": 1, "failures": 0, "lost": 0, "ram_gb": 0,
        "spawn_failures": 0})


def client_for(server: FakeServer) -> ServerClient:
    # An in-process transport: nothing crosses a network, so plain http is allowed.
    return ServerClient("http://herder.test", TOKEN, LABEL, transport=server.transport(),
                        retry_base=0.001, retry_cap=0.01, allow_plaintext=True)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
def make_source(server: FakeServer) -> Iterator[Callable[..., HttpSource]]:
    """An attached HttpSource (no polling) on the fake server; closed at teardown."""
    made: list[HttpSource] = []

    def make(**options: Any) -> HttpSource:
        settings: dict[str, Any] = {"check_ram": False, "poll": False, "log_interval": 0.05,
                                    "close_timeout": 5.0, **options}
        source = HttpSource(client_for(server), LocalGate(), 4, heartbeat_interval=0.2,
                            **settings)
        source.attach(f"{LABEL}/{os.getpid()}/1")
        made.append(source)
        return source

    yield make
    for source in made:
        source.close_timeout = 1.0
        source.close()


def finish(source: HttpSource, job_id: int, outcome: Outcome = Outcome.OK) -> None:
    source.finished(make_job(job_id), outcome, 0, datetime.now(UTC))


def start(source: HttpSource, job_id: int, log_path: Path) -> None:
    log_path.touch()
    source.started(AttemptToken(job_id, 1), 4242, str(log_path), datetime.now(UTC))


def wait_delivered(server: FakeServer, key: str, timeout: float = 20.0) -> None:
    wait_for(lambda: server.delivered(key) >= 1, timeout, f"{key} to be delivered",
             server.describe)


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if text in record.getMessage()]


# -- classification (pure) ------------------------------------------------------------------


@pytest.mark.parametrize(("code", "verdict"), [
    (200, Verdict.OK), (204, Verdict.OK), (401, Verdict.UNAUTHORIZED),
    (403, Verdict.UNAUTHORIZED), (409, Verdict.GONE), (410, Verdict.GONE),
    (400, Verdict.REFUSED), (404, Verdict.REFUSED), (413, Verdict.REFUSED),
    (422, Verdict.REFUSED), (408, Verdict.RETRY), (429, Verdict.RETRY), (500, Verdict.RETRY),
    (502, Verdict.RETRY), (503, Verdict.RETRY), (302, Verdict.RETRY),
])
def test_every_status_has_one_meaning(code: int, verdict: Verdict) -> None:
    assert classify(code) is verdict


def test_retry_after_reads_seconds_and_dates_and_caps_them() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert retry_after_seconds("3", now) == 3.0
    assert retry_after_seconds(format_datetime(now + timedelta(seconds=90), usegmt=True),
                               now) == 90.0
    assert retry_after_seconds(format_datetime(now - timedelta(seconds=5), usegmt=True),
                               now) == 0.0
    assert retry_after_seconds("86400", now) == 600.0
    assert retry_after_seconds("soon", now) is None
    assert retry_after_seconds("nan", now) is None
    assert retry_after_seconds(None, now) is None


def test_server_url_needs_http_or_https_and_a_host() -> None:
    assert check_server_url(" https://coordinator:8470/ ") == "https://coordinator:8470"
    with pytest.raises(InputError, match=r"has no scheme.*use https://coordinator:8470"):
        check_server_url("coordinator:8470")
    with pytest.raises(InputError, match="scheme 'ftp' is not http or https"):
        check_server_url("ftp://coordinator:8470")
    with pytest.raises(InputError, match="names no host"):
        check_server_url("https://")


def test_backlog_keeps_the_newest_bytes() -> None:
    assert backlog_skip(offset=0, size=500, limit=1000) == 0
    assert backlog_skip(offset=0, size=10_000, limit=1000) == 9000
    assert backlog_skip(offset=9500, size=10_000, limit=1000) == 0


# -- results ----------------------------------------------------------------------------------


def test_a_500_then_200_delivers_the_finish_once(server, make_source) -> None:
    server.script("finish 1.1", status(500))
    source = make_source()
    finish(source, 1)
    wait_delivered(server, "finish 1.1")
    source.close()
    assert [seen.answer for seen in server.requests("finish 1.1")] == ["500", "200"]
    assert server.requests("finish 1.1")[1].request.read() == (
        b'{"outcome":"ok","exit_code":0,"retry_after":null}')


def test_a_422_is_logged_as_a_bug_and_dropped_and_later_reports_still_go(
        server, make_source, caplog, tmp_path) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    server.script("start 2.1", status(422, detail=[{"loc": ["body", "pid"],
                                                    "msg": "field required"}]))
    source = make_source()
    start(source, 2, tmp_path / "2.log")
    finish(source, 2)
    finish(source, 3)
    wait_delivered(server, "finish 2.1")
    wait_delivered(server, "finish 3.1")
    source.close()
    assert [seen.answer for seen in server.requests("start 2.1")] == ["422"]
    [bug] = lines(caplog, "attempt 2.1: start dropped")
    assert bug.levelno == logging.ERROR
    assert "HTTP 422" in bug.getMessage() and "field required" in bug.getMessage()
    assert "bug" in bug.getMessage()


def test_a_409_drops_the_report_with_one_line(server, make_source, caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    server.script("finish 4.1", status(409, detail="attempt 4.1 is no longer live on h1"))
    source = make_source()
    finish(source, 4)
    finish(source, 5)
    wait_delivered(server, "finish 5.1")
    source.close()
    assert [seen.answer for seen in server.requests("finish 4.1")] == ["409"]
    [line] = lines(caplog, "attempt 4.1")
    assert line.levelno == logging.WARNING
    assert "no longer live on h1" in line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_410_is_treated_like_a_409(server, make_source) -> None:
    server.script("finish 6.1", status(410))
    source = make_source()
    finish(source, 6)
    wait_for(lambda: server.requests("finish 6.1"), 20, "the finish to be sent")
    source.close()
    assert [seen.answer for seen in server.requests("finish 6.1")] == ["410"]


def test_connection_refused_is_retried_until_the_server_answers(server, make_source) -> None:
    refused = [httpx.ConnectError("[Errno 111] Connection refused") for _ in range(6)]
    server.script("finish 7.1", *refused)
    source = make_source()
    finish(source, 7)
    wait_delivered(server, "finish 7.1")
    source.close()
    assert [seen.answer for seen in server.requests("finish 7.1")] == (
        ["ConnectError"] * 6 + ["200"])


def test_a_server_restart_mid_report_loses_nothing_and_keeps_the_order(
        server, make_source, tmp_path) -> None:
    # The server dies while answering the start, is down for a while, then is back but
    # not ready (503) before it answers again.
    server.script("start 8.1", httpx.ReadError("connection reset by peer"),
                  httpx.RemoteProtocolError("Server disconnected without sending a response"),
                  httpx.ConnectError("[Errno 111] Connection refused"),
                  httpx.ConnectError("[Errno 111] Connection refused"), status(503))
    source = make_source()
    start(source, 8, tmp_path / "8.log")
    finish(source, 8)
    wait_delivered(server, "finish 8.1")
    source.close()
    assert [seen.answer for seen in server.requests("start 8.1")] == [
        "ReadError", "RemoteProtocolError", "ConnectError", "ConnectError", "503", "200"]
    assert server.requests("finish 8.1")[0].at > server.requests("start 8.1")[-1].at
    assert server.delivered("finish 8.1") == 1


def test_retry_after_is_honoured(server, make_source) -> None:
    server.script("finish 9.1", status(503, headers={"Retry-After": "1"}))
    source = make_source()
    finish(source, 9)
    wait_delivered(server, "finish 9.1")
    source.close()
    first, second = server.requests("finish 9.1")
    # The backoff alone would have retried within 10 ms.
    assert second.at - first.at >= 0.95


def test_a_report_stuck_for_one_attempt_does_not_delay_another(
        server, make_source, tmp_path) -> None:
    hang = Hang()
    # Attempt 10's finish hangs (a request the server never answers), then keeps failing.
    server.script("finish 10.1", hang)
    server.always("finish 10.1", status(500))
    source = make_source()
    try:
        finish(source, 10)
        wait_for(hang.entered.is_set, 20, "attempt 10's finish to hang")
        finish(source, 11)
        start(source, 12, tmp_path / "12.log")
        wait_delivered(server, "finish 11.1")
        wait_delivered(server, "start 12.1")
        assert server.delivered("finish 10.1") == 0
    finally:
        hang.released.set()
    server.clear("finish 10.1")
    wait_delivered(server, "finish 10.1")
    source.close()
    assert server.delivered("finish 10.1") == 1


def test_an_unexpected_error_while_sending_is_logged_and_retried(
        server, make_source, caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    server.script("finish 13.1", RuntimeError("a bug in the transport"))
    source = make_source()
    finish(source, 13)
    wait_delivered(server, "finish 13.1")
    source.close()
    assert [seen.answer for seen in server.requests("finish 13.1")] == ["RuntimeError", "200"]
    assert any(r.exc_info and "a bug in the transport" in str(r.exc_info[1])
               for r in caplog.records)


def test_a_refused_token_is_said_once_without_a_traceback_and_retried(
        server, make_source, caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    refused = status(401, detail="agent token required (Authorization: Bearer ...)")
    server.script("finish 14.1", refused, status(403, detail="not valid for host 'h1'"),
                  status(401))
    source = make_source()
    finish(source, 14)
    wait_delivered(server, "finish 14.1")
    source.close()
    assert [seen.answer for seen in server.requests("finish 14.1")] == [
        "401", "403", "401", "200"]
    [line] = lines(caplog, "refused this agent's token")
    assert line.levelno == logging.ERROR and line.exc_info is None
    assert line.getMessage().startswith("the server refused this agent's token for host h1: "
                                        "HTTP 401: agent token required")
    assert "check --token-file / HERDER_AGENT_TOKEN" in line.getMessage()
    assert TOKEN not in caplog.text
    assert lines(caplog, "accepts this agent's token again")


def test_a_refused_token_at_the_first_heartbeat_is_retried_not_fatal(server, caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    server.script("heartbeat", *[status(401) for _ in range(5)])
    source = HttpSource(client_for(server), LocalGate(), 1, heartbeat_interval=0.2,
                        poll=False, check_ram=False, close_timeout=1.0)
    source.attach(f"{LABEL}/{os.getpid()}/1")
    source.close()
    assert [seen.answer for seen in server.requests("heartbeat")][:6] == ["401"] * 5 + ["200"]
    assert len(lines(caplog, "refused this agent's token")) == 1


def test_close_gives_up_after_its_timeout_and_says_what_was_not_delivered(
        server, make_source, caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    server.always("finish 15.1", status(502))
    source = make_source(close_timeout=0.5)
    finish(source, 15)
    wait_for(lambda: len(server.requests("finish 15.1")) >= 3, 20, "retries")
    source.close()
    [line] = lines(caplog, "not delivered before shutdown")
    assert "15.1 finish" in line.getMessage()
    assert server.delivered("finish 15.1") == 0


# -- logs -------------------------------------------------------------------------------------


def test_the_last_log_chunk_goes_before_the_finish(server, make_source, tmp_path) -> None:
    source = make_source()
    log_path = tmp_path / "16.log"
    start(source, 16, log_path)
    log_path.write_bytes(b"line one\nline two\n")
    finish(source, 16)
    wait_delivered(server, "finish 16.1")
    source.close()
    assert server.log_of("16.1") == b"line one\nline two\n"
    assert server.requests("log 16.1")[-1].at < server.requests("finish 16.1")[0].at


@pytest.mark.parametrize("failure", [status(500), status(409), status(413),
                                     httpx.ConnectError("refused")],
                         ids=["500", "409", "413", "refused"])
def test_a_failing_log_upload_never_holds_the_finish_back(
        server, make_source, tmp_path, failure) -> None:
    server.always("log 17.1", failure)
    source = make_source(close_timeout=0.5)
    log_path = tmp_path / "17.log"
    start(source, 17, log_path)
    log_path.write_bytes(b"the end\n")
    finish(source, 17)
    # Far sooner than FINAL_LOG_WAIT (10 s): the finish stops waiting at the first failure.
    wait_delivered(server, "finish 17.1", timeout=8.0)
    assert server.requests("log 17.1")
    source.close()


@pytest.mark.parametrize(("code", "detail", "said"), [
    (413, "the log would pass server.max_log_bytes", "max_log_bytes"),
    (410, "the attempt ended at ...: its log is closed", "log is closed")])
def test_a_log_the_server_refuses_for_good_stops_shipping_with_one_warning(
        server, make_source, tmp_path, caplog, code, detail, said) -> None:
    """A log over the server's max_log_bytes (413), or of an attempt that ended longer ago
    than the server's grace (410): the agent stops shipping that log, says so once (not as
    a bug), and the finish still goes."""
    caplog.set_level(logging.INFO, "herder")
    server.always("log 21.1", status(code, detail=detail))
    source = make_source()
    log_path = tmp_path / "21.log"
    start(source, 21, log_path)
    log_path.write_bytes(b"x" * 100)
    finish(source, 21)
    wait_delivered(server, "finish 21.1")
    source.close()
    assert len(server.requests("log 21.1")) == 1
    [warning] = lines(caplog, said)
    assert warning.levelno == logging.WARNING and "bug" not in warning.getMessage()


def test_the_log_backlog_is_bounded_dropping_the_oldest_with_a_marker(
        server, make_source, tmp_path) -> None:
    hang = Hang()
    source = make_source(log_backlog=1000)
    log_path = tmp_path / "18.log"
    old = b"".join(b"old %05d\n" % n for n in range(1000))  # 10,000 bytes
    log_path.write_bytes(old)
    start(source, 18, log_path)
    wait_for(lambda: server.log_of("18.1") == drop_marker(9000) + old[-1000:], 20,
             "the newest 1000 bytes behind a marker", lambda: server.log_of("18.1")[:200])
    # The job writes 5,000 bytes more and the server hangs on their upload: the runner's
    # calls do not wait for it, and what is sent stays bounded (the newest 1000 bytes).
    server.script("log 18.1", hang)
    new = b"".join(b"new %05d\n" % n for n in range(500))
    descriptor = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    try:
        assert os.write(descriptor, new) == len(new)
    finally:
        os.close(descriptor)
    wait_for(hang.entered.is_set, 20, "the upload to hang", server.describe)
    finish(source, 18)  # returns at once, with the upload still hanging
    hang.released.set()
    wait_delivered(server, "finish 18.1")
    source.close()
    assert server.log_of("18.1") == (drop_marker(9000) + old[-1000:]
                                     + drop_marker(4000) + new[-1000:])


def test_a_log_over_the_backlog_is_cut_while_the_server_is_down(
        server, make_source, tmp_path) -> None:
    server.script("log 19.1", *[httpx.ConnectError("refused")] * 3)
    source = make_source(log_backlog=300)
    log_path = tmp_path / "19.log"
    start(source, 19, log_path)
    body = b"".join(b"x%03d\n" % n for n in range(200))  # 1,000 bytes
    log_path.write_bytes(body)
    finish(source, 19)
    wait_delivered(server, "finish 19.1")
    wait_for(lambda: server.log_of("19.1").endswith(body[-300:]), 20, "the log's tail")
    source.close()
    shipped = server.log_of("19.1")
    assert shipped == drop_marker(700) + body[-300:]


# -- token files ------------------------------------------------------------------------------


def test_a_token_file_is_read_only_when_nobody_else_can_read_it(tmp_path) -> None:
    path = tmp_path / "agent-token"
    path.write_text(f"{TOKEN}\n")
    path.chmod(0o600)
    assert read_token_file(str(path)) == TOKEN
    path.chmod(0o640)
    with pytest.raises(InputError, match=rf"mode 0640.*chmod 600 {re.escape(str(path))}"):
        read_token_file(str(path))
    path.chmod(0o604)
    with pytest.raises(InputError, match="open to group or others"):
        read_token_file(str(path))
    with pytest.raises(InputError, match="does not exist"):
        read_token_file(str(tmp_path / "missing"))
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "empty").chmod(0o600)
    with pytest.raises(InputError, match="does not hold one token"):
        read_token_file(str(tmp_path / "empty"))


# -- setup checks against real servers ------------------------------------------------------


class _Answer(http.server.BaseHTTPRequestHandler):
    """200 to everything; records the Authorization header it got."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def _answer(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def plain_server() -> Iterator[tuple[str, list[str | None]]]:
    """A plain HTTP server on 127.0.0.1: its address and the Authorization headers it got."""
    handler = type("Answer", (_Answer,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def tls_server(tmp_path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server with a self-signed certificate: its address and the certificate."""
    cert, key = make_certificate(tmp_path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", cert
    finally:
        server.shutdown()
        server.server_close()


def test_https_against_a_plain_server_says_so(plain_server) -> None:
    address, _ = plain_server
    client = ServerClient(f"https://{address}", TOKEN, LABEL)
    with pytest.raises(InputError, match=rf"does not answer TLS.*use http://{address}"):
        client.check(patience=5)
    client.close()


def test_an_unverified_certificate_says_pass_ca_and_with_the_ca_it_works(tls_server) -> None:
    address, cert = tls_server
    client = ServerClient(f"https://{address}", TOKEN, LABEL)
    with pytest.raises(InputError, match=r"^--ca: the certificate of .* does not verify .*"
                                         r"pass --ca FILE"):
        client.check(patience=5)
    client.close()
    trusted = ServerClient(f"https://{address}", TOKEN, LABEL, verify=str(cert))
    trusted.check(patience=5)
    trusted.close()


def test_a_ca_file_that_is_not_a_certificate_is_refused(tmp_path) -> None:
    bogus = tmp_path / "ca.pem"
    bogus.write_text("not a certificate\n")
    with pytest.raises(InputError, match=r"--ca: .* holds no usable certificate"):
        ServerClient("https://127.0.0.1:1", TOKEN, LABEL, verify=str(bogus))


def test_a_server_not_up_yet_is_waited_for_one_line_per_try(caplog) -> None:
    caplog.set_level(logging.INFO, "herder.agent")
    port = free_port()
    client = ServerClient(f"http://127.0.0.1:{port}", TOKEN, LABEL, retry_base=0.01,
                          retry_cap=0.05)
    done = threading.Event()
    errors: list[BaseException] = []

    def check() -> None:
        try:
            client.check()
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=check, daemon=True)
    thread.start()
    wait_for(lambda: len(lines(caplog, "cannot reach the server")) >= 3, 20, "three tries")
    assert not done.is_set()
    handler = type("Answer", (_Answer,), {"seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_for(done.is_set, 20, "the check to pass once the server is up")
    finally:
        server.shutdown()
        server.server_close()
        client.close()
    assert errors == []
    assert all(r.exc_info is None and "Connection refused" in r.getMessage()
               for r in lines(caplog, "cannot reach the server"))


def test_check_gives_up_after_its_patience() -> None:
    client = ServerClient(f"http://127.0.0.1:{free_port()}", TOKEN, LABEL, retry_base=0.01,
                          retry_cap=0.05)
    with pytest.raises(ServerUnavailable, match="cannot reach"):
        client.check(patience=0.3)
    client.close()


# -- the CLI, as real processes ---------------------------------------------------------------


def herder(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
           ) -> subprocess.CompletedProcess[str]:
    return run_herder(*args, cwd=tmp_path, db=f"sqlite:///{tmp_path}/herder.db",
                      env={"HOME": str(tmp_path), **(env or {})})


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    text = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(text) == 1, result.stderr
    return text[0]


def test_agent_with_a_server_url_without_scheme_exits_2_in_one_line(tmp_path) -> None:
    result = herder(tmp_path, "agent", "--server", "coordinator:8470", "--host", LABEL,
                    "--token", TOKEN)
    assert result.returncode == 2
    assert "--server: 'coordinator:8470' has no scheme (use https://coordinator:8470" in (
        one_line(result))


def test_agent_with_https_against_a_plain_server_exits_2_in_one_line(
        tmp_path, plain_server) -> None:
    address, _ = plain_server
    result = herder(tmp_path, "agent", "--server", f"https://{address}", "--host", LABEL,
                    env={"HERDER_AGENT_TOKEN": TOKEN})  # --token: a deprecation warning
    assert result.returncode == 2
    assert f"does not answer TLS (a plain http server?) (use http://{address}" in (
        one_line(result))
    assert TOKEN not in result.stderr


def test_agent_refuses_a_token_file_others_can_read(tmp_path) -> None:
    path = tmp_path / ".config" / "herder" / "agent-token"
    path.parent.mkdir(parents=True)
    path.write_text(TOKEN)
    path.chmod(0o644)
    result = herder(tmp_path, "agent", "--server", "http://127.0.0.1:1", "--host", LABEL)
    assert result.returncode == 2
    assert f"(run chmod 600 {path})" in one_line(result)
    missing = herder(tmp_path, "agent", "--server", "http://127.0.0.1:1", "--host", LABEL,
                     "--token-file", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert "does not exist" in one_line(missing)


def test_heartbeat_reads_the_token_file_and_the_variable_wins(tmp_path, plain_server) -> None:
    address, seen = plain_server
    path = tmp_path / "token"
    path.write_text("hdr_from-the-file\n")
    path.chmod(0o600)
    result = herder(tmp_path, "heartbeat", "--host", LABEL, "--server", f"http://{address}",
                    env={"HERDER_TOKEN_FILE": str(path)})
    assert result.returncode == 0, result.stderr
    path.chmod(0o644)  # not even looked at when the variable is set
    result = herder(tmp_path, "heartbeat", "--host", LABEL, "--server", f"http://{address}",
                    env={"HERDER_TOKEN_FILE": str(path), "HERDER_AGENT_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr
    assert seen == ["Bearer hdr_from-the-file", f"Bearer {TOKEN}"]
    refused = herder(tmp_path, "heartbeat", "--host", LABEL, "--server", f"http://{address}",
                     env={"HERDER_TOKEN_FILE": str(path)})
    assert refused.returncode == 2
    assert "chmod 600" in one_line(refused)


def test_calls_on_the_runners_thread_time_out_well_inside_the_fence(server, make_source) -> None:
    """A server that swallows packets must not stall supervision for the client's whole
    timeout: heartbeats and cancel checks give up after half a heartbeat interval (1 s at
    least, 10 s at most)."""
    source = make_source()
    assert source.runner_timeout == 1.0  # heartbeat_interval 0.2 s: the floor
    source.heartbeat([], datetime.now(UTC))
    source.cancel_requested([7])
    for key in ("heartbeat", "cancels"):
        timeouts = server.requests(key)[-1].request.extensions["timeout"]
        assert timeouts["read"] == 1.0, (key, timeouts)
    slow = HttpSource(client_for(server), LocalGate(), 1, heartbeat_interval=60.0,
                      check_ram=False, poll=False)
    assert slow.runner_timeout == 10.0


def test_a_409_on_a_start_marks_the_attempt_fenced_out_for_the_runner(server, make_source,
                                                                      tmp_path) -> None:
    """The runner must not wait a heartbeat to stop an attempt the server says is not live
    (its job may already run elsewhere): the dropped report names it at once."""
    server.script("start 7.1", status(409, detail="attempt 7.1 is not live on host h1"))
    source = make_source()
    start(source, 7, tmp_path / "7.log")
    fenced: set[AttemptToken] = set()
    wait_for(lambda: fenced.update(source.fenced_out()) or AttemptToken(7, 1) in fenced, 20,
             "the 409 to reach the runner's side", server.describe)
    assert source.fenced_out() == set(), "a fenced-out attempt is reported once"


def test_the_servers_lease_is_known_from_the_first_assignment_reply(server, make_source
                                                                   ) -> None:
    """Before any heartbeat: a job taken from the long-poll is fenced (and its guardian
    told) by the lease the server enforces, not the agent's own `attempt_lease`."""
    gate = {"label": LABEL, "enabled": True, "window": "prime", "max_workers": 2,
            "max_weight": None, "allowed_job_types": None, "allowed_weights": None,
            "priority_floor": None, "weights": {"light": 1.0}, "escalation": ["light"]}
    # The heartbeat replies say no lease: only the long-poll's reply can tell it.
    server.always("heartbeat", httpx.Response(200, json={
        "live": [], "cancel": [], "host": gate, "attempts": []}))
    server.always("assignments", httpx.Response(200, json={"jobs": [], "lease_seconds": 7.5}))
    source = make_source(poll=True)
    wait_for(lambda: source.lease_seconds == 7.5, 10, "the lease from the long-poll")


def test_the_servers_lease_is_known_from_a_host_heartbeat(server, make_source) -> None:
    server.always("heartbeat", httpx.Response(200, json={
        "live": [], "cancel": [], "host": None, "attempts": [], "lease_seconds": 4.0}))
    source = make_source(poll=True)
    wait_for(lambda: source.lease_seconds == 4.0, 10, "the lease from a host heartbeat")


def test_the_heartbeat_units_command_sends_a_heartbeat_with_the_token_file(
        tmp_path, plain_server) -> None:
    """What `herder heartbeat install-systemd` writes, run as systemd would run it."""
    address, seen = plain_server
    path = tmp_path / "token"
    path.write_text("hdr_from-the-file\n")
    path.chmod(0o600)
    printed = herder(tmp_path, "heartbeat", "install-systemd", "--server", f"http://{address}",
                     "--host", LABEL, "--token-file", str(path), "--print")
    assert printed.returncode == 0, printed.stderr
    [line] = [line for line in printed.stdout.splitlines() if line.startswith("ExecStart=")]
    argv = [part.replace("$$", "$").replace("%%", "%")
            for part in shlex.split(line.removeprefix("ExecStart="))]
    ran = subprocess.run(argv, cwd=tmp_path, env=clean_environment({"HOME": str(tmp_path)}),
                         capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, ran.stderr
    assert seen == ["Bearer hdr_from-the-file"]
    assert "hdr_from-the-file" not in printed.stdout


# -- adoption ---------------------------------------------------------------------------------


def test_an_adopted_attempts_log_resumes_where_the_servers_copy_ends(
        server, make_source, tmp_path) -> None:
    """The server has the first 9 bytes (shipped by the dead agent): the adopting agent
    ships from there, so its copy is whole and nothing is sent twice; a 409 (not live on
    the server, or not that worker's) is no adoption."""
    previous = f"{LABEL}/1/1"
    server.script("adopt 22.1", httpx.Response(200, json={"log_size": 9}))
    server.script("adopt 23.1", status(409))
    source = make_source()
    log_path = tmp_path / "22.log"
    log_path.write_bytes(b"line one\nline two\n")
    server.logs["22.1"] += b"line one\n"
    assert source.adopt(AttemptToken(22, 1), previous, str(log_path))
    body = json.loads(server.requests("adopt 22.1")[0].request.content)
    assert body == {"worker": source.worker, "previous": previous}
    finish(source, 22)
    wait_delivered(server, "finish 22.1")
    assert server.log_of("22.1") == b"line one\nline two\n"
    assert [int(seen.request.url.params["offset"]) for seen in server.requests("log 22.1")] \
        == [9]
    assert not source.adopt(AttemptToken(23, 1), previous, str(tmp_path / "23.log"))
    source.close()
