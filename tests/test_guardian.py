"""The guardian: its report that its agent died (`report_gone`, against
`httpx.MockTransport`) and its watch over the attempts' deadlines (a real pipe); the whole
path runs with real processes in tests/test_fleet_faults.py."""

from __future__ import annotations

import logging
import os
import threading
import time

import httpx
import pytest

from herder.core.backoff import Backoff
from herder.runtime.guardian import decode_deadlines, due, encode_deadlines, report_gone, watch

TOKEN = "hdr_secret-token-never-logged"


def no_jitter() -> Backoff:
    return Backoff(base=0.01, cap=0.05, draw=lambda low, high: high)


def test_a_5xx_then_200_is_retried_and_reported(caplog):
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(500, json={"error": "database restarting"})
        return httpx.Response(200, json={"lost": 2, "host_stopped": 1})

    with caplog.at_level(logging.DEBUG):
        assert report_gone("http://server:8470/", TOKEN, "alpha", "alpha/10/20",
                           backoff=no_jitter(), transport=httpx.MockTransport(answer),
                           sleep=lambda _seconds: None, allow_plaintext=True)
    assert len(seen) == 2
    request = seen[-1]
    assert (request.method, request.url.path) == ("POST", "/api/v1/agent/alpha/gone")
    assert request.url.params["worker"] == "alpha/10/20"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert "reported agent alpha/10/20 gone" in caplog.text
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("status", [401, 403, 422])
def test_a_4xx_is_final_and_not_retried(status, caplog):
    calls = []

    def answer(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(status, json={"detail": "no"})

    assert not report_gone("http://server", TOKEN, "alpha", "alpha/10/20",
                           backoff=no_jitter(), transport=httpx.MockTransport(answer),
                           sleep=lambda _seconds: None, allow_plaintext=True)
    assert len(calls) == 1
    assert f"HTTP {status}" in caplog.text and TOKEN not in caplog.text


def test_an_unreachable_server_is_given_up_within_the_budget(caplog):
    calls = []
    slept: list[float] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    assert not report_gone("http://server", TOKEN, "alpha", "alpha/10/20", budget_seconds=0.2,
                           backoff=no_jitter(), transport=httpx.MockTransport(refuse),
                           sleep=slept.append, allow_plaintext=True)
    # retried with backoff (capped at 0.05 s here) until the next wait would pass the budget
    assert len(calls) >= 2 and all(delay <= 0.05 for delay in slept)
    assert "could not tell the server agent alpha/10/20 is gone (ConnectError)" in caplog.text
    assert TOKEN not in caplog.text


# -- the deadline watch ---------------------------------------------------------------------


def test_deadlines_round_trip_and_malformed_entries_are_skipped():
    deadlines = {"7.1@alpha/10/20": 123.25, "8.2@alpha/10/20": 99.5}
    line = encode_deadlines(deadlines)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_deadlines(line.rstrip(b"\n")) == deadlines
    assert decode_deadlines(b"a=1.5 junk =2 b=nan c=x d=3") == {"a": 1.5, "d": 3.0}
    assert decode_deadlines(b"") == {}
    assert due({"a": 1.0, "b": 2.0, "c": 3.0}, 2.0) == ["a", "b"]


def test_watch_kills_only_what_passed_its_deadline_and_ends_with_the_pipe():
    read_end, write_end = os.pipe()
    killed: list[list[str]] = []
    first_kill = threading.Event()

    def kill(markers: list[str]) -> None:
        killed.append(markers)
        first_kill.set()

    watcher = threading.Thread(target=watch, args=(read_end, kill), daemon=True)
    watcher.start()
    try:
        now = time.monotonic()
        # Written in two pieces: a line counts only once it is whole.
        line = encode_deadlines({"soon": now + 0.2, "later": now + 3600})
        os.write(write_end, line[:5])
        os.write(write_end, line[5:])
        assert first_kill.wait(30), "the overdue attempt was never killed"
        assert killed == [["soon"]]
        # Renewed by the agent, an attempt is watched again; an empty line clears all.
        os.write(write_end, encode_deadlines({"later": time.monotonic() + 3600}))
        os.write(write_end, encode_deadlines({}))
    finally:
        os.close(write_end)
    watcher.join(30)
    assert not watcher.is_alive(), "the watch did not end when the agent's end closed"
    assert killed == [["soon"]]
    os.close(read_end)


def test_without_proc_the_guardian_keeps_the_sockets_and_goes_on(monkeypatch, caplog):
    """No /proc to list the descriptors: the guardian leaves the sockets open and still
    guards, rather than dying at once (its `finally` exits the process)."""
    import socket

    from herder.runtime import guardian

    def no_proc(path: str) -> list[str]:
        raise FileNotFoundError(2, "No such file or directory", path)

    left, right = socket.socketpair()
    with left, right:
        monkeypatch.setattr(guardian.os, "listdir", no_proc)
        guardian.close_sockets(keep=set())
        monkeypatch.undo()
        left.sendall(b"x")  # still open
        assert right.recv(1) == b"x"
    assert "sockets stay open" in caplog.text
