"""Ratios for herder's targets, from a results JSONL (run_all.sh's or herder_bench.py's).

usage: python bench/summarize_ratios.py [results.jsonl] [--peers other.jsonl]

Prints markdown tables (medians over the repetitions; invalid runs are left out when a valid
one exists, and flagged):

1. claim->finish: herder vs the raw limit at the same backend, concurrency and batch size:
   `herder-raw-pg` / `herder-raw-sqlite` (bare Python loops, same database, same run) and,
   where present, pgbench's `pg-raw claim1_2tx c=N` / `claim10_2tx c=N` and the shared
   `sqlite claim synchronous=X procs=N` (B=1). Target: herder >= 0.5x raw.
2. enqueue: herder vs the bare single-INSERT loops.
3. best configuration: herder's best claim->finish row per backend vs the best PGQueuer and
   Procrastinate processing rows. Target: above both (reference run: 6,426 and 446 jobs/s).
   Peer rows are taken from the results file, else from --peers, else from the shared
   reference run (results/latest.jsonl of the shared bench folder).
4. latency: submit->start p50/p99 with an idle `herder up`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(
    os.environ.get("SHARED_BENCH", os.path.join(REPO, "..", "shared", "bench")))
TARGET_RAW_RATIO = 0.5
ISSUE_REFERENCE = {"pgqueuer": 6426.0, "procrastinate": 446.0}

Row = dict[str, object]


@dataclass(frozen=True)
class Stat:
    median: float
    runs: int
    invalid: int

    def fmt(self) -> str:
        flag = f" ({self.invalid} invalid)" if self.invalid else ""
        return f"{self.median:,.0f}{flag}"


def load(path: str) -> list[Row]:
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def stat(rows: Iterable[Row], key: str = "ops_per_s") -> Stat | None:
    rows = list(rows)
    if not rows:
        return None
    valid = [r for r in rows if r.get("valid", True)]
    use = valid or rows
    vals = [float(r[key]) for r in use if r.get(key) is not None]  # type: ignore[arg-type]
    if not vals:
        return None
    return Stat(statistics.median(vals), len(rows), len(rows) - len(valid))


def grouped(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    out: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        out.setdefault((str(r["group"]), str(r["variant"])), []).append(r)
    return out


CLAIM = re.compile(r"^claim-finish B=(\d+) c=(\d+)(?: sync=(\w+))?(.*)$")


def ratio(a: Stat | None, b: Stat | None) -> str:
    if a is None or b is None or b.median == 0:
        return ""
    return f"{a.median / b.median:.2f}"


def mark(a: Stat | None, b: Stat | None, target: float) -> str:
    if a is None or b is None or b.median == 0:
        return ""
    return "yes" if a.median / b.median >= target else "**no**"


def is_herder(group: str) -> bool:
    """herder's own rows (herder-pg, herder-sqlite), not the raw or SQL-alone loops."""
    return group in ("herder-pg", "herder-sqlite")


def claim_table(groups: dict[tuple[str, str], list[Row]]) -> None:
    print("### claim->finish: herder vs raw at the same concurrency (c) and batch (B)\n")
    print("| backend | B | c | sync | herder jobs/s | raw Python (same run) | herder/raw "
          "| >= 0.5x? | pgbench / shared raw | herder/that | herder xacts/job "
          "| herder client µs/job | raw client µs/job | herder WAL B/job | raw WAL B/job |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (group, variant), rows in groups.items():
        if not is_herder(group):
            continue
        m = CLAIM.match(variant)
        if not m:
            continue
        batch, clients, sync, suffix = int(m[1]), int(m[2]), m[3], m[4].strip()
        backend = group.removeprefix("herder-")
        base = f"claim-finish B={batch} c={clients}" + (f" sync={sync}" if sync else "")
        h = stat(rows)
        raw_rows = groups.get((f"herder-raw-{backend}", base), [])
        raw = stat(raw_rows)
        ext: Stat | None = None
        ext_name = ""
        if backend == "pg" and batch in (1, 10):
            ext_name = f"claim{batch}_2tx c={clients}"
            ext = stat(groups.get(("pg-raw", ext_name), []))
        elif backend == "sqlite" and batch == 1 and sync:
            ext_name = f"claim synchronous={sync.upper()} procs={clients}"
            ext = stat(groups.get(("sqlite", ext_name), []))
        label = backend + (f" ({suffix})" if suffix else "")
        print(f"| {label} | {batch} | {clients} | {sync or ''} | {h.fmt() if h else ''} "
              f"| {raw.fmt() if raw else ''} | {ratio(h, raw)} "
              f"| {mark(h, raw, TARGET_RAW_RATIO)} "
              f"| {f'{ext.fmt()} ({ext_name})' if ext else ''} | {ratio(h, ext)} "
              f"| {_med(rows, 'xacts_per_job', 2)} | {_cpu_us(rows)} | {_cpu_us(raw_rows)} "
              f"| {_med(rows, 'wal_bytes_per_job', 0)} "
              f"| {_med(raw_rows, 'wal_bytes_per_job', 0)} |")
    print()


def split_table(groups: dict[tuple[str, str], list[Row]]) -> None:
    """herder vs its own statements run alone (part `sql`) vs raw: what the store's Python
    layer costs, and what herder's schema and statements cost."""
    lines = []
    for (group, variant), rows in groups.items():
        if not is_herder(group) or not CLAIM.match(variant):
            continue
        backend = group.removeprefix("herder-")
        sql_rows = groups.get((f"herder-sql-{backend}", variant), [])
        raw_rows = groups.get((f"herder-raw-{backend}", variant), [])
        if not sql_rows:
            continue
        h, q, raw = stat(rows), stat(sql_rows), stat(raw_rows)
        lines.append(f"| {backend} | {variant.removeprefix('claim-finish ')} "
                     f"| {h.fmt() if h else ''} | {q.fmt() if q else ''} "
                     f"| {raw.fmt() if raw else ''} | {ratio(h, q)} | {ratio(q, raw)} "
                     f"| {_cpu_us(rows)} | {_cpu_us(sql_rows)} |")
    if not lines:
        return
    print("### where the rest goes: herder vs its statements alone vs raw\n")
    print("| backend | cell | herder jobs/s | herder's SQL alone | raw Python | herder/SQL "
          "| SQL/raw | herder client µs/job | SQL-alone client µs/job |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print()


def _med(rows: list[Row], key: str, digits: int) -> str:
    vals = [float(r[key]) for r in rows if r.get(key) is not None]  # type: ignore[arg-type]
    return f"{statistics.median(vals):.{digits}f}" if vals else ""


def _cpu_us(rows: list[Row]) -> str:
    vals = [float(r["client_cpu_s"]) / float(r["n"]) * 1e6  # type: ignore[arg-type]
            for r in rows if r.get("client_cpu_s") is not None and r.get("n")]
    return f"{statistics.median(vals):,.0f}" if vals else ""


def enqueue_table(groups: dict[tuple[str, str], list[Row]]) -> None:
    print("### enqueue: herder vs bare inserts (1 client)\n")
    print("| herder row | jobs/s | raw row | jobs/s | herder/raw |")
    print("|---|---|---|---|---|")
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    for (group, variant) in groups:
        if not is_herder(group):
            continue
        if not variant.startswith("enqueue"):
            continue
        backend = group.removeprefix("herder-")
        sync = re.search(r"sync=(\w+)", variant)
        single = "single" in variant
        if backend == "pg":
            raws = ([("herder-raw-pg", "enqueue single (autocommit INSERT)"),
                     ("herder-raw-pg", "enqueue single (BEGIN; INSERT; pg_notify; COMMIT)"),
                     ("pg-raw", "enqueue1 c=1")] if single
                    else [("herder-raw-pg", "enqueue batch (1000 rows/tx, executemany)")])
        elif single and sync:
            raws = [("herder-raw-sqlite", f"enqueue single (1 INSERT/tx) sync={sync[1]}"),
                    ("sqlite", f"enqueue synchronous={sync[1].upper()} procs=1")]
        else:
            raws = []
        pairs.extend(((group, variant), r) for r in raws if r in groups)
        if not raws or not any(r in groups for r in raws):
            pairs.append(((group, variant), ("", "")))
    for h_key, r_key in pairs:
        h = stat(groups[h_key])
        r = stat(groups.get(r_key, []))
        print(f"| {h_key[0]} {h_key[1]} | {h.fmt() if h else ''} "
              f"| {' '.join(r_key).strip()} | {r.fmt() if r else ''} | {ratio(h, r)} |")
    print()


def best(groups: dict[tuple[str, str], list[Row]], group: str,
         keep: re.Pattern[str]) -> tuple[str, Stat] | None:
    found: tuple[str, Stat] | None = None
    for (g, variant), rows in groups.items():
        if g != group or not keep.search(variant):
            continue
        s = stat(rows)
        if s and (found is None or s.median > found[1].median):
            found = (variant, s)
    return found


PEER_KEEP = {"pgqueuer": re.compile(r"^process"),
             "procrastinate": re.compile(r"worker|processes")}


def best_table(groups: dict[tuple[str, str], list[Row]], peer_sources: list[str]) -> None:
    print("### best configuration vs the best peer rows\n")
    peers: dict[str, tuple[str, Stat, str]] = {}
    for peer, keep in PEER_KEEP.items():
        for source in peer_sources:
            found = best(grouped(load(source)) if source != "-" else groups, peer, keep)
            if found:
                peers[peer] = (*found, "this run" if source == "-" else source)
                break
        else:
            peers[peer] = ("issue reference", Stat(ISSUE_REFERENCE[peer], 0, 0), "issue")
    print("| peer | best row | jobs/s | from |")
    print("|---|---|---|---|")
    for peer, (variant, s, source) in peers.items():
        print(f"| {peer} | {variant} | {s.fmt()} | {source} |")
    print()
    print("| herder backend | best claim->finish row | jobs/s | vs PGQueuer | vs Procrastinate "
          "| above both? |")
    print("|---|---|---|---|---|---|")
    for backend in ("pg", "sqlite"):
        found = best(groups, f"herder-{backend}", re.compile(r"^claim-finish"))
        if not found:
            continue
        variant, s = found
        pgq, proc = peers["pgqueuer"][1], peers["procrastinate"][1]
        above = s.median > pgq.median and s.median > proc.median
        print(f"| {backend} | {variant} | {s.fmt()} | {ratio(s, pgq)}x | {ratio(s, proc)}x "
              f"| {'yes' if above else '**no**'} |")
    print()


def latency_table(groups: dict[tuple[str, str], list[Row]]) -> None:
    rows = [(g, v, rs) for (g, v), rs in groups.items() if v.startswith("latency")]
    if not rows:
        return
    print("### submit->start latency, idle `herder up`\n")
    print("| group | variant | samples/run | runs | p50 ms | p99 ms | max ms |")
    print("|---|---|---|---|---|---|---|")
    for g, v, rs in rows:
        print(f"| {g} | {v} | {rs[0]['n']} | {len(rs)} | {_med(rs, 'p50_ms', 1)} "
              f"| {_med(rs, 'p99_ms', 1)} | {_med(rs, 'max_ms', 1)} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = os.path.join(REPO, "bench", "results", "latest.jsonl")
    parser.add_argument("results", nargs="?", default=default)
    parser.add_argument("--peers", action="append", default=[],
                        help="another results file to take peer (PGQueuer, Procrastinate) "
                             "rows from when the results file has none")
    args = parser.parse_args()
    groups = grouped(load(args.results))
    sources = ["-", *args.peers]
    ref = os.path.join(SHARED, "results", "latest.jsonl")
    if os.path.exists(ref):
        sources.append(ref)
    print(f"Ratios from {args.results} (medians over repetitions)\n")
    claim_table(groups)
    split_table(groups)
    enqueue_table(groups)
    best_table(groups, sources)
    latency_table(groups)


if __name__ == "__main__":
    main()
