"""The one-time sign-in link of a local dashboard: `offer_link` is the hook a command that
serves the dashboard on loopback calls (`herder up --ui`; `herder server --sign-in-link`,
which `herder demo --ui` starts), and `redeem` is what `/ui/?login=<code>` does with the code
(herder.api.dashboard).

A code is redeemed only when the request arrives from a loopback address on a listener bound
to loopback, and only on an app that offered a link (`herder server` only with
`--sign-in-link`). It becomes the usual session cookie, whose key is signed with the serving
process's secret (herder.runtime.sessions.link_key), and the code goes from the address bar
by a redirect. The code is never logged: the access log redacts `login=`, and no refusal
repeats it."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit

from fastapi import FastAPI, Request

from herder.api.depends import Access, call, client_address
from herder.core.signin import CodeBook, Redeemed
from herder.core.urls import loopback_name
from herder.runtime.sessions import Session, link_key, new_session_id

LOGIN_VALUE = re.compile(r"(login=)[^&\s\"]*")
FORWARDING = frozenset({"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto",
                        "x-real-ip"})
OFF_LOOPBACK = ("sign-in links work only on a dashboard that listens on loopback, opened from "
                "this machine: sign in with a token instead")


class RedactLogin(logging.Filter):
    """Replaces a `login=` value in a log record's message and arguments (uvicorn's access
    log puts the request's path and query in its arguments)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redacted(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redacted(arg) if isinstance(arg, str) else arg
                                for arg in record.args)
        return True


def redacted(text: str) -> str:
    return LOGIN_VALUE.sub(r"\1[redacted]", text)


def offer_link(app: FastAPI, base_url: str, now: datetime | None = None) -> str:
    """The one-time sign-in link of `app` served at `base_url` (loopback, http); the caller
    prints it on standard output. The first call turns links on for this app."""
    codes: CodeBook | None = getattr(app.state, "sign_in_codes", None)
    if codes is None:
        codes = app.state.sign_in_codes = CodeBook()
        access_log = logging.getLogger("uvicorn.access")
        if not any(isinstance(found, RedactLogin) for found in access_log.filters):
            access_log.addFilter(RedactLogin())
    return f"{base_url.rstrip('/')}/ui/?login={codes.issue(now or datetime.now(UTC))}"


def local_request(request: Request) -> bool:
    """The request came from a loopback address to a listener bound to loopback (the app's
    Access says so: herder.cli.server.edge_access), reached it at a loopback address and
    names a loopback `Host`, and no proxy forwarded it (a proxy on this machine would make a
    browser elsewhere look local)."""
    access: Access = request.app.state.access
    server = request.scope.get("server")
    host = urlsplit(f"//{request.headers.get('host', '')}").hostname or ""
    return (access.loopback_names is not None and server is not None
            and loopback_name(str(server[0])) and loopback_name(client_address(request))
            and loopback_name(host) and not FORWARDING.intersection(request.headers.keys()))


async def redeem(request: Request, code: str) -> Session | tuple[int, str]:
    """The new session a code opens, or the status and reason of the refusal (for the login
    page; neither names the code): 403 off loopback or unknown, 410 expired or used."""
    codes: CodeBook | None = getattr(request.app.state, "sign_in_codes", None)
    if codes is None or not local_request(request):
        return 403, OFF_LOOPBACK
    outcome = codes.redeem(code, datetime.now(UTC))  # on the event loop: one at a time
    if outcome is not Redeemed.SIGNED_IN:
        return 403 if outcome is Redeemed.UNKNOWN else 410, outcome.reason
    session_id = new_session_id()
    opened: Session = await call(request.app.state.sessions.open,
                                 link_key(session_id, codes.secret), session_id)
    return opened
