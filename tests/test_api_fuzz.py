"""A fuzz of the HTTP API from its own OpenAPI document (schemathesis): requests generated
from every route's schema, sent with an admin token and with a host's agent token, must
never get a server error. Also checks that the document describes real schemas.

`HERDER_FUZZ_EXAMPLES` sets the examples per route and token (default 60: about 2,500
requests in CI; 125 gives the issue's 5,000). Hypothesis is derandomized, but the draws
also follow Python's hash seed, random per process: each run fuzzes another set, and
`PYTHONHASHSEED=N` repeats one. `HERDER_FUZZ_SEED=N` draws yet another set, to hunt further.
A server error prints its request (method, URL, query, body) at once, so a failure that does
not replay (another process, another set) still shows what was sent."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from support.postgres import BACKENDS, empty_herder_tables

from herder.api.app import Access, create_app
from herder.core.access import new_token, token_hash
from herder.core.model import HostRecord, Scope
from herder.core.settings.hooks import HookRuleSection, HookSourceSection, HooksSection
from herder.core.settings.job_types import JobTypeSection
from herder.core.settings.loading import Config
from herder.core.settings.sections import HerderSection, ServerSection, Settings
from herder.core.webhooks import signature
from herder.runtime.coordinator import Coordinator
from herder.runtime.metrics import CONTENT_TYPE
from herder.store import open_store

EXAMPLES = int(os.environ.get("HERDER_FUZZ_EXAMPLES", "60"))
SEED = os.environ.get("HERDER_FUZZ_SEED")
NOW = datetime(2026, 12, 1, tzinfo=UTC)
HOOK_SECRET = b"fuzz-hook-secret"
HOOKS = HooksSection(sources={"github": HookSourceSection(
    kind="github", secret_env="HERDER_HOOK_FUZZ", rules=[HookRuleSection(
        event="issues", action="labeled", label="agent", job_type="dev-issue",
        dedup_key="{repository.full_name}#{issue.number}",
        payload={"repo": "{repository.full_name}", "issue": "{issue.number}"})])})



@dataclass
class Target:
    client: TestClient
    operations: list[Any]
    tokens: dict[str, str]


def fuzz_settings(target: Target) -> settings:
    return settings(max_examples=EXAMPLES * len(target.operations), deadline=None,
                    derandomize=SEED is None, database=None,
                    suppress_health_check=list(HealthCheck))


def fuzz_seed(test: Any) -> Any:
    """The examples of `HERDER_FUZZ_SEED` when it is set (else derandomized)."""
    return test if SEED is None else seed(int(SEED))(test)


@pytest.fixture(scope="module", params=BACKENDS)
def target(request, tmp_path_factory) -> Iterator[Target]:
    folder = tmp_path_factory.mktemp("fuzz")
    if request.param == "sqlite":
        url = f"sqlite:///{folder / 'fuzz.db'}"
    else:  # the session database: empty it, as the function-scoped postgres_url does
        url = request.getfixturevalue("postgres_database")
        empty_herder_tables(url)
    with open_store(url) as store:
        store.host_insert(HostRecord(label="alpha", ram_total_gb=16.0), NOW)
        tokens = {}
        for role, scope, host in (("admin", Scope.ADMIN, None), ("agent", Scope.AGENT, "alpha")):
            tokens[role] = new_token()
            store.token_insert(role, scope, token_hash(tokens[role]), NOW, host=host)
        # A short long-poll (the fuzz asks for waits of up to an hour) and logs in the folder.
        settings_ = Settings(server=ServerSection(long_poll=0.01),
                             herder=HerderSection(log_dir=str(folder / "logs")),
                             job_types={"dev-issue": JobTypeSection(
                                 command=["echo", "{repo}", "{issue}"])},
                             hooks=HOOKS)
        app = create_app(Coordinator(store, Config(settings_, None), host="server"),
                         Access(hook_secrets={"github": HOOK_SECRET}))
        schema = schemathesis.openapi.from_dict(app.openapi())
        operations = [result.ok() for result in schema.get_all_operations()]
        # Not entered as a context manager: no lifespan, so no scheduler threads meanwhile.
        yield Target(TestClient(app, raise_server_exceptions=False), operations, tokens)


def fuzz(target: Target, role: str, data: st.DataObject) -> None:
    operation = data.draw(st.sampled_from(target.operations), label="operation")
    case = data.draw(operation.as_strategy(), label="case")
    # Aim agent paths at the token's own host half of the time, so the fuzz gets past
    # authentication into the routes themselves.
    if role == "agent" and "label" in (case.path_parameters or {}) and data.draw(
            st.booleans(), label="own host"):
        case.path_parameters["label"] = "alpha"
        if isinstance(case.body, dict) and "worker" in case.body:
            case.body["worker"] = "alpha/1/1"
        if case.query and "worker" in case.query:
            case.query["worker"] = "alpha/1/1"
    request = case.as_transport_kwargs(base_url="http://testserver")
    request["headers"] = {key: value for key, value in request["headers"].items()
                          if key.lower() != "authorization"}
    request["headers"]["Authorization"] = f"Bearer {target.tokens[role]}"
    request.pop("cookies", None)
    if isinstance(request.get("data"), bytes | str):  # a raw body (the log route's)
        request["content"] = request.pop("data")
    response = target.client.request(**request)
    if response.status_code >= 500:
        # Printed at once (pytest shows it with the failure): Hypothesis replays a failing
        # example before it reports it, and one that does not fail again is reported as
        # flaky, possibly without the request.
        sent = {key: request.get(key) for key in ("method", "url", "params", "json", "content")}
        print(f"server error {response.status_code}: {sent}\n{response.text[:300]}",
              file=sys.stderr)
    assert response.status_code < 500, (
        f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
        f"\n{request}")
    assert target.tokens[role] not in response.text


def test_the_fuzz_covers_the_operator_overview(target):
    paths = {(operation.method.upper(), operation.path) for operation in target.operations}
    assert {("GET", "/queue"), ("GET", "/metrics")} <= paths


def test_no_server_error_with_an_admin_token(target):
    @fuzz_seed
    @fuzz_settings(target)
    @given(st.data())
    def run(data):
        fuzz(target, "admin", data)

    run()


def test_no_server_error_with_an_agent_token(target):
    @fuzz_seed
    @fuzz_settings(target)
    @given(st.data())
    def run(data):
        fuzz(target, "agent", data)

    run()


def test_the_openapi_document_describes_request_bodies(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(f"sqlite:///{tmp_path / 'doc.db'}") as store:
        document = create_app(Coordinator(store, Config(Settings(), None), host="s")).openapi()
    submit = document["paths"]["/api/v1/jobs"]["post"]
    body = submit["requestBody"]["content"]["application/json"]["schema"]
    assert body["$ref"].endswith("/SubmitBody")
    assert "command" in document["components"]["schemas"]["SubmitBody"]["properties"]


def test_the_openapi_document_describes_every_response(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(f"sqlite:///{tmp_path / 'doc.db'}") as store:
        document = create_app(Coordinator(store, Config(Settings(), None), host="s")).openapi()
    untyped = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            success = next(answer for code, answer in operation["responses"].items()
                           if code.startswith("2"))
            content = success.get("content", {})
            if f"{method.upper()} {path}" == "GET /metrics":
                assert list(content) == [CONTENT_TYPE]  # Prometheus text, not JSON
                continue
            if list(content) == ["text/event-stream"]:
                continue  # server-sent events (the dashboard's live signal), and said so
            raw = content.get("application/octet-stream", {})
            if raw.get("schema") == {"type": "string", "format": "binary"}:
                continue  # bytes (an attempt's log), and said so
            schema = content.get("application/json", {}).get("schema", {})
            if not schema.get("$ref") and not schema.get("items", {}).get("$ref"):
                untyped.append(f"{method.upper()} {path}")
    assert untyped == []
    assignment = document["components"]["schemas"]["Assignment"]
    assert {"id", "attempt", "command", "env", "ram_gb"} <= set(assignment["required"])


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=12)
LABELS = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["agent", "bug"]) | JSON_VALUES}),
                  max_size=3)
ISSUE_EVENTS = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from(["labeled", "opened", "unlabeled"]) | JSON_VALUES,
    "label": st.fixed_dictionaries({"name": st.just("agent") | JSON_VALUES}) | JSON_VALUES,
    "issue": st.fixed_dictionaries({}, optional={"number": JSON_VALUES, "labels": LABELS}),
    "repository": st.fixed_dictionaries({}, optional={"full_name": JSON_VALUES}),
})
LABELED = st.fixed_dictionaries({  # the rule matches: its templates read what was drawn
    "action": st.just("labeled"), "label": st.just({"name": "agent"}),
    "issue": st.fixed_dictionaries({"number": st.integers() | JSON_VALUES}),
    "repository": st.fixed_dictionaries({"full_name": st.text(max_size=20) | JSON_VALUES})})
HOOK_BODIES = st.one_of(LABELED.map(lambda event: json.dumps(event).encode()),
                        ISSUE_EVENTS.map(lambda event: json.dumps(event).encode()),
                        JSON_VALUES.map(lambda value: json.dumps(value).encode()),
                        st.binary(max_size=200))
HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


def test_signed_hook_deliveries_never_get_a_server_error(target):
    """The fuzz above cannot sign a body, so it stops at 401 and 404: here every body is
    signed with the source's secret and reaches parsing, the rules and the store."""

    @settings(max_examples=EXAMPLES * 10, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=HOOK_BODIES, event=st.sampled_from(["issues", "ping", "push"]) | HEADER_TEXT,
           delivery=st.uuids().map(str) | HEADER_TEXT, sign=st.booleans(),
           content_type=st.sampled_from(["application/json", "text/plain"]))
    def run(body, event, delivery, sign, content_type):
        digest = signature(HOOK_SECRET if sign else b"other", body)
        response = target.client.post("/hooks/github", content=body, headers={
            "X-Hub-Signature-256": f"sha256={digest}", "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery, "Content-Type": content_type})
        assert response.status_code < 500, (response.status_code, response.text[:300], body)
        assert response.status_code in (200, 202, 400, 401, 422), response.text[:300]
        assert HOOK_SECRET.decode() not in response.text

    run()
