"""What an attempt's log says about how it ended: a rate limit, a usage quota with its reset
time, a revoked login, memory, or nothing herder knows.

AI agent CLIs end in many ways that an exit code does not tell apart (beyond the launch
wrapper's exit codes): a 429 must wait and retry on its own budget, a
usage limit must wait until its reset, a revoked login needs a human. The classifier reads
the tail of the log (16 KB: where a CLI prints why it stopped) and, where the agent printed
one, its structured result (Claude Code's `--output-format json` / `stream-json` result
line), and names the outcome with what it found. Pure: the clock is passed in, the patterns
are data a job type may extend or replace.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from msgspec.structs import replace
from pydantic import ValidationError

from herder.core.job_result import JobResult
from herder.core.model import Outcome

TAIL_BYTES = 16 * 1024
"""How much of the log's end is read: enough for a CLI's last error, bounded for a huge log."""
RESULT_BYTES = 64 * 1024
"""The most of `$HERDER_RESULT` that is read; a bigger file is not a result."""

SEED_EXIT_CODES: Mapping[int, Outcome] = {
    2: Outcome.OOM,
    3: Outcome.RAM_CONTENTION,
    4: Outcome.NEEDS_HEAVIER,
    5: Outcome.USAGE_BLOCKED,
    6: Outcome.WORKSPACE_FAILED,
    7: Outcome.AUTH_REVOKED,
    8: Outcome.NO_HEALTHY_ACCOUNT,
}
"""The exit-code contract of the wrapper that launches an agent: a job type's
default `exit_codes` (a job type sets `exit_codes = {}` for a program that means something
else by them)."""

DECIDES = frozenset({Outcome.OK, Outcome.FAILED})
"""The runner's own outcomes that the job's word, its exit code and its log may refine;
the others (timeout, cancel, lost, stuck ...) are herder's knowledge and stand."""

SUCCESS_LOG_OUTCOMES = frozenset({Outcome.USAGE_BLOCKED, Outcome.AUTH_REVOKED})
"""What the log of an attempt that exited 0 may still say, for a job type with
`log_on_success`: no retry inside the client cures these, while a 429 or a 5xx it printed
may have been retried and recovered from."""

MAX_WAIT = timedelta(days=8)
"""A reset further away than this is not believed (a weekly quota is the longest known)."""


class Pattern(msgspec.Struct, frozen=True):
    """A log line that means `outcome`; earlier patterns win over later ones."""

    outcome: Outcome
    regex: re.Pattern[str]

    @classmethod
    def of(cls, outcome: Outcome | str, expression: str) -> Pattern:
        """A case-insensitive pattern; raises ValueError naming what is wrong."""
        try:
            regex = re.compile(expression, re.IGNORECASE)
        except re.error as exc:
            raise ValueError(f"{expression!r} is not a regular expression: {exc}") from None
        return cls(Outcome(outcome), regex)


_NOT_ASSERTION = r"^(?!\s*[E>]\s{2}|.*\bassert)"
"""Guards a pattern against a failing test's own lines (`assert response.status_code ==
429`, `AssertionError: upstream error 503 ...`, pytest's `E   ... .rate_limited` and `>`
source lines): a test suite's failure is no outage."""


def _defaults() -> tuple[Pattern, ...]:
    auth = Outcome.AUTH_REVOKED
    usage = Outcome.USAGE_BLOCKED
    memory = Outcome.OOM
    transient = Outcome.TRANSIENT
    failed = Outcome.FAILED
    guard = _NOT_ASSERTION
    # The words are the clients' own, recorded from Claude Code, Codex CLI, Gemini CLI and
    # aider against stand-ins of their APIs (tests/fixtures/clients/README.md).
    return tuple(Pattern.of(outcome, expression) for outcome, expression in (
        # A login or key only a human can renew (the wrapper's exit 7, spawn_oauth_expired).
        (auth, r"oauth (access )?token (has been|was) revoked"),
        (auth, r"invalid (x-)?api[ -_]?key|authentication_error|invalid bearer token"),
        (auth, r"please run /login|not logged in|login required|token (has )?expired"),
        (auth, r"incorrect api key|api key not valid|api_key_invalid|failed to authenticate"),
        (auth, r"authenticationerror|not able to authenticate you|permission_(error|denied)"),
        (auth, r"does not have access to model|belongs to a disabled organization"),
        (auth, r"log out and sign in again|refresh token was (revoked|already used)"),
        (auth, r"(missing environment variable|must specify the)\W+\w*(api_key|token)\b"),
        (auth, guard + r".*\b(401\W{1,3}unauthorized|403\W{1,3}forbidden)\b"),
        # A quota with a reset time (exit 5): Claude Code, Codex CLI, the API's own words.
        # Gemini's daily quota first: its per-minute one (below) shares the API's words.
        (usage, r"exhausted your daily quota|quotaid\W+\w*(perday|daily)"),
        # Google's per-minute quota, which Gemini CLI retries itself ("Please retry in
        # 1.2s"): a rate limit in a quota's words.
        (transient, r"quota exceeded for metric"),
        # Not Claude Code's "Server is temporarily limiting requests (not your usage
        # limit)" nor OpenAI's per-minute "Rate limit reached for gpt-5 ...".
        (usage, r"(?<!not your )usage limit|(?<!rate )limit reached"),
        (usage, r"(hit|reached) your (?!rate )(\w+ ){0,2}limit"),
        (usage, r"quota (exceeded|reached)|insufficient_quota|exceeded your current quota"),
        (usage, r"credit balance is too low|out of (extra )?(usage|credits)\b"),
        (usage, r"usage allocation has been disabled"),
        (usage, r"check your plan and billing details"),
        # Memory.
        (memory, r"out of memory|heap out of memory|memoryerror|cannot allocate memory"),
        (memory, r"oom[- ]?killed|killed process \d+ .*oom"),
        # The conversation outgrew the model's context window: no other weight or account
        # has a bigger one, so the attempt failed (retried on `max_attempts`, actionable),
        # with the line that says so as its evidence.
        (failed, r"prompt is too long|context_length_exceeded|maximum context length"),
        (failed, r"(exceeds|out of room in) the (model's )?context window"),
        (failed, r"input token count \(\d+\) exceeds the maximum|has hit a token limit"),
        # Worth another try after a while (429/rate limit/overloaded/503/529).
        # A bare status number only next to a word that makes it one ("processed 503 files"
        # is no outage).
        (transient, guard + r".*(error|status|http|code)\W{0,3}(\w+\W{1,3}){0,2}"
                            r"\b(429|50[0234]|529)\b"),
        (transient, guard + r".*(too many requests|rate[ _-]?limit(ed)?\b|ratelimiterror"
                            r"|overloaded)"),
        (transient, r"service unavailable|bad gateway|gateway timeout|internal server error"),
        (transient, r"econnreset|etimedout|econnrefused|connection (reset|refused|error)"),
        (transient, r"network error|temporarily unavailable|apiconnectionerror|api_error"),
        (transient, r"request timed out|resource[ _]exhausted|resource has been exhausted"),
        (transient, r"temporarily limiting requests"),
    ))


DEFAULT_PATTERNS: tuple[Pattern, ...] = _defaults()


class Usage(msgspec.Struct, frozen=True):
    """What the agent's structured result says it cost."""

    cost_usd: float | None = None
    turns: int | None = None
    is_error: bool | None = None
    subtype: str | None = None


class Classification(msgspec.Struct, frozen=True):
    """The log's verdict. `outcome` is None when nothing herder knows was found."""

    outcome: Outcome | None
    evidence: str = ""
    """The line that decided it (cut to 200 characters), for `herder show` and the event."""
    retry_after: float | None = None
    """Seconds the log asked to wait (Retry-After and its kin)."""
    resume_at: datetime | None = None
    """When a usage quota resets, if the log said."""
    usage: Usage = Usage()


def classify(tail: str, now: datetime,
             patterns: Sequence[Pattern] = DEFAULT_PATTERNS) -> Classification:
    """The outcome the log's tail shows, by the first pattern in `patterns` order that any
    line matches, and the waits and costs it states. `now` must be timezone-aware."""
    usage, result_text = structured_result(tail)
    text = tail if result_text is None else f"{tail}\n{result_text}"
    lines = text.splitlines()
    outcome: Outcome | None = None
    evidence = ""
    for pattern in patterns:
        line = next((line for line in reversed(lines) if pattern.regex.search(line)), None)
        if line is not None:
            outcome, evidence = pattern.outcome, line.strip()[:200]
            break
    retry_after = retry_after_seconds(text)
    resume_at = reset_time(text, now) if outcome is Outcome.USAGE_BLOCKED else None
    return Classification(outcome, evidence, retry_after, resume_at, usage)


def structured_result(tail: str) -> tuple[Usage, str | None]:
    """The last Claude-Code-style result object in the tail (`{"type": "result", ...}`, one
    per line in stream-json, the whole output in json), with its text; malformed lines are
    skipped."""
    for raw in reversed(tail.splitlines()):
        line = raw.strip()
        if not (line.startswith("{") and line.endswith("}") and '"result"' in line):
            continue
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if not isinstance(value, dict) or value.get("type") != "result":
            continue
        return Usage(
            cost_usd=_number(value.get("total_cost_usd", value.get("cost_usd"))),
            turns=_integer(value.get("num_turns")),
            is_error=value.get("is_error") if isinstance(value.get("is_error"), bool) else None,
            subtype=value.get("subtype") if isinstance(value.get("subtype"), str) else None,
        ), value.get("result") if isinstance(value.get("result"), str) else None
    return Usage(), None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value >= 0 else None


def _integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 0 else None


_WAIT = r"(?P<value>\d+(\.\d+)?)\s*(?P<unit>ms|s|sec|seconds?|m|min|minutes?)"
_RETRY_AFTER = re.compile(r"retry[-_ ]after(?P<ms>[-_]ms)?\"?\s*[:=]?\s*\"?" + _WAIT + r"?\b",
                          re.IGNORECASE)
_RETRY_IN = re.compile(r"(?:retry(?:ing)?|try again)\s+in\s+" + _WAIT + r"\b", re.IGNORECASE)


def retry_after_seconds(text: str) -> float | None:
    """The last wait the text asks for, in seconds: `Retry-After: 120`, `retry-after-ms:
    500`, `"retry_after": 30`, `retrying in 4.5 seconds`."""
    found: float | None = None
    for match in _RETRY_AFTER.finditer(text):
        unit = (match.group("unit") or ("ms" if match.group("ms") else "s")).lower()
        found = _seconds(float(match.group("value")), unit)
    if found is None:
        for match in _RETRY_IN.finditer(text):
            found = _seconds(float(match.group("value")), match.group("unit").lower())
    return found


def _seconds(value: float, unit: str) -> float:
    if unit == "ms":
        return value / 1000
    if unit.startswith("m"):
        return value * 60
    return value


_EPOCH = re.compile(r"(?:limit reached\||\"resetsAt\"\s*:\s*)(?P<epoch>\d{10})\b", re.IGNORECASE)
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_RESETS_AT = re.compile(
    r"(?:resets?|try again)\s+(?:at\s+)?"
    r"(?:(?P<month>" + "|".join(_MONTHS) + r")[a-z]*\.?\s+(?P<day>\d{1,2})(?:st|nd|rd|th)?"
    r",?\s+(?:(?P<year>\d{4})\s+)?(?:at\s+)?)?"
    r"(?P<hour>\d{1,2})(?::(?P<minute>\d{2}))?\s*(?P<half>am|pm)?"
    r"(?:\s*\((?P<zone>[A-Za-z_]+(?:/[A-Za-z_+-]+)*)\))?", re.IGNORECASE)
_DURATION = re.compile(
    r"(?:try again|resets?|available again)\s+in\s+(?P<parts>(?:\d+\s*(?:days?|d|hours?|h|"
    r"minutes?|mins?|m|seconds?|secs?|s)\b[\s,]*(?:and\s+)?)+)", re.IGNORECASE)
_DURATION_PART = re.compile(r"(\d+)\s*(days?|d|hours?|h|minutes?|mins?|m|seconds?|secs?|s)\b",
                            re.IGNORECASE)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def reset_time(text: str, now: datetime) -> datetime | None:
    """When a usage limit the text reports resets, in the forms agents print it:
    `Claude AI usage limit reached|1750000000`, `"resetsAt":1750000000` (Claude Code's
    stream-json), `resets 3pm (Europe/Berlin)`, `resets Dec 8, 7:26pm (UTC)`, `resets at
    15:30`, `try again at 4:43 PM`, `try again at Dec 8th, 2026 7:27 PM` (Codex CLI), `try
    again in 4h 12m`, `try again in 2 days 3 hours`. The last one stated wins; None when none
    is stated or it is in the past or implausibly far. A clock time without a zone is read
    in now's zone (the agent prints its host's local time)."""
    found: list[tuple[int, datetime]] = []
    for match in _EPOCH.finditer(text):
        found.append((match.start(), datetime.fromtimestamp(int(match["epoch"]), now.tzinfo)))
    for match in _RESETS_AT.finditer(text):
        at = _clock_time(match, now)
        if at is not None:
            found.append((match.start(), at))
    for match in _DURATION.finditer(text):
        seconds = sum(int(number) * _UNIT_SECONDS[unit[0].lower()]
                      for number, unit in _DURATION_PART.findall(match["parts"]))
        found.append((match.start(), now + timedelta(seconds=seconds)))
    for _, at in sorted(found, key=lambda item: item[0], reverse=True):
        if now < at <= now + MAX_WAIT:
            return at
    return None


def _clock_time(match: re.Match[str], now: datetime) -> datetime | None:
    """The time the match names in its zone (else now's zone): on its date where it gives
    one (the next such date when it gives no year), else the next time the clock shows it."""
    hour, minute = int(match["hour"]), int(match["minute"] or 0)
    half = (match["half"] or "").lower()
    if half:
        if not 1 <= hour <= 12:
            return None
        hour = hour % 12 + (12 if half == "pm" else 0)
    elif match["minute"] is None:
        return None  # a bare number ("resets 3") is not a time
    if hour > 23 or minute > 59:
        return None
    zone = now.tzinfo
    if match["zone"]:
        try:
            zone = ZoneInfo(match["zone"])
        except (ZoneInfoNotFoundError, ValueError):
            return None
    local = now.astimezone(zone)
    if match["month"]:
        month = _MONTHS.index(match["month"][:3].lower()) + 1
        years = [int(match["year"])] if match["year"] else [local.year, local.year + 1]
        for year in years:
            try:
                at = local.replace(year=year, month=month, day=int(match["day"]), hour=hour,
                                   minute=minute, second=0, microsecond=0)
            except ValueError:
                return None  # no such day
            if at > local:
                return at
        return None
    at = local.replace(hour=hour, minute=minute, second=0, microsecond=0)
    if at <= local:
        at += timedelta(days=1)
    return at


class Verdict(msgspec.Struct, frozen=True):
    """How an attempt ended, all signals weighed (`verdict`)."""

    outcome: Outcome
    source: str
    """What decided: "result" ($HERDER_RESULT), "exit_code", "log" or "runner"."""
    evidence: str = ""
    retry_after: float | None = None
    resume_at: datetime | None = None
    failure_reason: str | None = None
    """The job's own reason ($HERDER_RESULT), recorded instead of the policy's."""
    cost_usd: float | None = None
    turns: int | None = None
    result: JobResult | None = None
    result_error: str | None = None
    """Why $HERDER_RESULT was ignored for the decision (not JSON, unknown fields ...)."""

    def report(self) -> dict[str, object]:
        """What the attempt's `finished` event records of it (what is known only)."""
        values: dict[str, object] = {
            "source": self.source, "evidence": self.evidence or None,
            "retry_after": self.retry_after,
            "resume_at": self.resume_at.isoformat() if self.resume_at else None,
            "cost_usd": self.cost_usd, "turns": self.turns,
            "result": self.result.model_dump(mode="json", exclude_none=True)
            if self.result else None,
            "result_error": self.result_error}
        return {key: value for key, value in values.items() if value is not None}


def read_result(text: str | None) -> tuple[JobResult | None, str | None]:
    """The job's $HERDER_RESULT and, when it cannot be used, why (never raises)."""
    if text is None or not text.strip():
        return None, None
    if len(text) > RESULT_BYTES:
        return None, f"larger than {RESULT_BYTES} bytes"
    try:
        return JobResult.model_validate_json(text), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "result"
        return None, f"{where}: {first['msg']}"[:300]


def verdict(ended: Outcome, exit_code: int | None, tail: str, now: datetime,
            result_text: str | None = None,
            exit_codes: Mapping[int, Outcome] | None = None,
            patterns: Sequence[Pattern] = DEFAULT_PATTERNS,
            log_on_success: bool = False) -> Verdict:
    """The outcome of an attempt the runner saw end as `ended`. Which signal wins: the
    job's own `$HERDER_RESULT`, then an exit code the job type's map names, then the log's
    patterns (only for a non-zero exit: a job that retried a 429 and succeeded is done;
    with `log_on_success`, a usage limit or revoked login also after exit 0), then the
    runner's plain ok or failed."""
    result, result_error = read_result(result_text)
    found = classify(tail, now, patterns)
    cost = result.cost_usd if result and result.cost_usd is not None else found.usage.cost_usd
    turns = result.turns if result and result.turns is not None else found.usage.turns
    base = Verdict(ended, "runner", retry_after=found.retry_after, cost_usd=cost, turns=turns,
                   result=result, result_error=result_error,
                   failure_reason=result.failure_reason if result else None)
    if ended not in DECIDES:
        return base
    if result is not None and result.outcome is not None:
        resume_at = result.resume_at or (found.resume_at
                                         if result.outcome is Outcome.USAGE_BLOCKED else None)
        return replace(base, outcome=result.outcome, source="result",
                       evidence=(result.summary or "")[:200],
                       retry_after=result.retry_after if result.retry_after is not None
                       else found.retry_after, resume_at=resume_at)
    if ended is Outcome.OK:
        if log_on_success and found.outcome in SUCCESS_LOG_OUTCOMES:
            return replace(base, outcome=found.outcome, source="log", evidence=found.evidence,
                           resume_at=found.resume_at)
        return base
    mapped = (exit_codes or {}).get(exit_code) if exit_code is not None else None
    if mapped is not None:
        return replace(base, outcome=mapped, source="exit_code", evidence=f"exit {exit_code}",
                       resume_at=found.resume_at if mapped is Outcome.USAGE_BLOCKED else None)
    if found.outcome is not None:
        return replace(base, outcome=found.outcome, source="log", evidence=found.evidence,
                       resume_at=found.resume_at)
    return base
