"""Placement: every filter and reason on hand-made snapshots, the seed cases, and
properties over random snapshots checked against a naive jobs × hosts reference."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec.structs import replace

from herder.core.scheduling import placement
from herder.core.scheduling.capacity import (
    DEFAULT_WEIGHTS,
    WeightTable,
    WindowCaps,
    bookable_gb,
)
from herder.core.scheduling.explanation import explain
from herder.core.scheduling.health import HostHealth, accepts_work
from herder.core.scheduling.placement import (
    RAM_TOLERANCE_GB,
    Assignment,
    HostLoad,
    HostSpec,
    PendingJob,
    PlacementPolicy,
    Plan,
    Reason,
    Rejection,
    Snapshot,
    place,
)

NOON = datetime(2026, 7, 1, 12, 0, tzinfo=UTC)  # prime
LATE = datetime(2026, 7, 1, 22, 0, tzinfo=UTC)  # night
DEV_TYPES = frozenset({"dev-issue", "continue-issue", "review-pr", "review-plan"})
HEALTHY = HostHealth.HEALTHY

# The seed fleet: bms-4 (32 GB, 4 reserved → 22.4 bookable), vps-h1 and lap1 (seed 003 §2.5/2.6)
# and wsl1 (seed 000 §5: light only, priority floor 5, developer job types only).
BMS4 = HostSpec("bms-4", 32, 4, cpus=16, prime=WindowCaps(6), night=WindowCaps(8))
VPS_H1 = HostSpec("vps-h1", 8, 2, cpus=2, prime=WindowCaps(2, "heavy"),
                  night=WindowCaps(2, "heavy"))
LAP1 = HostSpec("lap1", 8, 3, cpus=4, prime=WindowCaps(2, "heavy"), night=WindowCaps(0, "light"))
WSL1 = HostSpec("wsl1", 16, 4, prime=WindowCaps(1, "light"), night=WindowCaps(1, "light"),
                allowed_job_types=DEV_TYPES, allowed_weights=frozenset({"super-light", "light"}),
                priority_floor=5)


def idle(*hosts: HostSpec, health: HostHealth = HEALTHY) -> dict[str, HostLoad]:
    return {host.label: HostLoad(host.label, health, 0, 0.0) for host in hosts}


def job(job_id: int, weight: str = "light", *, priority: int = 10, job_type: str = "dev-issue",
        **extra: object) -> PendingJob:
    return PendingJob(job_id, priority, weight, job_type, **extra)  # type: ignore[arg-type]


def snap(jobs, hosts, loads=None, *, now=NOON, **policy) -> Snapshot:
    loads = idle(*hosts) if loads is None else loads
    return Snapshot(now, list(jobs), list(hosts), loads, DEFAULT_WEIGHTS,
                    PlacementPolicy(**policy))


def placed(plan: Plan) -> dict[int, str]:
    return {assignment.job_id: assignment.host for assignment in plan.assignments}


def reasons(plan: Plan, job_id: int) -> dict[str, Reason]:
    return {rejection.host: rejection.reason for rejection in plan.waiting[job_id]}


def only_rejection(plan: Plan, job_id: int) -> Rejection:
    (rejection,) = plan.waiting[job_id]
    return rejection


# --- each filter, each reason -----------------------------------------------------------


def test_an_idle_healthy_host_takes_a_light_job():
    plan = place(snap([job(1)], [BMS4]))
    assert plan.assignments == (Assignment(1, "bms-4"),)
    assert dict(plan.waiting) == {}
    assert dict(plan.reservations) == {}


def test_a_drained_host_takes_nothing():
    plan = place(snap([job(1)], [replace(BMS4, enabled=False)]))
    assert only_rejection(plan, 1) == Rejection("bms-4", Reason.DRAINED, "drained")


@pytest.mark.parametrize(
    ("health", "detail"), [(HostHealth.DOWN, "down"), (HostHealth.UNKNOWN, "health unknown")]
)
def test_down_and_unknown_hosts_get_nothing(health, detail):
    plan = place(snap([job(1)], [BMS4], idle(BMS4, health=health)))
    assert only_rejection(plan, 1) == Rejection("bms-4", Reason.HEALTH, detail)


def test_a_host_without_a_load_entry_counts_as_unknown():
    plan = place(snap([job(1)], [BMS4], {}))
    assert only_rejection(plan, 1).reason is Reason.HEALTH


def test_a_host_whose_agent_is_down_gets_nothing_and_why_says_so():
    loads = idle(BMS4, LAP1)
    loads["bms-4"] = replace(loads["bms-4"], agent_down="agent down: no heartbeat for 31.0s")
    plan = place(snap([job(1)], [BMS4, LAP1], loads))
    assert placed(plan) == {1: "lap1"}
    plan = place(snap([job(1, affinity="bms-4")], [BMS4, LAP1], loads))
    assert reasons(plan, 1)["bms-4"] is Reason.AGENT_DOWN
    assert explain(1, plan, snap([job(1, affinity="bms-4")], [BMS4, LAP1], loads)).endswith(
        "bound to bms-4: bms-4 agent down: no heartbeat for 31.0s")


def test_a_down_agent_counts_against_the_fleets_capacity_for_shedding():
    hosts = [HostSpec(label, 32, 0, prime=WindowCaps(1)) for label in "abcd"]
    loads = idle(*hosts)
    for label in "abc":
        loads[label] = replace(loads[label], agent_down="agent stopped")
    plan = place(snap([job(1, "playwright"), job(2, "heavy")], hosts, loads))
    assert reasons(plan, 1)["d"] is Reason.SHED  # 25% of the slots live: up to heavy
    assert placed(plan) == {2: "d"}


@pytest.mark.parametrize("strategy", ["best_fit", "spread"])
def test_a_host_that_failed_to_start_the_job_is_passed_over_while_another_fits(strategy):
    hosts, loads = two_boxes()
    first = place(snap([job(1)], hosts, loads, strategy=strategy))
    usual = placed(first)[1]
    other = next(h.label for h in hosts if h.label != usual)
    pending = [job(1, avoid_host=usual), job(2, avoid_host=usual, preferred_host=usual)]
    snapshot = snap(pending, hosts, loads, strategy=strategy)
    plan = place(snapshot)
    assert placed(plan) == {1: other, 2: other}
    assert plan.avoided[1] == Rejection(usual, Reason.AVOIDED,
                                        "its last attempt there ended for the host's "
                                        "reasons; another host fits")
    assert explain(1, plan, snapshot) == (
        f"placed on {other}, not {usual}: its last attempt there ended for the host's "
        "reasons; another host fits")


def test_the_avoided_host_is_used_when_no_other_fits():
    hosts, loads = two_boxes()
    loads["snug"] = HostLoad("snug", HEALTHY, 4, 0.0)  # full
    plan = place(snap([job(1, avoid_host="roomy"), job(2, "heavy", avoid_host="snug")],
                      hosts, loads))
    assert placed(plan) == {1: "roomy", 2: "roomy"}
    assert dict(plan.avoided) == {}


def test_degraded_host_still_takes_work():
    plan = place(snap([job(1)], [BMS4], idle(BMS4, health=HostHealth.DEGRADED)))
    assert placed(plan) == {1: "bms-4"}


def test_lap1_takes_nothing_at_night_but_works_in_prime_time():
    assert placed(place(snap([job(1)], [LAP1], now=NOON))) == {1: "lap1"}
    plan = place(snap([job(1)], [LAP1], now=LATE))
    assert only_rejection(plan, 1) == Rejection("lap1", Reason.WINDOW_CLOSED, "closed at night")


def test_window_switch_picks_the_windows_worker_cap():
    host = HostSpec("box", 64, 0, prime=WindowCaps(1), night=WindowCaps(3))
    jobs = [job(i) for i in range(1, 5)]
    assert len(place(snap(jobs, [host], now=NOON)).assignments) == 1
    assert len(place(snap(jobs, [host], now=LATE)).assignments) == 3


def test_window_switch_picks_the_windows_max_weight():
    host = HostSpec("box", 64, 0, prime=WindowCaps(2, "light"), night=WindowCaps(2))
    plan = place(snap([job(1, "heavy")], [host], now=NOON))
    assert only_rejection(plan, 1) == Rejection("box", Reason.MAX_WEIGHT, "max weight light")
    assert placed(place(snap([job(1, "heavy")], [host], now=LATE))) == {1: "box"}


def test_slots_full_counts_existing_workers():
    loads = {"vps-h1": HostLoad("vps-h1", HEALTHY, 2, 6.0)}
    plan = place(snap([job(1)], [VPS_H1], loads))
    assert only_rejection(plan, 1) == Rejection("vps-h1", Reason.SLOTS_FULL, "2/2 workers")


def test_slots_booked_this_cycle_count_too():
    plan = place(snap([job(1), job(2), job(3)], [replace(BMS4, prime=WindowCaps(2))]))
    assert placed(plan) == {1: "bms-4", 2: "bms-4"}
    assert only_rejection(plan, 3) == Rejection("bms-4", Reason.SLOTS_FULL, "2/2 workers")


def test_ram_uses_the_80_percent_cap_of_total_minus_reserved():
    # Seed 004: 1 orchestrator + GHA heavy booked = 20 GB of 22.4 → 2.4 GB left.
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 2, 20.0)}
    plan = place(snap([job(1), job(2, "subagent")], [BMS4], loads))
    assert only_rejection(plan, 1) == Rejection("bms-4", Reason.RAM, "2.4 GB free, needs 3")
    assert placed(plan) == {2: "bms-4"}  # subagent books no host RAM


def test_an_overbooked_host_takes_nothing_not_even_zero_gb():
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 2, 28.0)}  # -5.6 GB, "gated" in seed 004
    plan = place(snap([job(1, "subagent")], [BMS4], loads))
    assert only_rejection(plan, 1) == Rejection("bms-4", Reason.RAM, "-5.6 GB free, needs 0")


def test_ram_booked_this_cycle_counts_and_an_exact_fit_is_a_fit():
    host = HostSpec("box", 11.25, 0, prime=WindowCaps(9))  # 9.0 bookable: three lights exactly
    plan = place(snap([job(i) for i in range(1, 5)], [host]))
    assert sorted(placed(plan)) == [1, 2, 3]
    assert only_rejection(plan, 4) == Rejection("box", Reason.RAM, "0.0 GB free, needs 3")


def test_float_sums_do_not_refuse_an_exact_fit():
    weights = WeightTable({"tenth": 0.1})
    host = HostSpec("box", 1.0, 0.0, prime=WindowCaps(20))
    jobs = [PendingJob(i, 10, "tenth", "t") for i in range(1, 12)]
    plan = place(Snapshot(NOON, jobs, [host], idle(host), weights,
                          PlacementPolicy(bookable_fraction=1.0)))
    assert len(plan.assignments) == 10  # 0.1 × 10 == 1.0 despite float drift


def test_max_weight_of_the_window():
    plan = place(snap([job(1, "orchestrator")], [VPS_H1]))
    assert only_rejection(plan, 1) == Rejection("vps-h1", Reason.MAX_WEIGHT, "max weight heavy")


def test_allow_lists_and_floor_and_affinity_reasons():
    plan = place(snap([
        job(1, job_type="infra-task"),
        job(2, "heavy"),
        job(3, priority=1),
        job(4, affinity="bms-4"),
    ], [WSL1]))
    assert only_rejection(plan, 1) == Rejection(
        "wsl1", Reason.JOB_TYPE_NOT_ALLOWED, "refuses job type infra-task")
    assert only_rejection(plan, 2) == Rejection(
        "wsl1", Reason.WEIGHT_NOT_ALLOWED, "refuses weight heavy")
    assert only_rejection(plan, 3) == Rejection("wsl1", Reason.PRIORITY_FLOOR, "priority floor 5")
    assert only_rejection(plan, 4) == Rejection(
        "wsl1", Reason.AFFINITY, "job bound to another host")


def test_a_job_type_pinned_to_hosts_runs_only_there_and_why_names_them():
    """Seed 000's hard affinity per type: infra-task runs on bms-4 alone, whatever else
    has room; a bound job of the type (`--host`) is refused elsewhere for the same reason."""
    pins = {"infra-task": frozenset({"bms-4"})}
    hosts = [BMS4, VPS_H1, LAP1]
    assert placed(place(snap([job(1, job_type="infra-task")], hosts))) == {1: "lap1"}
    plan = place(snap([job(1, job_type="infra-task"), job(2)], hosts, pinned=pins))
    assert placed(plan) == {1: "bms-4", 2: "lap1"}  # best fit, but for the pin
    full = {**idle(*hosts), "bms-4": HostLoad("bms-4", HEALTHY, 6, 0.0)}
    plan = place(snap([job(1, job_type="infra-task"), job(2),
                       job(3, job_type="infra-task", affinity="lap1")], hosts, full,
                      pinned=pins))
    assert placed(plan) == {2: "lap1"}
    detail = "job type infra-task runs only on bms-4"
    assert reasons(plan, 1) == {"bms-4": Reason.SLOTS_FULL, "vps-h1": Reason.JOB_TYPE_PINNED,
                                "lap1": Reason.JOB_TYPE_PINNED}
    assert plan.waiting[1][1] == Rejection("vps-h1", Reason.JOB_TYPE_PINNED, detail)
    assert plan.waiting[3][2] == Rejection("lap1", Reason.JOB_TYPE_PINNED, detail)
    assert detail in explain(1, plan, snap([job(1, job_type="infra-task")], hosts, full,
                                          pinned=pins))


def test_unknown_weight_is_refused_everywhere():
    plan = place(snap([job(1, "mystery")], [BMS4, VPS_H1]))
    assert set(reasons(plan, 1).values()) == {Reason.UNKNOWN_WEIGHT}
    assert plan.waiting[1][0].detail == "unknown weight mystery"


def test_filters_run_in_order():
    """A host failing several filters reports the first one."""
    host = replace(WSL1, enabled=False, prime=WindowCaps(0, "light"))
    plan = place(snap([job(1, "heavy", priority=1, job_type="infra-task")], [host],
                      idle(host, health=HostHealth.DOWN)))
    assert only_rejection(plan, 1).reason is Reason.DRAINED
    plan = place(snap([job(1, "heavy", priority=1, job_type="infra-task")],
                      [replace(host, enabled=True)], idle(host, health=HostHealth.DOWN)))
    assert only_rejection(plan, 1).reason is Reason.HEALTH
    plan = place(snap([job(1, "heavy", priority=1, job_type="infra-task")],
                      [replace(host, enabled=True)]))
    assert only_rejection(plan, 1).reason is Reason.WINDOW_CLOSED
    full = {"vps-h1": HostLoad("vps-h1", HEALTHY, 2, 4.8)}  # no slot and no RAM: slots first
    assert only_rejection(place(snap([job(1)], [VPS_H1], full)), 1).reason is Reason.SLOTS_FULL


# --- seed 000 §5.5: the wsl1 enforcement cases ---------------------------------------


@pytest.mark.parametrize(
    ("pending", "reason"),
    [
        (job(1, priority=1), Reason.PRIORITY_FLOOR),  # a dev-issue hand-queued at priority 1
        (job(1, job_type="infra-task"), Reason.JOB_TYPE_NOT_ALLOWED),
        (job(1, "heavy"), Reason.WEIGHT_NOT_ALLOWED),
        (job(1, affinity="bms-4"), Reason.AFFINITY),  # server_preference = bms-4
    ],
    ids=["priority-1", "infra-task", "heavy", "prefers-bms-4"],
)
def test_wsl1_refuses(pending, reason):
    assert only_rejection(place(snap([pending], [WSL1])), 1).reason is reason


@pytest.mark.parametrize("job_type", sorted(DEV_TYPES))
def test_wsl1_accepts_a_priority_10_light_developer_job(job_type):
    plan = place(snap([job(1, job_type=job_type)], [WSL1]))
    assert placed(plan) == {1: "wsl1"}


def test_wsl1_takes_rows_bound_to_it_and_the_floor_is_inclusive():
    assert placed(place(snap([job(1, affinity="wsl1")], [WSL1]))) == {1: "wsl1"}
    assert placed(place(snap([job(1, priority=5)], [WSL1]))) == {1: "wsl1"}


def test_priority_floor_splits_jobs_of_one_kind():
    jobs = [job(1, priority=4), job(2, priority=5), job(3, priority=1)]
    plan = place(snap(jobs, [replace(WSL1, prime=WindowCaps(3, "light"))]))
    assert placed(plan) == {2: "wsl1"}
    assert {reasons(plan, 1)["wsl1"], reasons(plan, 3)["wsl1"]} == {Reason.PRIORITY_FLOOR}


# --- shedding (seed 003 §2.3) --------------------------------------------------------


def shed_fleet(down: int) -> tuple[list[HostSpec], dict[str, HostLoad]]:
    hosts = [HostSpec(f"h{i}", 64, 0, prime=WindowCaps(1)) for i in range(4)]
    loads = idle(*hosts)
    for host in hosts[:down]:
        loads[host.label] = HostLoad(host.label, HostHealth.DOWN, 0, 0.0)
    return hosts, loads


@pytest.mark.parametrize(
    ("down", "allowed"),
    [
        (0, {"light", "heavy", "playwright", "orchestrator", "subagent"}),  # ratio 1.0
        (1, {"light", "heavy", "playwright", "orchestrator", "subagent"}),  # 0.75
        (2, {"light", "heavy", "subagent"}),  # 0.5: playwright and up shed
        (3, {"light", "heavy", "subagent"}),  # 0.25
    ],
)
def test_fleet_shedding_follows_the_capacity_ratio(down, allowed):
    hosts, loads = shed_fleet(down)
    for weight in ("light", "heavy", "playwright", "orchestrator", "subagent"):
        plan = place(snap([job(1, weight)], hosts, loads))
        assert (1 in placed(plan)) == (weight in allowed), weight


def test_shed_reason_names_the_ratio_and_cap():
    hosts, loads = shed_fleet(2)
    plan = place(snap([job(1, "playwright")], hosts, loads))
    assert reasons(plan, 1) == {"h0": Reason.HEALTH, "h1": Reason.HEALTH,
                                "h2": Reason.SHED, "h3": Reason.SHED}
    assert plan.waiting[1][2].detail == "fleet at 50% capacity, max weight heavy"


def test_below_a_quarter_only_light_work_runs():
    hosts = [HostSpec(f"h{i}", 64, 0, prime=WindowCaps(1)) for i in range(5)]
    loads = idle(*hosts)
    for host in hosts[1:]:
        loads[host.label] = HostLoad(host.label, HostHealth.DOWN, 0, 0.0)
    assert 1 in placed(place(snap([job(1)], hosts, loads)))
    assert 1 not in placed(place(snap([job(1, "heavy")], hosts, loads)))


def test_shedding_counts_slots_of_this_window_and_ignores_disabled_hosts():
    big = HostSpec("big", 64, 0, prime=WindowCaps(6))
    small = HostSpec("small", 64, 0, prime=WindowCaps(2))
    off = HostSpec("off", 64, 0, enabled=False, prime=WindowCaps(50))
    loads = idle(big, small, off)
    loads["small"] = HostLoad("small", HostHealth.DOWN, 0, 0.0)
    # 6 healthy of 8 enabled slots = 0.75: nothing shed, the disabled 50 slots do not count.
    assert placed(place(snap([job(1, "orchestrator")], [big, small, off], loads))) == {1: "big"}
    loads["big"] = HostLoad("big", HostHealth.DEGRADED, 0, 0.0)  # degraded still counts
    assert placed(place(snap([job(1, "orchestrator")], [big, small, off], loads))) == {1: "big"}


# --- scoring -------------------------------------------------------------------------


def two_boxes() -> tuple[list[HostSpec], dict[str, HostLoad]]:
    roomy = HostSpec("roomy", 25, 0, prime=WindowCaps(4))  # 20 GB bookable
    snug = HostSpec("snug", 12.5, 0, prime=WindowCaps(4))  # 10 GB bookable
    return [roomy, snug], idle(roomy, snug)


def test_best_fit_packs_the_fullest_host_that_still_fits():
    hosts, loads = two_boxes()
    plan = place(snap([job(1), job(2, "heavy")], hosts, loads))
    assert placed(plan) == {1: "snug", 2: "roomy"}  # 10 → 7, then heavy needs 8


def test_spread_takes_the_emptiest_host():
    hosts, loads = two_boxes()
    plan = place(snap([job(1), job(2), job(3)], hosts, loads, strategy="spread"))
    assert placed(plan) == {1: "roomy", 2: "roomy", 3: "roomy"}  # 20, 17, 14 > 10
    plan = place(snap([job(i) for i in range(1, 6)], hosts, loads, strategy="spread"))
    assert Counter(placed(plan).values()) == {"roomy": 4, "snug": 1}


def test_ties_break_by_label_whatever_the_host_order():
    hosts = [HostSpec(label, 16, 0, prime=WindowCaps(1)) for label in ("c", "a", "b")]
    for strategy in ("best_fit", "spread"):
        for order in (hosts, hosts[::-1]):
            plan = place(snap([job(1), job(2)], order, idle(*hosts), strategy=strategy))
            assert placed(plan) == {1: "a", 2: "b"}


def test_soft_affinity_beats_the_score():
    hosts, loads = two_boxes()
    plan = place(snap([job(1, preferred_host="roomy")], hosts, loads))
    assert placed(plan) == {1: "roomy"}


def test_soft_affinity_falls_back_when_the_preferred_host_cannot_take_it():
    hosts, loads = two_boxes()
    loads["roomy"] = HostLoad("roomy", HEALTHY, 4, 0.0)
    plan = place(snap([job(1, preferred_host="roomy"), job(2, preferred_host="ghost")],
                      hosts, loads))
    assert placed(plan) == {1: "snug", 2: "snug"}


def test_hard_affinity_waits_for_its_host_even_with_room_elsewhere():
    hosts, loads = two_boxes()
    loads["roomy"] = HostLoad("roomy", HEALTHY, 4, 0.0)
    plan = place(snap([job(1, affinity="roomy"), job(2, affinity="snug")], hosts, loads))
    assert placed(plan) == {2: "snug"}
    assert reasons(plan, 1) == {"roomy": Reason.SLOTS_FULL, "snug": Reason.AFFINITY}


def test_hard_affinity_to_an_unknown_host_is_refused_by_every_host():
    hosts, loads = two_boxes()
    plan = place(snap([job(1, affinity="ghost")], hosts, loads))
    assert set(reasons(plan, 1).values()) == {Reason.AFFINITY}


def test_jobs_go_in_priority_then_id_order():
    host = HostSpec("box", 64, 0, prime=WindowCaps(2))
    jobs = [job(5, priority=10), job(3, priority=50), job(9, priority=1), job(4, priority=10)]
    plan = place(snap(jobs, [host]))
    assert [a.job_id for a in plan.assignments] == [9, 4]
    assert set(plan.waiting) == {3, 5}


# --- starvation ------------------------------------------------------------------------


def starving_case(waited_seconds: float) -> Snapshot:
    """A 12 GB job in front of a stream of 3 GB jobs on a host with 9.4 GB free."""
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 3, 13.0)}
    big = job(1, "orchestrator", waiting_since=NOON - timedelta(seconds=waited_seconds))
    lights = [job(i, waiting_since=NOON - timedelta(seconds=30)) for i in range(2, 8)]
    return snap([big, *lights], [BMS4], loads)


def test_before_the_wait_small_jobs_backfill_the_host():
    plan = place(starving_case(599))
    assert dict(plan.reservations) == {}
    assert placed(plan) == {2: "bms-4", 3: "bms-4", 4: "bms-4"}  # 9.4 → 0.4 GB
    assert reasons(plan, 1) == {"bms-4": Reason.SLOTS_FULL}


def test_after_the_wait_the_host_is_held_for_the_starving_job():
    plan = place(starving_case(600))
    assert dict(plan.reservations) == {"bms-4": 1}
    assert placed(plan) == {}
    assert only_rejection(plan, 1) == Rejection("bms-4", Reason.RAM, "9.4 GB free, needs 12")
    assert only_rejection(plan, 2) == Rejection("bms-4", Reason.RESERVED, "held for job 1")


def test_a_starving_job_that_fits_is_simply_placed():
    snapshot = snap([job(1, "orchestrator", waiting_since=NOON - timedelta(hours=2))], [BMS4])
    plan = place(snapshot)
    assert placed(plan) == {1: "bms-4"}
    assert dict(plan.reservations) == {}


def test_reservation_goes_where_the_job_fits_soonest():
    small = HostSpec("small", 10, 0, prime=WindowCaps(4))  # 8 GB bookable: never fits 12
    busy = HostSpec("busy", 32, 4, prime=WindowCaps(4))  # 22.4 bookable
    busier = HostSpec("busier", 32, 4, prime=WindowCaps(4))
    loads = {"small": HostLoad("small", HEALTHY, 0, 0.0),
             "busy": HostLoad("busy", HEALTHY, 2, 14.0),  # 8.4 free
             "busier": HostLoad("busier", HEALTHY, 3, 17.0)}  # 5.4 free
    snapshot = snap([job(1, "orchestrator", waiting_since=NOON - timedelta(hours=1))],
                    [small, busy, busier], loads)
    assert dict(place(snapshot).reservations) == {"busy": 1}


def test_one_reservation_per_host_most_urgent_starving_job_first():
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 3, 13.0)}
    old = NOON - timedelta(hours=1)
    jobs = [job(7, "orchestrator", priority=20, waiting_since=old),
            job(8, "orchestrator", priority=10, waiting_since=old)]
    plan = place(snap(jobs, [BMS4], loads))
    assert dict(plan.reservations) == {"bms-4": 8}
    assert reasons(plan, 7) == {"bms-4": Reason.RAM}


def test_a_reservation_does_not_undo_work_placed_before_it():
    """Jobs ahead of the starving one in (priority, id) order still get the host."""
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 3, 13.0)}
    jobs = [job(1, priority=5), job(2, "orchestrator", waiting_since=NOON - timedelta(hours=1)),
            job(3)]
    plan = place(snap(jobs, [BMS4], loads))
    assert placed(plan) == {1: "bms-4"}
    assert dict(plan.reservations) == {"bms-4": 2}
    assert reasons(plan, 3) == {"bms-4": Reason.RESERVED}


def test_reservations_only_on_hosts_that_could_ever_take_the_job():
    loads = {"vps-h1": HostLoad("vps-h1", HEALTHY, 2, 4.0)}
    snapshot = snap([job(1, "orchestrator", waiting_since=NOON - timedelta(hours=1))],
                    [VPS_H1], loads)
    assert dict(place(snapshot).reservations) == {}  # max weight heavy: waiting won't help


def test_a_bound_starving_job_holds_its_own_host():
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 3, 13.0), "vps-h1": HostLoad(
        "vps-h1", HEALTHY, 0, 0.0)}
    jobs = [job(1, "orchestrator", affinity="bms-4", waiting_since=NOON - timedelta(hours=1)),
            job(2)]
    plan = place(snap(jobs, [BMS4, VPS_H1], loads))
    assert dict(plan.reservations) == {"bms-4": 1}
    assert placed(plan) == {2: "vps-h1"}


# --- explain -----------------------------------------------------------------------------


def seed_fleet_snapshot(*jobs: PendingJob) -> Snapshot:
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 3, 13.0),
             "vps-h1": HostLoad("vps-h1", HEALTHY, 0, 0.0),
             "lap1": HostLoad("lap1", HostHealth.DOWN, 0, 0.0)}
    return snap(jobs, [BMS4, VPS_H1, LAP1], loads)


def test_explain_a_waiting_job_names_each_hosts_reason():
    snapshot = seed_fleet_snapshot(job(17, "orchestrator"))
    assert explain(17, place(snapshot), snapshot) == (
        "needs 12 GB (orchestrator): bms-4 has 9.4 GB free, vps-h1 max weight heavy, lap1 down"
    )


def test_explain_a_placed_job():
    snapshot = seed_fleet_snapshot(job(3, "heavy"))
    assert explain(3, place(snapshot), snapshot) == "placed on bms-4"


def test_explain_a_starving_job_and_the_jobs_it_holds_back():
    snapshot = seed_fleet_snapshot(
        job(17, "orchestrator", waiting_since=NOON - timedelta(hours=1)), job(18, "heavy"))
    plan = place(snapshot)
    assert explain(17, plan, snapshot) == (
        "held bms-4 for it (starving); needs 12 GB (orchestrator): bms-4 has 9.4 GB free, "
        "vps-h1 max weight heavy, lap1 down")
    assert explain(18, plan, snapshot) == (
        "needs 8 GB (heavy): vps-h1 has 4.8 GB free, bms-4 held for job 17, lap1 down")


def test_explain_leads_with_the_held_host():
    big = HostSpec("big", 32, 0, prime=WindowCaps(4))  # 25.6 bookable
    huge = HostSpec("huge", 64, 0, prime=WindowCaps(2))  # 51.2 bookable
    loads = {"big": HostLoad("big", HEALTHY, 1, 20.0), "huge": HostLoad("huge", HEALTHY, 2, 40.0)}
    snapshot = snap([job(5, "orchestrator", waiting_since=NOON - timedelta(hours=1))],
                    [big, huge], loads)
    assert explain(5, place(snapshot), snapshot) == (
        "held huge for it (starving); needs 12 GB (orchestrator): huge full (2/2 workers), "
        "big has 5.6 GB free")


def test_explain_a_bound_job_names_only_its_host():
    snapshot = snap([job(1, affinity="lap1")], [BMS4, LAP1], now=LATE)
    assert explain(1, place(snapshot), snapshot) == (
        "needs 3 GB (light), bound to lap1: lap1 closed at night")
    snapshot = snap([job(1, affinity="ghost")], [BMS4])
    assert explain(1, place(snapshot), snapshot) == (
        "needs 3 GB (light), bound to ghost, which is not a registered host")


def test_explain_folds_many_alike_hosts():
    full = [HostSpec(f"full-{i:02d}", 32, 0, prime=WindowCaps(2)) for i in range(38)]
    tight = [HostSpec(f"tight-{i}", 32, 0, prime=WindowCaps(4)) for i in range(3)]
    down = [HostSpec(f"down-{i}", 32, 0) for i in range(2)]
    loads = {host.label: HostLoad(host.label, HEALTHY, 2, 6.0) for host in full}
    for index, host in enumerate(tight):
        loads[host.label] = HostLoad(host.label, HEALTHY, 1, 20.0 + index)
    loads.update(idle(*down, health=HostHealth.DOWN))
    snapshot = snap([job(1, "heavy")], [*full, *down, *tight], loads)
    assert explain(1, place(snapshot), snapshot) == (
        "needs 8 GB (heavy): tight-0 has 5.6 GB free and 2 more hosts short of RAM, "
        "full-00 full (2/2 workers) and 37 more hosts full, "
        "down-0 down and 1 more host down or unknown")


def test_explain_an_unknown_weight_and_an_unknown_job():
    snapshot = snap([job(1, "mystery")], [BMS4])
    plan = place(snapshot)
    assert explain(1, plan, snapshot) == (
        "unknown weight 'mystery': bms-4 unknown weight mystery")
    assert explain(99, plan, snapshot) == "job 99 is not queued in this snapshot"
    empty = snap([job(1)], [])
    assert explain(1, place(empty), empty) == "needs 3 GB (light): no hosts registered"


# --- plan shape and input checks ----------------------------------------------------------


def test_jobs_of_one_shape_share_one_rejection_tuple():
    plan = place(snap([job(1, "orchestrator"), job(2, "orchestrator"), job(3, "heavy")],
                      [VPS_H1, LAP1]))
    assert plan.waiting[1] is plan.waiting[2]
    assert [r.host for r in plan.waiting[3]] == ["vps-h1", "lap1"]
    assert repr(plan.waiting) == "<3 waiting jobs>"


def test_once_the_fleet_is_full_everyone_waits_for_a_slot():
    hosts = [HostSpec(f"h{i}", 64, 0, prime=WindowCaps(1)) for i in range(3)]
    jobs = [job(i, weight) for i, weight in
            enumerate(["light", "heavy", "light", "playwright", "subagent", "light"], 1)]
    plan = place(snap(jobs, hosts))
    assert sorted(placed(plan)) == [1, 2, 3]
    for job_id in (4, 5, 6):
        assert set(reasons(plan, job_id).values()) == {Reason.SLOTS_FULL}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="unique"):
        place(snap([job(1)], [BMS4, BMS4]))
    with pytest.raises(ValueError, match="unique"):
        place(snap([job(1), job(1, "heavy")], [BMS4]))
    with pytest.raises(ValueError, match="strategy"):
        PlacementPolicy(strategy="random")


# --- a naive reference and properties over random snapshots ----------------------------


class Reference:
    """Jobs × hosts, one filter at a time: slow, obvious, and what `place` must equal."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        policy = snapshot.policy
        self.weights = snapshot.weights
        self.window = policy.schedule.window_at(snapshot.now)
        self.hosts = list(snapshot.hosts)
        self.free: dict[str, float] = {}
        self.slots: dict[str, int] = {}
        self.bookable: dict[str, float] = {}
        self.health: dict[str, HostHealth] = {}
        self.agent_down: dict[str, bool] = {}
        self.held: dict[str, int] = {}
        for host in self.hosts:
            load = snapshot.loads.get(host.label)
            self.health[host.label] = load.health if load else HostHealth.UNKNOWN
            self.agent_down[host.label] = load is not None and load.agent_down is not None
            self.bookable[host.label] = bookable_gb(host.ram_total_gb, host.ram_reserved_gb,
                                                    policy.bookable_fraction)
            self.free[host.label] = self.bookable[host.label] - (load.booked_gb if load else 0.0)
            self.slots[host.label] = self.workers_cap(host) - (load.workers if load else 0)
        enabled = sum(self.workers_cap(h) for h in self.hosts if h.enabled)
        healthy = sum(self.workers_cap(h) for h in self.hosts
                      if h.enabled and accepts_work(self.health[h.label])
                      and not self.agent_down[h.label])
        self.shed_max = policy.shedding.max_weight(healthy / enabled if enabled else 1.0)

    def workers_cap(self, host: HostSpec) -> int:
        return max(0, host.caps(self.window).max_workers)

    def static_reason(self, job: PendingJob, host: HostSpec) -> Reason | None:
        caps = host.caps(self.window)
        checks = [
            (Reason.DRAINED, not host.enabled),
            (Reason.HEALTH, not accepts_work(self.health[host.label])),
            (Reason.AGENT_DOWN, self.agent_down[host.label]),
            (Reason.WINDOW_CLOSED, caps.max_workers <= 0),
            (Reason.JOB_TYPE_NOT_ALLOWED, host.allowed_job_types is not None
             and job.job_type not in host.allowed_job_types),
            (Reason.JOB_TYPE_PINNED, job.job_type in self.snapshot.policy.pinned
             and host.label not in self.snapshot.policy.pinned[job.job_type]),
            (Reason.WEIGHT_NOT_ALLOWED, host.allowed_weights is not None
             and job.weight not in host.allowed_weights),
            (Reason.PRIORITY_FLOOR, host.priority_floor is not None
             and job.priority < host.priority_floor),
            (Reason.AFFINITY, job.affinity is not None and job.affinity != host.label),
            (Reason.UNKNOWN_WEIGHT, not self.weights.known(job.weight)),
            (Reason.MAX_WEIGHT, not self.weights.allows(caps.max_weight, job.weight)),
            (Reason.SHED, not self.weights.allows(self.shed_max, job.weight)),
        ]
        return next((reason for reason, failed in checks if failed), None)

    def reason(self, job: PendingJob, host: HostSpec) -> Reason | None:
        static = self.static_reason(job, host)
        if static is not None:
            return static
        if self.slots[host.label] <= 0:
            return Reason.SLOTS_FULL
        if self.free[host.label] < self.weights.budget(job.weight) - RAM_TOLERANCE_GB:
            return Reason.RAM
        if self.held.get(host.label, job.id) != job.id:
            return Reason.RESERVED
        return None

    def run(self):
        snapshot = self.snapshot
        best_fit = snapshot.policy.strategy == "best_fit"
        cutoff = snapshot.now - timedelta(seconds=snapshot.policy.starvation_wait_seconds)
        assignments, waiting, avoided = [], [], {}
        free = self.free

        def pick(hosts: list[HostSpec], pending: PendingJob) -> HostSpec:
            preferred = [h for h in hosts if h.label == pending.preferred_host]
            return preferred[0] if preferred else min(
                hosts, key=lambda h: (free[h.label] if best_fit else -free[h.label], h.label))

        for pending in sorted(snapshot.jobs, key=lambda j: (j.priority, j.id)):
            fits = [h for h in self.hosts if self.reason(pending, h) is None]
            if fits:
                # The host to avoid only when nothing else fits.
                chosen = pick([h for h in fits if h.label != pending.avoid_host] or fits,
                              pending)
                if chosen.label != pending.avoid_host and pick(fits, pending).label == (
                        pending.avoid_host):
                    avoided[pending.id] = pending.avoid_host
                self.free[chosen.label] -= self.weights.budget(pending.weight)
                self.slots[chosen.label] -= 1
                assignments.append(Assignment(pending.id, chosen.label))
                continue
            waiting.append(pending)
            if pending.waiting_since is not None and pending.waiting_since <= cutoff:
                need = self.weights.budget(pending.weight) - RAM_TOLERANCE_GB \
                    if self.weights.known(pending.weight) else 0.0
                candidates = [h for h in self.hosts if self.static_reason(pending, h) is None
                              and self.bookable[h.label] >= need and h.label not in self.held]
                if candidates:
                    chosen = min(candidates, key=lambda h: (-self.free[h.label], h.label))
                    self.held[chosen.label] = pending.id
        rejections = {p.id: [(h.label, self.reason(p, h)) for h in self.hosts] for p in waiting}
        return assignments, rejections, self.held, avoided


LABELS = ["a", "b", "bms-4", "c", "lap1", "vps-h1", "wsl1"]
WEIGHT_NAMES = ["light", "heavy", "playwright", "orchestrator", "subagent", "mystery"]
CAP_WEIGHTS = [None, "light", "heavy", "playwright", "orchestrator", "subagent"]
JOB_TYPES = ["dev-issue", "review-pr", "infra-task"]
# Hypothesis favours the first choices and small numbers; lead with what makes a fleet work,
# so most examples place some jobs and fight over RAM, slots and reservations.
TOTAL_GB = st.sampled_from([32.0, 16.0, 8.0, 22.4, 12.0, 10.0, 6.0, 3.0, 0.7, 0.0]) | st.floats(
    0, 64, allow_nan=False)
BOOKED_GB = st.sampled_from([0.0, 3.0, 6.0, 8.0, 11.0, 2.5, 0.7, 30.0]) | st.floats(
    0, 40, allow_nan=False)
CAPS = st.builds(WindowCaps, st.sampled_from([2, 1, 3, 4, 2, 1, 0, -1]),
                 st.sampled_from(CAP_WEIGHTS))
HOST_FIELDS = st.tuples(
    TOTAL_GB,
    st.sampled_from([0.0, 0.0, 2.0, 4.0]),
    st.sampled_from([True, True, True, True, False]),
    CAPS,
    CAPS,
    st.sampled_from([None, None, None, frozenset(JOB_TYPES[:2]), frozenset(JOB_TYPES[2:]),
                     frozenset()]),
    st.sampled_from([None, None, None, frozenset({"light"}),
                     frozenset({"light", "heavy", "subagent"}), frozenset({"mystery"})]),
    st.sampled_from([None, None, 5, 12, 0]),
)
LOAD_FIELDS = st.tuples(
    st.sampled_from([True] * 9 + [False]),  # False: no load entry (health unknown)
    st.sampled_from([HEALTHY] * 6 + [HostHealth.DEGRADED, HostHealth.DOWN, HostHealth.UNKNOWN]),
    st.sampled_from([0, 1, 0, 2, 3, 5]),
    BOOKED_GB,
    st.sampled_from([None] * 6 + ["agent stopped"]),
)
TARGET = st.sampled_from([*LABELS, "ghost"])
JOB_FIELDS = st.tuples(
    st.integers(1, 500),
    st.sampled_from([10, 5, 15, 1, 0, 4, 12, 20]),
    st.sampled_from(WEIGHT_NAMES[:3] * 3 + WEIGHT_NAMES),
    st.sampled_from(JOB_TYPES),
    st.none() | st.none() | st.none() | TARGET,
    st.none() | TARGET,
    st.sampled_from([None, 0, 30, 599, 600, 700, 1500]),
    st.none() | st.none() | TARGET,
)
ODD_WEIGHTS = WeightTable(
    {"light": 0.7, "heavy": 2.5, "playwright": 0.1, "orchestrator": 10.0, "subagent": 0.0})


@st.composite
def snapshots(draw) -> Snapshot:
    """Random fleets and queues. Half of them are crowded: every host up and open to all,
    so the examples fight over RAM, slots, preferences and reservations rather than
    mostly failing static filters."""
    crowded = draw(st.booleans())
    now = draw(st.datetimes(datetime(2026, 1, 1), datetime(2026, 12, 31), timezones=st.just(UTC)))
    labels = draw(st.lists(st.sampled_from(LABELS), unique=True, min_size=1, max_size=6))
    hosts = [HostSpec(label, total, reserved, enabled=enabled, prime=prime, night=night,
                      allowed_job_types=job_types, allowed_weights=weights, priority_floor=floor)
             for label, (total, reserved, enabled, prime, night, job_types, weights, floor)
             in zip(labels, draw(st.lists(HOST_FIELDS, min_size=len(labels),
                                          max_size=len(labels))), strict=True)]
    loads = {label: HostLoad(label, health, workers, booked, down)
             for label, (present, health, workers, booked, down) in
             zip(labels, draw(st.lists(LOAD_FIELDS, min_size=len(labels),
                                       max_size=len(labels))), strict=True)
             if present}
    if crowded:
        hosts = [replace(host, enabled=True, allowed_job_types=None, allowed_weights=None,
                         priority_floor=None, prime=WindowCaps(max(1, host.prime.max_workers)),
                         night=WindowCaps(max(1, host.night.max_workers)))
                 for host in hosts]
        loads = {host.label: HostLoad(host.label, HEALTHY, 0, 0.0) for host in hosts} | {
            label: replace(load, health=HEALTHY) for label, load in loads.items()}
    jobs = [PendingJob(job_id, priority, weight, job_type, affinity, preferred,
                       None if waited is None else now - timedelta(seconds=waited), avoid)
            for job_id, priority, weight, job_type, affinity, preferred, waited, avoid
            in draw(st.lists(JOB_FIELDS, min_size=1, max_size=30,
                             unique_by=lambda fields: fields[0]))]
    policy = PlacementPolicy(
        bookable_fraction=draw(st.sampled_from([0.8, 0.5, 1.0])),
        strategy=draw(st.sampled_from(["best_fit", "spread"])),
        starvation_wait_seconds=draw(st.sampled_from([600.0, 0.0, 300.0, 1e9])),
        pinned=draw(st.sampled_from([{}, {}, {"review-pr": frozenset({"a", "b"})},
                                     {"infra-task": frozenset({"bms-4"}),
                                      "dev-issue": frozenset({"ghost"})}])),
    )
    weights = draw(st.sampled_from([DEFAULT_WEIGHTS, ODD_WEIGHTS]))
    return Snapshot(now, jobs, hosts, loads, weights, policy)


REFERENCE = settings(max_examples=300, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])
PROPERTIES = settings(max_examples=120, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@REFERENCE
@given(snapshots())
def test_place_equals_the_naive_reference(snapshot):
    plan = place(snapshot)
    assignments, rejections, held, avoided = Reference(snapshot).run()
    assert list(plan.assignments) == assignments
    assert {job_id: r.host for job_id, r in plan.avoided.items()} == avoided
    assert dict(plan.reservations) == held
    assert {job_id: [(r.host, r.reason) for r in plan.waiting[job_id]]
            for job_id in plan.waiting} == rejections


@PROPERTIES
@given(snapshots(), st.sampled_from([0, 1, 2]))
def test_merged_host_lists_give_the_same_plan(snapshot, pool_after):
    """Shapes that fit many host classes search one merged list; force that path."""
    expected = place(snapshot)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(placement, "POOL_AFTER", pool_after)
        assert place(snapshot) == expected


@PROPERTIES
@given(snapshots())
def test_no_host_is_booked_past_its_ram_or_its_workers(snapshot):
    plan = place(snapshot)
    window = snapshot.policy.schedule.window_at(snapshot.now)
    by_id = {pending.id: pending for pending in snapshot.jobs}
    for host in snapshot.hosts:
        mine = [by_id[a.job_id] for a in plan.assignments if a.host == host.label]
        if not mine:
            continue
        load = snapshot.loads[host.label]
        booked = load.booked_gb + sum(snapshot.weights.budget(p.weight) for p in mine)
        bookable = bookable_gb(host.ram_total_gb, host.ram_reserved_gb,
                               snapshot.policy.bookable_fraction)
        assert booked <= bookable + 1e-6
        assert load.workers + len(mine) <= host.caps(window).max_workers


@PROPERTIES
@given(snapshots())
def test_every_assignment_passes_every_filter_when_it_is_made(snapshot):
    plan = place(snapshot)
    replay = Reference(snapshot)
    by_id = {pending.id: pending for pending in snapshot.jobs}
    hosts = {host.label: host for host in snapshot.hosts}
    order = {pending.id: (pending.priority, pending.id) for pending in snapshot.jobs}
    for assignment in plan.assignments:
        pending = by_id[assignment.job_id]
        assert replay.reason(pending, hosts[assignment.host]) is None
        holder = plan.reservations.get(assignment.host)
        assert holder is None or order[pending.id] < order[holder]  # ahead of the hold
        replay.free[assignment.host] -= snapshot.weights.budget(pending.weight)
        replay.slots[assignment.host] -= 1


@PROPERTIES
@given(snapshots())
def test_each_job_is_placed_once_or_waits_with_a_reason_from_every_host(snapshot):
    plan = place(snapshot)
    assigned = [a.job_id for a in plan.assignments]
    assert len(assigned) == len(set(assigned))
    assert set(assigned).isdisjoint(plan.waiting)
    assert set(assigned) | set(plan.waiting) == {pending.id for pending in snapshot.jobs}
    labels = [host.label for host in snapshot.hosts]
    for job_id in plan.waiting:
        assert [r.host for r in plan.waiting[job_id]] == labels
        assert all(r.detail for r in plan.waiting[job_id])
    assert len(set(plan.reservations.values())) == len(plan.reservations)
    assert set(plan.reservations.values()) <= set(plan.waiting)
    for pending in snapshot.jobs:
        assert explain(pending.id, plan, snapshot)


@PROPERTIES
@given(snapshots(), st.randoms(use_true_random=False))
def test_placement_is_deterministic_and_ignores_host_and_job_order(snapshot, rng):
    plan = place(snapshot)
    assert place(snapshot) == plan
    hosts, jobs = list(snapshot.hosts), list(snapshot.jobs)
    rng.shuffle(hosts)
    rng.shuffle(jobs)
    shuffled = place(replace(snapshot, hosts=hosts, jobs=jobs))
    assert shuffled.assignments == plan.assignments
    assert dict(shuffled.reservations) == dict(plan.reservations)


def test_a_larger_random_cycle_matches_the_reference():
    """Hundreds of jobs on dozens of hosts: the shape and class shortcuts at some scale."""
    rng = random.Random(7)
    hosts = []
    for index in range(40):
        hosts.append(HostSpec(
            f"h{index:02d}", rng.choice([8, 16, 32, 64]), rng.choice([0, 2, 4]),
            enabled=rng.random() > 0.1,
            prime=WindowCaps(rng.randint(0, 6), rng.choice(CAP_WEIGHTS[:5])),
            allowed_job_types=rng.choice([None, None, frozenset({"dev-issue", "review-pr"})]),
            allowed_weights=rng.choice([None, None, frozenset({"light"})]),
            priority_floor=rng.choice([None, None, 5, 12]),
        ))
    health = [HEALTHY] * 6 + list(HostHealth)
    loads = {host.label: HostLoad(host.label, rng.choice(health), rng.randint(0, 3),
                                  rng.choice([0.0, 3.0, 8.0, 11.0])) for host in hosts}
    labels = [host.label for host in hosts]
    for strategy in ("best_fit", "spread"):
        jobs = [PendingJob(
            job_id, rng.choice([1, 5, 10, 15, 50]), rng.choice(WEIGHT_NAMES[:5]),
            rng.choice(JOB_TYPES), affinity=rng.choice([None] * 20 + labels[:3]),
            preferred_host=rng.choice([None] * 5 + labels),
            waiting_since=NOON - timedelta(seconds=rng.randint(0, 1200)),
            avoid_host=rng.choice([None] * 5 + labels),
        ) for job_id in range(1, 601)]
        snapshot = Snapshot(NOON, jobs, hosts, loads, DEFAULT_WEIGHTS,
                            PlacementPolicy(strategy=strategy))
        plan = place(snapshot)
        assignments, rejections, held, avoided = Reference(snapshot).run()
        assert list(plan.assignments) == assignments
        assert {job_id: r.host for job_id, r in plan.avoided.items()} == avoided
        assert dict(plan.reservations) == held
        assert {job_id: [(r.host, r.reason) for r in plan.waiting[job_id]]
                for job_id in plan.waiting} == rejections


def test_a_job_type_blocked_on_a_host_goes_elsewhere_and_says_why():
    """A host whose preflight for a job type failed (or whose breaker for it is open) takes
    other types as before; a job of that type goes elsewhere, or waits naming the reason."""
    blocked = {"dev-issue": (Reason.PREFLIGHT_FAILED, "preflight failed: claude: not found")}
    loads = {**idle(BMS4, VPS_H1), "bms-4": HostLoad("bms-4", HEALTHY, 0, 0.0, blocked=blocked)}
    plan = place(snap([job(1), job(2, job_type="review-pr")], [BMS4, VPS_H1], loads))
    assert placed(plan) == {1: "vps-h1", 2: "bms-4"}
    alone = place(snap([job(1)], [BMS4], {"bms-4": loads["bms-4"]}))
    assert only_rejection(alone, 1) == Rejection(
        "bms-4", Reason.PREFLIGHT_FAILED, "preflight failed: claude: not found")
    assert "preflight failed" in explain(1, alone, snap([job(1)], [BMS4],
                                                        {"bms-4": loads["bms-4"]}))


def test_an_open_breaker_is_a_reason_of_its_own():
    blocked = {"dev-issue": (Reason.BREAKER_OPEN, "3 transient outcomes in a row, until 12:05")}
    loads = {"bms-4": HostLoad("bms-4", HEALTHY, 0, 0.0, blocked=blocked)}
    plan = place(snap([job(1)], [BMS4], loads))
    assert reasons(plan, 1) == {"bms-4": Reason.BREAKER_OPEN}


def test_the_fleet_is_stopped_only_when_no_host_is_able_to_run_anything():
    down = {"bms-4": HostLoad("bms-4", HostHealth.DOWN, 0, 0.0),
            "vps-h1": HostLoad("vps-h1", HEALTHY, 0, 0.0, blocked={
                "dev-issue": (Reason.PREFLIGHT_FAILED, "preflight failed: no claude")})}
    plan = place(snap([job(1), job(2)], [BMS4, VPS_H1], down))
    assert placement.stopped(plan) == {"bms-4": "down",
                                       "vps-h1": "preflight failed: no claude"}
    # Work placed, or waiting only for room or for a host that suits it: not stopped.
    assert placement.stopped(place(snap([job(1)], [BMS4]))) is None
    full = {"bms-4": HostLoad("bms-4", HEALTHY, 6, 0.0)}
    assert placement.stopped(place(snap([job(1)], [BMS4], full))) is None
    assert placement.stopped(place(snap([job(1, job_type="infra-task")], [WSL1]))) is None
    assert placement.stopped(place(snap([], [BMS4], down))) is None
