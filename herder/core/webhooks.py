"""Forge webhooks, pure: is a delivery signed by its source, what does its body say, and
which jobs do the source's rules make of it. No I/O here: the API route
(`herder.api.hooks`) reads the request, the coordinator records the delivery and its jobs.

A rule's templates read dotted paths of the event (`{repository.full_name}#{issue.number}`);
a rule that matches an event lacking a path its templates read refuses the delivery (422,
nothing enqueued, nothing recorded) instead of enqueuing a job with a hole in it."""

from __future__ import annotations

import hmac
import json
import re
import string
import time
from collections.abc import Mapping, Sequence
from hashlib import sha256
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import msgspec

from herder.core.errors import Refused
from herder.core.submission import SubmitRequest

if TYPE_CHECKING:
    from herder.core.settings.hooks import HookRuleSection

PING = "ping"
DELIVERY_ID_LENGTH = 200
EVENT_LENGTH = 100
_FORMATTER = string.Formatter()
_TOKEN = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no space: ids and event names


class Scheme(msgspec.Struct, frozen=True):
    """Where a kind of source puts its signature, event name and delivery id."""

    signatures: tuple[tuple[str, str], ...]
    """(header, prefix) pairs, tried in order: the first header present is checked."""
    event: str
    delivery: str
    timestamp: str | None = None
    """herder's own scheme: the header of the send time (Unix seconds), signed with the
    delivery id and the event before the body (`signed_text`), so a captured delivery
    cannot be sent again as new: outside `REPLAY_WINDOW` it is refused, within it the
    delivery id is a duplicate. A forge's scheme signs the body alone; its replays are
    duplicates while the store remembers the delivery id ([hooks] retention)."""


SCHEMES: Mapping[str, Scheme] = {
    "github": Scheme((("x-hub-signature-256", "sha256="),), "x-github-event",
                     "x-github-delivery"),
    # Gitea sends its own header and, since 1.17, GitHub's too.
    "gitea": Scheme((("x-gitea-signature", ""), ("x-hub-signature-256", "sha256=")),
                    "x-gitea-event", "x-gitea-delivery"),
    "generic": Scheme((("x-herder-signature", "sha256="),), "x-herder-event",
                      "x-herder-delivery", "x-herder-timestamp"),
}
REPLAY_WINDOW = 300.0
"""Seconds a generic delivery's timestamp may be off this server's clock, either way."""
KINDS = tuple(SCHEMES)


class Delivery(msgspec.Struct, frozen=True):
    """A delivery whose signature checked out: its event name and id."""

    event: str
    delivery_id: str


def signature(secret: bytes, body: bytes) -> str:
    """The hex HMAC-SHA256 of the body, as every kind of source signs it."""
    return hmac.new(secret, body, sha256).hexdigest()


def signed_text(timestamp: str, delivery: str, event: str, body: bytes) -> bytes:
    """What a generic delivery's signature covers: `{timestamp}.{delivery}.{event}.{body}`
    (as Stripe and Svix sign a timestamp and an id with the body)."""
    return f"{timestamp}.{delivery}.{event}.".encode() + body


def verify(kind: str, secret: bytes, headers: Mapping[str, str], body: bytes,
           now: float | None = None) -> Delivery:
    """The delivery's event and id once its signature is the HMAC under `secret` of the
    body (of `signed_text` for the generic kind, whose timestamp must be within
    `REPLAY_WINDOW` of `now`, Unix seconds), compared in constant time. Refused 401 for a
    missing or wrong signature or a stale timestamp, 400 for a missing or unusable event,
    delivery or timestamp header."""
    if not secret:
        raise Refused(401, "this source has no secret")  # fails closed, never unsigned
    scheme = SCHEMES[kind]
    lowered = {name.lower(): value for name, value in headers.items()}
    sent = next(((lowered[name], prefix) for name, prefix in scheme.signatures
                 if name in lowered), None)
    if sent is None:
        names = " or ".join(name for name, _ in scheme.signatures)
        raise Refused(401, f"no signature: send {names}")
    value, prefix = sent
    digest = value.strip()[len(prefix):] if value.strip().startswith(prefix) else ""
    delivery = Delivery(_token(lowered, scheme.event, EVENT_LENGTH),
                        _token(lowered, scheme.delivery, DELIVERY_ID_LENGTH))
    signed = body
    if scheme.timestamp is not None:
        if "." in delivery.delivery_id:
            # The timestamp is digits and the body comes last; an id without a dot makes
            # the split of timestamp.delivery.event.body unique (else a body signed for id
            # 123, event issue.opened would verify as id 123.issue, event opened).
            raise Refused(400, f"the {scheme.delivery} header may not contain '.' (it "
                          "separates the signed fields): use letters, digits, - or _")
        stamp = _timestamp(lowered, scheme.timestamp)
        signed = signed_text(stamp, delivery.delivery_id, delivery.event, body)
    expected = signature(secret, signed).encode()
    if not hmac.compare_digest(digest.lower().encode("utf-8", "replace"), expected):
        raise Refused(401, "the signature does not match the body" if scheme.timestamp is None
                      else "the signature does not match timestamp.delivery.event.body")
    if scheme.timestamp is not None:
        skew = int(stamp) - (time.time() if now is None else now)
        if abs(skew) > REPLAY_WINDOW:
            raise Refused(401, f"the {scheme.timestamp} header is {abs(skew):.0f}s "
                          f"{'ahead of' if skew > 0 else 'behind'} this server's clock "
                          f"(at most {REPLAY_WINDOW:.0f}s): a replay, or a clock to set")
    return delivery


def _timestamp(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise Refused(400, f"the {name} header is missing (the Unix time of sending)")
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        raise Refused(400, f"the {name} header is not the Unix time in seconds")
    return value


def _token(headers: Mapping[str, str], name: str, limit: int) -> str:
    value = headers.get(name, "").strip()
    if not value:
        raise Refused(400, f"the {name} header is missing")
    if len(value) > limit or not _TOKEN.match(value):
        raise Refused(400, f"the {name} header is not up to {limit} printable characters")
    return value


def parse_body(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The event as a JSON object: the body itself, or the `payload` field of a form
    (GitHub's default content type). Refused 400 otherwise."""
    text: str | bytes = body
    if (content_type or "").split(";")[0].strip().lower() == "application/x-www-form-urlencoded":
        try:
            fields = parse_qs(body.decode("utf-8"), strict_parsing=True)
        except (UnicodeDecodeError, ValueError):
            raise Refused(400, "the form body is malformed") from None
        if len(fields.get("payload", ())) != 1:
            raise Refused(400, "the form body has no single payload field")
        text = fields["payload"][0]
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise Refused(400, "the body is not JSON") from None
    if not isinstance(value, dict):
        raise Refused(400, "the body is not a JSON object")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# -- rules -------------------------------------------------------------------------------------


class Missing(Exception):
    """A path the event does not have."""


def lookup(event: Any, path: str) -> Any:
    """The value at a dotted path (`issue.labels.0.name`: a number indexes a list)."""
    value = event
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise Missing(path)
    return value


def render(template: str, event: Mapping[str, Any], where: str) -> Any:
    """A template filled from the event. A template that is one placeholder alone keeps the
    value's JSON type (`{issue.number}` is 42, not "42"); otherwise text. Refused 422 when
    the event lacks a path."""
    parts: list[str] = []
    parsed = list(_FORMATTER.parse(template))
    for literal, name, _spec, _conversion in parsed:
        parts.append(literal)
        if name is None:
            continue
        try:
            value = lookup(event, name)
        except Missing:
            raise Refused(422, f"{where}: the event has no {name}") from None
        if len(parsed) == 1 and not literal:
            return value
        parts.append(value if isinstance(value, str) else json.dumps(value))
    return "".join(parts)


def labels(event: Mapping[str, Any]) -> set[str]:
    """The label a `labeled` event adds (GitHub's `label`); else the labels its issue or
    pull request carries (Gitea's `label_updated` names no single label)."""
    label = event.get("label")
    if isinstance(label, dict) and isinstance(label.get("name"), str):
        return {label["name"]}
    for key in ("issue", "pull_request"):
        item = event.get(key)
        if isinstance(item, dict) and isinstance(item.get("labels"), list):
            return {entry["name"] for entry in item["labels"]
                    if isinstance(entry, dict) and isinstance(entry.get("name"), str)}
    return set()


def matches(rule: HookRuleSection, event_name: str, event: Mapping[str, Any]) -> bool:
    if rule.event != event_name:
        return False
    if rule.action is not None and event.get("action") != rule.action:
        return False
    if rule.label is not None and rule.label not in labels(event):
        return False
    for path, wanted in rule.when.items():
        try:
            value = lookup(event, path)
        except Missing:
            return False
        if (value if isinstance(value, str) else json.dumps(value)) != wanted:
            return False
    return True


def match(rules: Sequence[HookRuleSection], event_name: str,
          event: Mapping[str, Any]) -> list[SubmitRequest]:
    """The submits the matching rules make of an event, in rule order; Refused 422 when a
    matching rule reads a path the event lacks."""
    requests = []
    for index, rule in enumerate(rules):
        if not matches(rule, event_name, event):
            continue
        where = f"rules.{index}"
        dedup_key = None
        if rule.dedup_key is not None:
            key = render(rule.dedup_key, event, f"{where}.dedup_key")
            dedup_key = key if isinstance(key, str) else json.dumps(key)
        requests.append(SubmitRequest(
            job_type=rule.job_type, dedup_key=dedup_key, priority=rule.priority,
            weight=rule.weight,
            payload={name: render(template, event, f"{where}.payload.{name}")
                     for name, template in rule.payload.items()}))
    return requests
