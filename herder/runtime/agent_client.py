"""The agent's side of the wire: one HTTP client, and the two streams that must survive a
flaky server, results and logs.

Every answer is classified once (`classify`): 2xx done; 409/410 the attempt is no longer
live here, so the report is moot; other 4xx a bug, logged and dropped; 401/403 a refused
token, said once and retried (an operator may fix it); no answer, 5xx, 408 and 429 retried
with capped exponential backoff and full jitter, never sooner than a Retry-After.
"""

from __future__ import annotations

import email.utils
import enum
import json
import logging
import math
import os
import ssl
import stat
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import msgspec

from herder.core.backoff import Backoff
from herder.core.errors import InputError
from herder.core.model import AttemptToken
from herder.core.urls import loopback_name

log = logging.getLogger("herder.agent")

LOG_CHUNK = 512 * 1024


class ServerError(Exception):
    """A call to the server did not succeed; the subclass says whether to try again."""


class ServerUnavailable(ServerError, ConnectionError):
    """No answer, or one that says "later" (5xx, 408, 429): try again."""


class AgentAuthError(ServerUnavailable):
    """401/403: the server refused the token. Retried: an operator may fix the token."""


class ReportGone(ServerError):
    """409/410: the attempt is no longer live on this host; the report is moot."""


class RequestRefused(ServerError):
    """Any other 4xx: one side has a bug; sending the same request again cannot help."""


class Verdict(enum.Enum):
    """What one answer (or its absence) means for the request that got it."""

    OK = "ok"
    RETRY = "retry"
    UNAUTHORIZED = "unauthorized"
    GONE = "gone"
    REFUSED = "refused"


def classify(status: int) -> Verdict:
    if 200 <= status < 300:
        return Verdict.OK
    if status in (401, 403):
        return Verdict.UNAUTHORIZED
    if status in (409, 410):
        return Verdict.GONE
    if 400 <= status < 500 and status not in (408, 429):
        return Verdict.REFUSED
    # 5xx, 408, 429, and statuses an agent route never gives (1xx, 3xx): a result must not
    # be dropped on an answer that may mean "not now".
    return Verdict.RETRY


class Reply(msgspec.Struct, frozen=True):
    """One request's answer, classified; `status` None when no HTTP answer came."""

    verdict: Verdict
    status: int | None
    body: Any
    problem: str
    retry_after: float | None = None
    error: BaseException | None = None


RETRY_AFTER_LIMIT = 600.0
"""A Retry-After beyond ten minutes is treated as ten minutes: results must not sit for hours."""


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """A Retry-After header (seconds, or an HTTP date) as seconds from `now`."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if not math.isfinite(seconds):
        return None
    return min(max(seconds, 0.0), RETRY_AFTER_LIMIT)


def retry_delay(backoff: Backoff, reply: Reply) -> float:
    """The backoff's next delay, but never shorter than the server asked for."""
    return max(backoff.next(), reply.retry_after or 0.0)


def _answer_excerpt(response: httpx.Response) -> str:
    """`HTTP 422: <reason>` from the JSON `detail`/`error`, else the body's start."""
    try:
        body = response.json()
    except ValueError:
        body = None
    reason: Any = None
    if isinstance(body, dict):
        reason = body.get("detail", body.get("error"))
    if reason is None:
        reason = response.text
    text = reason if isinstance(reason, str) else json.dumps(reason)
    text = " ".join(text.split())
    return f"HTTP {response.status_code}: {text[:200]}" if text else f"HTTP {response.status_code}"


def _causes(error: BaseException | None) -> list[BaseException]:
    """An exception, its causes and contexts, and exceptions carried in their args."""
    found: list[BaseException] = []
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        pending += [current.__cause__, current.__context__]
        pending += [arg for arg in current.args if isinstance(arg, BaseException)]
    return found


def check_server_url(text: str, allow_plaintext: bool = False) -> str:
    """The server URL without its trailing slash; InputError naming the fix otherwise. A
    plain http URL off loopback is refused unless `allow_plaintext` (--allow-plaintext):
    the token, logs and account credentials would cross the network in clear text."""
    url = text.strip()
    parts = urllib.parse.urlsplit(url)
    fix = "use https://HOST:PORT, or http://HOST:PORT for a server without TLS"
    if parts.scheme not in ("http", "https"):
        if not parts.netloc:
            raise InputError("--server", f"{text!r} has no scheme",
                             f"use https://{url}, or http://{url} for a server without TLS")
        raise InputError("--server", f"{text!r}: scheme {parts.scheme!r} is not http or https",
                         fix)
    if not parts.hostname:
        raise InputError("--server", f"{text!r} names no host", fix)
    if parts.scheme == "http" and not allow_plaintext and not loopback_name(parts.hostname):
        raise InputError("--server", f"{url} is plain http off loopback: the token would "
                         "cross the network in clear text", "use https:// with a TLS server "
                         "(herder server --tls-cert/--tls-key), or pass --allow-plaintext "
                         "on a network you trust")
    return url.rstrip("/")


def setup_problem(error: BaseException | None, server: str, ca: str | None) -> InputError | None:
    """A transport error that no retry can cure (wrong scheme, untrusted certificate), as the
    one-line fix; None for the ones that pass (refused, reset, timeout)."""
    causes = _causes(error)
    text = " ".join(str(cause) for cause in causes)
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        plain = "http://" + server.partition("://")[2]
        return InputError("--server", f"{server} does not answer TLS (a plain http server?)",
                          f"use {plain}, or start the server with --tls-cert and --tls-key")
    verify = [cause for cause in causes if isinstance(cause, ssl.SSLCertVerificationError)]
    if verify or "CERTIFICATE_VERIFY_FAILED" in text:
        reason = verify[0].verify_message if verify else "certificate verify failed"
        if ca is None:
            return InputError("--ca", f"the certificate of {server} does not verify ({reason})",
                              "pass --ca FILE, the CA that signed the server's certificate")
        return InputError("--ca", f"the certificate of {server} does not verify against {ca} "
                          f"({reason})", "pass --ca with the CA that signed it")
    return None


def read_token_file(path: str, variable: str = "HERDER_AGENT_TOKEN") -> str:
    """A token (a host's, or an operator's with `variable` HERDER_TOKEN) from a file only
    its owner can read."""
    fix = f"write the token there with mode 0600, or set {variable}"
    try:
        mode = os.stat(path).st_mode
        if mode & 0o077:
            raise InputError("--token-file", f"{path} is open to group or others "
                             f"(mode {stat.S_IMODE(mode):04o})", f"run chmod 600 {path}")
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except FileNotFoundError:
        raise InputError("--token-file", f"{path} does not exist", fix) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError("--token-file", f"cannot read {path}: {exc}", fix) from None
    if not token or len(token.split()) != 1:
        raise InputError("--token-file", f"{path} does not hold one token", fix)
    return token


class ServerClient:
    """HTTP calls with the host token. `request` tries once and classifies the answer;
    `call` retries what is worth retrying, with capped exponential backoff and full jitter."""

    AUTH_REMINDER = 300.0
    """While the token stays refused, say so again this often (seconds)."""

    def __init__(self, server: str, token: str, label: str, verify: bool | str = True,
                 timeout: float = 10.0, *, transport: httpx.BaseTransport | None = None,
                 retry_base: float = 0.2, retry_cap: float = 30.0,
                 allow_plaintext: bool = False) -> None:
        self.server = check_server_url(server, allow_plaintext)
        self.label = label
        self.ca = verify if isinstance(verify, str) else None
        self.retry_base = retry_base
        self.max_delay = retry_cap
        self._auth_lock = threading.Lock()
        self._auth_refused_at: float | None = None
        self.observer: Callable[[Reply], None] | None = None
        """Told of every reply (herder.runtime.agent_trouble watches them)."""
        trust: bool | ssl.SSLContext = verify if isinstance(verify, bool) else True
        if isinstance(verify, str):
            try:
                trust = ssl.create_default_context(cafile=verify)
            except (OSError, ssl.SSLError) as exc:
                raise InputError("--ca", f"{verify} holds no usable certificate ({exc})",
                                 "pass the PEM file of the CA that signed the server's "
                                 "certificate") from None
        self.http = httpx.Client(
            base_url=self.server, verify=trust, timeout=timeout, transport=transport,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "herder-agent"},
        )

    def backoff(self) -> Backoff:
        return Backoff(base=self.retry_base, cap=self.max_delay)

    def agent_path(self, path: str) -> str:
        return f"/api/v1/agent/{self.label}{path}"

    def request(self, method: str, path: str, **kwargs: Any) -> Reply:
        """One try; never raises for an HTTP status or a network error."""
        reply = self._request(method, path, **kwargs)
        if self.observer is not None:
            self.observer(reply)
        return reply

    def _request(self, method: str, path: str, **kwargs: Any) -> Reply:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.RequestError as exc:
            return Reply(Verdict.RETRY, None, None, f"{type(exc).__name__}: {exc}", error=exc)
        verdict = classify(response.status_code)
        try:
            body = response.json()
        except ValueError:
            body = None
        if verdict is Verdict.OK:
            self._token_accepted()
            return Reply(verdict, response.status_code, body, f"HTTP {response.status_code}")
        return Reply(verdict, response.status_code, body, _answer_excerpt(response),
                     retry_after_seconds(response.headers.get("retry-after"), datetime.now(UTC)))

    def call(self, method: str, path: str, *, retry: bool = True,
             stop: threading.Event | None = None, **kwargs: Any) -> Any:
        """An agent route's JSON answer. Network errors, 5xx and refused tokens are retried
        until `stop` is set (then, or with `retry` False, raised as ServerUnavailable or
        AgentAuthError); 409/410 raise ReportGone, other 4xx RequestRefused."""
        backoff = self.backoff()
        while True:
            reply = self.request(method, self.agent_path(path), **kwargs)
            if reply.verdict is Verdict.OK:
                return reply.body
            if reply.verdict is Verdict.GONE:
                raise ReportGone(reply.problem)
            if reply.verdict is Verdict.REFUSED:
                raise RequestRefused(f"{method} {path}: {reply.problem}")
            error: ServerUnavailable = (
                self.token_refused(reply) if reply.verdict is Verdict.UNAUTHORIZED
                else ServerUnavailable(reply.problem))
            if not retry or (stop is not None and stop.is_set()):
                raise error
            delay = retry_delay(backoff, reply)
            if reply.verdict is Verdict.RETRY:
                log.warning("server unreachable (%s); retrying in %.1fs", reply.problem, delay)
            if _sleep(delay, stop):
                raise error

    def check(self, stop: threading.Event | None = None, patience: float | None = None) -> None:
        """The first call, before any work: a setup that cannot work raises InputError
        naming the fix; a server that is not up yet is waited for (for `patience` seconds,
        None = as long as it takes), one log line per try."""
        backoff = self.backoff()
        deadline = None if patience is None else time.monotonic() + patience
        while True:
            reply = self.request("GET", "/healthz")
            if reply.status is not None:
                if 300 <= reply.status < 400:
                    raise InputError("--server", f"{self.server} answers with a redirect "
                                     f"(HTTP {reply.status})", "pass the URL it redirects to")
                return
            problem = setup_problem(reply.error, self.server, self.ca)
            if problem is not None:
                raise problem
            if deadline is not None and time.monotonic() >= deadline:
                raise ServerUnavailable(f"cannot reach {self.server}: {reply.problem}")
            delay = retry_delay(backoff, reply)
            hint = ""
            if (isinstance(reply.error, httpx.RemoteProtocolError)
                    and self.server.startswith("http://")):
                hint = " (if the server uses TLS, use https://)"
            log.warning("cannot reach the server at %s (%s)%s; retrying in %.1fs",
                        self.server, reply.problem, hint, delay)
            if _sleep(delay, stop):
                raise ServerUnavailable(f"cannot reach {self.server}: {reply.problem}")

    def refusal(self, reply: Reply) -> str:
        return (f"the server refused this agent's token for host {self.label}: "
                f"{reply.problem}; check --token-file / HERDER_AGENT_TOKEN")

    def token_refused(self, reply: Reply) -> AgentAuthError:
        """Say it once (and every AUTH_REMINDER while it lasts), without a traceback."""
        error = AgentAuthError(self.refusal(reply))
        now = time.monotonic()
        with self._auth_lock:
            quiet = (self._auth_refused_at is not None
                     and now - self._auth_refused_at < self.AUTH_REMINDER)
            if not quiet:
                self._auth_refused_at = now
        if not quiet:
            log.error("%s", error)
        return error

    def _token_accepted(self) -> None:
        with self._auth_lock:
            refused, self._auth_refused_at = self._auth_refused_at, None
        if refused is not None:
            log.info("the server accepts this agent's token again")

    def close(self) -> None:
        self.http.close()


def _sleep(seconds: float, stop: threading.Event | None) -> bool:
    """Wait; True when `stop` was set meanwhile."""
    return (stop or threading.Event()).wait(seconds)


REPORT_SENDERS = 4
"""Threads that send result reports: a request hanging for one attempt leaves three for the
others."""
FINAL_LOG_WAIT = 10.0
"""How long a finish waits for its attempt's last log chunks (it goes at once if they fail)."""
LOG_BACKLOG = 16 * 1024 * 1024
"""Unsent log bytes kept per attempt; older ones are skipped, with a marker in the log."""
LOG_ROUND = 4 * LOG_CHUNK
"""Bytes one attempt may ship before the others get their turn."""
LOG_GIVE_UP = 600.0
"""An ended attempt's log stops being retried after failing this long (logs are best effort)."""


class Report(msgspec.Struct, frozen=True):
    """A result (`start` or `finish`) of one attempt, queued at `queued` (monotonic)."""

    token: AttemptToken
    kind: str
    body: dict[str, Any]
    queued: float


@dataclass
class _Lane:
    """One attempt's reports, sent in order. A retry is a due time, not a sleeping thread."""

    backoff: Backoff
    reports: deque[Report] = field(default_factory=deque)
    due: float = 0.0
    busy: bool = False


class Outbox:
    """Results, one lane per attempt, sent by a few threads that take whichever lane is due:
    a report that the server keeps refusing for attempt A never delays attempt B's."""

    def __init__(self, client: ServerClient, hold: Callable[[Report], float],
                 senders: int = REPORT_SENDERS,
                 gone: Callable[[AttemptToken], None] = lambda _token: None) -> None:
        self.client = client
        self.hold = hold
        self.senders = senders
        self.gone = gone
        """Told of an attempt the server says is no longer live (409/410 on a report)."""
        self._lanes: dict[AttemptToken, _Lane] = {}
        self._changed = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.senders):
            thread = threading.Thread(target=self._sender, name=f"herder-agent-outbox-{number}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def put(self, token: AttemptToken, kind: str, body: dict[str, Any]) -> None:
        with self._changed:
            lane = self._lanes.get(token)
            if lane is None:
                lane = self._lanes[token] = _Lane(self.client.backoff())
            lane.reports.append(Report(token, kind, body, time.monotonic()))
            self._changed.notify_all()

    def wake(self) -> None:
        """Something `hold` depends on changed."""
        with self._changed:
            self._changed.notify_all()

    def pending(self, token: AttemptToken, kind: str) -> bool:
        """A report of `kind` for `token` is queued or on its way (not answered yet)."""
        with self._changed:
            lane = self._lanes.get(token)
            return lane is not None and any(r.kind == kind for r in lane.reports)

    def flush(self, deadline: float) -> list[Report]:
        """Wait until every report was answered or `deadline` (monotonic) passed; what is
        left."""
        with self._changed:
            while self._threads and self._lanes and time.monotonic() < deadline:
                self._changed.wait(min(1.0, deadline - time.monotonic()))
            return [report for lane in self._lanes.values() for report in lane.reports]

    def stop(self, wait: float = 1.0) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(wait)

    def _next(self) -> Report | None:
        """The oldest lane's head that is due and not being sent; None once stopping."""
        with self._changed:
            while not self._stopping:
                now = time.monotonic()
                wake_at = math.inf
                for lane in self._lanes.values():
                    if lane.busy:
                        continue
                    at = max(lane.due, self.hold(lane.reports[0]))
                    if at <= now:
                        lane.busy = True
                        return lane.reports[0]
                    wake_at = min(wake_at, at)
                self._changed.wait(None if wake_at == math.inf else wake_at - now)
            return None

    def _sender(self) -> None:
        trouble = self.client.backoff()
        while True:
            try:
                report = self._next()
                if report is None:
                    return
                try:
                    reply = self._send(report)
                except Exception as exc:
                    log.exception("attempt %s: sending %s failed", report.token, report.kind)
                    reply = Reply(Verdict.RETRY, None, None, f"{type(exc).__name__}: {exc}")
                self._settle(report, reply)
                trouble.reset()
            except Exception:
                # A bug here must not silence this agent's results for good.
                log.exception("outbox sender failed; continuing")
                _sleep(trouble.next(), None)

    def _send(self, report: Report) -> Reply:
        token = report.token
        return self.client.request(
            "POST", self.client.agent_path(f"/attempts/{token.job_id}/{token.attempt}/"
                                           f"{report.kind}"), json=report.body)

    def _settle(self, report: Report, reply: Reply) -> None:
        token, kind = report.token, report.kind
        retry_in: float | None = None
        with self._changed:
            lane = self._lanes[token]
            lane.busy = False
            if reply.verdict in (Verdict.RETRY, Verdict.UNAUTHORIZED):
                retry_in = retry_delay(lane.backoff, reply)
                lane.due = time.monotonic() + retry_in
            else:
                lane.reports.popleft()
                lane.backoff.reset()
                lane.due = 0.0
                if not lane.reports:
                    del self._lanes[token]
            self._changed.notify_all()
        if reply.verdict is Verdict.OK:
            body = reply.body if isinstance(reply.body, dict) else {}
            if kind == "finish":
                log.info("attempt %s reported: %s", token, body.get("status"))
        elif reply.verdict is Verdict.GONE:
            log.warning("attempt %s: %s dropped, the attempt is no longer live here (%s)",
                        token, kind, reply.problem)
            self.gone(token)
        elif reply.verdict is Verdict.REFUSED:
            log.error("attempt %s: %s dropped, the server refused it (%s); this is a bug in "
                      "herder, please report it", token, kind, reply.problem)
        elif reply.verdict is Verdict.UNAUTHORIZED:
            self.client.token_refused(reply)
        else:
            log.warning("attempt %s: %s not delivered (%s); retrying in %.1fs", token, kind,
                        reply.problem, retry_in)


def drop_marker(count: int) -> bytes:
    return f"\n# herder: {count} bytes of log dropped\n".encode()


def backlog_skip(offset: int, size: int, limit: int) -> int:
    """Bytes to skip so that at most `limit` unsent bytes (the newest) remain."""
    return max(0, size - offset - limit)


@dataclass
class _Shipping:
    """Where one attempt's log stands: `offset` in the local file (sent or skipped), `sent`
    on the server (log plus drop markers)."""

    path: Path
    backoff: Backoff
    offset: int = 0
    sent: int = 0
    dropped: int = 0
    final: bool = False
    due: float = 0.0
    failing_since: float | None = None


class LogShipper:
    """Streams attempt logs to the server, apart from results: best effort, bounded.

    The local log keeps everything; what waits to be sent is capped at `backlog` bytes per
    attempt (the oldest are skipped, with a marker line). A failing upload is retried with
    backoff and never holds a result back: a finish waits for its log only while the last
    chunks are going through (`holding`)."""

    def __init__(self, client: ServerClient, backlog: int = LOG_BACKLOG,
                 chunk: int = LOG_CHUNK, interval: float = 1.0,
                 on_settled: Callable[[], None] = lambda: None) -> None:
        self.client = client
        self.backlog = backlog
        self.chunk = chunk
        self.interval = interval
        self.on_settled = on_settled
        self._attempts: dict[AttemptToken, _Shipping] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def add(self, token: AttemptToken, path: Path, offset: int = 0) -> None:
        """Ship `path` from `offset`, where the server's copy ends (an adopted attempt's
        log resumes there; bytes dropped by a predecessor's backlog are not known here, so
        at most the local file's size is taken as sent)."""
        with self._lock:
            try:
                local = os.stat(path).st_size
            except OSError:
                local = 0
            self._attempts[token] = _Shipping(path, self.client.backoff(),
                                              offset=min(offset, local), sent=offset)

    def finish(self, token: AttemptToken) -> None:
        """The attempt ended: ship the rest now, then forget it."""
        with self._lock:
            shipping = self._attempts.get(token)
            if shipping is not None:
                shipping.final = True
                shipping.due = 0.0
        self._wake.set()

    def holding(self, token: AttemptToken) -> bool:
        """The attempt's last chunks are on their way and none has failed yet."""
        with self._lock:
            shipping = self._attempts.get(token)
            return (shipping is not None and shipping.final
                    and shipping.failing_since is None)

    def unsettled(self) -> int:
        """Ended attempts whose log is not shipped yet."""
        with self._lock:
            return sum(1 for shipping in self._attempts.values() if shipping.final)

    def run(self, stop: threading.Event) -> None:
        trouble = self.client.backoff()
        more = False
        while not stop.is_set():
            try:
                if not more:
                    self._wake.wait(self._next_wait())
                    self._wake.clear()
                if stop.is_set():
                    return
                more = self.ship_round(time.monotonic())
                trouble.reset()
            except Exception:
                log.exception("log shipping failed; continuing")
                more = False
                stop.wait(trouble.next())

    def _next_wait(self) -> float:
        with self._lock:
            dues = [shipping.due for shipping in self._attempts.values()
                    if shipping.final or shipping.failing_since is not None]
        soonest = min(dues, default=math.inf) - time.monotonic()
        return max(0.0, min(self.interval, soonest))

    def ship_round(self, now: float) -> bool:
        """Ship what each due attempt has; True when some attempt has more right away."""
        with self._lock:
            due = [(token, shipping) for token, shipping in self._attempts.items()
                   if shipping.due <= now]
        more = False
        settled = False
        for token, shipping in due:
            outcome = self._ship(token, shipping)
            if outcome == "more":
                more = True
            elif outcome == "settled":
                with self._lock:
                    self._attempts.pop(token, None)
                settled = True
        if settled:
            self.on_settled()
        return more

    def _ship(self, token: AttemptToken, shipping: _Shipping) -> str:
        """Up to LOG_ROUND bytes of one attempt: "more", "idle", or "settled" (forget it)."""
        shipped = 0
        while shipped < LOG_ROUND:
            try:
                size = os.stat(shipping.path).st_size
                skip = backlog_skip(shipping.offset, size, self.backlog)
                if skip:
                    shipping.offset += skip
                    shipping.dropped += skip
                marker = drop_marker(shipping.dropped) if shipping.dropped else b""
                with open(shipping.path, "rb") as handle:
                    handle.seek(shipping.offset)
                    data = handle.read(max(1, self.chunk - len(marker)))
            except OSError as exc:
                log.warning("attempt %s: cannot read its log (%s); not shipping it", token, exc)
                return "settled"
            if not data and not marker:
                return "settled" if shipping.final else "idle"
            reply = self.client.request(
                "POST", self.client.agent_path(f"/attempts/{token.job_id}/{token.attempt}/log"),
                content=marker + data, params={"offset": shipping.sent})
            if reply.verdict is Verdict.OK:
                shipping.sent += len(marker) + len(data)
                shipping.offset += len(data)
                shipping.dropped = 0
                shipping.failing_since = None
                shipping.backoff.reset()
                shipped += len(data)
                continue
            return self._failed(token, shipping, reply)
        return "more"

    def _failed(self, token: AttemptToken, shipping: _Shipping, reply: Reply) -> str:
        if reply.verdict is Verdict.GONE:
            log.warning("attempt %s: log not shipped, the attempt is no longer live here (%s)",
                        token, reply.problem)
            return "settled"
        if reply.status == 413:
            log.warning("attempt %s: the rest of its log is not shipped, it passed the "
                        "server's max_log_bytes (%s)", token, reply.problem)
            return "settled"
        if reply.verdict is Verdict.REFUSED:
            log.error("attempt %s: log not shipped, the server refused it (%s); this is a bug "
                      "in herder, please report it", token, reply.problem)
            return "settled"
        if reply.verdict is Verdict.UNAUTHORIZED:
            self.client.token_refused(reply)
        now = time.monotonic()
        first = shipping.failing_since is None
        if shipping.failing_since is None:
            shipping.failing_since = now
        if shipping.final and now - shipping.failing_since >= LOG_GIVE_UP:
            log.warning("attempt %s: giving up on the rest of its log after %.0fs (%s)",
                        token, now - shipping.failing_since, reply.problem)
            return "settled"
        shipping.due = now + retry_delay(shipping.backoff, reply)
        log.debug("attempt %s: log chunk not shipped (%s)", token, reply.problem)
        if first and shipping.final:
            self.on_settled()  # the finish stops waiting for this log
        return "idle"
