"""Alerts, delivered: a leader-only service that reads `herder_alerts` and sends what
`herder.core.scheduling.alerting` says is due, through Apprise, from a queue of its own.

Why a service that diffs the store rather than a hook on `alert_open`: alerts are opened by
the scheduler, by whoever records an attempt's end (the server, `herder up`, any runner on
the store) and by the account probes; the store is the one place they all meet. Marking a
row sent is a conditional update, so a restart, a new leader or two `herder up` processes
never send one twice, and an alert opened while no one was delivering is sent on start.

Delivery never blocks its caller: `Delivery.submit` appends to a bounded queue per URL (the
oldest message is dropped when it is full, logged and counted) and each URL's own sender thread
does its network I/O, with its timeout and retries, so an endpoint that hangs or fails forever
delays and drops only its own messages. A URL may hold a token: only its scheme and position
are ever logged.
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

from herder.core.backoff import Backoff
from herder.core.errors import ConfigError
from herder.core.scheduling.alerting import (
    HOUR,
    AlertRules,
    Notice,
    NoticeKind,
    due_notices,
    pending_notices,
    silent_for,
)
from herder.core.settings.sections import AlertsSection
from herder.runtime.hardening import secret_value

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
    alerts are sent (server, up), not at every config load: Apprise is slow to import (the
    figure is in bench/README.md, "Import costs behind the code")."""
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
    """Per URL and message: one notice to two URLs counts twice."""

    sent: int = 0
    failed: int = 0
    """Messages a URL did not take after every retry (dropped for that URL only)."""
    retried: int = 0
    dropped: int = 0
    """Messages dropped from a URL's full queue (the oldest first)."""


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


class _UrlSender:
    """One URL's bounded queue and the thread that sends it: a URL that hangs or fails
    forever delays and drops only its own messages, never another URL's."""

    def __init__(self, delivery: Delivery, index: int, url: str) -> None:
        self.delivery = delivery
        self.url = url
        self.label = f"{scheme_of(url)}:// (URL #{index + 1})"
        """What is logged: the scheme and the position, never the rest (it may hold a token)."""
        self.queue: collections.deque[Notice] = collections.deque()
        self.busy = False
        self.thread = threading.Thread(target=self._run, name=f"herder-alert-sender-{index}",
                                       daemon=True)

    def submit(self, notice: Notice) -> None:
        """Queue a notice (under the delivery's lock); a full queue drops its oldest."""
        section = self.delivery.section
        if len(self.queue) >= section.queue_size:
            dropped = self.queue.popleft()
            self.delivery.counts.dropped += 1
            log.error("alert queue of %s full (%d): dropped %s %s", self.label,
                      section.queue_size, dropped.kind, dropped.key)
        self.queue.append(notice)

    def idle(self) -> bool:
        return not self.queue and not self.busy

    def _run(self) -> None:
        delivery = self.delivery
        ready, stop = delivery._ready, delivery._stop
        while not stop.is_set():
            with ready:
                while not self.queue and not stop.is_set():
                    ready.wait()
                if stop.is_set():
                    return
                notice = self.queue.popleft()
                self.busy = True
            try:
                taken = self._send_with_retries(notice)
            except Exception as exc:  # a bug in a plugin must not end the sender
                taken = False  # the type only: a plugin's message may quote the URL
                log.error("alert %s to %s: delivery failed (%s)", notice.key, self.label,
                          type(exc).__name__)
            with ready:
                if taken:
                    delivery.counts.sent += 1
                else:
                    delivery.counts.failed += 1
                self.busy = False
                ready.notify_all()

    def _send_with_retries(self, notice: Notice) -> bool:
        section, stop = self.delivery.section, self.delivery._stop
        backoff = Backoff(base=section.retry_backoff, cap=RETRY_CAP)
        for attempt in range(section.retries + 1):
            if self.delivery.send(self.url, notice, section.timeout):
                return True
            if attempt == section.retries or stop.is_set():
                break
            with self.delivery._ready:
                self.delivery.counts.retried += 1
            delay = backoff.next()
            log.warning("alert %s to %s failed; retry %d/%d in %.1fs", notice.key,
                        self.label, attempt + 1, section.retries, delay)
            if stop.wait(delay):
                break
        log.error("alert %s (%s) could not be sent to %s after %d tries: dropped for this "
                  "URL", notice.key, notice.kind, self.label, section.retries + 1)
        return False


class Delivery:
    """A bounded queue and a sender thread per URL: each URL gets every notice, with its own
    timeout and retries, so a hanging or dead endpoint delays only itself."""

    def __init__(self, urls: Sequence[str], section: AlertsSection,
                 send: Send = apprise_send) -> None:
        self.urls = list(urls)
        self.section = section
        self.send = send
        self.counts = DeliveryCounts()
        self._ready = threading.Condition()
        """One lock for every URL's queue and the counts; each sender waits on it."""
        self._stop = threading.Event()
        self._senders = [_UrlSender(self, index, url) for index, url in enumerate(self.urls)]

    def start(self) -> Delivery:
        _quiet_apprise()
        for sender in self._senders:
            sender.thread.start()
        log.info("alerts go to %d URL(s): %s", len(self.urls),
                 ", ".join(scheme_of(url) for url in self.urls) or "none")
        return self

    def submit(self, notice: Notice) -> None:
        """Queue a notice for every URL; never waits. A URL's full queue drops its oldest."""
        with self._ready:
            if not self._senders:
                self.counts.sent += 1
            for sender in self._senders:
                sender.submit(notice)
            self._ready.notify_all()

    def waiting(self) -> int:
        """Messages queued, summed over the URLs."""
        with self._ready:
            return sum(len(sender.queue) for sender in self._senders)

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` for every URL's queue to be sent (a process about to exit);
        True when none is left."""
        deadline = time.monotonic() + timeout
        with self._ready:
            while not all(sender.idle() for sender in self._senders):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not all(sender.thread.is_alive() or sender.idle()
                                             for sender in self._senders):
                    return False
                self._ready.wait(remaining)
            return True

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()
        deadline = time.monotonic() + timeout
        for sender in self._senders:
            if sender.thread.ident is not None:
                sender.thread.join(max(0.0, deadline - time.monotonic()))


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

