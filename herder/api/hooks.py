"""Forge webhooks: `POST /hooks/{source}`. No token (a forge cannot send one): the body's
HMAC signature under the source's secret authenticates it. The route only validates and
enqueues (one transaction); it never waits for the work. Logged: source, event, delivery
id and outcome; never the secret, the signature or the body."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import JSONResponse

from herder.api.body import declared_over, read_within
from herder.api.depends import Access, Operating, call, signed
from herder.core.errors import InputError, Refused
from herder.core.webhooks import PING, Delivery, match, parse_body, verify
from herder.wire.hooks import HookReply

log = logging.getLogger("herder.hooks")
router = APIRouter(prefix="/hooks", tags=["webhooks"])
HOOK_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"type": "object"}}}}}
Source = Annotated[str, Path(max_length=64)]


@router.post("/{source}", status_code=202, response_model=HookReply,
             dependencies=[Depends(signed)], openapi_extra=HOOK_BODY,
             responses={200: {"model": HookReply}})
async def receive(source: Source, request: Request, response: Response,
                  operations: Operating) -> HookReply | JSONResponse:
    """A signed delivery: 202 enqueued or ignored, 200 duplicate or pong; 404 unknown
    source, 401 bad signature, 413 too large, 400 malformed, 422 a rule cannot fill it."""
    access: Access = request.app.state.access
    section = operations.config.settings.hooks.sources.get(source)
    secret = access.hook_secrets.get(source)
    delivery: Delivery | None = None
    try:
        if section is None or secret is None:
            raise Refused(404, f"no webhook source {source!r} (see [hooks.sources] in "
                               "herder.toml)")
        body = await _read(request, operations.config.settings.hooks.max_body_bytes)
        delivery = verify(section.kind, secret, request.headers, body)
        if delivery.event == PING:
            log.info("hook %r: ping %s", source, delivery.delivery_id)
            response.status_code = 200
            return HookReply(outcome="pong", delivery=delivery.delivery_id)
        event = parse_body(body, request.headers.get("content-type"))
        requests = match(section.rules, delivery.event, event)
    except Refused as refused:
        log.info("hook %r: %s %s refused (%d): %s", source,
                 delivery.event if delivery else "-", delivery.delivery_id if delivery else "-",
                 refused.status, refused.reason)
        return JSONResponse({"detail": refused.reason}, status_code=refused.status)
    if not requests:
        log.info("hook %r: %s %s ignored (no rule matches)", source, delivery.event,
                 delivery.delivery_id)
        return HookReply(outcome="ignored", delivery=delivery.delivery_id)
    try:
        record = await call(operations.receive_delivery, source, delivery, requests)
    except InputError as exc:  # a rule's job the job type refuses: 422, as a submit's
        log.info("hook %r: %s %s refused (422): %s", source, delivery.event,
                 delivery.delivery_id, exc)
        raise
    reply = HookReply(outcome="enqueued" if record.first else "duplicate",
                      delivery=delivery.delivery_id, jobs=list(record.job_ids),
                      created=list(record.created))
    log.info("hook %r: %s %s %s: jobs %s", source, delivery.event, delivery.delivery_id,
             reply.outcome, reply.jobs)
    if not record.first:
        response.status_code = 200
    return reply


async def _read(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` (never buffered past it)."""
    body = None
    if not declared_over(request.headers.get("content-length"), limit):
        body = await read_within(request.stream(), limit)
    if body is None:
        raise Refused(413, f"the body is over {limit} bytes")
    return body
