"""The agent's side of the wire: one HTTP client. The two streams that must survive a flaky
server, results and logs, are outbox.py and log_shipper.py.

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
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec

from herder.core.backoff import Backoff
from herder.core.errors import InputError
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
            if sleep_unless_stopped(delay, stop):
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
            if sleep_unless_stopped(delay, stop):
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


def sleep_unless_stopped(seconds: float, stop: threading.Event | None) -> bool:
    """Wait; True when `stop` was set meanwhile."""
    return (stop or threading.Event()).wait(seconds)
