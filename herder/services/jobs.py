"""The job operations: submit (from Python values, an HTTP body or a webhook delivery),
read, explain, cancel, retry, wait, and the dispatch guards (`herder should-dispatch`)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec

from herder.core.errors import InputError, NotFound
from herder.core.model import (
    Attempt,
    Event,
    HostRecord,
    InsertResult,
    Job,
    JobSpec,
    JobStatus,
    TokenRecord,
    Transport,
)
from herder.services.base import OperationsBase

if TYPE_CHECKING:
    from herder.core.submission import SubmitRequest
    from herder.core.webhooks import Delivery
    from herder.store.records import DeliveryRecord
    from herder.wire.dashboard import JobPage
    from herder.wire.jobs import SubmitBody


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
    """`submit`'s arguments as one request (`available_at` as delay_seconds)."""
    if available_at is not None and available_at > now:
        fields["delay_seconds"] = (available_at - now).total_seconds()
    return submit_request(job_type=job_type, command=None if command is None
                          else list(command), payload=dict(payload or {}), **fields)


FOLLOW_INTERVAL = 0.25
"""How often `logs -f`, `submit --wait` and `wait` ask again, against a database or a server."""


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


class JobOperations(OperationsBase):
    """The job operations of `herder.services.operations.Operations`."""


    # -- submit ---------------------------------------------------------------------------------

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
        from herder.services.intake import resolve  # only submit renders commands (shlex)

        request = submit_request_of(job_type, command, payload, available_at, now, fields)
        hosts = self.store.host_list()
        if check_command and any(host.transport is not Transport.LOCAL for host in hosts):
            # Another host (an agent or ssh host) may run it: the command and workdir need
            # not exist here; that host's preflight checks them.
            check_command = False
        spec = resolve(self.config, request, now, check_command=check_command)
        result = self._enqueue(spec, request.force, hosts)
        return Submitted(result.job_id, result.created, result.status)

    def resolve_submit(self, body: SubmitBody) -> JobSpec:
        """A submit over HTTP, validated against the config (the caller is not on the host
        that runs it: no current directory, no PATH check)."""
        from herder.services.intake import resolve

        return resolve(self.config, body, datetime.now(UTC), local=False, check_command=False)

    def enqueue(self, spec: JobSpec, force: bool) -> InsertResult:
        """Enqueue a resolved job (`resolve_submit`); InputError when no host can ever
        take it."""
        return self._enqueue(spec, force, self.store.host_list())

    def _enqueue(self, spec: JobSpec, force: bool, hosts: Sequence[HostRecord]) -> InsertResult:
        if hosts:
            self.check_feasible(spec, hosts)
        result = self.store.job_insert([spec], datetime.now(UTC), force)[0]
        self.on_change()
        return result

    def check_feasible(self, spec: JobSpec, hosts: Sequence[HostRecord]) -> None:
        """Refuse (InputError naming the field) a job none of these hosts can ever take:
        bound to a host that does not exist or refuses it, or heavier than any host."""
        from herder.core.fleet import Fleet
        from herder.core.scheduling.feasibility import check_job
        from herder.core.scheduling.placement import HostSpec

        fleet = Fleet.from_settings(self.config.settings)
        check_job(spec.job_type, spec.weight, spec.priority, spec.affinity,
                  [HostSpec.configured(host) for host in hosts], fleet.weights,
                  fleet.policy.bookable_fraction, fleet.policy.pinned.get(spec.job_type))

    def receive_delivery(self, source: str, delivery: Delivery,
                         requests: Sequence[SubmitRequest]) -> DeliveryRecord:
        """A signed webhook delivery's jobs, validated as an HTTP submit is, then enqueued
        with the delivery's record in one transaction (a replay enqueues nothing)."""
        from herder.services.intake import resolve

        now = datetime.now(UTC)
        specs = [resolve(self.config, request, now, local=False, check_command=False)
                 for request in requests]
        record = self.store.delivery_record(source, delivery.delivery_id, delivery.event,
                                            specs, now)
        if record.created:
            self.on_change()
        return record

    # -- read -----------------------------------------------------------------------------------

    def get(self, job_id: int) -> Job:
        job = self.store.job_get(job_id)
        if job is None:
            raise NotFound(f"no job {job_id}")
        return job

    def list(
        self, status: Sequence[JobStatus] | None = None, limit: int = 100
    ) -> builtins.list[Job]:
        return self.store.job_list(status, limit)

    def job_page(self, status: JobStatus | None, job_type: str | None, host: str | None,
                 dedup_key: str | None, before: int | None, limit: int) -> JobPage:
        """A page of the dashboard's jobs view; the queued rows on it say why they wait."""
        from herder.services.why import why_of
        from herder.wire.dashboard import JobPage, JobRow

        jobs = self.store.job_list_page(status, job_type, host, dedup_key, before, limit + 1)
        shown = jobs[:limit]
        queued = [job for job in shown if job.status is JobStatus.QUEUED]
        reasons = why_of(self.store, self._fleet(), queued, datetime.now(UTC),
                         self.placement) if queued else {}
        rows = [JobRow.model_validate(job).model_copy(update={"why": reasons.get(job.id)})
                for job in shown]
        return JobPage(jobs=rows,
                       next_before=shown[-1].id if len(jobs) > limit else None)

    def attempts(self, job_id: int) -> builtins.list[Attempt]:
        return self.store.attempt_list(job_id)

    def events(self, job_id: int) -> builtins.list[Event]:
        return self.store.event_list(job_id)

    def history(self, job_id: int) -> tuple[Job, builtins.list[Attempt], builtins.list[Event]]:
        """The job, its attempts and its events (`herder show`)."""
        return self.get(job_id), self.attempts(job_id), self.events(job_id)

    def log(self, job_id: int, number: int, offset: int) -> bytes | None:
        """The attempt's log from `offset` (a chunk at most); None while it has none."""
        from herder.services.attempt_logs import log_file, read_from

        return read_from(log_file(self.config.log_dir, job_id, number,
                                  self.attempts(job_id)), offset)

    def why(self, job_id: int) -> str:
        from herder.services.why import why

        return why(self.store, self._fleet(), job_id, datetime.now(UTC))

    def token(self, token_hash: str) -> TokenRecord | None:
        """The API token with this hash (the server's authentication)."""
        return self.store.token_get(token_hash)

    # -- change ---------------------------------------------------------------------------------

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

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (TimeoutError after timeout)."""
        waker = self.store.listen()
        try:
            return wait_for_end(self.get, waker.wait, job_id, timeout)
        finally:
            waker.close()

    # -- dispatch guards ------------------------------------------------------------------------

    def should_dispatch(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        """None when no job holds the key; otherwise the holder."""
        return self.store.job_dedup_holder(dedup_key)

    def dispatch_check(self, job_type: str, dedup_key: str,
                       payload: Mapping[str, str]) -> str | None:
        """Run the job type's `dispatch_check` here: its skip reason, or None to dispatch
        (also when it has none). InputError for an unknown type or a bad payload,
        `DispatchCheckFailed` when the check neither dispatched nor skipped."""
        from herder.runtime.hardening import child_environment, secret_variables
        from herder.services.dispatch_check import (
            check_environment,
            check_payload,
            run_dispatch_check,
        )

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
