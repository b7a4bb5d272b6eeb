"""An agent's own trouble with its server as an alert: the pure rules (what a stretch of
failed calls is, when it is worth an alert); the agent's watch, delivering through a real
local receiver and keeping what the server must still hear in a file that outlives a
restart; and end to end, a real server and agent: the server down for longer than
`agent_unreachable` (raised by the server once it is back), and a refused token (raised by
the agent's own [alerts] urls at once, recorded by the server once a right token is in)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.waits import wait_for
from test_alert_delivery import Receiver, receiver, section  # noqa: F401  (the fixture)

from herder.core.scheduling.alerting import (
    TOKEN_REFUSED,
    UNREACHABLE,
    Trouble,
    track_trouble,
    trouble_due,
)
from herder.runtime.agent_client import Reply, ServerUnavailable, Verdict
from herder.runtime.agent_trouble import STATE_FILE, TroubleWatch, failure_of, trouble_body
from herder.runtime.delivery import Delivery
from herder.wire.agents import TroubleBody

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
DOWN = Reply(Verdict.RETRY, None, None, "ConnectError: [Errno 111] Connection refused")
REFUSED = Reply(Verdict.UNAUTHORIZED, 401, None, "HTTP 401: unknown or revoked token")
OK = Reply(Verdict.OK, 200, {}, "HTTP 200")


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


# -- the rules (pure) ---------------------------------------------------------------------------


def test_a_stretch_of_failures_is_one_trouble_until_a_call_succeeds():
    first = track_trouble(None, UNREACHABLE, "refused", T0)
    assert first == Trouble(UNREACHABLE, T0, "refused")
    later = track_trouble(first, UNREACHABLE, "timed out", at(30))
    assert later == Trouble(UNREACHABLE, T0, "timed out")  # since its first failure
    assert track_trouble(later, None, "HTTP 200", at(40)) is None
    assert track_trouble(None, None, "HTTP 200", at(40)) is None
    # Once raised under a kind, the key holds (the resolved notice must match the alert).
    raised = Trouble(UNREACHABLE, T0, "x", raised=True)
    assert track_trouble(raised, TOKEN_REFUSED, "HTTP 401", at(5)).kind == UNREACHABLE
    assert track_trouble(first, TOKEN_REFUSED, "HTTP 401", at(5)).kind == TOKEN_REFUSED


def test_unreachable_is_due_after_the_hold_and_a_refused_token_at_once():
    down = Trouble(UNREACHABLE, T0, "x")
    assert not trouble_due(down, at(299), 300.0) and trouble_due(down, at(300), 300.0)
    assert trouble_due(Trouble(TOKEN_REFUSED, T0, "x"), T0, 300.0)
    assert not trouble_due(None, at(999), 300.0)


def test_which_replies_are_trouble():
    assert failure_of(DOWN) == UNREACHABLE
    assert failure_of(Reply(Verdict.RETRY, 503, None, "HTTP 503")) == UNREACHABLE
    assert failure_of(REFUSED) == TOKEN_REFUSED
    for fine in (OK, Reply(Verdict.GONE, 409, None, ""), Reply(Verdict.REFUSED, 422, None, "")):
        assert failure_of(fine) is None


def test_the_report_body_is_what_the_server_validates():
    body = trouble_body(Trouble(UNREACHABLE, T0, "x" * 500), at(60), True)
    parsed = TroubleBody.model_validate(body)
    assert (parsed.kind, parsed.since, parsed.until, parsed.delivered) == (
        "unreachable", T0, at(60), True)
    assert len(parsed.problem) == 300
    with pytest.raises(ValueError, match="until must not be before since"):
        TroubleBody.model_validate({**body, "until": T0.replace(hour=11).isoformat()})
    with pytest.raises(ValueError):
        TroubleBody.model_validate({**body, "kind": "bored"})


# -- the agent's watch, with a real receiver --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_the_watch_raises_through_its_own_urls_and_reports_once_back(tmp_path: Path,
                                                                     receiver: Receiver):  # noqa: F811
    clock = Clock()
    delivery = Delivery([receiver.url], section()).start()
    watch = TroubleWatch("alpha", 300.0, tmp_path, delivery, clock)
    told: list[tuple[Trouble, datetime, bool]] = []

    def send(trouble: Trouble, until: datetime, delivered: bool) -> None:
        told.append((trouble, until, delivered))

    try:
        watch.observe(DOWN)
        clock.now = at(299)
        watch.observe(DOWN)
        assert watch.run_once(clock.now, send) == {"raised": 0, "reported": 0}
        clock.now = at(300)
        assert watch.run_once(clock.now, send) == {"raised": 1, "reported": 0}
        assert watch.run_once(clock.now, send)["raised"] == 0  # once
        wait_for(lambda: receiver.titles() == ["herder ALERT: agent:alpha:unreachable"], 30,
                 "the agent's own alert")
        assert "cannot reach its server (ConnectError" in receiver.messages[0]["message"]

        # Back: the resolved notice goes out at once, the report on the next pass; a server
        # that does not take it yet keeps it for the pass after.
        clock.now = at(400)
        watch.observe(OK)
        wait_for(lambda: "herder RESOLVED: agent:alpha:unreachable" in receiver.titles(), 30,
                 "the agent's own resolved notice")

        def failing(*_args: object) -> None:
            raise ServerUnavailable("HTTP 503")

        assert watch.run_once(clock.now, failing)["reported"] == 0
        # A restart in between forgets nothing: the file has it.
        again = TroubleWatch("alpha", 300.0, tmp_path, None, clock)
        assert again.run_once(clock.now, send) == {"raised": 0, "reported": 1}
        ((trouble, until, delivered),) = told
        assert (trouble.kind, trouble.since, until, delivered) == (UNREACHABLE, T0, at(400),
                                                                   True)
        assert again.run_once(clock.now, send)["reported"] == 0
    finally:
        delivery.stop()


def test_a_blip_is_forgotten_and_without_urls_the_server_is_told(tmp_path: Path):
    clock = Clock()
    watch = TroubleWatch("alpha", 300.0, tmp_path, None, clock)
    told: list[bool] = []
    watch.observe(DOWN)
    clock.now = at(10)
    watch.observe(OK)  # ten seconds out of reach: not worth anyone's attention
    assert watch.run_once(clock.now, lambda *args: told.append(args[2])) == {
        "raised": 0, "reported": 0}
    watch.observe(REFUSED)  # a refused token is worth it however short
    clock.now = at(11)
    assert watch.run_once(clock.now, lambda *args: told.append(args[2]))["raised"] == 0
    watch.observe(OK)
    assert watch.run_once(clock.now, lambda *args: told.append(args[2]))["reported"] == 1
    assert told == [False]  # nobody sent it: the server is to raise it
    (tmp_path / STATE_FILE).write_text("{not json")
    assert TroubleWatch("alpha", 300.0, tmp_path, None, clock).trouble is None


# -- end to end: a real server and agent ---------------------------------------------------------


def test_a_server_down_for_long_is_raised_by_the_server_once_it_is_back(
        make_fleet, tmp_path: Path, sqlite_url: str, receiver: Receiver):  # noqa: F811
    server_config = (f'[alerts]\nurls = ["{receiver.url}"]\ninterval = "0.1s"\nretries = 0\n'
                     'agent_unreachable = "1s"\n')
    fleet = make_fleet(tmp_path, sqlite_url, extra=server_config)
    fleet.add_host("alpha", "--ram", "16", "--prime-workers", "1", "--night-workers", "1")
    fleet.start_server()
    # The agent's herder.toml names no alert URLs: only the server can raise it.
    fleet.write_config(extra='[alerts]\nagent_unreachable = "1s"\n')
    fleet.start_agent("alpha")
    fleet.stop_server()
    state = tmp_path / "agents" / "alpha" / STATE_FILE

    def down_for() -> float:
        try:
            trouble = json.loads(state.read_text())["trouble"]
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0
        if not trouble:
            return 0.0
        return (datetime.now(UTC) - datetime.fromisoformat(trouble["since"])).total_seconds()

    wait_for(lambda: down_for() > 1.5, 60, "the agent out of reach for over 1s", fleet.describe)
    assert fleet.tokens["alpha"] not in state.read_text()
    fleet.write_config(extra=server_config)
    fleet.start_server()
    wait_for(lambda: "herder ALERT: agent:alpha:unreachable" in receiver.titles(), 60,
             "the server to raise the agent's trouble", fleet.describe)
    (message,) = [m for m in receiver.messages
                  if m["title"] == "herder ALERT: agent:alpha:unreachable"]
    assert "the agent of host alpha cannot reach its server" in message["message"]
    assert "it is back" in message["message"]
    # It is over: once sent, the leader clears it, which sends the resolved notice.
    wait_for(lambda: "herder RESOLVED: agent:alpha:unreachable" in receiver.titles(), 60,
             "the agent's trouble resolved", fleet.describe)
    assert fleet.tokens["alpha"] not in json.dumps(receiver.messages)


def test_a_refused_token_is_sent_by_the_agent_itself_and_recorded_by_the_server(
        make_fleet, tmp_path: Path, sqlite_url: str, receiver: Receiver):  # noqa: F811
    fleet = make_fleet(tmp_path, sqlite_url, extra=(
        f'[alerts]\nurls = ["{receiver.url}"]\ninterval = "0.1s"\nretries = 0\n'))
    fleet.add_host("alpha", "--ram", "16", "--prime-workers", "1", "--night-workers", "1")
    fleet.start_server()
    wrong = "hdr_" + "x" * 40
    fleet.start_agent("alpha", token=wrong, wait=False)
    key = "agent:alpha:token_refused"
    wait_for(lambda: f"herder ALERT: {key}" in receiver.titles(), 60,
             "the agent's own alert of its refused token", fleet.describe)
    (message,) = [m for m in receiver.messages if m["title"] == f"herder ALERT: {key}"]
    assert "has its token refused by the server (HTTP 401" in message["message"]
    # The server never heard of it: the token it refused is not the host's.
    assert key not in {alert.key for alert in fleet.store.alert_list(open_only=False)}

    fleet.kill_agent("alpha")
    fleet.start_agent("alpha")  # the right token: the agent tells the server what it was
    recorded = wait_for(
        lambda: [a for a in fleet.store.alert_list(open_only=False) if a.key == key], 60,
        "the server to record the agent's trouble", fleet.describe)
    assert recorded[0].cleared_at is not None  # over, and sent by the agent already
    wait_for(lambda: f"herder RESOLVED: {key}" in receiver.titles(), 60,
             "the agent's own resolved notice", fleet.describe)
    assert receiver.titles().count(f"herder ALERT: {key}") == 1
    state = (tmp_path / "agents" / "alpha" / STATE_FILE).read_text()
    for secret in (wrong, fleet.tokens["alpha"]):
        assert secret not in state and secret not in json.dumps(receiver.messages)
        assert secret not in fleet.stderr_of(fleet.server)


# -- the server's side, over the store ------------------------------------------------------------


def test_the_sweep_clears_agent_trouble_once_sent_or_after_the_window(store):
    from herder.core.scheduling.alerting import AlertRules, due_notices
    from herder.runtime.maintenance import AgentTroubleSweep

    for key in ("agent:a:unreachable", "agent:b:unreachable", "ram:a"):
        assert store.alert_open(key, "m", T0)
    (sent,) = [a for a in store.alert_list() if a.key == "agent:a:unreachable"]
    assert store.alert_mark_sent(sent.id, at(1))
    sweep = AgentTroubleSweep(store, 900.0)
    assert sweep.run_once(at(2)) == {"cleared": 1}
    assert {a.key for a in store.alert_list()} == {"agent:b:unreachable", "ram:a"}
    assert sweep.run_once(at(900)) == {"cleared": 1}
    assert {a.key for a in store.alert_list()} == {"ram:a"}

    # What an agent's own URLs sent is recorded closed: kept, never sent again.
    store.alert_record("agent:c:token_refused", "sent by the agent", at(901))
    (recorded,) = [a for a in store.alert_list(open_only=False)
                   if a.key == "agent:c:token_refused"]
    assert recorded.cleared_at == at(901) and recorded.sent_at is None
    notices = due_notices(store.alert_list_since(T0), at(902), AlertRules(
        timedelta(minutes=15), 30))
    assert "agent:c:token_refused" not in {notice.key for notice in notices}
