"""bench/RESULTS.md's generator, on made-up measurements: ratios, sections, missing peers.

No benchmark runs here; `bench/results_report.py` is pure (a dict in, markdown out)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import results_report as report


def claim(group: str, variant: str, rate: float, valid: bool = True) -> dict[str, object]:
    return {"group": group, "variant": variant, "ops_per_s": rate, "valid": valid}


def measurements(**parts: object) -> dict[str, object]:
    """A run whose named parts ran (data) or failed (an Exception's message)."""
    entries = {name: ({"ok": False, "error": str(data)} if isinstance(data, Exception)
                      else {"ok": True, "data": data}) for name, data in parts.items()}
    return {"meta": {"date": "2026-12-05 20:00 UTC", "mode": "quick", "cores": 2,
                     "command": "bench/run.sh --quick", "machine": "2 cores",
                     "load_before": [3.1, 2.0, 1.0], "load_after": [2.5, 2.0, 1.0],
                     "versions": {"herder": "abc1234", "pgqueuer": "1.6.0"}},
            "parts": entries}


STORE = [
    claim("herder-pg", "claim-finish B=10 c=1", 5000),
    claim("herder-raw-pg", "claim-finish B=10 c=1", 8000),
    claim("herder-sqlite", "claim-finish B=10 c=1 sync=full", 3000),
    claim("herder-raw-sqlite", "claim-finish B=10 c=1 sync=full", 10000),
    claim("herder-sqlite", "claim-finish B=10 c=1 sync=normal", 1000),
    claim("herder-raw-sqlite", "claim-finish B=10 c=1 sync=normal", 10000),
]


@pytest.mark.parametrize(("value", "text"), [
    (None, "—"), (0.0012, "0.0012×"), (0.625, "0.62×"), (1.25, "1.2×"), (41.4, "41×"),
    (1234.0, "1,234×")])
def test_ratios_are_formatted_for_reading(value, text):
    assert report.format_ratio(value) == text


def test_a_ratio_needs_both_figures_and_a_nonzero_peer():
    assert report.ratio(5.0, 10.0) == 0.5
    assert report.ratio(None, 10.0) is None
    assert report.ratio(5.0, None) is None
    assert report.ratio(5.0, 0.0) is None


@pytest.mark.parametrize(("value", "unit", "text"), [
    (12314.4, "jobs/s", "12,314 jobs/s"), (3.44, "ms", "3.44 ms"), (0.1704, "s", "0.170 s"),
    (61.04, "s", "61.0 s"), (0.0012, "s", "0.0012 s"), (0.0, "", "0"), (None, "ms", "—")])
def test_figures_keep_their_units(value, unit, text):
    assert report.format_value(value, unit) == text


def test_the_store_guard_is_judged_on_default_settings_only():
    found, guards = report.sections(measurements(store=STORE))
    store = found[0]
    cells = {row.what: row.ratio for row in store.rows}
    assert cells["PostgreSQL, B=10 c=1"] == pytest.approx(0.625)
    assert cells["SQLite, B=10 c=1 sync=full"] == pytest.approx(0.3)
    assert cells["SQLite, B=10 c=1 sync=normal"] == pytest.approx(0.1), "shown, not guarded"
    guard = guards[0]
    assert guard.held is False
    assert "0.30×–0.62×" in guard.detail and "SQLite, B=10 c=1 sync=full" in guard.detail


def test_the_store_guard_holds_when_every_default_cell_does():
    rows = [*STORE[:2], claim("herder-sqlite", "claim-finish B=10 c=1 sync=full", 4100),
            STORE[3]]
    _, guards = report.sections(measurements(store=rows))
    assert guards[0].held is True


def test_postgres_cells_meet_the_peer_rows_that_do_the_same():
    found, _ = report.sections(measurements(
        store=STORE, pgbench=[claim("pg-raw", "claim10_2tx c=1", 10000),
                              claim("pg-raw", "claim1_2tx c=1", 2000)],
        pgqueuer=[claim("pgqueuer", "process default (asyncpg, batch_size=10, unlimited)",
                        2500)]))
    same = [row for row in found[0].rows if "same batch" in (row.peer or "")]
    assert [(row.peer.split(",")[0], row.ratio) for row in same] == [
        ("pgbench SKIP LOCKED loop", 0.5), ("PGQueuer", 2.0)]
    assert report.like_for_like("claim-finish B=1 c=4")[-1] == (
        "procrastinate", "worker concurrency=4",
        "Procrastinate, one job per fetch, same concurrency")


def test_invalid_runs_are_left_out_and_counted():
    rows = [*STORE[:2], claim("herder-pg", "claim-finish B=10 c=1", 99999, valid=False)]
    store = report.sections(measurements(store=rows))[0][0]
    assert store.rows[0].value == 5000
    assert any("1 run(s) failed their checks" in note for note in store.notes)


def test_missing_peers_are_named_with_the_reason_and_get_no_ratio():
    found, _ = report.sections(measurements(
        store=STORE, pgbench=[claim("pg-raw", "claim10_2tx c=1", 9000)],
        pgqueuer=RuntimeError("no peers' venv at /tmp/peers-venv")))
    rows = {row.peer.split(" (")[0]: row for row in found[0].rows
            if row.peer and "best" in row.peer}
    assert rows["pgbench SKIP LOCKED loop, best"].ratio == pytest.approx(5000 / 9000)
    pgqueuer = rows["PGQueuer, best"]
    assert pgqueuer.ratio is None and "no peers' venv" in pgqueuer.missing
    assert rows["Procrastinate, best"].missing == "not run"
    cells = report.row_cells(pgqueuer)
    assert cells[2].startswith("PGQueuer, best: not measured (no peers' venv")
    assert cells[3] == "—"


def test_a_part_that_did_not_run_says_why_and_its_guard_is_not_measured():
    page = report.render(measurements(chaos=RuntimeError("pytest exited 1 without figures")))
    assert "**Not available in this run:** pytest exited 1 without figures" in page
    assert "| store claim → finish ≥ 0.4× the raw loop | ≥ 0.4× | not measured |" in page
    assert page.count("*How to read:*") == 10  # the guards and every section


def test_the_page_has_its_header_and_one_section_per_measurement():
    page = report.render(measurements(
        store=STORE,
        cancel={"samples": 5, "herder": {"p50_s": 0.006, "max_s": 0.01},
                "killpg": {"p50_s": 0.0012, "max_s": 0.002}},
        cli={"python -c pass": {"median_ms": 20.0, "p90_ms": 22.0, "cpu_median_ms": 18.0},
             "herder jobs": {"median_ms": 80.0, "p90_ms": 90.0, "cpu_median_ms": 60.0}},
        placement=[{"hosts": 10000, "jobs": 100000, "fleet": "templated",
                    "strategy": "best_fit", "seconds": 0.25, "placed": 9000}],
        idle=[{"part": "idle", "backend": "sqlite", "agents": 200, "cores": 0.05,
               "errors": 0}],
    ))
    assert page.startswith("# herder benchmark results\n")
    assert "before 3.10 / 2.00 / 1.00, after 2.50 / 2.00 / 1.00 on 2 cores" in page
    assert "the machine was busy with other work" in page
    assert "herder abc1234, pgqueuer 1.6.0" in page
    assert "`bench/run.sh --quick`" in page
    assert "| cancel → tree gone, p50 | 6.00 ms | killpg(SIGTERM) → tree gone, p50: 1.20 ms " \
           "| 5.0× ↓ |" in page
    assert "| `herder jobs` | 80.0 ms | `python -c pass`: 20.0 ms | 4.0× ↓ | p90 90 ms |" in page
    assert "| 10,000 hosts × 100,000 jobs (templated, best_fit) | 0.250 s | target: 1.00 s " \
           "| 0.25× ↓ |" in page
    assert "| 200 idle agents, sqlite | 4,000 agents/core | target: 1,000 agents/core " \
           "| 4.0× ↑ |" in page
    titles = [line for line in page.splitlines() if line.startswith("## ")]
    assert titles == ["## Guards", "## Store: claim → finish throughput",
                      "## Submit → start latency", "## Cancel → process tree gone",
                      "## Recovery after kill -9", "## Placement cycle time vs fleet size",
                      "## Idle agents per server core", "## CLI wall time", "## Chaos suite",
                      "## herder simulate: RAM against its lower bound"]


def test_latency_rows_compare_the_agent_with_the_local_executor_and_the_follower_with_it():
    local = [{"group": "herder-pg", "variant": "latency submit->start", "p50_ms": 4.0,
              "p99_ms": 8.0}]
    fleet = [{"part": "latency", "backend": "postgres", "replicas": 1, "p50_ms": 40.0,
              "p99_ms": 60.0},
             {"part": "latency", "backend": "postgres", "replicas": 2, "p50_ms": 44.0,
              "p99_ms": 66.0},
             {"part": "latency", "backend": "sqlite", "replicas": 1, "p50_ms": 20.0,
              "p99_ms": 30.0}]
    section = report.latency_section(measurements(latency_local=local, fleet=fleet))
    rows = {row.what: row for row in section.rows}
    assert rows["agent over HTTP, PostgreSQL, p50"].ratio == pytest.approx(10.0)
    assert rows["agent on a follower replica, PostgreSQL, p99"].ratio == pytest.approx(1.1)
    sqlite = rows["agent over HTTP, SQLite, p50"]
    assert sqlite.ratio is None and sqlite.missing == "local not measured"


def test_chaos_figures_and_guard():
    chaos = {"seed": 11, "seconds": 30.0, "heartbeat_s": 0.5, "lease_s": 3.0,
             "jobs_submitted": 10, "jobs_done": 10, "jobs_lost": 0, "faults": 8,
             "faults_by_kind": {"host_dies": 2, "network_cut": 6}, "attempts_started": 14,
             "overlaps": 0, "recovery_target_s": 4.0,
             "host_dies_recovery": {"n": 2, "p50_s": 3.0, "max_s": 5.0, "never": 0},
             "agent_dies_recovery": {"n": 0, "p50_s": None, "max_s": None},
             "invariants": {"every job done": True, "no overlapping attempts": True}}
    section, guards = report.chaos_section(measurements(chaos=chaos))
    rows = {row.what: row for row in section.rows}
    assert rows["faults survived"].ratio == 1.0
    assert rows["host dies → job running again, p50"].ratio == pytest.approx(0.75)
    assert rows["agent dies → job running again, p50"].ratio is None
    assert guards[0].held is True
    broken = {**chaos, "invariants": {"every job done": False}, "jobs_lost": 1}
    section, guards = report.chaos_section(measurements(chaos=broken))
    assert guards[0].held is False
    assert {row.what: row.value for row in section.rows}["faults survived"] == 0


def test_the_simulator_section_sets_ram_against_the_lower_bound_or_says_not_available():
    absent = report.simulate_section(measurements(
        simulate=RuntimeError("no trace in bench/traces")))
    assert "no trace" in absent.unavailable
    figures = {"lower_bound": 0.25, "utilization": 0.5, "used_utilization": 0.3,
               "wait_by_weight": {"heavy": {"jobs": 3, "p50": 0.0, "p95": 120.0, "p99": 180.0}},
               "jobs": 3, "makespan": 7200.0, "done": 2, "failed": 1, "escalated": 0,
               "rotated": 0, "lost_attempts": 0}
    present = report.simulate_section(measurements(
        simulate={"week": {"figures": figures, "wall_s": 1.5}}))
    rows = {row.what: row for row in present.rows}
    assert rows["`week`: RAM booked, share of fleet RAM-time"].ratio == pytest.approx(2.0)
    assert rows["`week`: RAM really used, share of fleet RAM-time"].ratio == pytest.approx(0.6)
    assert rows["`week`: wait to first start, heavy, p95"].value == pytest.approx(2.0)
    assert "1 failed" in present.notes[0]


def test_recovery_sets_the_agent_crash_against_its_target_and_the_dead_host_against_the_bound():
    recovery = {"heartbeat_s": 1.0, "lease_s": 6.0, "missed": 3, "bound_s": 8.0, "reps": 2,
                "backends": {"sqlite": {"crash_s": [1.0, 3.0], "host_running_s": [7.0, 9.0],
                                        "host_placed_s": [], "late_placements": 0}}}
    section = report.recovery_section(measurements(recovery=recovery))
    rows = {row.what: row for row in section.rows}
    assert rows["kill -9 of an agent → its job running elsewhere, sqlite, p50"].ratio == 1.0
    assert rows["kill -9 of a host → its running job elsewhere, sqlite, max"].ratio == \
        pytest.approx(9 / 8)
    assert not any("placed at the kill" in row.what for row in section.rows)
    assert "heartbeat 1 s, lease 6 s" in section.notes[0]
