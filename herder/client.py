"""The Python API: submit, get, list, cancel, retry and wait, as the CLI does them.

    from herder.client import Client

    with Client("sqlite:///herder.db") as herder:
        job_id = herder.submit(command=["pytest", "-q"], weight="heavy").job_id
        job = herder.wait(job_id, timeout=600)
        print(job.status, job.exit_code)
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from herder.config import Config, load_config
from herder.errors import NotFound
from herder.model import Attempt, Event, Job, JobStatus
from herder.store import Store, open_store

if TYPE_CHECKING:
    from herder.submission import SubmitRequest


@dataclass(frozen=True, slots=True)
class Submitted:
    """`created` is False when a job with the same dedup key already held it."""

    job_id: int
    created: bool
    status: JobStatus


def submit_request(**fields: Any) -> SubmitRequest:
    """A submit from Python values, unvalidated: `resolve` checks every field and names the
    fix. An unknown field is a TypeError, as a keyword argument would be."""
    from herder.submission import SubmitRequest  # only submit: reading loads one class less

    unknown = sorted(set(fields) - {item.name for item in dataclasses.fields(SubmitRequest)})
    if unknown:
        raise TypeError(f"submit() got unexpected keyword arguments: {', '.join(unknown)}")
    return SubmitRequest(**fields)


class Client:
    def __init__(
        self, db: str | None = None, config: Config | str | Path | None = None
    ) -> None:
        self.config = config if isinstance(config, Config) else load_config(config)
        self.store: Store = open_store(self.config.db_url(db))

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
        `herder.submission.SubmitRequest`, as in the HTTP API's submit body (priority, weight,
        dedup_key, force, affinity, max_attempts, timeout_seconds, workdir, env,
        delay_seconds); `available_at` stands for
        delay_seconds. Raises InputError (naming the field) on bad input."""
        now = datetime.now(UTC)
        if available_at is not None and available_at > now:
            fields["delay_seconds"] = (available_at - now).total_seconds()
        from herder.intake import resolve  # only submit renders commands (string, shlex)

        request = submit_request(job_type=job_type, command=None if command is None
                              else list(command), payload=dict(payload or {}), **fields)
        spec = resolve(self.config, request, now, check_command=check_command)
        result = self.store.job_insert([spec], now, force=request.force)[0]
        return Submitted(result.job_id, result.created, result.status)

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

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        """Block until the job is done, failed or cancelled (TimeoutError after timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        waker = self.store.listen()
        try:
            while True:
                job = self.get(job_id)
                if job.status.terminal:
                    return job
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"job {job_id} is still {job.status}")
                remaining = 0.25 if deadline is None else min(0.25, deadline - time.monotonic())
                waker.wait(max(remaining, 0.0))
        finally:
            waker.close()
