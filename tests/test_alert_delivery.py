"""Alerts, delivered (issue 16 item 3): the dedup / window / rate-limit decision, and Apprise
delivery to a real local HTTP receiver, which may fail, hang or be down without ever
delaying the work."""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
from collections import deque
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import replace
from support.cli import run_herder
from support.local import Harness, shell
from support.waits import holds_for, wait_for

from herder.core.errors import ConfigError
from herder.core.model import Attempt, JobStatus, Outcome
from herder.core.scheduling.alerting import (
    AlertRules,
    Notice,
    NoticeKind,
    due_notices,
    in_memory_loop,
    pending_notices,
)
from herder.core.settings.loading import load_config
from herder.core.settings.sections import AlertsSection
from herder.runtime.delivery import (
    SCHEDULER_SILENT,
    AlertService,
    Delivery,
    alert_urls,
    check_urls,
)
from herder.store import Store

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=15)


# -- a real receiver ----------------------------------------------------------------------------


class Receiver:
    """A JSON webhook endpoint on 127.0.0.1: records what Apprise posts; can answer with a
    given status, or hang until released."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.requests = 0
        self.statuses: deque[int] = deque()
        self.released = threading.Event()
        self.released.set()
        self.hung = threading.Event()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if not receiver.released.is_set():
                    receiver.hung.set()
                    receiver.released.wait(120)
                with receiver.lock:
                    receiver.requests += 1
                    status = receiver.statuses.popleft() if receiver.statuses else 200
                    if status == 200:
                        receiver.messages.append(json.loads(body))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/alerts"

    def titles(self) -> list[str]:
        with self.lock:
            return [message["title"] for message in self.messages]

    def hang(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    try:
        yield served
    finally:
        served.close()


def section(**changes: Any) -> AlertsSection:
    base = AlertsSection(retries=0, retry_backoff=0.05, timeout=30.0)
    return replace(base, **changes)


@contextlib.contextmanager
def running(delivery: Delivery) -> Iterator[Delivery]:
    delivery.start()
    try:
        yield delivery
    finally:
        delivery.stop()


# -- the decision (pure) ------------------------------------------------------------------------


class Row(msgspec.Struct, frozen=True):
    id: int
    key: str
    message: str
    opened_at: datetime
    cleared_at: datetime | None = None
    sent_at: datetime | None = None
    resolved_sent_at: datetime | None = None


class Book:
    """The store's alert rows, in memory, with its open/clear/mark semantics."""

    def __init__(self, rules: AlertRules) -> None:
        self.rules = rules
        self.rows: list[Row] = []
        self.sent: list[tuple[datetime, Notice]] = []

    def open(self, key: str, now: datetime) -> None:
        if not any(row.key == key and row.cleared_at is None for row in self.rows):
            self.rows.append(Row(len(self.rows) + 1, key, f"{key} broke", now))

    def clear(self, key: str, now: datetime) -> None:
        self.rows = [replace(row, cleared_at=now)
                     if row.key == key and row.cleared_at is None else row
                     for row in self.rows]

    def deliver(self, now: datetime) -> list[Notice]:
        notices = due_notices(self.rows, now, self.rules)
        for notice in notices:
            index = notice.alert_id - 1
            stamp = "sent_at" if notice.kind is NoticeKind.OPENED else "resolved_sent_at"
            self.rows[index] = replace(self.rows[index], **{stamp: now})
            self.sent.append((now, notice))
        return notices


def test_an_open_alert_is_sent_once_and_resolved_once():
    book = Book(AlertRules(WINDOW, 30))
    book.open("fleet:stopped", T0)
    assert [n.kind for n in book.deliver(T0)] == [NoticeKind.OPENED]
    assert book.deliver(T0 + timedelta(hours=5)) == []  # still open: no repeat
    book.clear("fleet:stopped", T0 + timedelta(hours=6))
    resolved = book.deliver(T0 + timedelta(hours=6))
    assert [n.kind for n in resolved] == [NoticeKind.RESOLVED]
    assert resolved[0].title == "herder RESOLVED: fleet:stopped"
    assert book.deliver(T0 + timedelta(hours=7)) == []


def test_a_flapping_cause_sends_one_alert_per_window_and_one_when_it_clears():
    book = Book(AlertRules(WINDOW, 30))
    minute = timedelta(minutes=1)
    for step in range(6):  # open/clear/open/clear ... every minute, inside one window
        now = T0 + step * minute
        if step % 2 == 0:
            book.open("breaker:h1:dev", now)
        else:
            book.clear("breaker:h1:dev", now)
        book.deliver(now)
    assert [n.kind for _, n in book.sent] == [NoticeKind.OPENED, NoticeKind.RESOLVED]
    # Opened again and still open once the window has passed: sent again.
    book.open("breaker:h1:dev", T0 + 10 * minute)
    assert book.deliver(T0 + 10 * minute) == []
    later = book.deliver(T0 + WINDOW)
    assert [(n.key, n.kind) for n in later] == [("breaker:h1:dev", NoticeKind.OPENED)]


def test_the_hour_budget_holds_the_rest_oldest_first():
    book = Book(AlertRules(WINDOW, 2))
    for index in range(3):
        book.open(f"job:{index}:failed", T0 + timedelta(seconds=index))
    sent = book.deliver(T0 + timedelta(seconds=5))
    assert [n.key for n in sent] == ["job:0:failed", "job:1:failed"]
    assert len(pending_notices(book.rows, T0, WINDOW)) == 1
    assert book.deliver(T0 + timedelta(minutes=59)) == []
    assert [n.key for n in book.deliver(T0 + timedelta(hours=1, seconds=5))] == [
        "job:2:failed"]


OPERATIONS = st.lists(st.tuples(st.sampled_from(["open", "clear", "wait"]),
                                st.sampled_from(["a", "b", "c"]),
                                st.integers(min_value=0, max_value=1200)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(OPERATIONS, st.integers(min_value=1, max_value=5))
def test_no_key_repeats_within_its_window_and_no_hour_exceeds_the_budget(operations, budget):
    rules = AlertRules(WINDOW, budget)
    book = Book(rules)
    now = T0
    for action, key, seconds in operations:
        if action == "wait":
            now += timedelta(seconds=seconds)
        elif action == "open":
            book.open(key, now)
        else:
            book.clear(key, now)
        book.deliver(now)
    for _ in range(len(book.rows) + 2):  # quiet afterwards: everything due goes out
        now += timedelta(hours=1)
        book.deliver(now)
    stamps = [stamp for stamp, _ in book.sent]
    for stamp in stamps:
        assert sum(1 for other in stamps if stamp <= other < stamp + timedelta(hours=1)) <= budget
    openings: dict[str, list[datetime]] = {}
    for stamp, notice in book.sent:
        if notice.kind is NoticeKind.OPENED:
            openings.setdefault(notice.key, []).append(stamp)
    for times in openings.values():
        assert all(later - earlier >= WINDOW for earlier, later in itertools.pairwise(times))
    notified = {n.alert_id for _, n in book.sent if n.kind is NoticeKind.OPENED}
    for _, notice in book.sent:
        if notice.kind is NoticeKind.RESOLVED:
            assert notice.alert_id in notified  # never "resolved" for what was never sent
    assert len({(n.alert_id, n.kind) for _, n in book.sent}) == len(book.sent)
    for row in book.rows:  # nothing is left owed
        assert row.cleared_at is not None or row.sent_at is not None
        assert row.sent_at is None or row.cleared_at is None or row.resolved_sent_at


def attempt(number: int, outcome: Outcome, ended: datetime) -> Attempt:
    return Attempt(7, number, "h1", "w", 1, None, ended, ended, ended, ended, 4, outcome)


def test_three_memory_endings_in_five_minutes_are_a_loop():
    minute = timedelta(minutes=1)
    heavy = [attempt(1, Outcome.NEEDS_HEAVIER, T0), attempt(2, Outcome.OOM, T0 + minute),
             attempt(3, Outcome.NEEDS_HEAVIER, T0 + 2 * minute)]
    window = timedelta(minutes=5)
    assert in_memory_loop(heavy, T0 + 3 * minute, 3, window)
    assert not in_memory_loop(heavy[:2], T0 + 3 * minute, 3, window)
    assert not in_memory_loop(heavy, T0 + 6 * minute, 3, window)  # the first is too old
    mixed = [*heavy[:2], attempt(3, Outcome.FAILED, T0 + 2 * minute)]
    assert not in_memory_loop(mixed, T0 + 3 * minute, 3, window)


# -- config -------------------------------------------------------------------------------------


def test_a_url_apprise_does_not_know_is_refused_naming_the_key_not_the_url(tmp_path: Path):
    config = tmp_path / "herder.toml"
    config.write_text('[alerts]\nurls = ["json://127.0.0.1/x", "nosuch://SECRET@host/x"]\n')
    with pytest.raises(ConfigError) as refused:
        check_urls(load_config(config).settings.alerts)
    assert "alerts.urls.1" in str(refused.value)
    assert "SECRET" not in str(refused.value)
    result = run_herder("up", "--exit-when-idle", cwd=tmp_path, config=config,
                        db=f"sqlite:///{tmp_path / 'herder.db'}")
    assert result.returncode == 2, result.stderr
    assert "alerts.urls.1" in result.stderr and "SECRET" not in result.stderr


def test_urls_come_from_the_file_and_the_named_variable():
    alerts = AlertsSection(urls=["json://a/x"], urls_env="ALERT_URLS")
    assert alert_urls(alerts, {"ALERT_URLS": "json://b/y, tgram://1/2"}) == [
        "json://a/x", "json://b/y", "tgram://1/2"]
    assert "json://a/x" not in repr(alerts)  # a URL may carry a token


# -- delivery to a real receiver ----------------------------------------------------------------


def notice(key: str, kind: NoticeKind = NoticeKind.OPENED) -> Notice:
    return Notice(1, key, kind, f"{key} broke", T0)


def test_apprise_posts_the_alert_to_a_json_webhook(receiver: Receiver):
    with running(Delivery([receiver.url], section())) as delivery:
        delivery.submit(notice("fleet:stopped"))
        wait_for(lambda: receiver.messages, 60, "the receiver to get the alert")
    message = receiver.messages[0]
    assert message["title"] == "herder ALERT: fleet:stopped"
    assert "fleet:stopped broke" in message["message"]
    assert delivery.counts.sent == 1 and delivery.counts.failed == 0


def test_a_500_is_retried(receiver: Receiver):
    receiver.statuses.extend([500, 502])
    with running(Delivery([receiver.url], section(retries=3))) as delivery:
        delivery.submit(notice("no_healthy_host"))
        wait_for(lambda: receiver.messages, 60, "the retried alert to arrive")
    assert receiver.requests == 3
    assert delivery.counts.retried == 2 and delivery.counts.sent == 1


def test_a_down_endpoint_fails_after_its_retries(receiver: Receiver):
    port = receiver.server.server_address[1]
    receiver.close()  # nothing listens there any more
    with running(Delivery([f"json://127.0.0.1:{port}/alerts"], section(retries=1))) as delivery:
        delivery.submit(notice("fleet:stopped"))
        wait_for(lambda: delivery.counts.failed == 1, 60, "the delivery to give up")
    assert delivery.counts.retried == 1 and delivery.counts.sent == 0


def test_a_hanging_endpoint_never_blocks_submit_and_a_full_queue_drops_the_oldest(
        receiver: Receiver):
    receiver.hang()
    with running(Delivery([receiver.url], section(queue_size=2))) as delivery:
        delivery.submit(notice("k0"))
        wait_for(receiver.hung.is_set, 60, "the first alert to reach the hanging receiver")
        for index in range(1, 5):
            delivery.submit(notice(f"k{index}"))  # returns at once: the sender is stuck
        assert delivery.counts.dropped == 2 and delivery.waiting() == 2
        receiver.release()
        wait_for(lambda: len(receiver.messages) == 3, 60, "the queued alerts to arrive")
    assert receiver.titles() == [f"herder ALERT: {key}" for key in ("k0", "k3", "k4")]


def test_a_hanging_url_delays_only_itself():
    """Issue 24 item 4: the working URL gets the alert while the one that accepts and never
    answers is still hanging, well before it times out and gives up."""
    hanging, working = Receiver(), Receiver()
    try:
        hanging.hang()
        urls = [hanging.url, working.url]  # the hanging one first: a serial sender waited
        with running(Delivery(urls, section(retries=2, timeout=60.0))) as delivery:
            delivery.submit(notice("job:1:failed"))
            wait_for(hanging.hung.is_set, 60, "the alert to reach the hanging receiver")
            wait_for(lambda: working.messages, 60, "the working receiver to get the alert")
            assert hanging.hung.is_set() and hanging.requests == 0  # still hanging
            assert delivery.counts.failed == 0 and delivery.counts.retried == 0
            assert working.titles() == ["herder ALERT: job:1:failed"]
            delivery.submit(notice("job:2:failed"))  # the next one is not held up either
            wait_for(lambda: len(working.messages) == 2, 60, "the second alert to arrive")
            assert hanging.requests == 0
            hanging.release()
            wait_for(lambda: delivery.flush(0) and delivery.counts.sent == 4, 60,
                     "the released receiver to take both")
        assert hanging.titles() == ["herder ALERT: job:1:failed", "herder ALERT: job:2:failed"]
    finally:
        hanging.close()
        working.close()


def test_a_url_that_fails_forever_is_dropped_after_its_retries_and_logged_without_its_secret(
        caplog: pytest.LogCaptureFixture):
    failing, working = Receiver(), Receiver()
    try:
        failing.statuses.extend([500] * 100)
        port = failing.server.server_address[1]
        secret_url = f"json://127.0.0.1:{port}/hook/SECRET-TOKEN-42"
        caplog.set_level("WARNING", logger="herder.alerts")
        with running(Delivery([secret_url, working.url], section(retries=2))) as delivery:
            delivery.submit(notice("k1"))
            wait_for(lambda: delivery.counts.failed == 1, 60, "the failing URL to give up")
            assert failing.requests == 3 and delivery.counts.retried == 2
            wait_for(lambda: working.messages, 60, "the working receiver to get the alert")
            delivery.submit(notice("k2"))
            wait_for(lambda: delivery.counts.failed == 2 and len(working.messages) == 2, 60,
                     "the second alert: dropped for one URL, sent to the other")
        assert working.titles() == ["herder ALERT: k1", "herder ALERT: k2"]
        assert failing.requests == 6 and delivery.counts.sent == 2
        text = caplog.text
        assert "could not be sent to json:// (URL #1) after 3 tries" in text
        assert "SECRET" not in text and "/hook" not in text and str(port) not in text
    finally:
        failing.close()
        working.close()


# -- the service: the store's rows to the receiver (both backends) --------------------------


def service_on(store: Store, receiver: Receiver, **changes: Any) -> AlertService:
    alerts = section(**changes)
    return AlertService(store, Delivery([receiver.url], alerts).start(), alerts)


def test_the_same_open_alert_is_sent_once_per_window(store: Store, receiver: Receiver):
    service = service_on(store, receiver)
    try:
        store.alert_open("fleet:stopped", "work is queued and no host can run it", T0)
        assert service.run_once(T0)["queued"] == 1
        assert service.run_once(T0 + timedelta(seconds=1))["queued"] == 0
        wait_for(lambda: receiver.messages, 60, "the alert to arrive")
        holds_for(lambda: len(receiver.messages) == 1, 0.5, "one message only")
        [alert] = store.alert_list()
        assert alert.sent_at is not None and alert.sent_count == 1
    finally:
        service.delivery.stop()


def test_a_flapping_alert_sends_one_and_one_resolved(store: Store, receiver: Receiver):
    service = service_on(store, receiver)
    try:
        key = "breaker:h1:dev"
        for step in range(6):  # open, clear, open, clear ... a minute apart
            now = T0 + timedelta(minutes=step)
            if step % 2 == 0:
                store.alert_open(key, "h1 keeps rate-limiting dev jobs", now)
            else:
                store.alert_clear(key, now)
            service.run_once(now)
        wait_for(lambda: len(receiver.messages) == 2, 60, "the alert and its resolution")
        holds_for(lambda: len(receiver.messages) == 2, 0.5, "no more messages")
        assert receiver.titles() == [f"herder ALERT: {key}", f"herder RESOLVED: {key}"]
        assert [m["type"] for m in receiver.messages] == ["failure", "success"]
    finally:
        service.delivery.stop()


def test_the_hour_budget_holds_alerts_across_keys(store: Store, receiver: Receiver):
    service = service_on(store, receiver, max_per_hour=2)
    try:
        for index in range(3):
            store.alert_open(f"job:{index}:failed", f"job {index} failed", T0)
        assert service.run_once(T0) == {"queued": 2, "held": 1}
        wait_for(lambda: len(receiver.messages) == 2, 60, "two alerts")
        assert service.run_once(T0 + timedelta(minutes=30)) == {"queued": 0, "held": 1}
        assert service.run_once(T0 + timedelta(hours=1, seconds=1))["queued"] == 1
        wait_for(lambda: len(receiver.messages) == 3, 60, "the held alert")
        assert sorted(receiver.titles()) == [f"herder ALERT: job:{i}:failed" for i in range(3)]
    finally:
        service.delivery.stop()


def test_two_services_on_one_store_send_an_alert_once(store: Store, receiver: Receiver):
    first, second = service_on(store, receiver), service_on(store, receiver)
    try:
        store.alert_open("no_healthy_host", "no host", T0)
        assert first.run_once(T0)["queued"] + second.run_once(T0)["queued"] == 1
        wait_for(lambda: receiver.messages, 60, "the alert")
        holds_for(lambda: len(receiver.messages) == 1, 0.5, "one message only")
    finally:
        first.delivery.stop()
        second.delivery.stop()


def test_a_silent_scheduler_opens_an_alert_and_clears_it(store: Store, receiver: Receiver):
    service = service_on(store, receiver, scheduler_silence=300.0)
    try:
        service.run_once(T0, scheduler_age=120.0)
        assert store.alert_list() == []
        service.run_once(T0, scheduler_age=301.0)
        [alert] = store.alert_list()
        assert alert.key == SCHEDULER_SILENT and "301s" in alert.message
        service.run_once(T0 + timedelta(seconds=5), scheduler_age=0.5)
        assert store.alert_list() == []
        wait_for(lambda: len(receiver.messages) == 2, 60, "the alert and its resolution")
        assert receiver.titles() == [f"herder ALERT: {SCHEDULER_SILENT}",
                                     f"herder RESOLVED: {SCHEDULER_SILENT}"]
    finally:
        service.delivery.stop()


# -- end to end: herder up ----------------------------------------------------------------------


def test_herder_up_delivers_a_failed_job_and_a_hung_receiver_delays_no_job(
        tmp_path: Path, store_url: str, receiver: Receiver):
    receiver.hang()
    secret_url = receiver.url.replace("json://", "json://user:SECRET@")  # a token in the URL
    extra = (f'[alerts]\nurls = ["{secret_url}"]\ninterval = "0.1s"\ntimeout = "60s"\n'
             "retries = 0\n")
    harness = Harness(tmp_path, store_url, extra_config=extra)
    try:
        up = harness.up()
        harness.wait_ready(up)
        failed = harness.submit(shell("echo broken >&2; exit 1"), max_attempts=1)
        harness.wait_status(failed, JobStatus.FAILED)
        wait_for(receiver.hung.is_set, 60, "the alert to reach the receiver", harness.describe)
        # The receiver holds the alert's request open: jobs still run.
        later = harness.submit(shell("echo fine"))
        harness.wait_status(later, JobStatus.DONE, timeout=60)
        assert receiver.messages == [] and not receiver.released.is_set()
        receiver.release()
        wait_for(lambda: receiver.messages, 60, "the alert to be delivered", harness.describe)
        [message] = receiver.messages
        assert message["title"] == f"herder ALERT: job:{failed}:failed"
        assert "implementation_error" in message["message"]
        listed = json.loads(harness.cli("alerts", "--json").stdout)
        assert [(a["key"], a["open"], a["sent_count"]) for a in listed] == [
            (f"job:{failed}:failed", True, 1)]
        text = harness.cli("alerts").stdout
        assert f"job:{failed}:failed  open" in text and "sent 1" in text
        up.terminate()  # so that the retried job stays queued
        assert harness.wait_exit(up, 60, "herder up") == 0, harness.stderr_of(up)
        logged = harness.stderr_of(up)
        assert "alerts go to 1 URL(s): json" in logged and "SECRET" not in logged
        harness.cli("retry", str(failed))  # someone acted: the alert clears
        assert json.loads(harness.cli("alerts", "--json").stdout) == []
        cleared = json.loads(harness.cli("alerts", "--all", "--json").stdout)
        assert [(a["key"], a["open"]) for a in cleared] == [(f"job:{failed}:failed", False)]
    finally:
        harness.close()


# -- end to end: herder server --------------------------------------------------------------------


@pytest.mark.slow
def test_the_server_places_work_while_the_alert_receiver_hangs(make_fleet, tmp_path: Path,
                                                               sqlite_url: str,
                                                               receiver: Receiver):
    receiver.hang()
    fleet = make_fleet(tmp_path, sqlite_url, extra=(
        f'[alerts]\nurls = ["{receiver.url}"]\ninterval = "0.1s"\ntimeout = "60s"\n'
        "retries = 0\n"))
    fleet.add_host("alpha", "--ram", "16", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server(wait=False)
    fleet.start_agent("alpha")
    failed = fleet.submit(["/bin/sh", "-c", "exit 1"], max_attempts=1)
    fleet.wait_status(failed, JobStatus.FAILED)
    # The first alert (the agent-less start's no healthy host, or the failure) hangs.
    wait_for(receiver.hung.is_set, 60, "the leader to send an alert", fleet.describe)
    later = fleet.submit(["/bin/sh", "-c", "true"])
    done = fleet.wait_status(later, JobStatus.DONE, timeout=60)
    assert done.host == "alpha"  # placed and run while the receiver held the alert
    assert receiver.messages == [] and not receiver.released.is_set()
    receiver.release()
    wait_for(lambda: f"herder ALERT: job:{failed}:failed" in receiver.titles(), 60,
             "the failure's alert to be delivered", fleet.describe)


# -- the OOM-loop alert, from the ended attempts in the store ------------------------------------


def test_three_memory_endings_of_one_job_open_an_oom_loop_alert(store_url: str):
    from herder.client import Client
    from herder.core.settings.sections import Settings
    from herder.runtime.endings import PolicyLimits, record_ending

    limits = PolicyLimits.from_settings(Settings())
    client = Client(store_url)
    try:
        store = client.store
        job_id = client.submit(command=["/bin/true"], weight="light").job_id
        key = f"job:{job_id}:oom_loop"
        now = datetime.now(UTC)
        # light -> heavy -> orchestrator (escalation skips the smaller playwright), then an
        # oom at the ceiling holds the weight and backs off.
        endings = [(Outcome.NEEDS_HEAVIER, 4), (Outcome.NEEDS_HEAVIER, 4), (Outcome.OOM, 2)]
        for number, (outcome, code) in enumerate(endings):
            assert key not in {a.key for a in store.alert_list()}, number
            now += timedelta(seconds=30)
            [job] = store.job_claim("h1", "w1", 1, now)
            assert store.attempt_start(job.token, 1, None, now)
            record_ending(store, job, outcome, now, limits, exit_code=code)
        [alert] = [a for a in store.alert_list() if a.key == key]
        assert "ran out of memory 3 times within 300s" in alert.message
        # At a weight that fits, after its backoff, it succeeds: the loop is over.
        now = store.job_get(job_id).available_at + timedelta(seconds=1)
        [job] = store.job_claim("h1", "w1", 1, now)
        assert store.attempt_start(job.token, 1, None, now)
        assert record_ending(store, job, Outcome.OK, now, limits) is JobStatus.DONE
        assert key not in {a.key for a in store.alert_list()}
        assert key in {a.key for a in store.alert_list(open_only=False)}
    finally:
        client.close()
