"""The server's edges, pure: which `Host` and `Origin` a loopback server answers (DNS
rebinding), and how many failed token checks a client may make before it waits.

A loopback server trusts whoever can reach it, and a web page in a browser on the same machine
can: by DNS rebinding (a name of the attacker's that first resolves to the attacker and then
to 127.0.0.1) its script reaches the server with a foreign `Host`, and by a form or a simple
request it reaches it with a foreign `Origin`. Refusing both leaves only callers that named
the server by its loopback address (or the name an operator declared for a proxy)."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from herder.core.urls import loopback_name

FAILURE_LIMIT = 20
"""Different tokens a client may fail with in one window before it waits."""
FAILURE_WINDOW = 60.0
"""Seconds: the window, and the longest a client waits."""
MAX_CLIENTS = 4096
"""Clients the limiter remembers at most; the oldest is forgotten first."""
VERIFIED_TTL = 600.0
"""Seconds a token that checked out lets its holder past a throttled address."""
MAX_VERIFIED = 4096
"""Verified tokens the limiter remembers at most; the least recently used is forgotten."""


def host_name(host: str) -> str:
    """The name of a `Host` value without its port, lowercased (`[::1]:8470` -> `::1`)."""
    value = host.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        return value.partition(":")[0]
    return value


def rebinding_refusal(host: str | None, origin: str | None,
                      also: Iterable[str] = ()) -> str | None:
    """Why a request to a loopback server is refused (None when it is not): its `Host` must
    be a loopback name (or one of `also`, a proxy's name from [server] public_url), and an
    `Origin`, when sent, must be the same host (or one of `also`)."""
    names = {name.lower() for name in also}
    if not host or not (loopback_name(host_name(host)) or host_name(host) in names):
        shown = (host or "")[:100]
        return (f"Host {shown!r} is not this loopback server's name: use 127.0.0.1, localhost "
                "or [::1] (a foreign Host is how DNS rebinding reaches it; behind a proxy, "
                "set [server] public_url)")
    if origin is not None:
        parts = urlsplit(origin if origin != "null" else "")
        # Its own pages: the Host they were loaded from, or the proxy's public name (a
        # proxy may pass the server its own loopback address as Host).
        if parts.netloc.lower() != host.strip().lower() and parts.hostname not in names:
            return (f"cross-origin request from {origin[:100]!r} refused: a loopback server "
                    "answers only its own pages")
    return None


def url_host(url: str | None) -> tuple[str, ...]:
    """The host name of a URL ([server] public_url), for `rebinding_refusal`'s `also`."""
    name = urlsplit(url).hostname if url else None
    return (name,) if name else ()


def proxy_options(environ: Mapping[str, str]) -> dict[str, Any]:
    """uvicorn's proxy-header options: X-Forwarded-For and X-Forwarded-Proto are trusted
    only from the addresses an operator lists in FORWARDED_ALLOW_IPS, from none without it.
    uvicorn's own default trusts 127.0.0.1, so any process on the server's machine (a job
    on a local host) could name any client's address and have it throttled."""
    trusted = environ.get("FORWARDED_ALLOW_IPS", "").strip()
    if not trusted:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": trusted}


class _Count(msgspec.Struct):
    tokens: set[int]
    since: float


class FailureLimiter:
    """Failed token checks per client address: after `limit` different tokens failed
    within `window` seconds the client is refused (429) until the window ends, before any
    store lookup, unless the token it presents checked out lately (`verified`).

    Different tokens: a guesser tries many, while an agent whose token was revoked retries
    its one from every thread, and must not shut out the other agents at its address.
    Known-good tokens pass a throttled address: an address is not an identity (all local
    child agents share 127.0.0.1, and a process on the server's machine can name any
    address in X-Forwarded-For when a local proxy is trusted), so whoever fails from it
    must not lock the agents out; a token the server has not seen lately still waits.
    Memory is bounded: at most `max_clients` addresses of `limit` token hashes each, the
    least recently failing address forgotten first, and `max_verified` token keys. A
    success does not reset the count (a client with one good token must not guess on with
    others); the window does."""

    def __init__(self, limit: int = FAILURE_LIMIT, window: float = FAILURE_WINDOW,
                 max_clients: int = MAX_CLIENTS,
                 clock: Callable[[], float] = time.monotonic,
                 verified_ttl: float = VERIFIED_TTL,
                 max_verified: int = MAX_VERIFIED) -> None:
        self.limit = limit
        self.window = window
        self.max_clients = max_clients
        self.clock = clock
        self.verified_ttl = verified_ttl
        self.max_verified = max_verified
        self._counts: OrderedDict[str, _Count] = OrderedDict()
        self._verified: OrderedDict[str, float] = OrderedDict()  # key -> when it checked out
        self._lock = threading.Lock()  # the event loop, and a local child's thread (verified)

    def wait(self, client: str, key: str | None = None) -> int | None:
        """Whole seconds `client` must wait before its next try; None when it may try
        (always when `key`, the presented token's hash, checked out within the TTL: its
        lookup then decides)."""
        with self._lock:
            count = self._counts.get(client)
            if count is None:
                return None
            left = count.since + self.window - self.clock()
            if left <= 0:
                del self._counts[client]
                return None
            if len(count.tokens) < self.limit or (key is not None and self._known(key)):
                return None
            return max(1, math.ceil(left))

    def known(self, key: str) -> bool:
        """Whether the token whose hash is `key` checked out within the TTL."""
        with self._lock:
            return self._known(key)

    def _known(self, key: str) -> bool:
        since = self._verified.get(key)
        if since is None:
            return False
        if since + self.verified_ttl <= self.clock():
            del self._verified[key]
            return False
        return True

    def verified(self, key: str) -> None:
        """Remember that the token whose hash is `key` checked out (now), or was minted by
        this server for its own local agent."""
        with self._lock:
            self._verified.pop(key, None)
            self._verified[key] = self.clock()  # the most recent at the end
            while len(self._verified) > self.max_verified:
                self._verified.popitem(last=False)

    def failed(self, client: str, token: str) -> None:
        """Count a failed check of `token` (a token, or its hash) by `client` (a token it
        failed with before in this window counts once); a token that fails is no longer
        known-good."""
        with self._lock:
            self._verified.pop(token, None)
            now = self.clock()
            count = self._counts.pop(client, None)
            if count is None or count.since + self.window <= now:
                count = _Count(set(), now)
            if len(count.tokens) < self.limit:
                count.tokens.add(hash(token))
            self._counts[client] = count  # the most recent at the end
            while len(self._counts) > self.max_clients:
                self._counts.popitem(last=False)

    def __len__(self) -> int:
        return len(self._counts)
