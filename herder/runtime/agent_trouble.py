"""An agent's own trouble with its server (it does not answer, or it refuses the token) as
an alert, though the server is the one that sends alerts and is the very thing out of reach.

Every call the agent makes is observed (`ServerClient.observer`); the pure rules in
`herder.core.scheduling.alerting` (`track_trouble`, `trouble_due`) say when a stretch of failures
is worth an alert. While it lasts, the agent's own `[alerts] urls` (in its herder.toml, if
any) are given it directly; once the server answers and takes the token again, the agent
reports what happened (`POST /api/v1/agent/{label}/trouble`) and the server raises it (or
only records it, when the agent's own URLs sent it). The stretch and the unsent reports are
kept in a small file in the agent's log folder, so a restart (the usual cure of a refused
token: a new one) does not forget them. Nothing secret is in them: the token never is, only
the server's answer or the network error.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from herder.core.scheduling.alerting import (
    TOKEN_REFUSED,
    UNREACHABLE,
    Notice,
    NoticeKind,
    Trouble,
    track_trouble,
    trouble_due,
)
from herder.runtime.agent_client import Reply, ServerError, Verdict
from herder.runtime.delivery import Delivery

log = logging.getLogger("herder.agent")

STATE_FILE = ".agent-trouble.json"
PROBLEM_CHARS = 300
INTERVAL = 1.0


class Ended(msgspec.Struct, frozen=True):
    """A stretch of trouble that is over, waiting to be told to the server."""

    trouble: Trouble
    until: datetime


class Saved(msgspec.Struct):
    trouble: Trouble | None = None
    ended: list[Ended] = msgspec.field(default_factory=list)


Send = Callable[[Trouble, datetime, bool], None]
"""Tells the server of an ended trouble (and whether the agent's own URLs sent it); raises
ServerError when the server did not take it."""


def failure_of(reply: Reply) -> str | None:
    """What kind of trouble a reply is; None when the server answered and took the token
    (a 4xx about the request itself is the request's problem, not the agent's)."""
    if reply.verdict is Verdict.UNAUTHORIZED:
        return TOKEN_REFUSED
    if reply.verdict is Verdict.RETRY:
        return UNREACHABLE
    return None


class TroubleWatch:
    def __init__(self, label: str, hold_seconds: float, folder: Path | None = None,
                 delivery: Delivery | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.label = label
        self.hold_seconds = hold_seconds
        self.path = None if folder is None else folder / STATE_FILE
        self.delivery = delivery
        """The agent's own alert URLs; None when its herder.toml names none."""
        self.clock = clock
        self._lock = threading.Lock()
        saved = self._load()
        self.trouble = saved.trouble
        self.ended = saved.ended

    # -- observing calls (any thread) ---------------------------------------------------------

    def observe(self, reply: Reply) -> None:
        failure = failure_of(reply)
        now = self.clock()
        with self._lock:
            before = self.trouble
            if before is None and failure is None:
                return
            after = track_trouble(before, failure, reply.problem[:PROBLEM_CHARS], now)
            self.trouble = after
            if before is not None and after is None:
                self._over(before, now)
            if before is None or after is None:
                self._save()

    def _over(self, trouble: Trouble, now: datetime) -> None:
        """Under the lock: the server answers again."""
        if not trouble_due(trouble, now, self.hold_seconds):
            return  # a blip: not worth anyone's attention
        log.warning("the server answers again: %s since %s", trouble.kind,
                    trouble.since.isoformat())
        self.ended.append(Ended(trouble, now))
        if trouble.raised and self.delivery is not None:
            self.delivery.submit(Notice(0, trouble.key(self.label), NoticeKind.RESOLVED,
                                        trouble.describe(self.label), trouble.since, now))

    # -- the loop --------------------------------------------------------------------------------

    def run_once(self, now: datetime, send: Send) -> dict[str, int]:
        """Raise a due trouble through the agent's own URLs; tell the server of the ended
        ones (oldest first; one it does not take waits for the next pass)."""
        counts = {"raised": 0, "reported": 0}
        with self._lock:
            trouble = self.trouble
            if (trouble is not None and not trouble.raised and self.delivery is not None
                    and trouble_due(trouble, now, self.hold_seconds)):
                self.trouble = msgspec.structs.replace(trouble, raised=True)
                self.delivery.submit(Notice(0, trouble.key(self.label), NoticeKind.OPENED,
                                            trouble.describe(self.label), trouble.since))
                log.error("ALERT (sent by this agent): %s", trouble.describe(self.label))
                counts["raised"] += 1
                self._save()
            ended = list(self.ended)
        for item in ended:
            try:
                send(item.trouble, item.until, item.trouble.raised)
            except ServerError as exc:
                log.warning("could not tell the server of the %s since %s yet (%s)",
                            item.trouble.kind, item.trouble.since.isoformat(), exc)
                break
            with self._lock:
                with contextlib.suppress(ValueError):
                    self.ended.remove(item)
                self._save()
            counts["reported"] += 1
        return counts

    def start(self, send: Send, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            while not stop.wait(INTERVAL):
                try:
                    self.run_once(self.clock(), send)
                except Exception:  # the watch must outlive a bug in one pass
                    log.exception("agent trouble watch failed")

        if self.delivery is not None:
            self.delivery.start()
        thread = threading.Thread(target=loop, name="herder-agent-trouble", daemon=True)
        thread.start()
        return thread

    # -- the file ------------------------------------------------------------------------------

    def _load(self) -> Saved:
        if self.path is None:
            return Saved()
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=Saved)
        except FileNotFoundError:
            return Saved()
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("%s is unreadable (%s); starting afresh", self.path, exc)
            return Saved()

    def _save(self) -> None:
        """Under the lock. Written whole and renamed, so a crash leaves the old or the new."""
        if self.path is None:
            return
        data = msgspec.json.encode(Saved(self.trouble, list(self.ended)))
        partial = self.path.with_suffix(".tmp")
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(partial, self.path)
        except OSError as exc:
            log.warning("cannot keep the agent's trouble in %s (%s)", self.path, exc)


def trouble_body(trouble: Trouble, until: datetime, delivered: bool) -> dict[str, Any]:
    """The report's JSON body (`herder.wire.agents.TroubleBody`)."""
    body: dict[str, Any] = json.loads(msgspec.json.encode({
        "kind": trouble.kind, "since": trouble.since, "until": until,
        "problem": trouble.problem[:PROBLEM_CHARS], "delivered": delivered}))
    return body
