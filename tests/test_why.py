"""`herder why` for jobs whose answer needs no placement: the wording of each wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from herder.core.model import Job, JobStatus
from herder.services.why import _settled_why

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def queued(reason: str | None, attempt: int = 1, wait: float = 600.0) -> Job:
    return Job(id=7, job_type="agent", command=("true",), shell=False, payload={}, priority=0,
               weight="light", dedup_key=None, affinity=None,
               available_at=NOW + timedelta(seconds=wait), max_attempts=5,
               timeout_seconds=None, env={}, workdir=None, backoff_base_seconds=1.0,
               backoff_max_seconds=60.0, status=JobStatus.QUEUED, attempt=attempt,
               failures=attempt, lost=0, host=None, exit_code=None, failure_reason=reason,
               cancel_requested=False, created_at=NOW, claimed_at=None, started_at=None,
               finished_at=None, updated_at=NOW)


@pytest.mark.parametrize(("reason", "said"), [
    ("usage_blocked", "waiting 600s for a usage limit's reset after usage_blocked"),
    ("no_healthy_account",
     "waiting 600s for an account that can serve it to turn usable after no_healthy_account"),
    ("transient", "waiting 600s for its retry backoff after transient"),
])
def test_an_account_wait_is_not_called_a_backoff(reason: str, said: str) -> None:
    text = _settled_why(queued(reason), NOW)
    assert text is not None and text.startswith(said)
    assert "2026-12-05T12:10:00" in text


def test_a_delayed_submission_says_so() -> None:
    text = _settled_why(queued(None, attempt=0), NOW)
    assert text is not None and "submitted with a delay" in text


def test_a_queued_job_under_herder_up_names_a_full_fleet_cap(store) -> None:
    """`herder up` claims nothing while `herder fleet cap` is full: why says so, as the
    placement does for a fleet."""
    from herder.core.fleet import Fleet
    from herder.core.model import JobSpec
    from herder.core.settings.sections import Settings
    from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS
    from herder.services.why import why

    fleet = Fleet.from_settings(Settings())
    job_id = store.job_insert([JobSpec(command=("true",))], NOW)[0].job_id
    assert "fleet cap" not in why(store, fleet, job_id, NOW)
    store.fleet_setting_put(EMERGENCY_MAX_WORKERS, 0, NOW, "ops")
    assert "but not now: fleet cap reached (0 running, fleet cap 0; `herder fleet cap`)" \
        in why(store, fleet, job_id, NOW)
