"""The HTTP contract as pure code: what the server writes, the agent reads back unchanged;
requests stay strict."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import msgspec
import pytest
from pydantic import ValidationError

from herder.core.model import AttemptToken, Job, JobStatus
from herder.core.submission import SubmitRequest
from herder.runtime.agent import job_from_assignment
from herder.wire import Assignment, HeartbeatBody, HeartbeatReply, JobView, SubmitBody, tokens

T0 = datetime(2026, 1, 1, 12, 30, tzinfo=UTC)
JOB = Job(
    id=7, job_type="agent", command=("run", "x"), shell=True, payload={"n": [1, {"a": None}]},
    priority=-5, weight="heavy", dedup_key="k", affinity="h1", available_at=T0,
    max_attempts=3, timeout_seconds=60.5, env={"A": "b"}, workdir="/src",
    backoff_base_seconds=10.0, backoff_max_seconds=600.0, status=JobStatus.CLAIMED, attempt=2,
    failures=1, lost=1, host="h1", exit_code=None, failure_reason=None, cancel_requested=False,
    created_at=T0, claimed_at=T0, started_at=None, finished_at=None, updated_at=T0,
    ram_gb=8.0, spawn_failures=2)


def test_an_assignment_reaches_the_agent_as_the_job_the_server_placed():
    sent = json.loads(Assignment.of(JOB).model_dump_json())
    received = job_from_assignment(sent)
    # What the agent does not get (it is the server's business) it fills as a claim.
    expected = msgspec.structs.replace(JOB, dedup_key=None, affinity=None, host=None,
                                   claimed_at=None)
    assert received == expected


def test_times_are_written_as_isoformat_with_an_offset():
    view = JobView.of(JOB).model_dump(mode="json")
    assert view["created_at"] == "2026-01-01T12:30:00+00:00"
    assert view["started_at"] is None
    assert view["status"] == "claimed"


def test_a_heartbeat_reply_names_attempts_as_pairs():
    reply = HeartbeatReply.model_validate_json(
        '{"live": [[1, 2]], "cancel": [], "host": null, "added_later": true}')
    assert tokens(reply.live) == {AttemptToken(1, 2)}
    assert reply.lease_seconds is None and reply.attempts == []


@pytest.mark.parametrize(("body", "field"), [
    ({"command": ["a\x00"]}, "command"),
    ({"command": ["true"], "env": {"A": "\ud800"}}, "env"),
    ({"command": ["true"], "payload": {"x": float("nan")}}, "payload"),
    ({"command": ["true"], "priority": 2**31}, "priority"),
    ({"command": ["true"], "delay_seconds": float("inf")}, "delay_seconds"),
    ({"command": ["true"], "colour": "red"}, "colour"),
])
def test_a_submit_body_refuses_what_cannot_be_stored_by_field(body, field):
    with pytest.raises(ValidationError) as raised:
        SubmitBody.model_validate(body)
    assert raised.value.errors()[0]["loc"][0] == field


def test_a_heartbeat_body_refuses_ids_outside_the_store():
    with pytest.raises(ValidationError):
        HeartbeatBody(worker="h/1/1", running=[(0, 1)])
    with pytest.raises(ValidationError):
        HeartbeatBody(worker="h/1/1", running=[(1, 2**31)])


def test_the_api_submit_body_has_the_fields_and_defaults_of_the_submit_request():
    """The CLI and the client build a SubmitRequest (no pydantic); the API validates a
    SubmitBody; `resolve` takes either, so they must not drift apart."""
    request = SubmitRequest()
    fields = {item.name: getattr(request, item.name)
              for item in msgspec.structs.fields(SubmitRequest)}
    body = SubmitBody()
    assert fields == {name: getattr(body, name) for name in SubmitBody.model_fields}


def test_host_settings_cross_the_wire_unchanged_and_a_field_left_out_stays_out():
    from herder.core.host_settings import HostSettings
    from herder.core.model import Transport
    from herder.wire import HostAddBody, HostSettingsBody

    given = HostSettings(ram_total_gb=32.0, ram_reserved_gb=4.0, cpus=8,
                         transport=Transport.SSH, ssh_target="u@h", prime_workers=3,
                         prime_max_weight="any", night_workers=0, night_max_weight="light",
                         job_types=frozenset(), weights=frozenset({"heavy", "light"}),
                         priority_floor=-5, labels=frozenset({"gpu"}))
    body = json.loads(json.dumps(HostSettingsBody.body_of(given)))
    assert body["job_types"] == [] and body["weights"] == ["heavy", "light"]
    assert HostSettingsBody.model_validate(body).settings() == given
    only = HostSettings(cpus=2)
    assert HostSettingsBody.body_of(only) == {"cpus": 2}
    added = HostAddBody.model_validate({"label": "lap-1", "enabled": False, "cpus": 2})
    assert added.settings() == only and (added.label, added.enabled) == ("lap-1", False)
    with pytest.raises(ValidationError):
        HostSettingsBody.model_validate({"cpus": 2, "label": "x"})  # add's field, not set's
