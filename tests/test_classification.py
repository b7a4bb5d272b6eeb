"""The log classifier on realistic tails of Claude Code, Codex CLI and aider runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from herder.core.model import Outcome
from herder.core.scheduling.classification import (
    DEFAULT_PATTERNS,
    SEED_EXIT_CODES,
    Pattern,
    classify,
    reset_time,
    retry_after_seconds,
    structured_result,
    verdict,
)

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)  # 11:00 in Berlin

CLAUDE_429 = """\
> Implementing the fix for issue #412
⏺ Read(src/app.py)
  ⎿  Read 120 lines
API Error: 429 {"type":"error","error":{"type":"rate_limit_error","message":"This request \
would exceed the rate limit for your organization of 40,000 input tokens per minute."}}
Retry-After: 120
"""

CLAUDE_OVERLOADED = """\
⏺ Bash(pytest -q)
  ⎿  12 passed
API Error: 529 {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}
"""

CLAUDE_USAGE_EPOCH = "Claude AI usage limit reached|1764590400\n"  # 2025-12-01 12:00 UTC

CLAUDE_USAGE_CLOCK = """\
⏺ Update(src/queue.py)
  ⎿  Updated src/queue.py with 4 additions
Claude usage limit reached. Your limit will reset at 3pm (Europe/Berlin).
"""

CLAUDE_FIVE_HOUR = "5-hour limit reached ∙ resets 7:30pm (Europe/Berlin)\n"

CLAUDE_REVOKED = """\
API Error: 401 {"type":"error","error":{"type":"authentication_error","message":"OAuth \
access token has been revoked."}} · Please run /login
"""

CODEX_USAGE = """\
[2026-12-01T09:58:12] codex
I'll start by reading the failing test.
[2026-12-01T09:58:40] ERROR: You've hit your usage limit. Upgrade to Pro \
(https://openai.com/chatgpt/pricing) or try again in 4 hours 12 minutes.
"""

CODEX_429 = """\
[2026-12-01T09:58:12] stream error: exceeded retry limit, last status: 429 Too Many \
Requests; retrying in 2.5s
"""

AIDER_RATE_LIMIT = """\
Tokens: 12k sent, 1.1k received. Cost: $0.05 message, $0.31 session.
litellm.RateLimitError: AnthropicException - {"type":"error","error":{"type":\
"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate \
limit"}}
The API provider has rate limited you. Try again later or check your quotas.
Retrying in 8.0 seconds...
"""

NODE_OOM = """\
<--- Last few GCs --->
FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory
"""

PLAIN_FAILURE = """\
============================= test session starts ==============================
FAILED tests/test_queue.py::test_claim - AssertionError: assert 2 == 1
1 failed, 41 passed in 3.20s
"""


def stream_json_result(**fields: object) -> str:
    result = {"type": "result", "subtype": "success", "is_error": False, "num_turns": 17,
              "total_cost_usd": 0.4213, "result": "Done: opened PR #88.", "session_id": "x"}
    result.update(fields)
    return ('{"type":"assistant","message":{"content":[{"type":"text","text":"hi"}]}}\n'
            + json.dumps(result) + "\n")


@pytest.mark.parametrize(("tail", "outcome", "retry_after"), [
    (CLAUDE_429, Outcome.TRANSIENT, 120.0),
    (CLAUDE_OVERLOADED, Outcome.TRANSIENT, None),
    (CODEX_429, Outcome.TRANSIENT, 2.5),
    (AIDER_RATE_LIMIT, Outcome.TRANSIENT, 8.0),
    (CLAUDE_REVOKED, Outcome.AUTH_REVOKED, None),
    (NODE_OOM, Outcome.OOM, None),
])
def test_each_form_is_named_with_its_wait(tail: str, outcome: Outcome,
                                          retry_after: float | None) -> None:
    found = classify(tail, NOW)
    assert (found.outcome, found.retry_after) == (outcome, retry_after)
    assert found.evidence and found.evidence in tail.replace("\\\n", "")


@pytest.mark.parametrize("line", [
    "API Error: 503 Service temporarily down", "HTTP 502", "status code 504",
    "Error: upstream 500"])
def test_a_status_number_counts_next_to_a_word_that_makes_it_one(line: str) -> None:
    assert classify(line, NOW).outcome is Outcome.TRANSIENT


@pytest.mark.parametrize("line", ["processed 503 files", "line 429: x = 1", "took 500 ms"])
def test_a_bare_number_is_no_outage(line: str) -> None:
    assert classify(line, NOW).outcome is None


def test_a_plain_failure_is_nothing_the_classifier_knows() -> None:
    found = classify(PLAIN_FAILURE, NOW)
    assert (found.outcome, found.evidence, found.retry_after) == (None, "", None)


def test_claude_s_epoch_usage_limit_gives_its_reset() -> None:
    now = datetime(2025, 12, 1, 9, 0, tzinfo=UTC)
    found = classify(CLAUDE_USAGE_EPOCH, now)
    assert found.outcome is Outcome.USAGE_BLOCKED
    assert found.resume_at == datetime(2025, 12, 1, 12, 0, tzinfo=UTC)


def test_a_reset_clock_time_in_a_named_zone_is_the_next_such_time() -> None:
    found = classify(CLAUDE_USAGE_CLOCK, NOW)
    assert found.outcome is Outcome.USAGE_BLOCKED
    assert found.resume_at == datetime(2026, 12, 1, 15, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    # Past 3pm in Berlin, it is tomorrow's 3pm.
    late = classify(CLAUDE_USAGE_CLOCK, NOW + timedelta(hours=6))
    assert late.resume_at == datetime(2026, 12, 2, 15, 0, tzinfo=ZoneInfo("Europe/Berlin"))


def test_claude_s_five_hour_limit_line() -> None:
    found = classify(CLAUDE_FIVE_HOUR, NOW)
    assert found.outcome is Outcome.USAGE_BLOCKED
    assert found.resume_at == datetime(2026, 12, 1, 19, 30, tzinfo=ZoneInfo("Europe/Berlin"))


def test_codex_s_usage_limit_gives_its_duration() -> None:
    found = classify(CODEX_USAGE, NOW)
    assert found.outcome is Outcome.USAGE_BLOCKED
    assert found.resume_at == NOW + timedelta(hours=4, minutes=12)


@pytest.mark.parametrize(("text", "expected"), [
    ("try again in 2 days 3 hours", timedelta(days=2, hours=3)),
    ("Try again in 4h 12m", timedelta(hours=4, minutes=12)),
    ("resets in 45 minutes", timedelta(minutes=45)),
    ("limit resets at 15:30", timedelta(hours=5, minutes=30)),  # now's zone: UTC
    ("limit resets at 9:15am", timedelta(hours=23, minutes=15)),
    ("resets 12am", timedelta(hours=14)),
    ("You've hit your weekly limit · resets Dec 3, 7:26pm (UTC)",
     timedelta(days=2, hours=9, minutes=26)),
    ("try again at 4:43 PM.", timedelta(hours=6, minutes=43)),  # Codex CLI, same day
    ("try again at Dec 4th, 2026 7:27 PM.", timedelta(days=3, hours=9, minutes=27)),
    (f'{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":'
     f'{int(NOW.timestamp()) + 7200}}}}}', timedelta(hours=2)),  # Claude's stream-json
])
def test_reset_time_forms(text: str, expected: timedelta) -> None:
    assert reset_time(text, NOW) == NOW + expected


@pytest.mark.parametrize("text", [
    "resets 3",  # a bare number is no time
    "resets at 25:00",
    "resets 13pm",
    "resets 3pm (Mars/Olympus_Mons)",
    "Claude AI usage limit reached|1000000000",  # in the past
    "try again in 30 days",  # implausibly far
    "resets Feb 30, 1pm (UTC)",  # no such day
    "try again at Dec 1st, 2026 9:00 AM",  # an hour ago
    "try again at Jan 5th, 2027 8:19 PM",  # a month away
    "nothing here",
])
def test_reset_time_refuses_what_is_no_plausible_time(text: str) -> None:
    assert reset_time(text, NOW) is None


def test_a_reset_date_without_a_year_is_the_next_such_date() -> None:
    new_year_s_eve = datetime(2026, 12, 30, 12, 0, tzinfo=UTC)
    assert reset_time("resets Jan 2, 10am (UTC)", new_year_s_eve) == datetime(
        2027, 1, 2, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("line", [
    "API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited",
    "litellm.RateLimitError: Rate limit reached for gpt-4.1 in organization org-x on tokens "
    "per min (TPM): Limit 30000, Used 29410. Please try again in 3.06s.",
    "* Quota exceeded for metric: generativelanguage.googleapis.com/"
    "generate_content_free_tier_requests, limit: 5, model: gemini-2.5-pro",
])
def test_a_rate_limit_in_a_usage_limit_s_words_is_transient(line: str) -> None:
    assert classify(line, NOW).outcome is Outcome.TRANSIENT


@pytest.mark.parametrize("line", [
    ">       assert response.status_code == 429",
    "E       AssertionError: upstream error 503 was not retried",
    "E        +  where True = <limits.RateLimiter object at 0x7f>.rate_limited",
    "FAILED tests/test_api.py::test_retry - AssertionError: HTTP 401 Unauthorized expected",
])
def test_a_failing_test_s_assertion_lines_are_no_outage(line: str) -> None:
    assert classify(line, NOW).outcome is None


@pytest.mark.parametrize(("line", "outcome"), [
    ("ERROR: unexpected status 401 Unauthorized: Incorrect API key provided: sk-x***.",
     Outcome.AUTH_REVOKED),
    ("ERROR: Codex ran out of room in the model's context window.", Outcome.FAILED),
    ("Prompt is too long · the request is ~215123 tokens (limit 200000)", Outcome.FAILED),
])
def test_the_clients_own_words(line: str, outcome: Outcome) -> None:
    found = classify(line, NOW)
    assert (found.outcome, found.evidence) == (outcome, line)


@pytest.mark.parametrize(("text", "seconds"), [
    ("Retry-After: 120", 120.0),
    ("retry-after-ms: 1500", 1.5),
    ('{"retry_after": 30}', 30.0),
    ("Retrying in 4.5 seconds...", 4.5),
    ("please retry after 2 minutes", 120.0),
    ("Retry-After: 10\nlater\nRetry-After: 60", 60.0),  # the last one stated
    ("no wait mentioned", None),
])
def test_retry_after_forms(text: str, seconds: float | None) -> None:
    assert retry_after_seconds(text) == seconds


def test_a_usage_limit_wins_over_the_429_that_carries_it() -> None:
    tail = ("API Error: 429 Too Many Requests\n"
            "Claude AI usage limit reached|1764597600\n")
    assert classify(tail, datetime(2025, 12, 1, 9, 0, tzinfo=UTC)).outcome is (
        Outcome.USAGE_BLOCKED)


def test_claude_s_structured_result_gives_cost_turns_and_its_text() -> None:
    found = classify(stream_json_result(), NOW)
    assert found.outcome is None
    assert (found.usage.cost_usd, found.usage.turns, found.usage.is_error,
            found.usage.subtype) == (0.4213, 17, False, "success")


def test_an_error_in_the_structured_result_text_is_classified() -> None:
    tail = stream_json_result(is_error=True, subtype="error_during_execution",
                              result="Claude AI usage limit reached|1764597600")
    found = classify(tail, datetime(2025, 12, 1, 9, 0, tzinfo=UTC))
    assert found.outcome is Outcome.USAGE_BLOCKED
    assert found.usage.is_error is True
    assert found.resume_at == datetime(2025, 12, 1, 14, 0, tzinfo=UTC)


@pytest.mark.parametrize("line", [
    '{"type": "result", "num_turns": -1, "total_cost_usd": "cheap", "is_error": "no"}',
    '{"type": "result", broken',
    '{"type": "assistant", "result": "x"}',
    '["result"]',
])
def test_malformed_structured_results_give_nothing_rather_than_a_guess(line: str) -> None:
    usage, _text = structured_result(line)
    assert (usage.cost_usd, usage.turns, usage.is_error) == (None, None, None)


def test_patterns_are_data_and_earlier_wins() -> None:
    mine = (Pattern.of("needs_heavier", r"needs more ram"), *DEFAULT_PATTERNS)
    found = classify("error: needs more RAM\nAPI Error: 429\n", NOW, mine)
    assert found.outcome is Outcome.NEEDS_HEAVIER
    assert classify("error: needs more RAM\n", NOW).outcome is None


def test_a_bad_pattern_names_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="not a regular expression"):
        Pattern.of("transient", "(unclosed")
    with pytest.raises(ValueError):
        Pattern.of("no_such_outcome", "x")


@given(st.text(max_size=2000))
def test_any_text_classifies_without_error(text: str) -> None:
    found = classify(text, NOW)
    if found.resume_at is not None:
        assert NOW < found.resume_at <= NOW + timedelta(days=8)
    if found.retry_after is not None:
        assert found.retry_after >= 0


# -- the verdict: which signal wins ------------------------------------------------------------

SEED = SEED_EXIT_CODES


def test_the_job_s_own_word_wins_over_exit_code_and_log() -> None:
    result = json.dumps({"outcome": "failed", "failure_reason": "mutex_collision",
                         "summary": "another worker holds issue #412", "cost_usd": 0.02})
    found = verdict(Outcome.FAILED, 5, CLAUDE_429, NOW, result, SEED)
    assert (found.outcome, found.source, found.failure_reason, found.cost_usd) == (
        Outcome.FAILED, "result", "mutex_collision", 0.02)
    assert found.evidence == "another worker holds issue #412"


def test_an_exit_code_the_map_names_wins_over_the_log() -> None:
    found = verdict(Outcome.FAILED, 4, CLAUDE_429, NOW, None, SEED)
    assert (found.outcome, found.source, found.evidence) == (
        Outcome.NEEDS_HEAVIER, "exit_code", "exit 4")
    usage = verdict(Outcome.FAILED, 5, CODEX_USAGE, NOW, None, SEED)
    assert (usage.outcome, usage.resume_at) == (Outcome.USAGE_BLOCKED,
                                                NOW + timedelta(hours=4, minutes=12))


def test_the_log_decides_a_plain_non_zero_exit() -> None:
    found = verdict(Outcome.FAILED, 1, CLAUDE_429, NOW, None, SEED)
    assert (found.outcome, found.source, found.retry_after) == (Outcome.TRANSIENT, "log", 120)
    plain = verdict(Outcome.FAILED, 1, PLAIN_FAILURE, NOW, None, SEED)
    assert (plain.outcome, plain.source) == (Outcome.FAILED, "runner")


def test_exit_0_is_done_even_when_the_log_met_a_rate_limit_on_the_way() -> None:
    found = verdict(Outcome.OK, 0, CLAUDE_429 + stream_json_result(), NOW, None, SEED)
    assert (found.outcome, found.cost_usd, found.turns) == (Outcome.OK, 0.4213, 17)


def test_herder_s_own_outcomes_stand_whatever_the_job_says() -> None:
    result = json.dumps({"outcome": "ok"})
    for ended in (Outcome.TIMEOUT, Outcome.CANCELLED, Outcome.LOST, Outcome.STUCK):
        assert verdict(ended, None, CLAUDE_429, NOW, result, SEED).outcome is ended


def test_without_a_map_an_exit_code_means_nothing_special() -> None:
    assert verdict(Outcome.FAILED, 4, PLAIN_FAILURE, NOW, None, {}).outcome is Outcome.FAILED


@pytest.mark.parametrize(("text", "problem"), [
    ("not json", "result: Invalid JSON"),
    ('{"outcome": "ok", "colour": "red"}', "colour: Extra inputs are not permitted"),
    ('{"outcome": "lost"}', "outcome: Value error, lost is herder's to say"),
    ('{"failure_reason": "Has Spaces"}', "failure_reason: String should match pattern"),
    ('{"resume_at": "2026-12-01T15:00:00"}', "resume_at: Value error, give a timezone"),
    ('{"cost_usd": -1}', "cost_usd: Input should be greater than or equal to 0"),
    ('"x" ' + " " * 70_000, "larger than 65536 bytes"),
])
def test_a_bad_result_is_recorded_as_such_and_ignored(text: str, problem: str) -> None:
    found = verdict(Outcome.FAILED, 1, CLAUDE_429, NOW, text, SEED)
    assert found.result is None and found.result_error is not None
    assert found.result_error.startswith(problem), found.result_error
    assert found.outcome is Outcome.TRANSIENT  # decided as if there were none


def test_an_empty_or_missing_result_is_no_result() -> None:
    for text in (None, "", "  \n"):
        found = verdict(Outcome.OK, 0, "", NOW, text, SEED)
        assert (found.result, found.result_error) == (None, None)
