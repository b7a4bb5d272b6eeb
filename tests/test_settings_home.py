"""Every default lives in herder.core.settings: the runtime's options and the pure core's
parameters come from the settings, and their own defaults are the settings' defaults."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from herder.core.fleet import Fleet
from herder.core.model import JobSpec, JobStatus, Outcome
from herder.core.scheduling.capacity import DEFAULT_WEIGHTS, Shedding, WindowSchedule, bookable_gb
from herder.core.scheduling.health import HealthThresholds, Liveness
from herder.core.scheduling.placement import PlacementPolicy
from herder.core.scheduling.policy import RetryState, decide
from herder.core.settings.loading import load_config
from herder.core.settings.sections import Settings
from herder.runtime.endings import OutcomeRules, PolicyLimits
from herder.runtime.runner import Runner
from herder.runtime.runner_options import RunnerOptions
from herder.runtime.sources import ClaimSource
from herder.store import open_store

HERDER = Path(__file__).resolve().parent.parent / "herder"

CONFIG = """
[runtime]
concurrency = 3
heartbeat_interval = "4s"
attempt_lease = "40s"
kill_grace = "3s"
poll_interval = "0.5s"
max_lost = 7
pass_env = ["OPENAI_API_KEY"]
fence_margin = "9s"

[fleet]
max_spawn_failures = 2
spawn_backoff = "7s"
"""


def test_runner_options_carry_every_runtime_and_spawn_setting(tmp_path):
    (tmp_path / "herder.toml").write_text(CONFIG)
    settings = load_config(tmp_path / "herder.toml").settings
    options = RunnerOptions.from_settings(settings, "here", tmp_path)
    runtime = options.runtime
    assert (runtime.concurrency, runtime.heartbeat_interval, runtime.attempt_lease,
            runtime.kill_grace, runtime.poll_interval, runtime.max_lost, runtime.pass_env,
            runtime.fence_margin) == (3, 4.0, 40.0, 3.0, 0.5, 7, ["OPENAI_API_KEY"], 9.0)
    assert (options.runtime, options.fleet) == (settings.runtime, settings.fleet)
    assert options.limits == PolicyLimits(7, 2, 7.0, OutcomeRules.from_settings(settings)) == (
        PolicyLimits.from_settings(settings))
    overridden = RunnerOptions.from_settings(settings, "here", tmp_path, concurrency=1,
                                             attempt_lease=90.0, poll_interval=0.2,
                                             exit_when_idle=True, drain_timeout=5.0)
    assert (overridden.runtime.concurrency, overridden.runtime.attempt_lease,
            overridden.runtime.poll_interval, overridden.exit_when_idle,
            overridden.drain_timeout) == (1, 90.0, 0.2, True, 5.0)


def test_herder_ups_runner_spends_spawn_failures_as_the_config_says(tmp_path):
    """`herder up` claims from the store: its ClaimSource decides with [fleet]
    max_spawn_failures and spawn_backoff (it used the built-in 5 and 300 s before)."""
    (tmp_path / "herder.toml").write_text(CONFIG)
    settings = load_config(tmp_path / "herder.toml").settings
    with open_store(f"sqlite:///{tmp_path / 'herder.db'}") as store:
        runner = Runner(store, RunnerOptions.from_settings(settings, "here", tmp_path))
        assert isinstance(runner.source, ClaimSource)
        limits = runner.source.limits
    now = datetime(2026, 1, 1, tzinfo=UTC)
    state = RetryState(failures=0, lost=0, max_attempts=3, backoff_base_seconds=10.0,
                       backoff_max_seconds=600.0, spawn_failures=0)
    first = decide(Outcome.SPAWN_FAILED, state, now, limits.max_lost,
                   max_spawn_failures=limits.max_spawn_failures,
                   spawn_backoff_seconds=limits.spawn_backoff_seconds)
    assert (first.status, first.available_at) == (JobStatus.QUEUED, now + timedelta(seconds=7))
    second = decide(Outcome.SPAWN_FAILED, msgspec.structs.replace(state, spawn_failures=1), now,
                    limits.max_lost, max_spawn_failures=limits.max_spawn_failures,
                    spawn_backoff_seconds=limits.spawn_backoff_seconds)
    assert second.status is JobStatus.FAILED


def test_runner_options_are_built_from_settings_in_one_place():
    """`herder up`, `herder agent` and `run-attempt` (the server's local hosts are served
    by `herder agent` children) all call RunnerOptions.from_settings; nothing else spells
    the options out."""
    builders = sorted(str(path.relative_to(HERDER.parent)) for path in HERDER.rglob("*.py")
                      if re.search(r"(?<!class )\bRunnerOptions\(", path.read_text()))
    assert builders == []
    callers = sorted(path.name for path in HERDER.rglob("*.py")
                     if "RunnerOptions.from_settings(" in path.read_text())
    assert callers == ["agent.py", "server.py"]


def test_the_pure_cores_defaults_are_the_settings_defaults():
    settings = Settings()
    fleet = Fleet.from_settings(settings)
    assert PlacementPolicy() == fleet.policy
    assert WindowSchedule() == fleet.policy.schedule
    assert Shedding() == fleet.policy.shedding
    assert fleet.weights == DEFAULT_WEIGHTS
    assert HealthThresholds() == fleet.thresholds
    assert Liveness() == fleet.liveness
    assert bookable_gb(10, 0) == settings.fleet.bookable_fraction * 10
    # The rules the job types and weights make are data, not defaults: compared apart.
    built = RunnerOptions.from_settings(settings, "here", Path())
    assert RunnerOptions("here", Path()) == msgspec.structs.replace(built,
                                                                outcome_rules=OutcomeRules())
    state = RetryState(failures=0, lost=settings.runtime.max_lost - 1, max_attempts=3,
                       backoff_base_seconds=10.0, backoff_max_seconds=600.0, spawn_failures=0)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert decide(Outcome.LOST, state, now).status is JobStatus.FAILED
    spawn = msgspec.structs.replace(state, lost=0)
    assert decide(Outcome.SPAWN_FAILED, spawn, now).available_at == now + timedelta(
        seconds=settings.fleet.spawn_backoff)


def test_no_default_is_restated_from_a_fresh_section():
    """A default is read from `DEFAULTS` or a section the caller holds, never from a section
    built on the spot to read one field (`FleetSection().x` restated the default 41 times)."""
    restated = [f"{path.relative_to(HERDER.parent)}:{number}"
                for path in HERDER.rglob("*.py")
                for number, line in enumerate(path.read_text().splitlines(), 1)
                if re.search(r"\b\w+Section\(\)\.\w+", line)]
    assert restated == []


def test_a_job_spec_left_unsaid_is_what_the_defaults_section_says():
    spec, defaults = JobSpec(command=("true",)), Settings().defaults
    assert (spec.priority, spec.weight, spec.max_attempts, spec.timeout_seconds,
            spec.backoff_base_seconds, spec.backoff_max_seconds) == (
        defaults.priority, defaults.weight, defaults.max_attempts, defaults.timeout,
        defaults.backoff_base, defaults.backoff_max)


def test_the_settings_import_nothing_outside_the_core():
    """Function-level imports included: the settings are the bottom layer's."""
    outside = []
    for path in (HERDER / "core" / "settings").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            outside += [f"{path.name}: {name}" for name in names
                        if name.startswith("herder") and not name.startswith("herder.core")]
    assert outside == []
