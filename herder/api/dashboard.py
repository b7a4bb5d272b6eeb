"""The dashboard: its JSON routes under the API (scoped like every other route) and its
pages under `/ui/` (static HTML, CSS and JS shipped in the package; the pages hold no data,
their script fetches it with the session cookie).

Sign-in turns a pasted token into a session cookie (herder.api.sessions); the API's own
routes accept that cookie, so the dashboard's actions are the API's cancel, retry, drain
and enable with their scopes, plus the CSRF check a cookie needs."""

from __future__ import annotations

import asyncio
import html
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse

from herder.api.depends import (
    HOST_LABEL,
    Access,
    Operating,
    Reader,
    Service,
    call,
    public,
    session_cookie,
    session_identity,
    token_caller,
)
from herder.api.sessions import csrf_refusal, foreign_origin
from herder.api.signin import redeem
from herder.core.access import LEGACY_ADMIN, OPERATOR_RANK, authorize, token_hash
from herder.core.errors import Refused
from herder.core.model import BIGINT_MAX, JobStatus, Scope
from herder.core.submission import DEDUP_KEY_LENGTH, NAME_LENGTH
from herder.runtime.sessions import (
    LIFETIME_SECONDS,
    Session,
    SessionBook,
    legacy_key,
    new_session_id,
)
from herder.wire.dashboard import JobPage, SessionView

router = APIRouter(prefix="/api/v1/dashboard", tags=["dashboard"])
pages = APIRouter(prefix="/ui", dependencies=[Depends(public)], include_in_schema=False)

STATIC = Path(__file__).resolve().parent.parent / "dashboard" / "static"
CHECK_SECONDS = 1.0
"""How often the live stream looks at the store: at most one change signal a second."""
RETRY_MILLISECONDS = 1000
"""How soon a browser reconnects when a stream ends (each lasts at most [server] long_poll)."""
PRINTABLE = r"^[^\x00-\x1f]*$"  # PostgreSQL refuses NUL in text: a 422, not a 500
ASSETS = {"dashboard.css": "text/css; charset=utf-8",
          "dashboard.js": "text/javascript; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",  # no-referrer makes a form post say Origin: null
    "Cache-Control": "no-store",
}


# -- JSON, for the pages' script ----------------------------------------------------------------


@router.get("/session", response_model=SessionView)
async def session(caller: Reader, request: Request) -> SessionView:
    signed_in = getattr(request.state, "session", None)
    rank = OPERATOR_RANK.get(caller.scope, 0)
    return SessionView(name=caller.name, scope=str(caller.scope),
                       can_submit=rank >= OPERATOR_RANK[Scope.SUBMIT],
                       can_admin=rank >= OPERATOR_RANK[Scope.ADMIN],
                       csrf=None if signed_in is None else signed_in.csrf)


@router.get("/jobs", response_model=JobPage)
async def jobs(_caller: Reader, operations: Operating,
               status: JobStatus | None = None,
               job_type: Annotated[str | None, Query(max_length=NAME_LENGTH,
                                                     pattern=PRINTABLE)] = None,
               host: Annotated[str | None, Query(pattern=HOST_LABEL)] = None,
               dedup_key: Annotated[str | None, Query(max_length=DEDUP_KEY_LENGTH,
                                                      pattern=PRINTABLE)] = None,
               before: Annotated[int | None, Query(ge=1, le=BIGINT_MAX)] = None,
               limit: Annotated[int, Query(ge=1, le=200)] = 50) -> JobPage:
    """One page of jobs, newest first, ids below `before` (keyset paging: the cost is the
    page's, whatever the table's size); queued rows say why they wait."""
    return await call(operations.job_page, status, job_type or None, host or None,
                      dedup_key or None, before, limit)


@router.get("/changes", response_class=StreamingResponse, responses={200: {"content": {
    "text/event-stream": {"schema": {"type": "string"}}}}})
async def changes(_caller: Reader, service: Service, request: Request,
                  wait: Annotated[float, Query(ge=0, le=3600, allow_inf_nan=False)] = 0.0,
                  last_event_id: Annotated[str | None, Header(max_length=20)] = None
                  ) -> StreamingResponse:
    """Server-sent events: a `changed` event (its id the store's newest event id) when a
    job changed since `Last-Event-ID`, checked once a second, for `wait` seconds at most
    ([server] long_poll); the browser reconnects on its own when the stream ends."""
    seen = (int(last_event_id) if last_event_id and last_event_id.isascii()
            and last_event_id.isdigit() else None)
    seconds = min(wait, service.settings.server.long_poll)

    async def stream() -> AsyncIterator[bytes]:
        nonlocal seen
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        yield f"retry: {RETRY_MILLISECONDS}\n\n".encode()
        while True:
            latest = await call(service.reads.latest_change)
            if latest != seen:
                seen = latest
                yield f"id: {latest}\nevent: changed\ndata: {latest}\n\n".encode()
            remaining = deadline - loop.time()
            if remaining <= 0 or await request.is_disconnected():
                return
            await asyncio.sleep(min(CHECK_SECONDS, remaining))

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


# -- pages ----------------------------------------------------------------------------------------


@cache
def asset(name: str) -> str:
    return (STATIC / name).read_text()


@cache
def framed(name: str) -> str:
    """A view of the static folder inside the frame every signed-in page shares."""
    return (asset("frame.html").replace("{{page}}", name)
            .replace("{{content}}", asset(f"{name}.html")))


def page(text: str, status: int = 200, **values: str) -> HTMLResponse:
    """A page, its `{{key}}` places filled in (escaped)."""
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", html.escape(value))
    return HTMLResponse(text, status_code=status, headers=PAGE_HEADERS)


def login_form(status: int = 200, error: str = "", link_error: str = "") -> HTMLResponse:
    """The sign-in page: `error` under the token form, `link_error` (a one-time link that
    was refused: used, expired, unknown, off loopback) above it, on its own."""
    return page(asset("login.html"), status, error=error, link_error=link_error)


def sessions_of(request: Request) -> SessionBook:
    book: SessionBook = request.app.state.sessions
    return book


async def signed_in(request: Request) -> bool:
    """A page is shown to a live session (or to anyone under --insecure-no-auth)."""
    access: Access = request.app.state.access
    if access.open_access:
        return True
    found = await call(sessions_of(request).get,
                       request.cookies.get(session_cookie(request)[0]))
    if found is None:
        return False
    try:
        await session_identity(request, found)
    except Refused:
        await call(sessions_of(request).close, found.id)
        return False
    return True


async def shown(request: Request, name: str) -> Response:
    if not await signed_in(request):
        return RedirectResponse("/ui/login", status_code=303)
    return page(framed(name))


@pages.get("")
async def root() -> Response:
    return RedirectResponse("/ui/", status_code=307)


@pages.get("/")
async def fleet_page(request: Request) -> Response:
    code = request.query_params.get("login")
    if code is None:
        return await shown(request, "fleet")
    opened = await redeem(request, code)  # a one-time sign-in link (herder.api.signin)
    if not isinstance(opened, Session):
        status, reason = opened
        return login_form(status, link_error=reason)
    return signed_in_as(request, opened)  # to /ui/: the code leaves the address bar


@pages.get("/jobs")
async def jobs_page(request: Request) -> Response:
    return await shown(request, "jobs")


@pages.get("/jobs/{job_id}")
async def job_page(request: Request) -> Response:
    return await shown(request, "job")


@pages.get("/login")
async def login_page() -> Response:
    return login_form()


async def session_key(request: Request, token: str, session_id: str) -> str:
    """What session `session_id` keeps of a pasted token (its hash, never the token), once
    the token is checked as the API checks a bearer token: Refused (401/403) otherwise."""
    caller = await token_caller(request, token)
    if caller is LEGACY_ADMIN:
        return legacy_key(session_id, token)
    authorize(caller, Scope.READ)  # an agent token signs in nowhere
    return token_hash(token)


@pages.post("/login")
async def login(request: Request) -> Response:
    refusal = foreign_origin(request.headers.get("origin"), request.headers.get("host"))
    if refusal is not None:
        return login_form(403, refusal)
    try:
        form = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=5)
    except ValueError:  # more fields than a sign-in form has
        form = {}
    token = (form.get("token") or [""])[0].strip()
    if not token:
        return login_form(401, "paste a read, submit or admin token")
    session_id = new_session_id()
    try:
        key = await session_key(request, token, session_id)
    except Refused as refused:
        return login_form(refused.status, refused.reason)
    return signed_in_as(request, await call(sessions_of(request).open, key, session_id))


SIGNED_IN_PAGE = """\
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0;url=/ui/">
<title>herder: signed in</title>
</head>
<body><p>Signed in: on to <a href="/ui/">the dashboard</a>.</p></body>
</html>
"""


def signed_in_as(request: Request, opened: Session) -> Response:
    """To the fleet view, holding the new session's cookie: by a redirect, or, when another
    site led the browser here (`herder demo`'s redirect page, a file://), by this page
    refreshing to it. A browser sends no SameSite=Strict cookie on a redirect in a chain
    that another site began; the page's own navigation is same-site."""
    response: Response = (page(SIGNED_IN_PAGE)
                          if request.headers.get("sec-fetch-site") == "cross-site"
                          else RedirectResponse("/ui/", status_code=303))
    name, secure = session_cookie(request)
    response.set_cookie(name, opened.id, max_age=LIFETIME_SECONDS, path="/", httponly=True,
                        samesite="strict", secure=secure)
    return response


@pages.post("/logout")
async def logout(request: Request) -> Response:
    book = sessions_of(request)
    name, secure = session_cookie(request)
    found = await call(book.get, request.cookies.get(name))
    if found is not None:
        refusal = csrf_refusal(found, "POST", request.headers.get("x-herder-csrf"),
                               request.headers.get("origin"), request.headers.get("host"))
        if refusal is not None:
            return Response(refusal, status_code=403, media_type="text/plain")
        await call(book.close, found.id)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(name, path="/", httponly=True, samesite="strict", secure=secure)
    return response


@pages.get("/static/{name}")
async def static(name: str) -> Response:
    media = ASSETS.get(name)
    if media is None:
        return Response("no such file", status_code=404, media_type="text/plain")
    return Response(asset(name), media_type=media, headers={"Cache-Control": "no-cache"})
