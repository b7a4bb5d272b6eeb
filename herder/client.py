"""The Python API: submit, get, list, cancel, retry and wait, as the CLI does them.

    from herder.client import Client

    with Client("sqlite:///herder.db") as herder:
        job_id = herder.submit(command=["pytest", "-q"], weight="heavy").job_id
        job = herder.wait(job_id, timeout=600)
        print(job.status, job.exit_code)
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from herder.core.errors import Conflict, InputError, NotFound
from herder.core.model import (
    INT_MAX,
    Account,
    Attempt,
    Event,
    HostRecord,
    Job,
    JobSpec,
    JobStatus,
    ReservationStatus,
    Scope,
    Transport,
)
from herder.core.settings.loading import Config, load_config
from herder.store import Store, open_store

if TYPE_CHECKING:
    from herder.core.submission import SubmitRequest
    from herder.host_settings import HostSettings
    from herder.runtime.scheduler import Fleet
    from herder.store.base import Alert
    from herder.wire import AccountView, FleetCapView, HostView


class Submitted(msgspec.Struct, frozen=True):
    """`created` is False when a job with the same dedup key already held it."""

    job_id: int
    created: bool
    status: JobStatus


def submit_request(**fields: Any) -> SubmitRequest:
    """A submit from Python values, unvalidated: `resolve` checks every field and names the
    fix. An unknown field is a TypeError, as a keyword argument would be."""
    from herder.core.submission import SubmitRequest  # only submit: reading loads one class less

    unknown = sorted(set(fields) - {item.name for item in msgspec.structs.fields(SubmitRequest)})
    if unknown:
        raise TypeError(f"submit() got unexpected keyword arguments: {', '.join(unknown)}")
    return SubmitRequest(**fields)


def submit_request_of(job_type: str | None, command: Sequence[str] | None,
                      payload: Mapping[str, Any] | None, available_at: datetime | None,
                      now: datetime, fields: dict[str, Any]) -> SubmitRequest:
    """`Client.submit`'s arguments as one request (`available_at` as delay_seconds)."""
    if available_at is not None and available_at > now:
        fields["delay_seconds"] = (available_at - now).total_seconds()
    return submit_request(job_type=job_type, command=None if command is None
                          else list(command), payload=dict(payload or {}), **fields)


def check_account_names(host: str, name: str) -> None:
    """InputError naming HOST or NAME when either is not a valid name."""
    from herder.core.settings.fields import NAME as _NAME

    for field, value in (("HOST", host), ("NAME", name)):
        if not _NAME.match(value):
            what = "host label" if field == "HOST" else "account name"
            raise InputError(field, f"{value!r} is not a valid {what}",
                             "use letters, digits, '.', '_' and '-'")


class Client:
    def __init__(
        self, db: str | None = None, config: Config | str | Path | None = None
    ) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        self.store: Store = open_store(self.config.db_url(db))

    @classmethod
    def over(cls, store: Store, config: Config) -> Client:
        """A client on a store its owner closes (the server's coordinator), so the server
        answers the operator's commands with the code that answers them locally."""
        client = cls.__new__(cls)
        client.config, client.store = config, store
        return client

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(
        self,
        job_type: str | None = None,
        command: Sequence[str] | None = None,
        payload: Mapping[str, Any] | None = None,
        *,
        available_at: datetime | None = None,
        check_command: bool = True,
        **fields: Any,
    ) -> Submitted:
        """Validate and enqueue one job. `fields` are those of
        `herder.core.submission.SubmitRequest`, as in the HTTP API's submit body (priority, weight,
        dedup_key, force, affinity, max_attempts, timeout_seconds, workdir, env,
        delay_seconds); `available_at` stands for
        delay_seconds. Raises InputError (naming the field) on bad input."""
        now = datetime.now(UTC)
        from herder.intake import resolve  # only submit renders commands (string, shlex)

        request = submit_request_of(job_type, command, payload, available_at, now, fields)
        hosts = self.store.host_list()
        if check_command and any(host.transport is not Transport.LOCAL for host in hosts):
            # Another host (an agent or ssh host) may run it: the command and workdir need
            # not exist here; that host's preflight checks them.
            check_command = False
        spec = resolve(self.config, request, now, check_command=check_command)
        if hosts:
            self.check_feasible(spec, hosts)
        result = self.store.job_insert([spec], now, force=request.force)[0]
        return Submitted(result.job_id, result.created, result.status)

    def check_feasible(self, spec: JobSpec, hosts: Sequence[HostRecord]) -> None:
        """Refuse (InputError naming the field) a job none of these hosts can ever take:
        bound to a host that does not exist or refuses it, or heavier than any host."""
        from herder.core.scheduling.feasibility import check_job
        from herder.core.scheduling.placement import HostSpec
        from herder.runtime.scheduler import Fleet

        fleet = Fleet.from_settings(self.config.settings)
        check_job(spec.job_type, spec.weight, spec.priority, spec.affinity,
                  [HostSpec.configured(host) for host in hosts], fleet.weights,
                  fleet.policy.bookable_fraction, fleet.policy.pinned.get(spec.job_type))

    def get(self, job_id: int) -> Job:
        job = self.store.job_get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def list(
        self, status: Sequence[JobStatus] | None = None, limit: int = 100
    ) -> builtins.list[Job]:
        return self.store.job_list(status, limit)

    def attempts(self, job_id: int) -> builtins.list[Attempt]:
        return self.store.attempt_list(job_id)

    def events(self, job_id: int) -> builtins.list[Event]:
        return self.store.event_list(job_id)

    def history(self, job_id: int) -> tuple[Job, builtins.list[Attempt], builtins.list[Event]]:
        """The job, its attempts and its events (`herder show`)."""
        return self.get(job_id), self.attempts(job_id), self.events(job_id)

    def log(self, job_id: int, number: int, offset: int) -> bytes | None:
        """The attempt's log from `offset` (a chunk at most); None while it has none."""
        from herder.attempt_logs import log_file, read_from

        return read_from(log_file(self.config.log_dir, job_id, number,
                                  self.attempts(job_id)), offset)

    def why(self, job_id: int) -> str:
        from herder.runtime.coordinator import why
        from herder.runtime.scheduler import Fleet

        return why(self.store, Fleet.from_settings(self.config.settings), job_id,
                   datetime.now(UTC))

    def hosts(self) -> builtins.list[HostView]:
        from herder.runtime.coordinator import host_status
        from herder.runtime.scheduler import Fleet

        fleet = Fleet.from_settings(self.config.settings)
        now = datetime.now(UTC)
        usage = self.store.host_usage(now)
        breakers = fleet.breakers(self.store, now)
        return [host_status(fleet, host, usage.get(host.label), now, breakers)
                for host in self.store.host_list()]

    def fleet_cap(self) -> FleetCapView:
        """`[fleet] emergency_max_workers` now, and the jobs running against it."""
        from herder.runtime.scheduler import fleet_cap
        from herder.wire import FleetCapView

        cap = fleet_cap(self.store, self.config.settings.fleet.emergency_max_workers)
        counts = self.store.job_counts()
        return FleetCapView(max_workers=cap.max_workers, at_run_time=cap.at_run_time,
                            updated_at=cap.updated_at, updated_by=cap.updated_by,
                            running=counts.get(JobStatus.CLAIMED, 0)
                            + counts.get(JobStatus.RUNNING, 0))

    def fleet_cap_set(self, max_workers: int | None, by: str = "cli") -> FleetCapView:
        """Set the fleet-wide cap on running jobs for every replica (None lifts it): new
        starts beyond it wait (`herder why` says so); running jobs are not stopped."""
        from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS

        if max_workers is not None and (isinstance(max_workers, bool)
                                        or not isinstance(max_workers, int)
                                        or not 0 <= max_workers <= INT_MAX):
            raise InputError("max_workers", f"{max_workers!r} is not a cap",
                             "give a whole number of jobs, 0 or more, or lift the cap")
        self.store.fleet_setting_put(EMERGENCY_MAX_WORKERS, max_workers, datetime.now(UTC), by)
        return self.fleet_cap()

    def fleet_cap_reset(self) -> FleetCapView:
        """Hand the cap back to herder.toml's `[fleet] emergency_max_workers`."""
        from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS

        self.store.fleet_setting_delete(EMERGENCY_MAX_WORKERS)
        return self.fleet_cap()

    def host_enable(self, label: str, enabled: bool) -> None:
        """Drain a host (enabled False: running jobs finish, nothing new) or enable it."""
        record = self.store.host_get(label)
        if record is None:
            raise NotFound(f"no host {label!r} (see `herder hosts`)")
        self.store.host_update(msgspec.structs.replace(record, enabled=enabled), datetime.now(UTC))

    def accounts(self, host: str | None = None) -> builtins.list[AccountView]:
        from herder.views import account_view

        now = datetime.now(UTC)
        cooldown = self.config.settings.fleet.auth_revoked_cooldown
        return [account_view(record, now, cooldown) for record in self.store.account_list(host)]

    def alerts(self, open_only: bool = True, limit: int = 100) -> builtins.list[Alert]:
        return self.store.alert_list(open_only, limit)

    def cancel(self, job_id: int) -> JobStatus:
        """Cancel a queued job at once; a claimed or running one is stopped by its runner."""
        status = self.store.job_cancel(job_id, datetime.now(UTC))
        if status is None:
            return self.get(job_id).status
        return status

    def retry(self, job_id: int) -> bool:
        """Queue a done, failed or cancelled job again with a fresh failure budget."""
        self.get(job_id)
        now = datetime.now(UTC)
        retried = self.store.job_retry(job_id, now)
        if retried:  # whoever retries it has acted on its failure
            for cause in ("human_action", "failed", "oom_loop"):
                self.store.alert_clear(f"job:{job_id}:{cause}", now)
        return retried

    def should_dispatch(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        """None when no job holds the key; otherwise the holder."""
        return self.store.job_dedup_holder(dedup_key)

    def dispatch_check(self, job_type: str, dedup_key: str,
                       payload: Mapping[str, str]) -> str | None:
        """Run the job type's `dispatch_check` here: its skip reason, or None to dispatch
        (also when it has none). InputError for an unknown type or a bad payload,
        `DispatchCheckFailed` when the check neither dispatched nor skipped."""
        from herder.dispatch_check import check_environment, check_payload, run_dispatch_check
        from herder.hardening import child_environment, secret_variables

        section = self.config.settings.job_types.get(job_type)
        if section is None:
            raise InputError("--type", f"no job type {job_type!r} in herder.toml",
                             "name one of its [job_types]")
        values = check_payload(payload)
        if section.dispatch_check is None:
            return None
        secrets = set(secret_variables(self.config.settings))
        base = {name: value for name, value in child_environment().items()
                if name not in secrets}
        return run_dispatch_check(
            section.dispatch_check, section.dispatch_check_timeout,
            check_environment(base, job_type, dedup_key, values),
            f"job_types.{job_type}.dispatch_check",
            str(self.config.path.parent) if self.config.path is not None else None)

    # -- hosts, accounts and reservations (`herder host`, `account`, `slots`, `reserve`) -------

    def _fleet(self) -> Fleet:
        from herder.runtime.scheduler import Fleet

        return Fleet.from_settings(self.config.settings)

    def _host(self, label: str) -> HostRecord:
        record = self.store.host_get(label)
        if record is None:
            raise NotFound(f"no host {label!r} (see `herder hosts`)")
        return record

    def host_add(self, label: str, settings: HostSettings, enabled: bool = True) -> str:
        """Register a host; its first agent token (only the hash is stored)."""
        from herder.core.settings.fields import NAME as _NAME
        from herder.host_settings import apply_settings

        if not _NAME.match(label):
            raise InputError("LABEL", f"{label!r} is not a valid host label",
                             "use letters, digits, '.', '_' and '-'")
        if settings.ram_total_gb is None:
            raise InputError("--ram", "is required", "pass the host's total RAM in GB")
        record = apply_settings(HostRecord(label=label, ram_total_gb=0.0, enabled=enabled),
                                settings, self.config)
        if not self.store.host_insert(record, datetime.now(UTC)):
            raise Conflict(f"host {label!r} exists already (use `herder host set`)")
        return self._agent_token(label)

    def host_set(self, label: str, settings: HostSettings) -> None:
        from herder.host_settings import apply_settings

        self.store.host_update(apply_settings(self._host(label), settings, self.config),
                               datetime.now(UTC))

    def host_remove(self, label: str) -> None:
        """Forget a host (Conflict while jobs are claimed or running on it)."""
        self._host(label)
        if not self.store.host_remove(label):
            raise Conflict(f"host {label!r} still has claimed or running jobs; drain it first")
        # A host added again later under this label must not accept the old tokens.
        self.store.token_revoke_host(label, datetime.now(UTC))

    def host_token(self, label: str) -> str:
        """A new agent token for the host; its old ones stop working."""
        self._host(label)
        self.store.token_revoke_host(label, datetime.now(UTC))
        return self._agent_token(label)

    def _agent_token(self, label: str) -> str:
        from herder.api.tokens import new_token, token_hash  # pure: hashlib and secrets

        token = new_token()
        self.store.token_insert(f"host:{label}", Scope.AGENT, token_hash(token),
                                datetime.now(UTC), host=label)
        return token

    def account_add(self, account: Account) -> None:
        """Add or update an account; InputError naming the CLI option when it is invalid."""
        from herder.core.settings.fields import ENV_NAME as _ENV_NAME

        check_account_names(account.host, account.name)
        for key in account.env:
            if not _ENV_NAME.match(key):
                raise InputError("--env", f"{key!r} is not NAME=VALUE with a variable name",
                                 "e.g. --env CLAUDE_CONFIG_DIR=/home/me/.claude-2")
        if not 1 <= account.max_sessions <= 10_000:
            raise InputError("--max-sessions", f"{account.max_sessions} is out of range",
                             "use 1 to 10000")
        if account.probe is not None and not account.probe:
            raise InputError("--probe", "is empty", "give a command, or leave it out")
        known = self.config.settings.job_types
        unknown = sorted(set(account.job_types or ()) - set(known))
        if unknown:
            raise InputError("--job-type", f"unknown job type {unknown[0]!r}",
                             f"use one of {sorted(known)}")
        self.store.account_upsert(account, datetime.now(UTC))

    def account_remove(self, host: str, name: str) -> None:
        if not self.store.account_delete(host, name):
            raise NotFound(f"no account {name!r} on {host!r} (see `herder accounts`)")

    def account_clear(self, host: str, name: str) -> bool:
        """Clear `depleted` and `auth_revoked`; False when it was healthy already."""
        if not [r for r in self.store.account_list(host) if r.account.name == name]:
            raise NotFound(f"no account {name!r} on {host!r} (see `herder accounts`)")
        return self.store.account_clear(host, name, datetime.now(UTC))

    def claim_slot(self, run_id: str, label: str, weight: str, created_by: int | None = None,
                   max_held: int | None = None) -> int:
        """A CI run's slot id; claiming again returns the same slot. `created_by` and
        `max_held`: the API's token and its cap (herder.api.reservations)."""
        from herder.runtime.coordinator import claim_slot

        return claim_slot(self.store, self.config, self._fleet(), run_id, label, weight,
                          datetime.now(UTC), created_by, max_held).id

    def release_slot(self, run_id: str, by: int | None = None) -> bool:
        """Release a run's slot; with `by`, only one that token made."""
        return self.store.reservation_release_ci(run_id, datetime.now(UTC), by) is not None

    def reserve(self, owner: str, label: str, weight: str, count: int,
                created_by: int | None = None, max_held: int | None = None,
                job: int | None = None) -> builtins.list[int]:
        """Subagent slots for `owner`: the ids of those that fit (maybe fewer than count);
        booked for `job`, none past its weight's cap (Conflict)."""
        from herder.runtime.coordinator import reserve

        return [r.id for r in reserve(self.store, self.config, self._fleet(), owner, label,
                                      weight, count, datetime.now(UTC), created_by, max_held,
                                      job)]

    def complete_reservation(self, reservation_id: int, status: ReservationStatus,
                             by: int | None = None) -> ReservationStatus:
        from herder.runtime.coordinator import complete_reservation

        return complete_reservation(self.store, reservation_id, status,
                                    datetime.now(UTC), by).status

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (TimeoutError after timeout)."""
        waker = self.store.listen()
        try:
            return wait_for_end(self.get, waker.wait, job_id, timeout)
        finally:
            waker.close()


FOLLOW_INTERVAL = 0.25
"""How often a follower asks again: `logs -f` (the file, or the server) and `submit --wait`
(locally woken early by the store's notifications, remotely by nothing)."""


def wait_for_end(get: Callable[[int], Job], pause: Callable[[float], object], job_id: int,
                 timeout: float | None, interval: float = FOLLOW_INTERVAL) -> Job:
    """Ask for the job until it is done, failed or cancelled, pausing up to `interval`
    between asks (TimeoutError after `timeout`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        job = get(job_id)
        if job.status.terminal:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"job {job_id} is still {job.status}")
        remaining = interval if deadline is None else min(interval,
                                                          deadline - time.monotonic())
        pause(max(remaining, 0.0))
