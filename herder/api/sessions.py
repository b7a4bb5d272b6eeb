"""Dashboard sessions: a browser signs in once with a token and then holds an opaque,
random session id in an HttpOnly cookie; the token itself never reaches a cookie.

The store keeps, per session (herder.runtime.sessions), the SHA-256 of its id, the SHA-256
of the token (so every request is checked against the token's current state: a revoked
token ends its sessions at once) and a CSRF value that state-changing requests must send
back in a header."""

from __future__ import annotations

from urllib.parse import urlsplit

from herder.core.access import same_secret
from herder.runtime.sessions import Session

COOKIE = "herder_session"
SECURE_COOKIE = "__Host-herder_session"
"""The cookie's name over TLS: a browser keeps a `__Host-` cookie only when it is Secure,
for this host alone and path /, so no plain-http page or sibling domain can set or shadow it."""
CSRF_HEADER = "X-Herder-CSRF"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def cookie_name(secure: bool) -> str:
    """The session cookie's name: `__Host-` prefixed whenever the server is reached over TLS."""
    return SECURE_COOKIE if secure else COOKIE


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
