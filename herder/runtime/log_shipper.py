"""The agent's attempt logs, streamed to the server apart from results: best effort, bounded."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from herder.core.backoff import Backoff
from herder.core.model import AttemptToken
from herder.runtime.agent_client import LOG_CHUNK, Reply, ServerClient, Verdict, retry_delay

log = logging.getLogger("herder.agent")


FINAL_LOG_WAIT = 10.0
"""How long a finish waits for its attempt's last log chunks (it goes at once if they fail)."""
LOG_BACKLOG = 16 * 1024 * 1024
"""Unsent log bytes kept per attempt; older ones are skipped, with a marker in the log."""
LOG_ROUND = 4 * LOG_CHUNK
"""Bytes one attempt may ship before the others get their turn."""
LOG_GIVE_UP = 600.0
"""An ended attempt's log stops being retried after failing this long (logs are best effort)."""


def drop_marker(count: int) -> bytes:
    return f"\n# herder: {count} bytes of log dropped\n".encode()


def backlog_skip(offset: int, size: int, limit: int) -> int:
    """Bytes to skip so that at most `limit` unsent bytes (the newest) remain."""
    return max(0, size - offset - limit)


@dataclass
class _Shipping:
    """Where one attempt's log stands: `offset` in the local file (sent or skipped), `sent`
    on the server (log plus drop markers)."""

    path: Path
    backoff: Backoff
    offset: int = 0
    sent: int = 0
    dropped: int = 0
    final: bool = False
    due: float = 0.0
    failing_since: float | None = None


class LogShipper:
    """Streams attempt logs to the server, apart from results: best effort, bounded.

    The local log keeps everything; what waits to be sent is capped at `backlog` bytes per
    attempt (the oldest are skipped, with a marker line). A failing upload is retried with
    backoff and never holds a result back: a finish waits for its log only while the last
    chunks are going through (`holding`)."""

    def __init__(self, client: ServerClient, backlog: int = LOG_BACKLOG,
                 chunk: int = LOG_CHUNK, interval: float = 1.0,
                 on_settled: Callable[[], None] = lambda: None) -> None:
        self.client = client
        self.backlog = backlog
        self.chunk = chunk
        self.interval = interval
        self.on_settled = on_settled
        self._attempts: dict[AttemptToken, _Shipping] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()

    def add(self, token: AttemptToken, path: Path, offset: int = 0) -> None:
        """Ship `path` from `offset`, where the server's copy ends (an adopted attempt's
        log resumes there; bytes dropped by a predecessor's backlog are not known here, so
        at most the local file's size is taken as sent)."""
        with self._lock:
            try:
                local = os.stat(path).st_size
            except OSError:
                local = 0
            self._attempts[token] = _Shipping(path, self.client.backoff(),
                                              offset=min(offset, local), sent=offset)

    def finish(self, token: AttemptToken) -> None:
        """The attempt ended: ship the rest now, then forget it."""
        with self._lock:
            shipping = self._attempts.get(token)
            if shipping is not None:
                shipping.final = True
                shipping.due = 0.0
        self._wake.set()

    def holding(self, token: AttemptToken) -> bool:
        """The attempt's last chunks are on their way and none has failed yet."""
        with self._lock:
            shipping = self._attempts.get(token)
            return (shipping is not None and shipping.final
                    and shipping.failing_since is None)

    def unsettled(self) -> int:
        """Ended attempts whose log is not shipped yet."""
        with self._lock:
            return sum(1 for shipping in self._attempts.values() if shipping.final)

    def run(self, stop: threading.Event) -> None:
        trouble = self.client.backoff()
        more = False
        while not stop.is_set():
            try:
                if not more:
                    self._wake.wait(self._next_wait())
                    self._wake.clear()
                if stop.is_set():
                    return
                more = self.ship_round(time.monotonic())
                trouble.reset()
            except Exception:
                log.exception("log shipping failed; continuing")
                more = False
                stop.wait(trouble.next())

    def _next_wait(self) -> float:
        with self._lock:
            dues = [shipping.due for shipping in self._attempts.values()
                    if shipping.final or shipping.failing_since is not None]
        soonest = min(dues, default=math.inf) - time.monotonic()
        return max(0.0, min(self.interval, soonest))

    def ship_round(self, now: float) -> bool:
        """Ship what each due attempt has; True when some attempt has more right away."""
        with self._lock:
            due = [(token, shipping) for token, shipping in self._attempts.items()
                   if shipping.due <= now]
        more = False
        settled = False
        for token, shipping in due:
            outcome = self._ship(token, shipping)
            if outcome == "more":
                more = True
            elif outcome == "settled":
                with self._lock:
                    self._attempts.pop(token, None)
                settled = True
        if settled:
            self.on_settled()
        return more

    def _ship(self, token: AttemptToken, shipping: _Shipping) -> str:
        """Up to LOG_ROUND bytes of one attempt: "more", "idle", or "settled" (forget it)."""
        shipped = 0
        while shipped < LOG_ROUND:
            try:
                size = os.stat(shipping.path).st_size
                skip = backlog_skip(shipping.offset, size, self.backlog)
                if skip:
                    shipping.offset += skip
                    shipping.dropped += skip
                marker = drop_marker(shipping.dropped) if shipping.dropped else b""
                with open(shipping.path, "rb") as handle:
                    handle.seek(shipping.offset)
                    data = handle.read(max(1, self.chunk - len(marker)))
            except OSError as exc:
                log.warning("attempt %s: cannot read its log (%s); not shipping it", token, exc)
                return "settled"
            if not data and not marker:
                return "settled" if shipping.final else "idle"
            reply = self.client.request(
                "POST", self.client.agent_path(f"/attempts/{token.job_id}/{token.attempt}/log"),
                content=marker + data, params={"offset": shipping.sent})
            if reply.verdict is Verdict.OK:
                shipping.sent += len(marker) + len(data)
                shipping.offset += len(data)
                shipping.dropped = 0
                shipping.failing_since = None
                shipping.backoff.reset()
                shipped += len(data)
                continue
            return self._failed(token, shipping, reply)
        return "more"

    def _failed(self, token: AttemptToken, shipping: _Shipping, reply: Reply) -> str:
        if reply.verdict is Verdict.GONE:
            log.warning("attempt %s: log not shipped, the attempt is no longer live here (%s)",
                        token, reply.problem)
            return "settled"
        if reply.status == 413:
            log.warning("attempt %s: the rest of its log is not shipped, it passed the "
                        "server's max_log_bytes (%s)", token, reply.problem)
            return "settled"
        if reply.verdict is Verdict.REFUSED:
            log.error("attempt %s: log not shipped, the server refused it (%s); this is a bug "
                      "in herder, please report it", token, reply.problem)
            return "settled"
        if reply.verdict is Verdict.UNAUTHORIZED:
            self.client.token_refused(reply)
        now = time.monotonic()
        first = shipping.failing_since is None
        if shipping.failing_since is None:
            shipping.failing_since = now
        if shipping.final and now - shipping.failing_since >= LOG_GIVE_UP:
            log.warning("attempt %s: giving up on the rest of its log after %.0fs (%s)",
                        token, now - shipping.failing_since, reply.problem)
            return "settled"
        shipping.due = now + retry_delay(shipping.backoff, reply)
        log.debug("attempt %s: log chunk not shipped (%s)", token, reply.problem)
        if first and shipping.final:
            self.on_settled()  # the finish stops waiting for this log
        return "idle"
