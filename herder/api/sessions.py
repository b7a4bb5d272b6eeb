"""Dashboard sessions: a browser signs in once with a token and then holds an opaque,
random session id in an HttpOnly cookie; the token itself never reaches a cookie.

The server keeps, per session, the SHA-256 of the token (so every request is checked against
the token's current state: a revoked token ends its sessions at once) and a CSRF value that
state-changing requests must send back in a header. Sessions live in this process's memory:
a restart signs everyone out, and replicas behind a balancer need sticky sessions."""

from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from urllib.parse import urlsplit

import msgspec

from herder.api.tokens import same_secret

COOKIE = "herder_session"
CSRF_HEADER = "X-Herder-CSRF"
LIFETIME_SECONDS = 12 * 3600
MAX_SESSIONS = 10_000
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LEGACY = "legacy-admin"
"""The session's key when it signed in with HERDER_API_TOKEN (which has no stored hash)."""


class Session(msgspec.Struct, frozen=True):
    id: str
    key: str
    """The token's SHA-256, or LEGACY."""
    csrf: str
    expires: float  # monotonic


class SessionBook:
    """The open sessions, bounded: past MAX_SESSIONS the oldest is forgotten."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 lifetime: float = LIFETIME_SECONDS, limit: int = MAX_SESSIONS) -> None:
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lock = threading.Lock()
        self._clock = clock
        self._lifetime = lifetime
        self._limit = limit

    def open(self, key: str) -> Session:
        session = Session(secrets.token_urlsafe(32), key, secrets.token_urlsafe(24),
                          self._clock() + self._lifetime)
        with self._lock:
            self._sessions[session.id] = session
            while len(self._sessions) > self._limit:
                self._sessions.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's value; None when unknown or expired."""
        if not session_id or len(session_id) > 100:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires <= self._clock():
                del self._sessions[session_id]
                return None
        return session

    def close(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)


def csrf_refusal(session: Session, method: str, sent: str | None, origin: str | None,
                 host: str | None) -> str | None:
    """Why a request made with a session cookie may not change state; None when it may.

    A state change must send the session's CSRF value in a header (a form on another
    site cannot set one) and, when the browser names an Origin, come from this server."""
    if method.upper() in SAFE_METHODS:
        return None
    if not sent or not same_secret(sent, session.csrf):
        return f"missing or wrong {CSRF_HEADER} header (sign in again)"
    return foreign_origin(origin, host)


def foreign_origin(origin: str | None, host: str | None) -> str | None:
    """Why an Origin header is not this server's (None when absent or the same host)."""
    if origin is None:
        return None
    if origin == "null" or not host or urlsplit(origin).netloc.lower() != host.lower():
        return f"cross-origin request from {origin[:100]!r} refused"
    return None
