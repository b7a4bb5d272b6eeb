"""Seed 003's capacity ratio and seed 004's spawn failures per host, where an operator looks:
`/queue` (JSON) and `/metrics` (Prometheus). The ratio's rule and the metric families are
pure and unit tested; the per-host count is a store query, on both backends; and a real
server with a real agent shows both, the spawn failure being a real RAM-contention hand-back
(a weight bigger than the machine's free memory)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from support.waits import wait_for

from herder.core.model import AttemptResult, Decision, JobSpec, JobStatus, Outcome
from herder.core.scheduling.capacity import WindowCaps
from herder.core.scheduling.health import HostHealth
from herder.core.scheduling.placement import HostLoad, HostSpec, fleet_capacity
from herder.runtime.metrics import FleetSample, families

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


# -- pure --------------------------------------------------------------------------------------


def test_the_capacity_ratio_is_the_share_of_enabled_slots_on_hosts_taking_work():
    hosts = [HostSpec("a", 32, prime=WindowCaps(6), night=WindowCaps(2)),
             HostSpec("b", 8, prime=WindowCaps(2), night=WindowCaps(2)),
             HostSpec("c", 8, prime=WindowCaps(4), enabled=False)]
    live = {"a": HostLoad("a", HostHealth.HEALTHY, 0, 0.0),
            "b": HostLoad("b", HostHealth.DOWN, 0, 0.0),
            "c": HostLoad("c", HostHealth.HEALTHY, 0, 0.0)}
    assert fleet_capacity(hosts, live, "prime") == 6 / 8  # the drained host counts nowhere
    assert fleet_capacity(hosts, live, "night") == 2 / 4  # the window's own caps
    degraded = {**live, "b": HostLoad("b", HostHealth.DEGRADED, 0, 0.0)}
    assert fleet_capacity(hosts, degraded, "prime") == 1.0
    agent_down = {**degraded, "a": HostLoad("a", HostHealth.HEALTHY, 0, 0.0, "agent silent")}
    assert fleet_capacity(hosts, agent_down, "prime") == 2 / 8
    assert fleet_capacity(hosts, {}, "prime") == 0.0  # never heard of: unknown, not healthy
    assert fleet_capacity([], {}, "prime") == 1.0


def test_families_carry_the_ratio_the_spawn_failures_and_the_fleet_cap():
    sample = FleetSample(statuses={}, queue_depth={}, failures={}, capacity_ratio=0.5,
                         spawn_failures={("a", "ram_contention"): 2, ("b", "oom"): 1},
                         max_workers=3)
    text = "".join(f"{s.name} {s.labels} {s.value}\n"
                   for family in families(sample) for s in family.samples)
    assert "herder_capacity_ratio {} 0.5" in text
    assert "herder_host_spawn_failures {'host': 'a', 'outcome': 'ram_contention'} 2" in text
    assert "herder_host_spawn_failures {'host': 'b', 'outcome': 'oom'} 1" in text
    assert "herder_fleet_max_workers {} 3" in text
    uncapped = FleetSample(statuses={}, queue_depth={}, failures={})
    text = "".join(f"{s.name} {s.value}\n"
                   for family in families(uncapped) for s in family.samples)
    assert "herder_capacity_ratio 1.0" in text and "herder_fleet_max_workers" not in text


# -- the store, both backends ------------------------------------------------------------------


def test_attempt_outcomes_are_counted_by_host_since_a_time(store):
    def ended(host: str, outcome: Outcome, seconds: float) -> None:
        store.job_insert([JobSpec(command=("true",), weight="light")], T0)
        [job] = store.job_claim(host, "w1", 1, T0 + timedelta(seconds=seconds - 1))
        decision = Decision(JobStatus.QUEUED, available_at=T0 + timedelta(hours=9),
                            failure_reason="spawn_ram", spend_spawn_failure=True)
        store.attempt_finish([AttemptResult(job.token, outcome, 3, decision)],
                             T0 + timedelta(seconds=seconds))

    ended("h1", Outcome.RAM_CONTENTION, 10)
    ended("h1", Outcome.RAM_CONTENTION, 3600)
    ended("h1", Outcome.OOM, 3700)
    ended("h2", Outcome.RAM_CONTENTION, 3800)
    assert store.attempt_outcome_counts(T0 + timedelta(seconds=100)) == {
        ("h1", Outcome.RAM_CONTENTION): 1, ("h1", Outcome.OOM): 1,
        ("h2", Outcome.RAM_CONTENTION): 1}
    assert store.attempt_outcome_counts(T0)[("h1", Outcome.RAM_CONTENTION)] == 2
    assert store.attempt_outcome_counts(T0 + timedelta(hours=2)) == {}


# -- a real server and agent -------------------------------------------------------------------


def test_queue_and_metrics_show_the_capacity_ratio_and_spawn_failures(make_fleet, tmp_path,
                                                                      store_url):
    # A weight no machine has the memory for: the agent hands the job back (RAM contention,
    # seed 004's exit 3) before it starts anything.
    fleet = make_fleet(tmp_path, store_url, fleet={"emergency_max_workers": 7},
                       extra="[weights]\nhuge = 50000\n")
    fleet.add_host("alpha", "--ram", "200000", "--prime-workers", "2", "--night-workers", "2")
    fleet.start_server()
    fleet.start_agent("alpha", ram_check=True)

    job = fleet.submit(["true"], weight="huge", affinity="alpha")
    wait_for(lambda: fleet.store.job_get(job).spawn_failures >= 1, 60,
             "a RAM-contention hand-back", fleet.describe)
    # Only now a host no agent serves: never heard of, so half the slots are gone (and
    # the huge weight is shed from here on).
    fleet.add_host("beta", "--ram", "16", "--prime-workers", "2", "--night-workers", "2")

    view = fleet.api("GET", "/queue").json()
    assert view["capacity_ratio"] == 0.5
    assert view["shed_max_weight"] == "heavy"  # seed 003: at 50 % playwright is shed
    assert set(view["spawn_failures"]) == {"alpha"}
    assert view["spawn_failures"]["alpha"]["ram_contention"] >= 1
    assert view["fleet_cap"]["max_workers"] == 7 and view["fleet_cap"]["at_run_time"] is False

    found = samples(fleet.api("GET", "/metrics").text)
    assert found[("herder_capacity_ratio", ())] == 0.5
    assert found[("herder_host_spawn_failures", (("host", "alpha"),
                                                 ("outcome", "ram_contention")))] >= 1
    assert found[("herder_fleet_max_workers", ())] == 7
