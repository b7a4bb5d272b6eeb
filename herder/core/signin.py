"""One-time sign-in codes for a local dashboard (`herder up --ui` prints
`http://127.0.0.1:PORT/ui/?login=<code>`, as Jupyter does).

A code is random (32 bytes from `secrets`), valid once and for `CODE_SECONDS`; the book keeps
only its SHA-256, in the memory of the one process that serves the dashboard, so a restart
forgets every code. The clock is passed in, so expiry is tested without waiting. Which
listener and which client may redeem a code is the API's rule (herder.api.signin); this
module only says whether a code is good, once."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta
from enum import StrEnum

from herder.core.access import Caller, plausible_token, same_secret
from herder.core.model import Scope

CODE_SECONDS = 300
"""How long a printed link signs in: long enough to open it, short enough that a link left in
a terminal's scrollback is dead by the time anyone else reads it."""
LINK_CALLER = Caller("local sign-in link", Scope.SUBMIT)
"""Who a link's session is: submit, the least scope that lets a local operator use the
dashboard's everyday actions (cancel, retry); drain and enable need an admin token, pasted in
the form, so a browser session opened by a link cannot change the fleet's hosts."""


class Redeemed(StrEnum):
    """What a code presented once turned out to be."""

    SIGNED_IN = "signed-in"
    UNKNOWN = "unknown"
    EXPIRED = "expired"
    USED = "used"

    @property
    def reason(self) -> str:
        """What the login page says (never the code itself)."""
        return REASONS[self]


REASONS = {
    Redeemed.SIGNED_IN: "",
    Redeemed.UNKNOWN: "this sign-in link is not valid here (each run of the command that "
                      "prints one has its own): sign in with a token instead",
    Redeemed.EXPIRED: f"this sign-in link expired (a link lasts {CODE_SECONDS // 60} minutes): "
                      "restart the command that printed it for a new one, or sign in with a "
                      "token",
    Redeemed.USED: "this sign-in link was used already (a link signs in once): restart the "
                   "command that printed it for a new one, or sign in with a token",
}


def code_hash(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


class CodeBook:
    """The codes one process issued: hash -> (expiry, used). A process issues a few (one per
    start), so nothing is swept."""

    def __init__(self, lifetime: float = CODE_SECONDS) -> None:
        self._lifetime = timedelta(seconds=lifetime)
        self._codes: dict[str, tuple[datetime, bool]] = {}
        self.secret = secrets.token_urlsafe(32)
        """Keys the sessions the book's codes open (herder.runtime.sessions.link_key): a
        session outlives no restart of the process that signed it in."""

    def issue(self, now: datetime) -> str:
        """A new code, good until `now` + the lifetime; only its hash is kept."""
        code = secrets.token_urlsafe(32)
        self._codes[code_hash(code)] = (now + self._lifetime, False)
        return code

    def redeem(self, code: str, now: datetime) -> Redeemed:
        """Whether `code` signs in at `now`; a good code is spent by this call."""
        if not plausible_token(code):
            return Redeemed.UNKNOWN
        key = code_hash(code)
        found = next((stored for stored in self._codes if same_secret(stored, key)), None)
        if found is None:
            return Redeemed.UNKNOWN
        expires, used = self._codes[found]
        if used:
            return Redeemed.USED
        if now >= expires:
            return Redeemed.EXPIRED
        self._codes[found] = (expires, True)
        return Redeemed.SIGNED_IN
