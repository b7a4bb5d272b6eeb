"""Forge webhooks (issue 16 item 7): signatures, event parsing and rule matching as pure
functions; delivery records on both backends; and `POST /hooks/{source}` on a real
`herder server` with payloads shaped like GitHub's and Gitea's: the right 4xx for bad
input with nothing changed, a replay enqueuing nothing, and no secret in the log."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.waits import wait_for

from herder.core.errors import ConfigError, InputError
from herder.core.model import JobSpec, JobStatus
from herder.core.settings.hooks import HookRuleSection, template_paths
from herder.core.settings.loading import Config, load_config
from herder.core.webhooks import (
    REPLAY_WINDOW,
    Refused,
    match,
    parse_body,
    signature,
    signed_text,
    verify,
)
from herder.runtime.hardening import hook_secrets
from herder.runtime.maintenance import DeliverySweep

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SECRET = b"It's a Secret to Everybody"
REPO = {"id": 1296269, "name": "app", "full_name": "octo-org/app",
        "owner": {"login": "octo-org", "id": 1}, "private": False,
        "html_url": "https://github.com/octo-org/app", "default_branch": "main"}
SENDER = {"login": "octocat", "id": 583231, "type": "User"}
AGENT_LABEL = {"id": 208045946, "name": "agent", "color": "f29513", "default": False}


def github_issue_labeled(number: int = 42, label: dict[str, Any] | None = None
                         ) -> dict[str, Any]:
    """Shaped like GitHub's `issues` event with action `labeled`."""
    label = label or AGENT_LABEL
    return {
        "action": "labeled",
        "issue": {"url": f"https://api.github.com/repos/octo-org/app/issues/{number}",
                  "id": 1, "number": number, "title": "Crash on start", "state": "open",
                  "user": SENDER, "labels": [label], "body": "It crashes.",
                  "created_at": "2026-11-30T10:00:00Z"},
        "label": label, "repository": REPO, "sender": SENDER,
    }


def github_pull_request_opened(number: int = 7) -> dict[str, Any]:
    """Shaped like GitHub's `pull_request` event with action `opened`."""
    return {
        "action": "opened", "number": number,
        "pull_request": {"url": f"https://api.github.com/repos/octo-org/app/pulls/{number}",
                         "id": 2, "number": number, "state": "open", "title": "Fix crash",
                         "user": SENDER, "labels": [], "draft": False,
                         "head": {"ref": "fix-crash", "sha": "6dcb09b5b57875f334f61aebed695e2e"},
                         "base": {"ref": "main", "sha": "9049f1265b7d61be4a8904a9a27120d2"}},
        "repository": REPO, "sender": SENDER,
    }


def github_ping() -> dict[str, Any]:
    return {"zen": "Keep it logically awesome.", "hook_id": 12345,
            "hook": {"type": "Repository", "id": 12345, "events": ["issues", "pull_request"],
                     "config": {"content_type": "json", "insecure_ssl": "0",
                                "url": "https://herder.example/hooks/github"}},
            "repository": REPO, "sender": SENDER}


def gitea_issue_label_updated(number: int = 9) -> dict[str, Any]:
    """Shaped like Gitea's `issues` event for a label change (X-Gitea-Event-Type
    `issue_label`): action `label_updated`, no single `label`, the issue's labels."""
    repository = {"id": 3, "name": "app", "full_name": "team/app",
                  "owner": {"login": "team", "id": 2}, "html_url": "https://gitea.example/team/app"}
    return {
        "action": "label_updated", "number": number,
        "issue": {"id": 11, "number": number, "title": "Slow query", "state": "open",
                  "user": {"login": "gitea-user", "id": 5},
                  "labels": [{"id": 1, "name": "bug", "color": "ee0701"},
                             {"id": 2, "name": "agent", "color": "0075ca"}]},
        "repository": repository, "sender": {"login": "gitea-user", "id": 5},
    }


def gitea_pull_request_opened(number: int = 12) -> dict[str, Any]:
    repository = {"id": 3, "name": "app", "full_name": "team/app"}
    return {"action": "opened", "number": number,
            "pull_request": {"id": 21, "number": number, "title": "Speed up", "labels": [],
                             "head": {"ref": "speed"}, "base": {"ref": "main"}},
            "repository": repository, "sender": {"login": "gitea-user", "id": 5}}


def encode(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def github_headers(body: bytes, event: str, delivery: str, secret: bytes = SECRET
                   ) -> dict[str, str]:
    return {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "X-GitHub-Hook-ID": "12345", "User-Agent": "GitHub-Hookshot/abc1234",
            "X-Hub-Signature-256": "sha256=" + signature(secret, body),
            "Content-Type": "application/json"}


def gitea_headers(body: bytes, event: str, delivery: str, secret: bytes = SECRET
                  ) -> dict[str, str]:
    digest = signature(secret, body)
    return {"X-Gitea-Event": event, "X-Gitea-Event-Type": event,
            "X-Gitea-Delivery": delivery, "X-Gitea-Signature": digest,
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": "sha256=" + digest, "Content-Type": "application/json"}


def generic_headers(body: bytes, event: str, delivery: str, secret: bytes = SECRET,
                    at: float | None = None) -> dict[str, str]:
    """herder's own scheme: the signature covers the timestamp, the delivery id and the
    event before the body."""
    stamp = str(int(time.time() if at is None else at))
    return {"X-Herder-Event": event, "X-Herder-Delivery": delivery,
            "X-Herder-Timestamp": stamp,
            "X-Herder-Signature": "sha256=" + signature(
                secret, signed_text(stamp, delivery, event, body)),
            "Content-Type": "application/json"}


DEV_ISSUE = HookRuleSection(
    event="issues", action="labeled", label="agent", job_type="dev-issue",
    dedup_key="{repository.full_name}#{issue.number}",
    payload={"repo": "{repository.full_name}", "issue": "{issue.number}"})
REVIEW_PR = HookRuleSection(
    event="pull_request", action="opened", job_type="review-pr",
    dedup_key="{repository.full_name}!{pull_request.number}",
    payload={"repo": "{repository.full_name}", "pr": "{pull_request.number}",
             "branch": "{pull_request.head.ref}"})


# -- signatures ------------------------------------------------------------------------------


def test_a_github_signature_is_the_hmac_of_the_raw_body():
    body = encode(github_issue_labeled())
    headers = github_headers(body, "issues", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
    delivery = verify("github", SECRET, headers, body)
    assert (delivery.event, delivery.delivery_id) == (
        "issues", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
    # GitHub's documented example: this secret and body give this digest.
    assert signature(SECRET, b"Hello, World!") == (
        "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17")


@pytest.mark.parametrize("change", [
    "other secret", "body changed", "no prefix", "no header", "empty", "truncated"])
def test_a_signature_that_does_not_match_is_refused_401(change):
    body = encode(github_issue_labeled())
    headers = github_headers(body, "issues", "d-1")
    good = headers["X-Hub-Signature-256"]
    sent_body = body
    if change == "other secret":
        headers = github_headers(body, "issues", "d-1", secret=b"guess")
    elif change == "body changed":
        sent_body = body.replace(b"42", b"43")
    elif change == "no prefix":
        headers["X-Hub-Signature-256"] = good.removeprefix("sha256=")
    elif change == "no header":
        del headers["X-Hub-Signature-256"]
    elif change == "empty":
        headers["X-Hub-Signature-256"] = ""
    else:
        headers["X-Hub-Signature-256"] = good[:-1]
    with pytest.raises(Refused) as refused:
        verify("github", SECRET, headers, sent_body)
    assert refused.value.status == 401
    assert good.removeprefix("sha256=") not in refused.value.reason


def test_gitea_is_verified_by_its_own_header_or_githubs():
    body = encode(gitea_issue_label_updated())
    headers = gitea_headers(body, "issues", "0b8d9c1a-5f3e-4a8e-9d3c-1f2e3d4c5b6a")
    assert verify("gitea", SECRET, headers, body).event == "issues"
    only_gitea = {k: v for k, v in headers.items() if k != "X-Hub-Signature-256"}
    assert verify("gitea", SECRET, only_gitea, body).delivery_id.startswith("0b8d")
    only_github = {k: v for k, v in headers.items() if k != "X-Gitea-Signature"}
    assert verify("gitea", SECRET, only_github, body).event == "issues"
    # Its own header is the one checked when both are sent: a wrong one is not excused.
    wrong = {**headers, "X-Gitea-Signature": signature(b"guess", body)}
    with pytest.raises(Refused) as refused:
        verify("gitea", SECRET, wrong, body)
    assert refused.value.status == 401
    # A GitHub source does not take Gitea's header.
    with pytest.raises(Refused):
        verify("github", SECRET, only_gitea, body)


def test_the_generic_source_and_its_headers():
    body = b'{"ref": "main"}'
    assert verify("generic", SECRET, generic_headers(body, "deploy", "run-1"), body).event == (
        "deploy")
    for missing in ("X-Herder-Event", "X-Herder-Delivery"):
        headers = generic_headers(body, "deploy", "run-1")
        del headers[missing]
        with pytest.raises(Refused) as refused:
            verify("generic", SECRET, headers, body)
        assert (refused.value.status, missing.lower() in refused.value.reason) == (400, True)
    for bad in ("a b", "x" * 201, "é"):
        with pytest.raises(Refused) as refused:
            verify("generic", SECRET, generic_headers(body, "deploy", bad), body)
        assert refused.value.status == 400


def test_a_generic_signature_covers_the_timestamp_the_delivery_and_the_event():
    body = b'{"ref": "main"}'
    now = 1_800_000_000.0
    headers = generic_headers(body, "deploy", "run-1", at=now)
    assert verify("generic", SECRET, headers, body, now=now).delivery_id == "run-1"
    for name, other in (("X-Herder-Timestamp", str(int(now) + 1)),
                        ("X-Herder-Delivery", "run-2"), ("X-Herder-Event", "push")):
        with pytest.raises(Refused) as refused:
            verify("generic", SECRET, {**headers, name: other}, body, now=now)
        assert refused.value.status == 401, name
    # Only the body signed, as a forge signs: not enough for the generic kind.
    body_only = {**headers, "X-Herder-Signature": "sha256=" + signature(SECRET, body)}
    with pytest.raises(Refused):
        verify("generic", SECRET, body_only, body, now=now)


def test_a_generic_delivery_id_with_a_dot_is_refused_400():
    """timestamp.delivery.event.body splits one way only when the id has no dot: a body
    signed for delivery 123, event issue.opened must not verify as 123.issue, opened."""
    body = b"{}"
    now = 1_800_000_000.0
    signed = generic_headers(body, "issue.opened", "123", at=now)
    assert verify("generic", SECRET, signed, body, now=now).delivery_id == "123"
    shifted = {**signed, "X-Herder-Delivery": "123.issue", "X-Herder-Event": "opened"}
    assert signed_text(signed["X-Herder-Timestamp"], "123.issue", "opened", body) == (
        signed_text(signed["X-Herder-Timestamp"], "123", "issue.opened", body))
    for headers in (shifted, generic_headers(body, "deploy", "run.1", at=now)):
        with pytest.raises(Refused) as refused:
            verify("generic", SECRET, headers, body, now=now)
        assert refused.value.status == 400 and "x-herder-delivery" in refused.value.reason
    # A forge's delivery ids are its own and sign nothing: a dot there is not refused.
    forge = {"X-GitHub-Event": "push", "X-GitHub-Delivery": "a.b",
             "X-Hub-Signature-256": "sha256=" + signature(SECRET, body)}
    assert verify("github", SECRET, forge, body).delivery_id == "a.b"


@pytest.mark.parametrize(("offset", "accepted"), [
    (0, True), (REPLAY_WINDOW, True), (-REPLAY_WINDOW, True), (REPLAY_WINDOW + 1, False),
    (-REPLAY_WINDOW - 1, False), (-86400, False)])
def test_a_generic_delivery_outside_the_window_is_refused(offset, accepted):
    body = b"{}"
    now = 1_800_000_000.0
    headers = generic_headers(body, "deploy", "run-1", at=now + offset)
    if accepted:
        assert verify("generic", SECRET, headers, body, now=now).event == "deploy"
        return
    with pytest.raises(Refused) as refused:
        verify("generic", SECRET, headers, body, now=now)
    assert refused.value.status == 401
    assert "x-herder-timestamp" in refused.value.reason and "clock" in refused.value.reason


@pytest.mark.parametrize("stamp", [None, "", "soon", "-5", "1.5", "9" * 13, "١٢٣"])
def test_a_generic_delivery_without_a_usable_timestamp_is_refused_400(stamp):
    body = b"{}"
    headers = generic_headers(body, "deploy", "run-1")
    if stamp is None:
        del headers["X-Herder-Timestamp"]
    else:
        headers["X-Herder-Timestamp"] = stamp
    with pytest.raises(Refused) as refused:
        verify("generic", SECRET, headers, body)
    assert refused.value.status == 400 and "x-herder-timestamp" in refused.value.reason


def test_an_empty_secret_accepts_nothing():
    body = b"{}"
    with pytest.raises(Refused) as refused:
        verify("github", b"", github_headers(body, "issues", "d", secret=b""), body)
    assert refused.value.status == 401


@settings(max_examples=200, deadline=None)
@given(secret=st.binary(min_size=1, max_size=64), body=st.binary(max_size=2048),
       flip=st.integers(min_value=0))
def test_any_signed_body_verifies_and_any_changed_byte_does_not(secret, body, flip):
    headers = generic_headers(body, "e", "d", secret=secret)
    assert verify("generic", secret, headers, body).delivery_id == "d"
    if body:
        index = flip % len(body)
        changed = body[:index] + bytes([body[index] ^ 1]) + body[index + 1:]
        with pytest.raises(Refused):
            verify("generic", secret, headers, changed)


@settings(max_examples=300, deadline=None)
@given(headers=st.dictionaries(
    st.sampled_from(["X-Hub-Signature-256", "X-Gitea-Signature", "X-GitHub-Event",
                     "X-GitHub-Delivery", "X-Gitea-Event", "X-Gitea-Delivery", "Other"]),
    st.text(max_size=80)), kind=st.sampled_from(["github", "gitea", "generic"]),
    body=st.binary(max_size=64))
def test_arbitrary_headers_are_refused_with_a_4xx_never_an_error(headers, kind, body):
    try:
        verify(kind, SECRET, headers, body)
    except Refused as refused:
        assert 400 <= refused.status < 500


# -- bodies ----------------------------------------------------------------------------------


def test_a_body_is_a_json_object_or_githubs_form():
    event = github_issue_labeled()
    assert parse_body(encode(event), "application/json") == event
    form = httpx.QueryParams({"payload": json.dumps(event)}).__str__().encode()
    assert parse_body(form, "application/x-www-form-urlencoded") == event
    for body, content_type in [(b"{", "application/json"), (b"[1, 2]", None),
                               (b'{"a": NaN}', None), (b"\xff\xfe", None),
                               (b"[" * 100_000, None), (b"", None),
                               (b"payload=%7B", "application/x-www-form-urlencoded"),
                               (b"other=1", "application/x-www-form-urlencoded")]:
        with pytest.raises(Refused) as refused:
            parse_body(body, content_type)
        assert refused.value.status == 400, body[:20]


# -- rules -----------------------------------------------------------------------------------


def test_an_issue_labeled_agent_becomes_a_dev_issue_job():
    [request] = match([DEV_ISSUE, REVIEW_PR], "issues", github_issue_labeled(42))
    assert request.job_type == "dev-issue"
    assert request.dedup_key == "octo-org/app#42"
    # A template that is one placeholder keeps the value's JSON type.
    assert request.payload == {"repo": "octo-org/app", "issue": 42}


def test_events_the_rules_do_not_name_make_no_job():
    other_label = github_issue_labeled(label={"id": 3, "name": "bug"})
    assert match([DEV_ISSUE, REVIEW_PR], "issues", other_label) == []
    assert match([DEV_ISSUE], "issue_comment", github_issue_labeled()) == []
    closed = {**github_pull_request_opened(), "action": "closed"}
    assert match([DEV_ISSUE, REVIEW_PR], "pull_request", closed) == []
    assert match([DEV_ISSUE, REVIEW_PR], "push", {"ref": "refs/heads/main"}) == []


def test_a_pull_request_opened_becomes_a_review_pr_job():
    [request] = match([DEV_ISSUE, REVIEW_PR], "pull_request", github_pull_request_opened(7))
    assert (request.job_type, request.dedup_key) == ("review-pr", "octo-org/app!7")
    assert request.payload == {"repo": "octo-org/app", "pr": 7, "branch": "fix-crash"}


def test_gitea_label_updated_matches_by_the_labels_the_issue_carries():
    gitea_rule = HookRuleSection(event="issues", action="label_updated", label="agent",
                                 job_type="dev-issue", dedup_key=DEV_ISSUE.dedup_key,
                                 payload=DEV_ISSUE.payload)
    [request] = match([gitea_rule], "issues", gitea_issue_label_updated(9))
    assert (request.dedup_key, request.payload) == ("team/app#9",
                                                    {"repo": "team/app", "issue": 9})
    unlabeled = gitea_issue_label_updated()
    unlabeled["issue"]["labels"] = [{"id": 1, "name": "bug"}]
    assert match([gitea_rule], "issues", unlabeled) == []


def test_when_filters_on_any_path_and_every_matching_rule_makes_a_job():
    only_app = HookRuleSection(event="pull_request", job_type="review-pr",
                               when={"repository.full_name": "octo-org/app",
                                     "pull_request.draft": "false"},
                               payload={"pr": "PR {pull_request.number} of {repository.name}"})
    other = HookRuleSection(event="pull_request", job_type="review-pr",
                            when={"repository.full_name": "octo-org/other"})
    requests = match([REVIEW_PR, only_app, other], "pull_request",
                     github_pull_request_opened(3))
    assert [r.payload.get("pr") for r in requests] == [3, "PR 3 of app"]
    assert requests[1].dedup_key is None
    missing_path = HookRuleSection(event="pull_request", job_type="review-pr",
                                   when={"pull_request.merged_by.login": "x"})
    assert match([missing_path], "pull_request", github_pull_request_opened()) == []


def test_a_matching_rule_that_reads_a_missing_path_refuses_the_delivery():
    event = github_issue_labeled()
    del event["repository"]
    with pytest.raises(Refused) as refused:
        match([DEV_ISSUE], "issues", event)
    assert refused.value.status == 422
    assert "rules.0.dedup_key" in refused.value.reason
    assert "repository.full_name" in refused.value.reason


def test_template_paths_are_dotted_paths_only():
    assert template_paths("{repository.full_name}#{issue.number}") == [
        "repository.full_name", "issue.number"]
    assert template_paths("{issue.labels.0.name} {{literal}}") == ["issue.labels.0.name"]
    for bad in ("{a[0]}", "{a!r}", "{a:>10}", "{}", "{0}", "{a..b}", "{", "}"):
        with pytest.raises(ValueError):
            template_paths(bad)


# -- config ----------------------------------------------------------------------------------

JOB_TYPES = """
[job_types.dev-issue]
command = ["echo", "issue", "{repo}", "{issue}"]
[job_types.review-pr]
command = ["echo", "review", "{repo}", "{pr}"]
"""


def source_rules(source: str, labeled: str) -> str:
    """An issue labeled `agent` -> dev-issue, a pull request opened -> review-pr."""
    return f"""
[[hooks.sources.{source}.rules]]
event = "issues"
action = "{labeled}"
label = "agent"
job_type = "dev-issue"
dedup_key = "{{repository.full_name}}#{{issue.number}}"
payload = {{ repo = "{{repository.full_name}}", issue = "{{issue.number}}" }}

[[hooks.sources.{source}.rules]]
event = "pull_request"
action = "opened"
job_type = "review-pr"
dedup_key = "{{repository.full_name}}!{{pull_request.number}}"
payload = {{ repo = "{{repository.full_name}}", pr = "{{pull_request.number}}" }}
"""


def hooks_config(github_secret: str = 'secret_env = "HERDER_HOOK_GITHUB_SECRET"',
                 gitea_secret: str = 'secret_file = "gitea.secret"', rules: str = "") -> str:
    return JOB_TYPES + f"""
[hooks]
retention = "48h"
max_body_bytes = 65536

[hooks.sources.github]
kind = "github"
{github_secret}
{source_rules("github", "labeled")}
[hooks.sources.gitea]
kind = "gitea"
{gitea_secret}
{source_rules("gitea", "label_updated")}
[hooks.sources.ci]
kind = "generic"
secret_env = "HERDER_HOOK_CI_SECRET"
{rules}
"""


def test_the_readme_shaped_config_loads(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text(hooks_config())
    hooks = load_config(path).settings.hooks
    assert hooks.retention == 48 * 3600
    assert hooks.sources["github"].rules[0].dedup_key == "{repository.full_name}#{issue.number}"
    assert [source.kind for source in hooks.sources.values()] == ["github", "gitea", "generic"]


@pytest.mark.parametrize(("change", "key", "words"), [
    ({"github_secret": 'secret = "hunter2"'}, "hooks.sources.github.secret",
     "does not belong in herder.toml"),
    ({"github_secret": ""}, "hooks.sources.github", "needs one secret"),
    ({"github_secret": 'secret_env = "A"\nsecret_file = "b"'}, "hooks.sources.github",
     "needs one secret"),
    ({"github_secret": 'secret_env = "not a name"'}, "hooks.sources.github.secret_env",
     "not a valid environment variable"),
    ({"rules": '[[hooks.sources.ci.rules]]\nevent = "x"\njob_type = "nope"'},
     "hooks.sources.ci.rules.0", "unknown job type 'nope'"),
    ({"rules": '[[hooks.sources.ci.rules]]\nevent = "x"\njob_type = "dev-issue"\n'
               'weight = "huge"'}, "hooks.sources.ci.rules.0", "unknown weight 'huge'"),
    ({"rules": '[[hooks.sources.ci.rules]]\nevent = "x"\njob_type = "dev-issue"\n'
               'dedup_key = "{a[0]}"'}, "hooks.sources.ci.rules.0.dedup_key",
     "not a dotted path"),
    ({"rules": '[[hooks.sources.ci.rules]]\nevent = "x"\njob_type = "dev-issue"\n'
               'payload = { a = "{b" }'}, "hooks.sources.ci.rules.0.payload",
     "bad template"),
])
def test_a_bad_hooks_config_is_refused_naming_the_key(tmp_path, change, key, words):
    path = tmp_path / "herder.toml"
    path.write_text(hooks_config(**change))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert key in str(refused.value) and words in str(refused.value), str(refused.value)
    assert "hunter2" not in str(refused.value)


def test_a_secret_variable_that_jobs_would_get_is_refused(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text('[runtime]\npass_env = ["FORGE_*"]\n' + hooks_config(
        github_secret='secret_env = "FORGE_SECRET"'))
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert "hooks.sources.github.secret_env" in str(refused.value)


def test_secrets_come_from_their_variable_or_file_or_the_server_does_not_start(tmp_path):
    path = tmp_path / "herder.toml"
    path.write_text(hooks_config())
    config = load_config(path)
    environ = {"HERDER_HOOK_GITHUB_SECRET": "gh-secret\n", "HERDER_HOOK_CI_SECRET": "ci"}
    with pytest.raises(InputError) as refused:
        hook_secrets(config, environ)
    assert refused.value.field == "hooks.sources.gitea.secret_file"
    write_secret(tmp_path / "gitea.secret", "")
    with pytest.raises(InputError, match="is empty"):
        hook_secrets(config, environ)
    write_secret(tmp_path / "gitea.secret", "gitea-secret\n")
    assert hook_secrets(config, environ) == {"github": b"gh-secret", "gitea": b"gitea-secret",
                                            "ci": b"ci"}
    with pytest.raises(InputError) as refused:
        hook_secrets(config, {**environ, "HERDER_HOOK_CI_SECRET": ""})
    assert refused.value.field == "hooks.sources.ci.secret_env"


def write_secret(path: Path, text: str) -> None:
    """A secret file as an operator must leave it: only its owner may read it."""
    path.write_text(text)
    path.chmod(0o600)


def test_a_secret_file_others_may_read_stops_the_start_naming_the_fix(tmp_path):
    """Group- or world-readable: refused, naming the file and `chmod 600`, the secret never
    echoed; the same file made private is read."""
    path = tmp_path / "herder.toml"
    path.write_text(hooks_config())
    config = load_config(path)
    environ = {"HERDER_HOOK_GITHUB_SECRET": "gh-secret", "HERDER_HOOK_CI_SECRET": "ci"}
    secret = tmp_path / "gitea.secret"
    for mode in (0o644, 0o640, 0o604):
        secret.write_text("gitea-secret-value\n")
        secret.chmod(mode)
        with pytest.raises(InputError) as refused:
            hook_secrets(config, environ)
        assert refused.value.field == "hooks.sources.gitea.secret_file"
        assert f"chmod 600 {secret}" in str(refused.value)
        assert f"mode {mode:04o}" in str(refused.value)
        assert "gitea-secret-value" not in str(refused.value)
    secret.chmod(0o600)
    assert hook_secrets(config, environ)["gitea"] == b"gitea-secret-value"


# -- the store -------------------------------------------------------------------------------


def spec(key: str | None) -> JobSpec:
    return JobSpec(command=("true",), job_type="dev-issue", dedup_key=key)


def test_a_delivery_is_recorded_with_its_jobs_once(store):
    first = store.delivery_record("github", "d-1", "issues", [spec("a#1"), spec(None)], NOW)
    assert first.first and len(first.job_ids) == 2 and first.created == first.job_ids
    replay = store.delivery_record("github", "d-1", "issues", [spec("a#1"), spec(None)], NOW)
    assert (replay.first, replay.job_ids, replay.created) == (False, first.job_ids, ())
    assert len(store.job_list()) == 2
    # Another source may use the same id; a new delivery of a held key makes no new job.
    other = store.delivery_record("gitea", "d-1", "issues", [spec("a#1")], NOW)
    assert other.first and other.job_ids == first.job_ids[:1] and other.created == ()
    assert len(store.job_list()) == 2
    event_kinds = [event.kind for event in store.event_list(first.job_ids[0])]
    assert event_kinds == ["submitted"]


def test_a_failing_insert_records_no_delivery(store):
    """The delivery row and the jobs commit together: a job the store refuses leaves the
    delivery unseen, so the forge's redelivery enqueues."""
    bad = JobSpec(command=("true",), job_type="dev-issue", priority=2**64)  # no column fits
    with pytest.raises(Exception):  # noqa: B017 - whatever the backend raises
        store.delivery_record("github", "d-2", "issues", [spec("b#1"), bad], NOW)
    assert store.job_list() == []
    again = store.delivery_record("github", "d-2", "issues", [spec("b#1")], NOW)
    assert again.first and len(again.created) == 1


def test_the_sweep_forgets_deliveries_past_their_retention(store):
    store.delivery_record("github", "old", "issues", [spec(None)], NOW - timedelta(days=8))
    store.delivery_record("github", "new", "issues", [spec(None)], NOW - timedelta(days=6))
    assert DeliverySweep(store, 7 * 86400.0).run_once(NOW) == {"forgotten": 1}
    assert DeliverySweep(store, 7 * 86400.0).run_once(NOW) == {"forgotten": 0}
    assert store.delivery_record("github", "old", "issues", [], NOW).first
    assert not store.delivery_record("github", "new", "issues", [], NOW).first


# -- through a real server -------------------------------------------------------------------

GITHUB_SECRET = "gh-Sekr1t-value"
GITEA_SECRET = "gitea-Sekr1t-value"
CI_SECRET = "ci-Sekr1t-value"


def start_hooks_server(make_fleet, tmp_path, store_url):
    fleet = make_fleet(tmp_path, store_url, extra=hooks_config() + """
[[hooks.sources.ci.rules]]
event = "deploy"
job_type = "dev-issue"
payload = { repo = "{repo}", issue = "{run}" }
""")
    write_secret(tmp_path / "gitea.secret", GITEA_SECRET + "\n")
    fleet.start_server(env={"HERDER_HOOK_GITHUB_SECRET": GITHUB_SECRET,
                            "HERDER_HOOK_CI_SECRET": CI_SECRET})
    return fleet


def post(fleet, source: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return fleet.api("POST", f"/hooks/{source}", token="", content=body, headers=headers)


def jobs_of(fleet) -> list[tuple[int, str, str | None, dict[str, Any]]]:
    return [(job.id, job.job_type, job.dedup_key, job.payload)
            for job in fleet.store.job_list()]


def test_forge_deliveries_through_a_real_server(make_fleet, tmp_path, store_url):
    fleet = start_hooks_server(make_fleet, tmp_path, store_url)
    gh = GITHUB_SECRET.encode()

    body = encode(github_ping())
    pong = post(fleet, "github", body, github_headers(body, "ping", "p-1", gh))
    assert (pong.status_code, pong.json()["outcome"]) == (200, "pong")

    body = encode(github_issue_labeled(42))
    headers = github_headers(body, "issues", "72d3162e-cc78-11e3-81ab-4c9367dc0958", gh)
    enqueued = post(fleet, "github", body, headers)
    assert enqueued.status_code == 202, enqueued.text
    assert enqueued.json()["outcome"] == "enqueued"
    [job_id] = enqueued.json()["created"]
    job = fleet.job(job_id)
    assert (job.job_type, job.dedup_key, job.payload) == (
        "dev-issue", "octo-org/app#42", {"repo": "octo-org/app", "issue": 42})
    assert job.command == ("echo", "issue", "octo-org/app", "42")
    assert job.status is JobStatus.QUEUED
    before = jobs_of(fleet)

    replay = post(fleet, "github", body, headers)
    assert (replay.status_code, replay.json()["outcome"], replay.json()["jobs"]) == (
        200, "duplicate", [job_id])
    # A new delivery of the same issue labeled again: its dedup key holds.
    again = post(fleet, "github", body, github_headers(body, "issues", "d-again", gh))
    assert (again.status_code, again.json()["jobs"], again.json()["created"]) == (
        202, [job_id], [])
    assert jobs_of(fleet) == before

    bad = {
        "bad signature": ("github", body, github_headers(body, "issues", "d-3", b"guess"), 401),
        "no signature": ("github", body, {k: v for k, v in headers.items()
                                          if k != "X-Hub-Signature-256"}, 401),
        "unknown source": ("gitlab", body, headers, 404),
        "oversized": ("github", b" " * 65536 + body,
                      github_headers(b" " * 65536 + body, "issues", "d-4", gh), 413),
        "malformed": ("github", body[:-1], github_headers(body[:-1], "issues", "d-5", gh), 400),
        "not an object": ("github", b"[]", github_headers(b"[]", "issues", "d-6", gh), 400),
        "no delivery id": ("github", body, {k: v for k, v in headers.items()
                                            if k != "X-GitHub-Delivery"}, 400),
    }
    for what, (source, sent, sent_headers, status) in bad.items():
        response = post(fleet, source, sent, sent_headers)
        assert response.status_code == status, (what, response.text)
        assert GITHUB_SECRET not in response.text
    assert jobs_of(fleet) == before

    ignored_body = encode({**github_issue_labeled(43), "action": "unlabeled"})
    ignored = post(fleet, "github", ignored_body,
                   github_headers(ignored_body, "issues", "d-7", gh))
    assert (ignored.status_code, ignored.json()["outcome"]) == (202, "ignored")
    push = post(fleet, "github", b'{"ref": "refs/heads/main"}',
                github_headers(b'{"ref": "refs/heads/main"}', "push", "d-8", gh))
    assert (push.status_code, push.json()["outcome"]) == (202, "ignored")
    assert jobs_of(fleet) == before

    pr = encode(github_pull_request_opened(7))
    reviewed = post(fleet, "github", pr, github_headers(pr, "pull_request", "d-9", gh))
    assert reviewed.status_code == 202, reviewed.text
    [review_id] = reviewed.json()["created"]
    assert fleet.job(review_id).payload == {"repo": "octo-org/app", "pr": 7}

    gitea = GITEA_SECRET.encode()
    labeled = encode(gitea_issue_label_updated(9))
    from_gitea = post(fleet, "gitea", labeled,
                      gitea_headers(labeled, "issues", "6f1c3e2a-0001", gitea))
    assert from_gitea.status_code == 202, from_gitea.text
    [gitea_job] = from_gitea.json()["created"]
    assert fleet.job(gitea_job).dedup_key == "team/app#9"
    pull = encode(gitea_pull_request_opened(12))
    gitea_pr = post(fleet, "gitea", pull, gitea_headers(pull, "pull_request", "6f1c-2", gitea))
    assert fleet.job(gitea_pr.json()["created"][0]).payload == {"repo": "team/app", "pr": 12}
    # Gitea's secret is not GitHub's: each source checks its own.
    crossed = post(fleet, "gitea", labeled, gitea_headers(labeled, "issues", "6f1c-3", gh))
    assert crossed.status_code == 401

    # A rule whose job type refuses the payload: 422 naming the field, nothing changed.
    before = jobs_of(fleet)
    deploy = b'{"repo": "r"}'
    refused = post(fleet, "ci", deploy, generic_headers(deploy, "deploy", "run-1",
                                                        CI_SECRET.encode()))
    assert refused.status_code == 422 and "run" in refused.text, refused.text
    deploy = b'{"repo": "r", "run": 5}'
    ci = post(fleet, "ci", deploy, generic_headers(deploy, "deploy", "run-1",
                                                   CI_SECRET.encode()))
    assert ci.status_code == 202, ci.text
    assert len(jobs_of(fleet)) == len(before) + 1

    log = fleet.stderr_of(fleet.server)
    assert "72d3162e-cc78-11e3-81ab-4c9367dc0958" in log and "duplicate" in log
    for secret in (GITHUB_SECRET, GITEA_SECRET, CI_SECRET):
        assert secret not in log
    assert headers["X-Hub-Signature-256"].removeprefix("sha256=") not in log


def test_concurrent_replays_enqueue_once(make_fleet, tmp_path, store_url):
    """The same delivery sent by many clients at once, with no dedup key on its rule: only
    the delivery record keeps it to one job."""
    fleet = start_hooks_server(make_fleet, tmp_path, store_url)
    body = b'{"repo": "r", "run": 1}'
    headers = generic_headers(body, "deploy", "run-77", CI_SECRET.encode())
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def send() -> None:
        with httpx.Client(base_url=fleet.url, timeout=30.0) as client:
            barrier.wait()
            response = client.post("/hooks/ci", content=body, headers=headers)
            outcomes.append(f"{response.status_code} {response.json()['outcome']}")

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["200 duplicate"] * 7 + ["202 enqueued"]
    assert len(fleet.store.job_list()) == 1


def test_the_server_refuses_to_start_without_a_secret(make_fleet, tmp_path, sqlite_url):
    fleet = make_fleet(tmp_path, sqlite_url, extra=hooks_config())
    write_secret(tmp_path / "gitea.secret", GITEA_SECRET)
    process = fleet.start_server(env={"HERDER_HOOK_CI_SECRET": CI_SECRET}, wait=False)
    assert fleet.wait_exit(process, 60, "herder server") == 2
    assert "HERDER_HOOK_GITHUB_SECRET is not set" in fleet.stderr_of(process)


def test_a_started_server_answers_hooks_while_it_schedules(make_fleet, tmp_path, store_url):
    """A delivery's job runs like any other: the scheduler is poked and places it."""
    fleet = start_hooks_server(make_fleet, tmp_path, store_url)
    fleet.add_host("alpha", "--ram", "16")
    fleet.start_agent("alpha")
    body = encode(github_issue_labeled(5))
    response = post(fleet, "github", body,
                    github_headers(body, "issues", "run-it", GITHUB_SECRET.encode()))
    [job_id] = response.json()["created"]
    wait_for(lambda: fleet.job(job_id).status is JobStatus.DONE, 60,
             f"job {job_id} to run", fleet.describe)


def test_hooks_answer_404_when_the_app_has_no_secret_for_a_source(tmp_path, monkeypatch):
    """A source configured but without a secret (an app built without one) accepts
    nothing: it fails closed."""
    from fastapi.testclient import TestClient

    from herder.api.app import create_app
    from herder.runtime.coordinator import Coordinator
    from herder.store import open_store

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "herder.toml"
    path.write_text(hooks_config())
    config: Config = load_config(path)
    with open_store(f"sqlite:///{tmp_path / 'h.db'}") as store:
        client = TestClient(create_app(Coordinator(store, config, host="s")))
        body = encode(github_issue_labeled())
        response = client.post("/hooks/github", content=body,
                               headers=github_headers(body, "issues", "d", b""))
        assert response.status_code == 404
        assert store.job_list() == []


def test_a_hostile_issue_title_from_a_signed_webhook_stays_text(tmp_path, monkeypatch):
    """Issue 23's attack end to end: a forge event whose issue title is `$(id>...)`, matched
    by a rule into a shell job type that writes it through an unquoted heredoc. The title
    reaches the script as $HERDER_P_TITLE; a real /bin/sh runs it and `id` never runs."""
    import subprocess

    from herder.services.intake import resolve

    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "pwned"
    path = tmp_path / "herder.toml"
    path.write_text("""
[job_types.triage]
shell = true
command = "cat <<EOF > note.md\\n# {title}\\nIssue {issue}\\nEOF"

[hooks.sources.github]
kind = "github"
secret_env = "HERDER_HOOK_GITHUB_SECRET"

[[hooks.sources.github.rules]]
event = "issues"
action = "labeled"
label = "agent"
job_type = "triage"
payload = { title = "{issue.title}", issue = "{issue.number}" }
""")
    config = load_config(path)
    event = github_issue_labeled(42)
    event["issue"]["title"] = f"$(id>{marker}) `id>{marker}` ${{IFS}}"
    [submitted] = match(config.settings.hooks.sources["github"].rules, "issues", event)
    spec = resolve(config, submitted)
    assert event["issue"]["title"] not in spec.command[2]
    subprocess.run(spec.command, cwd=tmp_path, check=True, timeout=30,
                   env={**spec.env, "PATH": "/usr/bin:/bin"})
    assert not marker.exists()
    assert (tmp_path / "note.md").read_text() == f"# {event['issue']['title']}\nIssue 42\n"


def test_a_captured_generic_delivery_does_not_replay_as_new(make_fleet, tmp_path, store_url):
    """Sent again as captured: a duplicate (nothing enqueued); with a new delivery id or an
    old timestamp: refused 401, nothing enqueued."""
    fleet = start_hooks_server(make_fleet, tmp_path, store_url)
    secret = CI_SECRET.encode()
    body = b'{"repo": "r", "run": 3}'
    captured = generic_headers(body, "deploy", "run-3", secret)
    first = post(fleet, "ci", body, captured)
    assert (first.status_code, first.json()["outcome"]) == (202, "enqueued"), first.text
    jobs = jobs_of(fleet)
    again = post(fleet, "ci", body, captured)
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    renamed = post(fleet, "ci", body, {**captured, "X-Herder-Delivery": "run-4"})
    assert renamed.status_code == 401, renamed.text
    stale = post(fleet, "ci", body, generic_headers(body, "deploy", "run-5", secret,
                                                     at=time.time() - REPLAY_WINDOW - 60))
    assert stale.status_code == 401 and "X-Herder-Timestamp".lower() in stale.text
    assert jobs_of(fleet) == jobs


def test_the_docs_openssl_example_signs_as_the_server_checks(tmp_path):
    """The webhooks page's shell lines for a generic delivery, run as written: the server takes
    their signature."""
    import re
    import subprocess
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "webhooks.md").read_text()
    block = re.search(r"```bash\n(body='.*?)\ncurl ", page, re.S)
    assert block is not None, "the webhooks page's generic example moved"
    script = block.group(1) + '\nprintf "%s\\n%s\\n%s\\n%s" "$ts" "$id" "$event" "$sig"\n'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                            env={"PATH": "/usr/bin:/bin", "HERDER_HOOK_CI_SECRET": "s3cret"})
    stamp, delivery, event, digest = result.stdout.split()
    body = re.search(r"body='(.*?)'", block.group(1)).group(1).encode()
    headers = {"X-Herder-Event": event, "X-Herder-Delivery": delivery,
               "X-Herder-Timestamp": stamp, "X-Herder-Signature": f"sha256={digest}"}
    assert verify("generic", b"s3cret", headers, body).delivery_id == delivery
