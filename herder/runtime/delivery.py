"""Alerts, delivered: a leader-only service that reads `herder_alerts` and sends what
`herder.scheduling.alerting` says is due, through Apprise, from a queue of its own.

Why a service that diffs the store rather than a hook on `alert_open`: alerts are opened by
the scheduler, by whoever records an attempt's end (the server, `herder up`, any runner on
the store) and by the account probes; the store is the one place they all meet. Marking a
row sent is a conditional update, so a restart, a new leader or two `herder up` processes
never send one twice, and an alert opened while no one was delivering is sent on start.

Delivery never blocks its caller: `Delivery.submit` appends to a bounded queue (the oldest
message is dropped when it is full, logged and counted) and one sender thread does the
network I/O, with a timeout and retries per URL. A URL may hold a token: only its scheme is
ever logged.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from herder.backoff import Backoff
from herder.config import AlertsSection
from herder.errors import ConfigError
from herder.hardening import secret_value
from herder.scheduling.alerting import (
    HOUR,
    AlertRules,
    Notice,
    NoticeKind,
    due_notices,
    pending_notices,
    silent_for,
)

if TYPE_CHECKING:
    from herder.store import Store

log = logging.getLogger("herder.alerts")

SCHEDULER_SILENT = "scheduler:silent"
RETRY_CAP = 60.0


def scheme_of(url: str) -> str:
    """What may be logged of a URL: its scheme (the rest may hold a token)."""
    return url.split("://", 1)[0] if "://" in url else "?"


def alert_urls(section: AlertsSection, environ: dict[str, str] | None = None) -> list[str]:
    """The configured URLs: `urls`, then those in the `urls_env` variable."""
    urls = list(section.urls)
    if section.urls_env:
        # secret_value: herder withdraws the variable from its environment at start.
        value = ((secret_value(section.urls_env) if environ is None
                  else environ.get(section.urls_env)) or "")
        urls += [url for url in re.split(r"[\s,]+", value) if url]
    return urls


def check_urls(section: AlertsSection, environ: dict[str, str] | None = None) -> list[str]:
    """The URLs, each one Apprise knows; a ConfigError naming the key otherwise. Checked where
    alerts are sent (server, up), not at every config load: Apprise takes ~150 ms to import."""
    urls = alert_urls(section, environ)
    if not urls:
        return urls
    import apprise

    _quiet_apprise()
    for index, url in enumerate(urls):
        if apprise.Apprise.instantiate(url) is None:
            where = (f"alerts.urls.{index}" if index < len(section.urls)
                     else f"alerts.urls_env ({section.urls_env})")
            raise ConfigError(where, f"Apprise cannot use this {scheme_of(url)}:// URL",
                              "see https://github.com/caronc/apprise/wiki for the URL forms")
    return urls


def _quiet_apprise() -> None:
    """Apprise logs whole URLs (at debug, and an unparseable one at error), and a URL may
    carry a token: its logger is silenced; herder logs each failure itself, scheme only."""
    logging.getLogger("apprise").setLevel(logging.CRITICAL + 1)


@dataclass
class DeliveryCounts:
    sent: int = 0
    failed: int = 0
    """Messages that no URL took after every retry."""
    retried: int = 0
    dropped: int = 0
    """Messages dropped from a full queue (the oldest first)."""


Send = Callable[[str, Notice, float], bool]
"""Sends one notice to one URL with a timeout; True when the endpoint took it."""


def apprise_send(url: str, notice: Notice, timeout: float) -> bool:
    import apprise

    plugin = apprise.Apprise.instantiate(url)
    if plugin is None:
        return False
    plugin.socket_connect_timeout = timeout
    plugin.socket_read_timeout = timeout
    kind = (apprise.NotifyType.FAILURE if notice.kind is NoticeKind.OPENED
            else apprise.NotifyType.SUCCESS)
    return bool(plugin.notify(body=notice.body, title=notice.title, notify_type=kind))


class Delivery:
    """A bounded queue of notices and the one thread that sends them to every URL."""

    def __init__(self, urls: Sequence[str], section: AlertsSection,
                 send: Send = apprise_send) -> None:
        self.urls = list(urls)
        self.section = section
        self.send = send
        self.counts = DeliveryCounts()
        self._queue: collections.deque[Notice] = collections.deque()
        self._ready = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._busy = False

    def start(self) -> Delivery:
        _quiet_apprise()
        self._thread = threading.Thread(target=self._run, name="herder-alert-sender",
                                        daemon=True)
        self._thread.start()
        log.info("alerts go to %d URL(s): %s", len(self.urls),
                 ", ".join(scheme_of(url) for url in self.urls) or "none")
        return self

    def submit(self, notice: Notice) -> None:
        """Queue a notice; never waits. A full queue drops its oldest message."""
        with self._ready:
            if len(self._queue) >= self.section.queue_size:
                dropped = self._queue.popleft()
                self.counts.dropped += 1
                log.error("alert queue full (%d): dropped %s %s", self.section.queue_size,
                          dropped.kind, dropped.key)
            self._queue.append(notice)
            self._ready.notify()

    def waiting(self) -> int:
        with self._ready:
            return len(self._queue)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` for every queued message to be sent (a process about to
        exit); True when none is left."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while self._queue or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._thread is None or not self._thread.is_alive():
                    return False
                self._ready.wait(remaining)
            return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._ready:
                while not self._queue and not self._stop.is_set():
                    self._ready.wait()
                if self._stop.is_set():
                    return
                notice = self._queue.popleft()
                self._busy = True
            try:
                self._deliver(notice)
            except Exception:  # a bug in a plugin must not end the sender
                self.counts.failed += 1
                log.exception("alert %s: delivery failed", notice.key)
            with self._ready:
                self._busy = False
                self._ready.notify_all()

    def _deliver(self, notice: Notice) -> None:
        delivered = False
        for url in self.urls:
            delivered = self._send_with_retries(url, notice) or delivered
        if delivered or not self.urls:
            self.counts.sent += 1
        else:
            self.counts.failed += 1

    def _send_with_retries(self, url: str, notice: Notice) -> bool:
        backoff = Backoff(base=self.section.retry_backoff, cap=RETRY_CAP)
        for attempt in range(self.section.retries + 1):
            if self.send(url, notice, self.section.timeout):
                return True
            if attempt == self.section.retries or self._stop.is_set():
                break
            self.counts.retried += 1
            delay = backoff.next()
            log.warning("alert %s to %s:// failed; retry %d/%d in %.1fs", notice.key,
                        scheme_of(url), attempt + 1, self.section.retries, delay)
            if self._stop.wait(delay):
                break
        log.error("alert %s (%s) could not be sent to %s:// after %d tries", notice.key,
                  notice.kind, scheme_of(url), self.section.retries + 1)
        return False


class AlertService:
    """Leader only: opens or clears the scheduler-silent alert and hands the due notices to
    delivery, marking each row first so that no other process sends it too."""

    def __init__(self, store: Store, delivery: Delivery, section: AlertsSection,
                 silence_key: str = SCHEDULER_SILENT) -> None:
        self.store = store
        self.delivery = delivery
        self.section = section
        self.silence_key = silence_key
        """`scheduler:silent` for the leader; each `herder up` watches its own loop."""
        self.rules = AlertRules.from_settings(section)
        self._held = 0
        self._silence_sent_directly = False

    def run_once(self, now: datetime, scheduler_age: float | None = None) -> dict[str, int]:
        """One pass; `scheduler_age` is the seconds since the scheduler's last cycle."""
        self._watch_scheduler(now, scheduler_age)
        since = now - max(self.rules.window, HOUR)
        alerts = self.store.alert_list_since(since)
        notices = due_notices(alerts, now, self.rules)
        queued = 0
        for notice in notices:
            marked = (self.store.alert_mark_sent(notice.alert_id, now)
                      if notice.kind is NoticeKind.OPENED
                      else self.store.alert_mark_resolved_sent(notice.alert_id, now))
            if marked:
                self.delivery.submit(notice)
                queued += 1
        held = len(pending_notices(alerts, now, self.rules.window)) - len(notices)
        if held and held != self._held:
            log.warning("%d alert message(s) wait: alerts.max_per_hour (%d) reached", held,
                        self.section.max_per_hour)
        self._held = held
        return {"queued": queued, "held": held}

    def _watch_scheduler(self, now: datetime, age: float | None) -> None:
        """The silent-scheduler alert, in the store like the others; if the store itself
        fails (the likeliest cause of silence), one message goes out directly."""
        silent = silent_for(age, self.section.scheduler_silence)
        try:
            if silent:
                message = (f"the scheduler has completed no cycle for {age:.0f}s "
                           f"(alerts.scheduler_silence {self.section.scheduler_silence:g}s)")
                if self.store.alert_open(self.silence_key, message, now):
                    log.error("ALERT: %s", message)
            elif self.store.alert_clear(self.silence_key, now):
                log.warning("alert cleared: the scheduler completes cycles again")
        except Exception:
            if silent and not self._silence_sent_directly:
                self._silence_sent_directly = True
                self.delivery.submit(Notice(0, self.silence_key, NoticeKind.OPENED,
                                            f"the scheduler has completed no cycle for "
                                            f"{age:.0f}s and the store fails", now))
            raise
        if not silent:
            self._silence_sent_directly = False


def alert_loop(service: AlertService, stop: threading.Event, clock: Callable[[], datetime],
               active: Callable[[], bool],
               scheduler_age: Callable[[], float | None]) -> None:
    """Run the service every `alerts.interval` while `active()` (this process leads); a
    failed pass (the store down) is logged and retried with backoff."""
    interval = service.section.interval
    backoff = Backoff(base=interval, cap=max(interval, 30.0))
    while not stop.is_set():
        delay = interval
        if active():
            try:
                service.run_once(clock(), scheduler_age())
                backoff.reset()
            except Exception as exc:
                delay = backoff.next()
                log.error("alert pass failed (%s); retrying in %.1fs", type(exc).__name__,
                          delay)
        stop.wait(delay)


@dataclass
class Alerts:
    """The running alert service and its delivery, as a process starts them."""

    service: AlertService
    delivery: Delivery
    clock: Callable[[], datetime]

    def close(self, flush_seconds: float = 0.0) -> None:
        """Stop; with `flush_seconds`, first send what is due and wait that long for the
        queue to empty (`herder up --exit-when-idle` ending right after a failure)."""
        if flush_seconds > 0:
            try:
                self.service.run_once(self.clock())
            except Exception as exc:
                log.error("last alert pass failed (%s)", type(exc).__name__)
            self.delivery.flush(flush_seconds)
        self.delivery.stop()


def start_alerts(store: Store, section: AlertsSection, stop: threading.Event,
                 clock: Callable[[], datetime], active: Callable[[], bool],
                 scheduler_age: Callable[[], float | None],
                 silence_key: str = SCHEDULER_SILENT) -> Alerts | None:
    """Start delivery and its service in threads of their own; None without URLs (alerts
    stay rows and log lines, listed by `herder alerts`)."""
    urls = check_urls(section)
    if not urls:
        return None
    delivery = Delivery(urls, section).start()
    service = AlertService(store, delivery, section, silence_key)
    threading.Thread(target=alert_loop, args=(service, stop, clock, active, scheduler_age),
                     name="herder-alerts", daemon=True).start()
    return Alerts(service, delivery, clock)

