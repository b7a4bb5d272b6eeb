"""Dashboard sessions in the store (the cookie and CSRF rules are in herder.api.sessions): a
restart keeps them, and replicas behind a balancer share them."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import msgspec

from herder.store import Store

LIFETIME_SECONDS = 12 * 3600
MAX_ID_CHARS = 100
LEGACY = "legacy-admin:"
"""A session that signed in with HERDER_API_TOKEN (which has no stored hash) keeps this
followed by `legacy_key`: a rotated token no longer matches, on any replica."""
LINK = "sign-in-link:"
"""A session that a one-time sign-in link opened (herder.core.signin) keeps this followed by
`link_key`, keyed by the serving process's secret: it ends when that process does."""


class Session(msgspec.Struct, frozen=True):
    id: str
    key: str
    """The token's SHA-256, LEGACY and `legacy_key`, or LINK and `link_key`."""
    csrf: str


def _utcnow() -> datetime:
    return datetime.now(UTC)


def id_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def new_session_id() -> str:
    return secrets.token_urlsafe(32)


def legacy_key(session_id: str, token: str) -> str:
    """What a legacy sign-in keeps of HERDER_API_TOKEN: keyed by the session's id, which the
    store holds only hashed, so the table gives nothing to guess an operator-chosen (maybe
    weak) token from offline."""
    return LEGACY + hmac.new(session_id.encode(), token.encode(), hashlib.sha256).hexdigest()


def link_key(session_id: str, secret: str) -> str:
    """What a sign-in link's session keeps: the session's id signed with the secret of the
    process that issued the link (a session of an earlier run no longer matches)."""
    return LINK + hmac.new(secret.encode(), session_id.encode(), hashlib.sha256).hexdigest()


class SessionBook:
    """The open sessions, in the store; synchronous (the API calls it off its event loop)."""

    def __init__(self, store: Store, clock: Callable[[], datetime] = _utcnow,
                 lifetime: float = LIFETIME_SECONDS) -> None:
        self.store = store
        self._clock = clock
        self._lifetime = timedelta(seconds=lifetime)

    def open(self, key: str, session_id: str | None = None) -> Session:
        """A new session (`session_id`: one made beforehand with `new_session_id`); the
        expired ones go first (a sign-in is rare, so this is the only sweep the table
        needs)."""
        if session_id is None and key.startswith((LEGACY, LINK)):
            raise ValueError("a legacy or link key is made for its session id: pass that id")
        session = Session(session_id or new_session_id(), key, secrets.token_urlsafe(24))
        now = self._clock()
        self.store.session_expire(now)
        self.store.session_open(id_hash(session.id), key, session.csrf, now + self._lifetime)
        return session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie's value; None when unknown or expired."""
        if not session_id or len(session_id) > MAX_ID_CHARS:
            return None
        found = self.store.session_get(id_hash(session_id), self._clock())
        return None if found is None else Session(session_id, *found)

    def close(self, session_id: str) -> None:
        self.store.session_close(id_hash(session_id))
