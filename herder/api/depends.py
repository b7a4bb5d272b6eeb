"""What routes depend on: the caller (scoped tokens), the operations, the coordinator, the
thread pool.

Every route declares the scope it needs through one of `operator(scope)`, `agent_host` or
`public`; each carries a `herder_scope` attribute, which `route_scope` finds, so the app
refuses to start with a route that declares none."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, TypeVar

import msgspec
from fastapi import Depends, Header, HTTPException, Path, Request
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from herder.api.board import AssignmentBoard
from herder.api.guard import FAILURE_LIMIT, FailureLimiter
from herder.api.sessions import CSRF_HEADER, cookie_name, csrf_refusal
from herder.core.access import (
    ANONYMOUS_ADMIN,
    LEGACY_ADMIN,
    Caller,
    authorize,
    identify,
    plausible_token,
    same_secret,
    token_hash,
)
from herder.core.errors import Refused
from herder.core.model import BIGINT_MAX, INT_MAX, Scope, WorkerId
from herder.core.settings.fields import NAME as _NAME
from herder.core.settings.sections import DEFAULTS
from herder.core.signin import LINK_CALLER, CodeBook
from herder.runtime.coordinator import Coordinator
from herder.runtime.sessions import LEGACY, LINK, Session, SessionBook, legacy_key, link_key
from herder.services.operations import Operations

T = TypeVar("T")

JobId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
AttemptNumber = Annotated[int, Path(ge=1, le=INT_MAX)]
ReservationId = Annotated[int, Path(ge=1, le=BIGINT_MAX)]
HOST_LABEL = _NAME.pattern
"""A host label as `herder host add` accepts one (herder.core.settings's name rule): anything else
is a 422 before the store sees it (PostgreSQL refuses NUL characters with an error)."""
HostLabel = Annotated[str, Path(pattern=HOST_LABEL)]


class Access(msgspec.Struct, frozen=True):
    """How the server authenticates callers."""

    open_access: bool = False
    """--insecure-no-auth (loopback only): a request without a token acts as admin."""
    legacy_admin_token: str | None = None
    """HERDER_API_TOKEN, kept working as an admin token (deprecated)."""
    max_body_bytes: int = DEFAULTS.server.max_body_bytes
    hook_secrets: Mapping[str, bytes] = msgspec.field(default_factory=dict)
    """Webhook source -> its secret (`Config.hook_secrets`); a source without one is 404."""
    loopback_names: tuple[str, ...] | None = None
    """Set when the server listens on loopback: it answers only a loopback `Host` (or one of
    these names, a proxy's from [server] public_url) and no foreign `Origin` (DNS
    rebinding). Open access always checks, and with loopback names alone."""
    secure_cookie: bool = False
    """[server] public_url is https: the session cookie is `Secure` and `__Host-` even when
    the request reaches the server as plain http (from a TLS proxy that says nothing)."""
    failure_limit: int = FAILURE_LIMIT
    """Different tokens a client may fail with in a minute before it gets 429 (guard)."""

    def host_guard(self) -> tuple[str, ...] | None:
        """The names besides loopback ones a request's `Host` may be; None: no check."""
        if self.open_access:
            return ()
        return self.loopback_names


async def call(function: Callable[..., T], *args: Any) -> T:
    """Store work is synchronous: run it in the thread pool, off the event loop."""
    return await run_in_threadpool(function, *args)


def coordinator(request: Request) -> Coordinator:
    found: Coordinator = request.app.state.coordinator
    return found


def operations(request: Request) -> Operations:
    found: Operations = request.app.state.operations
    return found


def board(request: Request) -> AssignmentBoard:
    found: AssignmentBoard = request.app.state.board
    return found


Service = Annotated[Coordinator, Depends(coordinator)]
Operating = Annotated[Operations, Depends(operations)]
"""Every operator operation (herder.services.operations): the routes' one way to them."""
Board = Annotated[AssignmentBoard, Depends(board)]


# -- authentication -------------------------------------------------------------------------


async def caller_of(request: Request, authorization: str | None) -> Caller | None:
    """The caller a bearer token stands for; None when no token was sent."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Refused(401, "use 'Authorization: Bearer <token>'")
    return await token_caller(request, token)


class Throttled(Exception):
    """429: this client failed too many token checks; try again after `seconds`."""

    def __init__(self, seconds: int) -> None:
        super().__init__(f"too many failed token checks from this address; retry in "
                         f"{seconds}s")
        self.seconds = seconds


def client_address(request: Request) -> str:
    """The caller's address (behind a trusted proxy, the one it forwarded: uvicorn's
    proxy headers)."""
    return request.client.host if request.client else "-"


async def token_caller(request: Request, token: str) -> Caller:
    """Who a token stands for, however it came (a bearer header, the dashboard's sign-in);
    Refused (401) for one that is unknown or revoked, Throttled (429) once this client
    failed too often (refused before any store lookup)."""
    failures: FailureLimiter = request.app.state.failures
    address = client_address(request)
    key = token_hash(token)
    wait = failures.wait(address, key)  # a token that checked out lately is let through
    if wait is not None:
        raise Throttled(wait)
    try:
        if not plausible_token(token):
            raise Refused(401, "unknown token")
        access: Access = request.app.state.access
        if access.legacy_admin_token and same_secret(token, access.legacy_admin_token):
            caller = LEGACY_ADMIN
        else:
            caller = identify(await call(operations(request).token, key))
    except Refused as refused:
        if refused.status == 401:
            failures.failed(address, key)
        raise
    failures.verified(key)
    return caller


async def session_caller(request: Request) -> Caller | None:
    """The caller a dashboard session cookie stands for (None without one); a state change
    made with it must pass the CSRF check (herder.api.sessions)."""
    book: SessionBook | None = getattr(request.app.state, "sessions", None)
    cookie = request.cookies.get(session_cookie(request)[0])
    session = None if book is None or not cookie else await call(book.get, cookie)
    if session is None:
        return None
    refusal = csrf_refusal(session, request.method, request.headers.get(CSRF_HEADER),
                           request.headers.get("origin"), request.headers.get("host"))
    if refusal is not None:
        raise Refused(403, refusal)
    request.state.session = session
    return await session_identity(request, session)


def session_cookie(request: Request) -> tuple[str, bool]:
    """(name, secure) of the session cookie for this request: Secure and `__Host-` when it
    came over TLS, directly, through a trusted proxy that said so (X-Forwarded-Proto, which
    uvicorn honours from --forwarded-allow-ips) or as [server] public_url says."""
    access: Access = request.app.state.access
    secure = request.url.scheme == "https" or access.secure_cookie
    return cookie_name(secure), secure


async def session_identity(request: Request, session: Session) -> Caller:
    """Who a session's token is now: a token revoked since sign-in is refused (401)."""
    if session.key.startswith(LEGACY):
        access: Access = request.app.state.access
        if access.legacy_admin_token and same_secret(
                session.key, legacy_key(session.id, access.legacy_admin_token)):
            return LEGACY_ADMIN
        raise Refused(401, "unknown token")
    if session.key.startswith(LINK):
        codes: CodeBook | None = getattr(request.app.state, "sign_in_codes", None)
        if codes is not None and same_secret(session.key, link_key(session.id, codes.secret)):
            return LINK_CALLER
        raise Refused(401, "the sign-in link's session ended with the process that served it")
    return identify(await call(operations(request).token, session.key))


def operator(scope: Scope) -> Any:
    """An operator route needing `scope` (admin > submit > read): a bearer token, or the
    dashboard's session cookie."""

    async def dependency(request: Request,
                         authorization: Annotated[str | None, Header()] = None) -> Caller:
        caller = await caller_of(request, authorization)
        if caller is None:
            caller = await session_caller(request)
        if caller is None:
            if not request.app.state.access.open_access:
                raise Refused(401, f"a {scope} token is required "
                                  "(Authorization: Bearer <token>)")
            caller = ANONYMOUS_ADMIN
        authorize(caller, scope)
        return caller

    dependency.herder_scope = scope  # type: ignore[attr-defined]
    return Depends(dependency)


async def agent_host(request: Request, label: Annotated[str, Path(max_length=200)],
                     authorization: Annotated[str | None, Header()] = None) -> str:
    """The token must be an agent token of the host named in the path: 403 otherwise."""
    caller = await caller_of(request, authorization)
    if caller is None:
        raise Refused(401, "an agent token is required (Authorization: Bearer <token>)")
    authorize(caller, Scope.AGENT, label)
    return label


agent_host.herder_scope = Scope.AGENT  # type: ignore[attr-defined]


async def public() -> None:
    """No token needed (liveness probes)."""


public.herder_scope = None  # type: ignore[attr-defined]

async def signed() -> None:
    """No token (a forge cannot send one): the body's signature authenticates a webhook
    (herder.core.webhooks.verify, in the route)."""


signed.herder_scope = None  # type: ignore[attr-defined]

Reader = Annotated[Caller, operator(Scope.READ)]
Submitter = Annotated[Caller, operator(Scope.SUBMIT)]
Admin = Annotated[Caller, operator(Scope.ADMIN)]
AgentHost = Annotated[str, Depends(agent_host)]


def route_scope(route: APIRoute) -> tuple[bool, Scope | None]:
    """(declared, scope) of a route: every route must declare one, None meaning public."""
    pending = list(route.dependant.dependencies)
    while pending:
        dependency = pending.pop()
        function = dependency.call
        if function is not None and hasattr(function, "herder_scope"):
            return True, function.herder_scope
        pending.extend(dependency.dependencies)
    return False, None


def check_worker(label: str, worker: str) -> str:
    """A worker id of the host in the path (`label/pid/start`): 422 otherwise."""
    parsed = WorkerId.parse(worker)
    if parsed is None or parsed.host != label:
        raise HTTPException(422, f"worker {worker!r} is not a worker of host {label!r}")
    return worker
