"""A job type's own outcome rules and log patterns in herder.toml: applied over the
defaults, and refused at start, naming the key, when they could not work."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from herder.core.errors import ConfigError
from herder.core.model import Job, JobStatus, Outcome
from herder.core.settings.loading import load_config
from herder.runtime.endings import Ending, OutcomeRules, PolicyLimits, decide_for

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def limits_for(tmp_path: Path, job_types: str) -> PolicyLimits:
    (tmp_path / "herder.toml").write_text(job_types)
    return PolicyLimits.from_settings(load_config(tmp_path / "herder.toml").settings)


def a_job(job_type: str) -> Job:
    return Job(7, job_type, ("claude",), False, {}, 10, "light", None, None, NOW, 3, None, {},
               None, 10.0, 600.0, JobStatus.RUNNING, 1, 0, 0, "h1", None, None, False, NOW,
               NOW, NOW, None, NOW)


def test_a_job_type_s_rule_overrides_the_default_and_others_keep_it(tmp_path: Path):
    limits = limits_for(tmp_path, """\
[job_types.strict]
command = ["claude"]
policy.failed = { action = "fail" }
policy.transient = { delay = "30s", delay_max = "30s", failure_reason = "api_weather" }

[job_types.plain]
command = ["claude"]
""")
    failed = decide_for(a_job("strict"), Outcome.FAILED, NOW, limits, exit_code=1)
    assert (failed.decision.status, failed.decision.failure_reason) == (
        JobStatus.FAILED, "implementation_error")
    weather = decide_for(a_job("strict"), Outcome.TRANSIENT, NOW, limits)
    assert (weather.decision.failure_reason,
            (weather.decision.available_at - NOW).total_seconds()) == ("api_weather", 30.0)
    plain = decide_for(a_job("plain"), Outcome.FAILED, NOW, limits, exit_code=1)
    assert plain.decision.status is JobStatus.QUEUED


def test_a_job_type_s_patterns_come_first_or_replace_the_defaults(tmp_path: Path):
    limits = limits_for(tmp_path, """\
[job_types.mine]
command = ["claude"]
patterns = [{ outcome = "needs_heavier", regex = "needs more RAM" }]

[job_types.only]
command = ["claude"]
replace_patterns = true
patterns = [{ outcome = "transient", regex = "flaky upstream" }]
""")
    tail = "error: needs more RAM\nAPI Error: 429 Too Many Requests\n"
    assert decide_for(a_job("mine"), Outcome.FAILED, NOW, limits, ending=Ending(tail),
                      exit_code=1).outcome is Outcome.NEEDS_HEAVIER
    # Replaced: the default 429 pattern is gone for this type.
    assert decide_for(a_job("only"), Outcome.FAILED, NOW, limits, ending=Ending(tail),
                      exit_code=1).outcome is Outcome.FAILED
    assert decide_for(a_job("only"), Outcome.FAILED, NOW, limits,
                      ending=Ending("flaky upstream\n"), exit_code=1).outcome is (
        Outcome.TRANSIENT)


@pytest.mark.parametrize(("text", "problem"), [
    ('policy.exploded = { action = "fail" }', "job_types.t.policy: 'exploded' is not an outcome"),
    ('policy.failed = { action = "explode" }',
     "job_types.t.policy.failed.action: 'explode': use one of done, retry"),
    ('policy.failed = { spends = "karma" }', "job_types.t.policy.failed.spends: 'karma'"),
    ('patterns = [{ outcome = "lost", regex = "x" }]', "job_types.t.patterns.0.outcome"),
    ('patterns = [{ outcome = "transient", regex = "(" }]',
     "job_types.t.patterns.0.regex: '(' is not a regular expression"),
])
def test_a_bad_rule_or_pattern_is_refused_at_load_naming_the_key(tmp_path: Path, text: str,
                                                               problem: str):
    (tmp_path / "herder.toml").write_text(f'[job_types.t]\ncommand = ["claude"]\n{text}\n')
    with pytest.raises(ConfigError, match=re.escape(problem)):
        load_config(tmp_path / "herder.toml")


def test_a_rule_that_could_loop_forever_is_refused_at_start(tmp_path: Path):
    (tmp_path / "herder.toml").write_text(
        '[job_types.t]\ncommand = ["claude"]\n'
        'policy.usage_blocked = { action = "retry", delay = "0s" }\n')
    settings = load_config(tmp_path / "herder.toml").settings  # the shape is fine
    with pytest.raises(ConfigError, match=re.escape(
            "job_types.t.policy.usage_blocked: a retry that spends no budget must wait")):
        OutcomeRules.from_settings(settings)


def test_the_transient_budget_is_a_setting_per_job_type(tmp_path: Path):
    """Seed 002's `transient_max_attempts`: [defaults] max_transient_attempts, and a job
    type's own."""
    from msgspec.structs import replace

    limits = limits_for(tmp_path, """\
[defaults]
max_transient_attempts = 2

[job_types.patient]
command = ["claude"]
max_transient_attempts = 4

[job_types.plain]
command = ["claude"]
""")

    def after(job_type: str, transient: int) -> JobStatus:
        job = replace(a_job(job_type), transient_attempts=transient)
        return decide_for(job, Outcome.TRANSIENT, NOW, limits).decision.status

    assert after("plain", 0) is JobStatus.QUEUED
    assert after("plain", 1) is JobStatus.FAILED  # its 2nd transient outcome: budget spent
    assert after("patient", 2) is JobStatus.QUEUED
    assert after("patient", 3) is JobStatus.FAILED
    assert OutcomeRules().transient_budget("any") == 5  # seed 002's default
