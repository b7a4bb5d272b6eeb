"""What a runner needs to know: herder.toml's [runtime] and [fleet] sections as they are, and
what the command decides for this run (`herder up`, an agent, the server's local hosts)."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from pathlib import Path

import msgspec

from herder.core.settings.fleet import FleetSection
from herder.core.settings.sections import RuntimeSection, Settings
from herder.runtime.endings import OutcomeRules, PolicyLimits
from herder.runtime.job_user import JobUser, check_workspace_root
from herder.runtime.job_user import resolve as resolve_job_user
from herder.runtime.preflight import Check, job_type_checks
from herder.runtime.workspace import Workspaces


def default_host() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class RunnerOptions(msgspec.Struct, frozen=True):
    """What a runner needs to know: herder.toml's [runtime] and [fleet] as they are, and what
    the command decides for this run. Commands build it with `from_settings`; a test passes
    sections of its own (their defaults are herder.toml's)."""

    host: str
    log_dir: Path
    runtime: RuntimeSection = RuntimeSection()
    """Concurrency, heartbeats, the lease, pass_env, workspaces, memory: as the runner runs."""
    fleet: FleetSection = FleetSection()
    """max_spawn_failures, spawn_backoff and emergency_max_workers (the fleet-wide cap `herder
    up` claims under)."""
    exit_when_idle: bool = False
    drain_timeout: float | None = None
    """On the first SIGTERM, let running attempts finish for this long before handing them
    back; None stops them at once (they are requeued either way)."""
    outcome_rules: OutcomeRules = msgspec.field(default_factory=OutcomeRules)
    """The job types' exit-code maps and the weight chain (`herder up` judges endings)."""
    run_as: JobUser | None = None
    """Who jobs run as when herder is root ([runtime] run_as); None: herder's own user."""
    preflight: Mapping[str, Check] = msgspec.field(default_factory=dict)
    """Job type -> its preflight, run by `herder up` before it claims that type."""

    @classmethod
    def from_settings(
        cls, settings: Settings, host: str, log_dir: Path, *, concurrency: int | None = None,
        attempt_lease: float | None = None, poll_interval: float | None = None,
        exit_when_idle: bool = False, drain_timeout: float | None = None,
    ) -> RunnerOptions:
        """The one place herder.toml becomes a runner's options; the keywords are what a
        command or the server decides instead (None: the config's value)."""
        runtime = settings.runtime
        overrides = {name: value for name, value in (
            ("concurrency", concurrency), ("attempt_lease", attempt_lease),
            ("poll_interval", poll_interval)) if value is not None}
        options = cls(
            host=host, log_dir=log_dir, runtime=msgspec.structs.replace(runtime, **overrides),
            fleet=settings.fleet, exit_when_idle=exit_when_idle, drain_timeout=drain_timeout,
            outcome_rules=OutcomeRules.from_settings(settings),
            run_as=resolve_job_user(runtime.run_as, os.geteuid()),
            preflight=job_type_checks(settings.job_types),
        )
        check_workspace_root(options.run_as, options.workspaces.root)
        return options

    @property
    def workspaces(self) -> Workspaces:
        runtime = self.runtime
        root = self.log_dir.parent / Path(runtime.workspace_root).expanduser()
        return Workspaces(root, runtime.workspace_keep_failed, runtime.workspace_min_free_gb)

    @property
    def limits(self) -> PolicyLimits:
        return PolicyLimits(self.runtime.max_lost, self.fleet.max_spawn_failures,
                            self.fleet.spawn_backoff, self.outcome_rules)
