"""bench/RESULTS.md from one run's measurements: pure functions, no processes, no clock.

`bench/run_results.py` runs the benchmarks and collects what each one wrote into one dict
(`measurements.json` in the run's folder); `render(measurements)` turns that dict into the
page. Every figure stands next to its peer or limit from the same run and their ratio; a
part that did not run (or a peer that was not measured) is said so in its section, never
left out silently.

The dict: {"meta": {...header...}, "parts": {name: {"ok": bool, "data": ..., "error": str,
"seconds": float}}}; the part names and the shape of each part's data are the ones
`run_results.py` writes (see PARTS there).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

STORE_GUARD = 0.4
"""herder's claim → finish throughput must hold this share of the same-run raw loop in
every measured cell at default settings (PostgreSQL, SQLite synchronous=FULL)."""


CRASH_TARGET = 2.0
"""Seconds from an agent's SIGKILL (its guardian alive) to its job running elsewhere."""


@dataclass(frozen=True)
class Row:
    """One figure, its peer or limit from the same run, and how to compare them.

    `higher_is_better` decides how the ratio reads; `peer` None means there is no peer
    for this figure (the ratio column says so), `peer_value` None with a peer means the
    peer was not measured in this run (`missing` says why)."""

    what: str
    value: float | None
    unit: str
    peer: str | None = None
    peer_value: float | None = None
    higher_is_better: bool = True
    missing: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return ratio(self.value, self.peer_value)


@dataclass(frozen=True)
class Section:
    title: str
    how_to_read: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    unavailable: str = ""  # the whole section did not run: why


@dataclass(frozen=True)
class Guard:
    name: str
    threshold: str
    held: bool | None  # None: not measured in this run
    detail: str


# -- formatting --------------------------------------------------------------------------------


def ratio(value: float | None, peer_value: float | None) -> float | None:
    """value / peer_value, or None when either is missing or the peer is zero."""
    if value is None or peer_value is None or peer_value == 0:
        return None
    return value / peer_value


def format_ratio(value: float | None) -> str:
    """0.62×, 41×, 1.2×: two significant digits below 10, whole numbers above."""
    if value is None:
        return "—"
    if value >= 10:
        return f"{value:,.0f}×"
    if value >= 1:
        return f"{value:.1f}×"
    if value >= 0.1:
        return f"{value:.2f}×"
    return f"{value:.2g}×"


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit, rounded for reading: 12,314 jobs/s, 3.4 ms, 0.170 s."""
    if value is None:
        return "—"
    if unit in ("ms", "s") and 0 < abs(value) < 0.01:
        return f"{value:.2g} {unit}"
    if unit in ("ms", "s"):
        digits = 3 if abs(value) < 1 else 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
        return f"{value:,.{digits}f} {unit}"
    if unit == "":
        return f"{value:,.0f}" if value == int(value) else f"{value:,.2f}"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:,.2f} {unit}"


def row_cells(row: Row) -> list[str]:
    figure = format_value(row.value, row.unit)
    if row.value is None and row.missing:
        figure = f"— ({row.missing})"
    if row.peer is None:
        peer, shown = "no peer", "—"
    elif row.peer_value is None:
        peer = f"{row.peer}: not measured" + (f" ({row.missing})" if row.missing else "")
        shown = "—"
    else:
        peer = f"{row.peer}: {format_value(row.peer_value, row.unit)}"
        shown = format_ratio(row.ratio)
        if row.ratio is not None:
            shown += " ↑" if row.higher_is_better else " ↓"
    return [row.what, figure, peer, shown, row.note]


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
    return [line(headers), "|" + "---|" * len(headers), *(line(cells) for cells in rows)]


def render_section(section: Section) -> list[str]:
    lines = [f"## {section.title}", "", f"*How to read:* {section.how_to_read} "
             "(↑: a higher ratio is better, ↓: a lower one.)", ""]
    if section.unavailable:
        why = section.unavailable.removeprefix("not available: ")
        lines += [f"**Not available in this run:** {why}", ""]
    if section.rows:
        lines += table(["figure", "value", "peer / limit (same run)", "ratio", "note"],
                       (row_cells(row) for row in section.rows))
        lines.append("")
    for note in section.notes:  # one paragraph each
        lines += [note, ""]
    return lines


def render_guards(guards: Sequence[Guard]) -> list[str]:
    lines = ["## Guards", "",
             "*How to read:* a guard is a ratio (or a count) the project promises to hold; "
             "a failed guard is a regression to fix before a release, whatever the "
             "absolute figures.", ""]
    states = {True: "held", False: "**FAILED**", None: "not measured"}
    lines += table(["guard", "threshold", "this run", "detail"],
                   ([g.name, g.threshold, states[g.held], g.detail] for g in guards))
    return [*lines, ""]


def render_header(meta: Mapping[str, Any]) -> list[str]:
    load_before = meta.get("load_before") or []
    load_after = meta.get("load_after") or []
    cores = meta.get("cores") or 0
    lines = [
        "# herder benchmark results",
        "",
        "Generated by `" + str(meta.get("command", "bench/run.sh")) + "`; do not edit by hand "
        "(see `bench/README.md`).",
        "",
        f"- **date:** {meta.get('date', '?')} ({meta.get('mode', '?')} run, "
        f"{meta.get('elapsed_s', 0):.0f} s)",
        f"- **machine:** {meta.get('machine', '?')}",
        f"- **load average (1/5/15 min):** before {fmt_load(load_before)}, "
        f"after {fmt_load(load_after)} on {cores} cores",
    ]
    versions = meta.get("versions") or {}
    if versions:
        lines.append("- **versions:** " + ", ".join(f"{name} {version}" for name, version
                                                    in versions.items()))
    lines.append(f"- **command:** `{meta.get('command', 'bench/run.sh')}`")
    busiest = max([*load_before[:1], *load_after[:1]], default=0.0)
    if cores and busiest > 0.5 * cores:
        lines.append("- **note:** the machine was busy with other work during this run "
                     "(load average above half its cores): absolute figures are low and "
                     "noisy; the ratios, measured back to back in the same run, are the "
                     "figures to compare. The full run is meant for a quiet machine.")
    if meta.get("mode") == "quick":
        lines.append("- **quick mode:** short runs and few samples per figure (the store: "
                     "one batch size, one claimer, 3 × 3 s); recovery uses short timings "
                     "(see its section). `bench/run.sh` without `--quick` is the full run.")
    return [*lines, ""]


def fmt_load(values: Sequence[float]) -> str:
    return " / ".join(f"{value:.2f}" for value in values) if values else "?"


# -- the sections ------------------------------------------------------------------------------


def part(measurements: Mapping[str, Any], name: str) -> tuple[Any, str]:
    """(the part's data, "") when it ran, else (None, why not)."""
    entry = (measurements.get("parts") or {}).get(name)
    if entry is None:
        return None, "not run"
    if not entry.get("ok"):
        return None, str(entry.get("error") or "failed")
    return entry.get("data"), ""


def measured_section(measurements: Mapping[str, Any], name: str, title: str, how: str,
                     build: Callable[[Any], tuple[list[Row], list[str]]]) -> Section:
    """The section of one part: its rows and notes from `build(data)`, or why it is empty."""
    data, why = part(measurements, name)
    if data is None:
        return Section(title, how, unavailable=why)
    rows, notes = build(data)
    return Section(title, how, rows, notes)


def median_of(rows: Iterable[Mapping[str, Any]], key: str = "ops_per_s") -> float | None:
    values = [float(row[key]) for row in rows if row.get(key) is not None]
    return statistics.median(values) if values else None


def grouped(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[Mapping[str, Any]]]:
    """Valid rows by (group, variant)."""
    found: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("valid", True):
            found.setdefault((row["group"], row["variant"]), []).append(row)
    return found


def best(groups: Mapping[tuple[str, str], list[Mapping[str, Any]]], group: str,
         pick: Callable[[str], bool] = lambda variant: True) -> tuple[str, float] | None:
    """The variant of `group` with the highest median rate: (variant, rate)."""
    found = [(variant, rate) for (name, variant), rows in groups.items()
             if name == group and pick(variant) and (rate := median_of(rows)) is not None]
    return max(found, key=lambda item: item[1]) if found else None


def store_section(measurements: Mapping[str, Any]) -> tuple[Section, list[Guard]]:
    how = ("jobs per second through herder's store (claim a batch of B with c claimers, "
           "finish it), median of the repetitions. Each herder cell is set against a bare "
           "Python claim loop on a one-table schema in the same database and run (the raw "
           "limit for that shape), and on PostgreSQL against the peers' rows that do the same "
           "(pgbench's SKIP LOCKED script with no Python at all, PGQueuer with the same batch); "
           "the last rows set herder's best PostgreSQL cell against the best row of each peer. "
           "Ratio = herder / peer: above 1 herder is faster.")
    data, why = part(measurements, "store")
    title = "Store: claim → finish throughput"
    if data is None:
        guard = Guard("store claim → finish ≥ 0.4× the raw loop", f"≥ {STORE_GUARD}×", None,
                      f"store part: {why}")
        return Section(title, how, unavailable=why), [guard]
    peers = [row for name in ("pgbench", "pgqueuer", "procrastinate")
             for row in (part(measurements, name)[0] or [])]
    groups = grouped([*data, *peers])
    rows: list[Row] = []
    ratios: list[tuple[str, float]] = []
    cells = sorted({variant for (group, variant) in groups if group.startswith("herder-")
                    and not group.startswith("herder-raw") and variant.startswith("claim")},
                   key=cell_order)
    for backend, label in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
        for variant in cells:
            herder_rows = groups.get((f"herder-{backend}", variant))
            if not herder_rows:
                continue
            raw_rows = groups.get((f"herder-raw-{backend}", variant), [])
            item = Row(f"{label}, {variant.removeprefix('claim-finish ')}",
                       median_of(herder_rows), "jobs/s", "raw Python loop",
                       median_of(raw_rows), missing="" if raw_rows else "raw part not run")
            rows.append(item)
            if item.ratio is not None and default_settings(variant):
                ratios.append((item.what, item.ratio))
            if backend == "pg":
                rows += [Row(item.what, item.value, "jobs/s", f"{peer} ({peer_variant})",
                             median_of(groups[(group, peer_variant)]))
                         for group, peer_variant, peer in like_for_like(variant)
                         if (group, peer_variant) in groups]
    herder_pg = best(groups, "herder-pg", lambda variant: variant.startswith("claim"))
    if herder_pg is not None:
        what = f"PostgreSQL, best cell ({herder_pg[0].removeprefix('claim-finish ')})"
        for group, peer, pick, why_missing in (
                ("pg-raw", "pgbench SKIP LOCKED loop, best", lambda v: v.startswith("claim"),
                 peer_missing(measurements, "pgbench")),
                ("pgqueuer", "PGQueuer, best", lambda v: v.startswith("process"),
                 peer_missing(measurements, "pgqueuer")),
                ("procrastinate", "Procrastinate, best", lambda v: "worker" in v,
                 peer_missing(measurements, "procrastinate"))):
            found = best(groups, group, pick)
            rows.append(Row(what, herder_pg[1], "jobs/s",
                            peer + (f" ({found[0]})" if found else ""),
                            found[1] if found else None, missing=why_missing))
    guard = store_guard(ratios)
    notes = ["\"Default settings\" for the guard: PostgreSQL, and SQLite with "
             "`synchronous=FULL` (herder's default); cells with other settings are shown "
             "but not guarded.",
             "On a busy machine the guard's ratios read low: herder's loop spends CPU where "
             "the raw loops mostly wait on fsync, so other work slows herder more. A failed "
             "guard in a run with a high load average is to be checked on a quiet machine "
             "before it is believed.",
             f"herder's cells in this run: {', '.join(cells) or 'none'}. A best-row "
             "comparison is only as fair as that coverage: the full run measures batches 1, "
             "10 and 100 with 1 and 4 claimers, as the peers' best rows use big batches."]
    invalid = sum(1 for row in data if not row.get("valid", True))
    if invalid:
        notes.append(f"{invalid} run(s) failed their checks (queue ran dry, lost or doubled "
                     "jobs) and are left out of the medians.")
    return Section(title, how, rows, notes), [guard]


def cell_words(variant: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in variant.split() if "=" in word)


def cell_order(variant: str) -> tuple[int, int, str]:
    words = cell_words(variant)
    return int(words.get("B", 0)), int(words.get("c", 0)), variant


def like_for_like(variant: str) -> list[tuple[str, str, str]]:
    """The peers' rows that do what a herder PostgreSQL cell does: (group, variant, label).
    pgbench's scripts claim 1 or 10 per statement; a PGQueuer worker fetches `batch_size`
    jobs per round trip; Procrastinate fetches one job at a time per worker."""
    words = cell_words(variant)
    batch, clients = int(words.get("B", 0)), int(words.get("c", 0))
    found = []
    if batch in (1, 10):
        found.append(("pg-raw", f"claim{batch}_2tx c={clients}",
                      "pgbench SKIP LOCKED loop, same batch and clients"))
    pgqueuer = {10: "process default (asyncpg, batch_size=10, unlimited)",
                100: "process batch_size=100, unlimited"}
    if clients == 1 and batch in pgqueuer:
        found.append(("pgqueuer", pgqueuer[batch], "PGQueuer, same batch, one worker"))
    if batch == 1:
        found.append(("procrastinate", f"worker concurrency={clients}",
                      "Procrastinate, one job per fetch, same concurrency"))
    return found


def default_settings(variant: str) -> bool:
    return "sync=" not in variant or "sync=full" in variant


def peer_missing(measurements: Mapping[str, Any], name: str) -> str:
    data, why = part(measurements, name)
    if data is None:
        return why
    return "" if data else "no valid row"


def store_guard(ratios: Sequence[tuple[str, float]]) -> Guard:
    name = "store claim → finish ≥ 0.4× the raw loop, every cell at default settings"
    if not ratios:
        return Guard(name, f"≥ {STORE_GUARD}×", None, "no herder cell had its raw loop")
    worst = min(ratios, key=lambda item: item[1])
    low, high = worst[1], max(value for _, value in ratios)
    detail = (f"{len(ratios)} cell(s), {format_ratio(low)}–{format_ratio(high)}; "
              f"lowest: {worst[0]}")
    return Guard(name, f"≥ {STORE_GUARD}×", low >= STORE_GUARD, detail)


def latency_section(measurements: Mapping[str, Any]) -> Section:
    how = ("milliseconds from the submit call to the job's first instruction, with the "
           "runner idle (p50 and p99 of the samples). The local executor (`herder up`) is "
           "the floor; the agent rows are set against it on the same backend (the price of "
           "the HTTP long-poll), the follower row against the agent on the leader. "
           "Ratio = figure / peer: above 1 is slower than the peer. The design target is "
           "~100 ms for every row.")
    rows: list[Row] = []
    notes: list[str] = []
    local: dict[str, tuple[float | None, float | None]] = {}
    data, why = part(measurements, "latency_local")
    if data is None:
        notes.append(f"Local executor: not measured ({why}).")
    else:
        for backend, label in (("pg", "PostgreSQL"), ("sqlite", "SQLite")):
            mine = [row for row in data if row.get("group") == f"herder-{backend}"
                    and str(row.get("variant", "")).startswith("latency")]
            if mine:
                local[backend] = (median_of(mine, "p50_ms"), median_of(mine, "p99_ms"))
                rows.append(Row(f"local executor (`herder up`), {label}, p50",
                                local[backend][0], "ms", "target", 100.0, False))
                rows.append(Row(f"local executor (`herder up`), {label}, p99",
                                local[backend][1], "ms", "target", 100.0, False))
    fleet, fleet_why = part(measurements, "fleet")
    if fleet is None:
        notes.append(f"Agent over HTTP and follower replica: not measured ({fleet_why}).")
    else:
        direct: dict[str, Mapping[str, Any]] = {}
        for row in fleet:
            if row.get("part") != "latency":
                continue
            backend = "pg" if row["backend"] == "postgres" else "sqlite"
            label = "PostgreSQL" if backend == "pg" else "SQLite"
            if row.get("replicas", 1) == 1:
                direct[backend] = row
                for stat, index in (("p50", 0), ("p99", 1)):
                    peer = local.get(backend, (None, None))[index]
                    rows.append(Row(f"agent over HTTP, {label}, {stat}", row[f"{stat}_ms"],
                                    "ms", f"local executor, {label}, {stat}", peer, False,
                                    missing="" if peer is not None else "local not measured"))
            else:
                for stat in ("p50", "p99"):
                    leader = direct.get(backend)
                    rows.append(Row(f"agent on a follower replica, {label}, {stat}",
                                    row[f"{stat}_ms"], "ms",
                                    f"agent on the leader, {label}, {stat}",
                                    leader[f"{stat}_ms"] if leader else None, False))
    return Section("Submit → start latency", how, rows, notes)


def cancel_section(measurements: Mapping[str, Any]) -> Section:
    how = ("from `cancel` to the moment no process of the job's tree is alive (a shell and "
           "two children), with `herder up` on SQLite; the limit is the same tree killed "
           "with one `killpg(SIGTERM)` and no queue in between. Ratio = herder / limit: "
           "what the queue adds on top of the kernel.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        return [Row(f"cancel → tree gone, {stat}", data["herder"][f"{stat}_s"] * 1000, "ms",
                    f"killpg(SIGTERM) → tree gone, {stat}",
                    data["killpg"][f"{stat}_s"] * 1000, False) for stat in ("p50", "max")
                ], [f"{data.get('samples', '?')} samples each."]

    return measured_section(measurements, "cancel", "Cancel → process tree gone", how, build)


def recovery_section(measurements: Mapping[str, Any]) -> Section:
    how = ("seconds from a SIGKILL to the job's next attempt starting on the other host. A "
           "crashed agent (its guardian alive) is reported at once; a dead host is noticed "
           "only by missed heartbeats, and its running job waits out its lease, so its limit "
           "is the bound the design promises: 2 heartbeats + the lease; the crashed agent's "
           "limit is the ~2 s design target. Ratio = figure / limit: at most 1 keeps the "
           "promise.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        bound = float(data["bound_s"])
        rows: list[Row] = []
        for backend, figures in data["backends"].items():
            for key, what, limit, limit_value in (
                    ("crash_s", "kill -9 of an agent → its job running elsewhere",
                     "target (adopt_grace 0 s: the guardian reports at once)", CRASH_TARGET),
                    ("host_running_s", "kill -9 of a host → its running job elsewhere",
                     "2 heartbeats + lease", bound),
                    ("host_placed_s", "kill -9 of a host → a job placed at the kill elsewhere",
                     "2 heartbeats + lease", bound)):
                values = figures[key]
                if not values:
                    continue
                for stat, value in (("p50", statistics.median(values)), ("max", max(values))):
                    rows.append(Row(f"{what}, {backend}, {stat}", value, "s", limit, limit_value,
                                    False))
            rows.append(Row(f"placements on the dead host after its missed heartbeats, {backend}",
                            float(figures["late_placements"]), "", note="must be 0"))
        note = (f"Timings: heartbeat {data['heartbeat_s']:g} s, lease {data['lease_s']:g} s, "
                f"{data['missed']} missed heartbeats; {data['reps']} repetition(s) per backend.")
        return rows, [note]

    return measured_section(measurements, "recovery", "Recovery after kill -9", how, build)


def placement_section(measurements: Mapping[str, Any]) -> Section:
    how = ("seconds for one pure `place()` pass (best of the repetitions) over a random "
           "fleet and queue of the given sizes, in CPython. The limit is the design target "
           "of 1 s per pass at 10k hosts × 100k jobs (applied to every size, so the smaller "
           "ones show their headroom). Ratio = seconds / 1 s.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        return [Row(f"{item['hosts']:,} hosts × {item['jobs']:,} jobs ({item['fleet']}, "
                    f"{item['strategy']})", item["seconds"], "s", "target", 1.0, False,
                    note=f"{item['placed']:,} placed") for item in data], []

    return measured_section(measurements, "placement", "Placement cycle time vs fleet size",
                            how, build)


def idle_section(measurements: Mapping[str, Any]) -> Section:
    how = ("idle agents (each with a long-poll open and a heartbeat every 10 s) one server "
           "core carries: agents / server CPU in cores. The limit is the design target of "
           "1,000 agents on less than one core. Ratio = figure / 1,000: at least 1 meets it.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        rows = []
        for item in data:
            cores = float(item["cores"])
            rows.append(Row(f"{item['agents']:,} idle agents, {item['backend']}",
                            item["agents"] / cores if cores > 0 else None, "agents/core",
                            "target", 1000.0,
                            note=f"server {cores:.2f} cores, {item['errors']} failed polls"))
        return rows, []

    return measured_section(measurements, "idle", "Idle agents per server core", how, build)


def cli_section(measurements: Mapping[str, Any]) -> Section:
    how = ("median wall time of each command as a fresh process on SQLite, against "
           "`python -c pass` (Python's own start, the floor for any CLI in Python) in the "
           "same run. Ratio = command / python: how many Python starts a command costs. "
           "The design target is < 100 ms for the commands scripts call in loops.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        floor = (data.get("python -c pass") or {}).get("median_ms")
        return [Row(f"`{label}`", figures["median_ms"], "ms", "`python -c pass`", floor,
                    False, note=f"p90 {figures['p90_ms']:.0f} ms")
                for label, figures in data.items() if label != "python -c pass"], []

    return measured_section(measurements, "cli", "CLI wall time", how, build)


def chaos_section(measurements: Mapping[str, Any]) -> tuple[Section, list[Guard]]:
    how = ("the chaos suite (`tests/chaos`): a fleet on PostgreSQL under random faults "
           "(hosts, agents and the server SIGKILLed, PostgreSQL restarted, agents stopped "
           "and cut off). Faults survived = faults injected in a run whose every invariant "
           "held; lost jobs and overlapping attempts must be 0. Recovery after a host dies "
           "is set against 2 heartbeats + the lease (the suite's short timings). Ratio = "
           "figure / limit.")
    data, why = part(measurements, "chaos")
    title = "Chaos suite"
    name = "chaos: 0 jobs lost, 0 overlapping attempts, every invariant"
    if data is None:
        return Section(title, how, unavailable=why), [Guard(name, "0 / 0 / all", None, why)]
    invariants: Mapping[str, bool] = data.get("invariants", {})
    broken = [item for item, passed in invariants.items() if not passed]
    survived = 0 if broken else int(data["faults"])
    target = float(data["recovery_target_s"])
    host = data["host_dies_recovery"]
    agent = data["agent_dies_recovery"]
    rows = [
        Row("faults survived", float(survived), "", "faults injected", float(data["faults"])),
        Row("jobs lost (not done)", float(data["jobs_lost"]), "", note=(
            f"{data['jobs_done']} of {data['jobs_submitted']} done")),
        Row("overlapping attempts", float(data["overlaps"]), ""),
        Row("host dies → job running again, p50", host.get("p50_s"), "s",
            "2 heartbeats + lease", target, False, note=f"n={host.get('n', 0)}, never "
            f"{host.get('never', 0)}"),
        Row("host dies → job running again, max", host.get("max_s"), "s",
            "2 heartbeats + lease", target, False),
        Row("agent dies → job running again, p50", agent.get("p50_s"), "s",
            "2 heartbeats + lease", target, False, note=f"n={agent.get('n', 0)}"),
        Row("agent dies → job running again, max", agent.get("max_s"), "s",
            "2 heartbeats + lease", target, False),
    ]
    kinds = ", ".join(f"{kind} {count}" for kind, count in
                      sorted((data.get("faults_by_kind") or {}).items()))
    notes = [f"Seed {data['seed']}, {data['seconds']:.0f} s of faults (heartbeat "
             f"{data['heartbeat_s']:g} s, lease {data['lease_s']:g} s); faults: {kinds}; "
             f"{data['attempts_started']} attempts started."]
    if broken:
        notes.append("Broken invariants: " + "; ".join(broken) + ".")
    held = not broken and data["jobs_lost"] == 0 and data["overlaps"] == 0
    detail = (f"{data['jobs_lost']} lost, {data['overlaps']} overlaps, "
              f"{len(invariants) - len(broken)}/{len(invariants)} invariants held")
    return Section(title, how, rows, notes), [Guard(name, "0 / 0 / all", held, detail)]


# -- SIMULATOR SECTION (herder simulate) -------------------------------------------------------
def simulate_section(measurements: Mapping[str, Any]) -> Section:
    how = ("`herder simulate` on each published trace (`bench/traces/`): the fleet's RAM "
           "booked, as a share of its RAM-time over the run, against the lower bound (each "
           "job's first budget × its duration, once, ÷ the fleet's RAM-time): no schedule of "
           "that length books less, so ratio = booked / bound, and the closer to 1 the less "
           "retries, escalations and losses cost. RAM really used is set against RAM booked "
           "(the budgets' slack). Waits and the simulator's own wall time have no peer.")

    def build(data: Any) -> tuple[list[Row], list[str]]:
        rows: list[Row] = []
        notes: list[str] = []
        for trace, run in data.items():
            figures = run["figures"]
            bound = 100 * figures["lower_bound"]
            booked = 100 * figures["utilization"]
            rows.append(Row(f"`{trace}`: RAM booked, share of fleet RAM-time", booked, "%",
                            "lower bound", bound, False))
            rows.append(Row(f"`{trace}`: RAM really used, share of fleet RAM-time",
                            100 * figures["used_utilization"], "%", "RAM booked", booked,
                            note="the rest is slack the budgets reserved"))
            for weight, waits in sorted(figures["wait_by_weight"].items()):
                rows.append(Row(f"`{trace}`: wait to first start, {weight}, p95",
                                waits["p95"] / 60, "min", note=f"{waits['jobs']} jobs"))
            rows.append(Row(f"`{trace}`: simulating it (wall time, one process)",
                            run["wall_s"], "s",
                            note=f"{figures['jobs']:,} jobs, {figures['makespan'] / 3600:.0f} h"))
            notes.append(f"`{trace}`: {figures['done']:,} done, {figures['failed']:,} failed, "
                         f"{figures['escalated']} escalated, {figures['rotated']} rotated to "
                         f"another account, {figures['lost_attempts']} attempt(s) lost to "
                         "outages.")
        return rows, notes

    return measured_section(measurements, "simulate", "herder simulate: RAM against its lower "
                            "bound", how, build)
# -- end of SIMULATOR SECTION ------------------------------------------------------------------


def sections(measurements: Mapping[str, Any]) -> tuple[list[Section], list[Guard]]:
    store, store_guards = store_section(measurements)
    chaos, chaos_guards = chaos_section(measurements)
    found = [store, latency_section(measurements), cancel_section(measurements),
             recovery_section(measurements), placement_section(measurements),
             idle_section(measurements), cli_section(measurements), chaos,
             simulate_section(measurements)]
    return found, [*store_guards, *chaos_guards]


def render(measurements: Mapping[str, Any]) -> str:
    """The whole RESULTS.md."""
    found, guards = sections(measurements)
    lines = render_header(measurements.get("meta") or {})
    lines += render_guards(guards)
    for section in found:
        lines += render_section(section)
    return "\n".join(lines).rstrip() + "\n"
