"""Settings that can never be satisfied are refused with the field and the fix (pure core;
the CLI's and the API's refusals are in tests/test_refusals.py)."""

from __future__ import annotations

import pytest

from herder.core.errors import InputError
from herder.core.scheduling.capacity import DEFAULT_WEIGHTS, WindowCaps
from herder.core.scheduling.feasibility import check_host, check_job
from herder.core.scheduling.placement import HostSpec

BMS4 = HostSpec("bms-4", ram_total_gb=32, ram_reserved_gb=4, prime=WindowCaps(3),
                night=WindowCaps(4))  # books 22.4 GB
LAP1 = HostSpec("lap-1", ram_total_gb=8, ram_reserved_gb=3, prime=WindowCaps(2, "heavy"),
                night=WindowCaps(0), allowed_job_types=frozenset({"dev-issue", "review-pr"}),
                allowed_weights=frozenset({"light", "subagent"}), priority_floor=5)  # 4 GB
SMALL = HostSpec("small", ram_total_gb=5)  # books 4 GB
HOSTS = [BMS4, LAP1, SMALL]
JOB_TYPES = {"dev-issue", "review-pr", "infra-task", "adhoc"}


def judge(job_type: str = "dev-issue", weight: str = "light", priority: int = 10,
          affinity: str | None = None) -> InputError | None:
    try:
        check_job(job_type, weight, priority, affinity, HOSTS, DEFAULT_WEIGHTS, 0.8)
    except InputError as error:
        return error
    return None


@pytest.mark.parametrize(("job", "field", "words"), [
    ({"affinity": "lap-2"}, "affinity", "--host lap-2: no such host"),
    ({"affinity": "lap-1", "job_type": "infra-task"}, "affinity",
     "host lap-1 refuses job type infra-task (it takes dev-issue, review-pr)"),
    ({"affinity": "lap-1", "weight": "playwright"}, "weight", "host lap-1 refuses weight"),
    ({"affinity": "lap-1", "priority": 1}, "priority", "refuses priorities below 5"),
    ({"affinity": "small", "weight": "heavy"}, "weight",
     "heavy books 8 GB of RAM; host small can book 4.0 GB"),
])
def test_a_job_no_host_can_take_is_refused_naming_the_field(job, field, words):
    error = judge(**job)
    assert error is not None and error.field == field and words in error.problem, error
    assert error.fix


@pytest.mark.parametrize("job", [
    {"weight": "orchestrator"}, {"weight": "orchestrator", "affinity": "bms-4"},
    {"affinity": "lap-1", "priority": 5}, {"job_type": "infra-task"}, {"priority": -3},
])
def test_a_job_some_host_can_take_passes(job):
    assert judge(**job) is None


def test_a_weight_heavier_than_every_host_is_refused_where_hosts_are_known():
    small = [LAP1, HostSpec("tiny", ram_total_gb=4)]
    with pytest.raises(InputError) as caught:
        check_job("dev-issue", "orchestrator", 10, None, small, DEFAULT_WEIGHTS, 0.8)
    assert caught.value.field == "weight"
    assert "orchestrator books 12 GB" in caught.value.problem
    assert "lap-1, can book 4.0 GB" in caught.value.problem
    check_job("dev-issue", "orchestrator", 10, None, [], DEFAULT_WEIGHTS, 0.8)  # `herder up`
    check_job("dev-issue", "light", 10, "anything", [], DEFAULT_WEIGHTS, 0.8)


def test_a_bound_job_whose_weight_no_window_admits_is_refused():
    closed = HostSpec("nights-off", ram_total_gb=64, prime=WindowCaps(2, "light"),
                      night=WindowCaps(0))
    with pytest.raises(InputError) as caught:
        check_job("dev-issue", "heavy", 10, "nights-off", [closed], DEFAULT_WEIGHTS, 0.8)
    assert caught.value.field == "weight"
    assert "(prime: max light, night: closed)" in caught.value.problem
    check_job("dev-issue", "light", 10, "nights-off", [closed], DEFAULT_WEIGHTS, 0.8)


@pytest.mark.parametrize(("host", "field", "words"), [
    (HostSpec("h", ram_total_gb=8, ram_reserved_gb=8), "--reserved", "leaves nothing"),
    (HostSpec("h", ram_total_gb=8, ram_reserved_gb=9), "--reserved", "9 GB reserved of 8 GB"),
    (HostSpec("h", ram_total_gb=0), "--ram", "more than 0"),
    (HostSpec("h", ram_total_gb=16, allowed_job_types=frozenset({"dev-isue"})),
     "--job-types", "no job type named dev-isue"),
    (HostSpec("h", ram_total_gb=8, ram_reserved_gb=3,
              allowed_weights=frozenset({"light", "heavy"})), "--weights", "heavy can never fit"),
    (HostSpec("h", ram_total_gb=16, prime=WindowCaps(0), night=WindowCaps(0)),
     "--prime-workers", "0 workers in prime time and at night"),
    (HostSpec("h", ram_total_gb=64, prime=WindowCaps(2, "light"), night=WindowCaps(0, None),
              allowed_weights=frozenset({"heavy", "orchestrator"})), "--weights",
     "no open window admits heavy, orchestrator (prime max light)"),
])
def test_a_host_configured_against_itself_is_refused_naming_the_option(host, field, words):
    with pytest.raises(InputError) as caught:
        check_host(host, JOB_TYPES, DEFAULT_WEIGHTS, 0.8)
    assert caught.value.field == field and words in caught.value.problem, caught.value
    assert caught.value.fix


def test_a_sound_host_passes():
    check_host(LAP1, JOB_TYPES, DEFAULT_WEIGHTS, 0.8)
    check_host(BMS4, JOB_TYPES, DEFAULT_WEIGHTS, 0.8)
