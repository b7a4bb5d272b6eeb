"""The agent's result reports: one lane per attempt, sent in order by a few threads, retried
until the server answers; a report the server keeps refusing for one attempt never delays
another's."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from herder.core.backoff import Backoff
from herder.core.model import AttemptToken
from herder.runtime.agent_client import (
    Reply,
    ServerClient,
    Verdict,
    retry_delay,
    sleep_unless_stopped,
)

log = logging.getLogger("herder.agent")


REPORT_SENDERS = 4
"""Threads that send result reports: a request hanging for one attempt leaves three for the
others."""


class Report(msgspec.Struct, frozen=True):
    """A result (`start` or `finish`) of one attempt, queued at `queued` (monotonic)."""

    token: AttemptToken
    kind: str
    body: dict[str, Any]
    queued: float


@dataclass
class _Lane:
    """One attempt's reports, sent in order. A retry is a due time, not a sleeping thread."""

    backoff: Backoff
    reports: deque[Report] = field(default_factory=deque)
    due: float = 0.0
    busy: bool = False


class Outbox:
    """Results, one lane per attempt, sent by a few threads that take whichever lane is due:
    a report that the server keeps refusing for attempt A never delays attempt B's."""

    def __init__(self, client: ServerClient, hold: Callable[[Report], float],
                 senders: int = REPORT_SENDERS,
                 gone: Callable[[AttemptToken], None] = lambda _token: None) -> None:
        self.client = client
        self.hold = hold
        self.senders = senders
        self.gone = gone
        """Told of an attempt the server says is no longer live (409/410 on a report)."""
        self._lanes: dict[AttemptToken, _Lane] = {}
        self._changed = threading.Condition()
        self._stopping = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.senders):
            thread = threading.Thread(target=self._sender, name=f"herder-agent-outbox-{number}",
                                      daemon=True)
            thread.start()
            self._threads.append(thread)

    def put(self, token: AttemptToken, kind: str, body: dict[str, Any]) -> None:
        with self._changed:
            lane = self._lanes.get(token)
            if lane is None:
                lane = self._lanes[token] = _Lane(self.client.backoff())
            lane.reports.append(Report(token, kind, body, time.monotonic()))
            self._changed.notify_all()

    def wake(self) -> None:
        """Something `hold` depends on changed."""
        with self._changed:
            self._changed.notify_all()

    def pending(self, token: AttemptToken, kind: str) -> bool:
        """A report of `kind` for `token` is queued or on its way (not answered yet)."""
        with self._changed:
            lane = self._lanes.get(token)
            return lane is not None and any(r.kind == kind for r in lane.reports)

    def flush(self, deadline: float) -> list[Report]:
        """Wait until every report was answered or `deadline` (monotonic) passed; what is
        left."""
        with self._changed:
            while self._threads and self._lanes and time.monotonic() < deadline:
                self._changed.wait(min(1.0, deadline - time.monotonic()))
            return [report for lane in self._lanes.values() for report in lane.reports]

    def stop(self, wait: float = 1.0) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join(wait)

    def _next(self) -> Report | None:
        """The oldest lane's head that is due and not being sent; None once stopping."""
        with self._changed:
            while not self._stopping:
                now = time.monotonic()
                wake_at = math.inf
                for lane in self._lanes.values():
                    if lane.busy:
                        continue
                    at = max(lane.due, self.hold(lane.reports[0]))
                    if at <= now:
                        lane.busy = True
                        return lane.reports[0]
                    wake_at = min(wake_at, at)
                self._changed.wait(None if wake_at == math.inf else wake_at - now)
            return None

    def _sender(self) -> None:
        trouble = self.client.backoff()
        while True:
            try:
                report = self._next()
                if report is None:
                    return
                try:
                    reply = self._send(report)
                except Exception as exc:
                    log.exception("attempt %s: sending %s failed", report.token, report.kind)
                    reply = Reply(Verdict.RETRY, None, None, f"{type(exc).__name__}: {exc}")
                self._settle(report, reply)
                trouble.reset()
            except Exception:
                # A bug here must not silence this agent's results for good.
                log.exception("outbox sender failed; continuing")
                sleep_unless_stopped(trouble.next(), None)

    def _send(self, report: Report) -> Reply:
        token = report.token
        return self.client.request(
            "POST", self.client.agent_path(f"/attempts/{token.job_id}/{token.attempt}/"
                                           f"{report.kind}"), json=report.body)

    def _settle(self, report: Report, reply: Reply) -> None:
        token, kind = report.token, report.kind
        retry_in: float | None = None
        with self._changed:
            lane = self._lanes[token]
            lane.busy = False
            if reply.verdict in (Verdict.RETRY, Verdict.UNAUTHORIZED):
                retry_in = retry_delay(lane.backoff, reply)
                lane.due = time.monotonic() + retry_in
            else:
                lane.reports.popleft()
                lane.backoff.reset()
                lane.due = 0.0
                if not lane.reports:
                    del self._lanes[token]
            self._changed.notify_all()
        if reply.verdict is Verdict.OK:
            body = reply.body if isinstance(reply.body, dict) else {}
            if kind == "finish":
                log.info("attempt %s reported: %s", token, body.get("status"))
        elif reply.verdict is Verdict.GONE:
            log.warning("attempt %s: %s dropped, the attempt is no longer live here (%s)",
                        token, kind, reply.problem)
            self.gone(token)
        elif reply.verdict is Verdict.REFUSED:
            log.error("attempt %s: %s dropped, the server refused it (%s); this is a bug in "
                      "herder, please report it", token, kind, reply.problem)
        elif reply.verdict is Verdict.UNAUTHORIZED:
            self.client.token_refused(reply)
        else:
            log.warning("attempt %s: %s not delivered (%s); retrying in %.1fs", token, kind,
                        reply.problem, retry_in)
