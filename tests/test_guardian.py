"""The guardian's report that its agent died (`herder.runtime.guardian.report_gone`),
against `httpx.MockTransport`; the whole path runs with real processes in
tests/test_fleet_faults.py."""

from __future__ import annotations

import logging

import httpx
import pytest

from herder.backoff import Backoff
from herder.runtime.guardian import report_gone

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
                           sleep=lambda _seconds: None)
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
                           sleep=lambda _seconds: None)
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
                           sleep=slept.append)
    # retried with backoff (capped at 0.05 s here) until the next wait would pass the budget
    assert len(calls) >= 2 and all(delay <= 0.05 for delay in slept)
    assert "could not tell the server agent alpha/10/20 is gone (ConnectError)" in caplog.text
    assert TOKEN not in caplog.text
