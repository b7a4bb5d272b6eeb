"""The claim's picking query walks the partial index `herder_jobs_queued`, not the table.

Planner settings are left alone: the data is shaped like a long-lived queue (20k jobs), the
statistics are fresh (ANALYZE), and the plan must choose the index by itself.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from herder.core.model import Decision, JobStatus, Outcome
from herder.store.driver import load_queries
from herder.store.parameters import finish_params
from herder.store.sqlite import parse_sqlite_url

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
ROWS = 20_000
INDEX = "herder_jobs_queued"
CLAIM_PARAMS = {"host": "h1", "worker": "w1", "limit": 10, "now": T0, "detail": Jsonb({}),
                "blocked": Jsonb([])}

# queued_every=100: 1% queued and the rest done (a long-lived queue); 1: a fresh backlog.
SHAPES = [pytest.param(100, id="mostly-done"), pytest.param(1, id="all-queued")]


def _picking_select(dialect: str) -> str:
    """The SELECT inside `job_claim` that chooses which queued rows to claim."""
    claim = load_queries(dialect)["job_claim"]
    pattern = {
        "postgres": r"WITH picked AS \(\s*(SELECT .*?)\s*\), claimed AS",
        "sqlite": r"WHERE id IN \(\s*(SELECT .*?LIMIT :limit)\s*\)",
    }[dialect]
    match = re.search(pattern, claim, re.DOTALL)
    assert match, f"job_claim ({dialect}) no longer has the expected shape:\n{claim}"
    return match.group(1)


# -- PostgreSQL -------------------------------------------------------------------------------


def _plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _plan_nodes(child)


def _pg_fill(conn: psycopg.Connection, queued_every: int, rows: int = ROWS) -> None:
    conn.execute(
        """
        INSERT INTO herder_jobs (job_type, command, weight, available_at, max_attempts,
                                 created_at, updated_at, finished_at, status, priority, attempt)
        SELECT 'adhoc', '["true"]'::jsonb, 'light', %(t)s - g * interval '1 second', 3,
               %(t)s - g * interval '1 second', %(t)s, %(t)s,
               CASE WHEN g %% %(every)s = 0 THEN 'queued' ELSE 'done' END,
               g %% 10, 1
        FROM generate_series(1, %(rows)s) AS g
        """,
        {"t": T0, "every": queued_every, "rows": rows},
    )
    conn.execute("ANALYZE herder_jobs")


def _assert_uses_queued_index(plan: dict[str, Any]) -> None:
    nodes = list(_plan_nodes(plan))
    shown = json.dumps(plan, indent=1)
    assert any(n.get("Index Name") == INDEX for n in nodes), shown
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), shown
    assert not any(n["Node Type"] in ("Sort", "Incremental Sort") for n in nodes), shown


@pytest.mark.postgres
@pytest.mark.parametrize("queued_every", SHAPES)
def test_postgres_claim_picks_through_partial_index(postgres_url, queued_every):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _pg_fill(conn, queued_every)

        [(picking,)] = conn.execute(
            "EXPLAIN (FORMAT JSON) " + _picking_select("postgres"), CLAIM_PARAMS
        ).fetchall()
        _assert_uses_queued_index(picking[0]["Plan"])

        # The same inside the whole claim statement (EXPLAIN without ANALYZE runs nothing).
        [(whole,)] = conn.execute(
            "EXPLAIN (FORMAT JSON) " + load_queries("postgres")["job_claim"], CLAIM_PARAMS
        ).fetchall()
        ctes = [n for n in _plan_nodes(whole[0]["Plan"]) if n.get("Subplan Name") == "CTE picked"]
        assert len(ctes) == 1, json.dumps(whole, indent=1)
        _assert_uses_queued_index(ctes[0])
        [(count,)] = conn.execute("SELECT count(*) FROM herder_jobs WHERE status = 'queued'")
        assert count == ROWS // queued_every, "EXPLAIN must not have claimed anything"


# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_fill(conn: sqlite3.Connection, queued_every: int, analyze: bool = True) -> None:
    t = T0.timestamp()
    conn.executemany(
        "INSERT INTO herder_jobs (weight, available_at, updated_at, finished_at, status,"
        " priority, attempt) VALUES ('light', ?, ?, ?, ?, ?, 1)",
        [
            (t - g, t, t, "queued" if g % queued_every == 0 else "done", g % 10)
            for g in range(1, ROWS + 1)
        ],
    )
    conn.commit()
    if analyze:
        conn.execute("ANALYZE")


def _sqlite_plan(conn: sqlite3.Connection, query: str) -> list[str]:
    params = {**CLAIM_PARAMS, "now": T0.timestamp(), "blocked": "[]"}
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params)]


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-statistics"])
@pytest.mark.parametrize("queued_every", SHAPES)
def test_sqlite_claim_picks_through_partial_index(sqlite_url, queued_every, analyze):
    """Also without statistics (herder never runs ANALYZE on its own): the planner would
    otherwise be free to scan another index and sort every queued row on each claim."""
    path, _ = parse_sqlite_url(sqlite_url)
    with sqlite3.connect(path) as conn:
        _sqlite_fill(conn, queued_every, analyze)
        queries = load_queries("sqlite")
        # job_list_due (placement) reads through the herder_job_records view: it must still
        # walk the index of the state table
        for query in (_picking_select("sqlite"), queries["job_claim"], queries["job_list_due"]):
            plan = _sqlite_plan(conn, query)
            assert any(INDEX in step for step in plan), plan
            assert not any("TEMP B-TREE" in step for step in plan), plan
            # the view names the state table `j`
            assert not any(re.fullmatch(r"SCAN (herder_jobs|j)\b(?! USING).*", s)
                           for s in plan), plan


def test_sqlite_heartbeat_and_cancel_reads_find_jobs_by_key(sqlite_url):
    """The tokens come as JSON arrays: each job row must be found by its rowid, not by a
    scan of every job ever run."""
    path, _ = parse_sqlite_url(sqlite_url)
    with sqlite3.connect(path) as conn:
        _sqlite_fill(conn, 100, analyze=False)
        queries = load_queries("sqlite")
        for name, params in (
                ("attempt_heartbeat", {"now": T0.timestamp(), "job_ids": "[1, 2]", "host": "h1",
                                       "attempts": "[1, 1]"}),
                ("job_cancel_requested", {"job_ids": "[1, 2]"})):
            plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + queries[name],
                                                   params)]
            assert any("herder_jobs USING INTEGER PRIMARY KEY" in step for step in plan), plan
            assert not any(re.fullmatch(r"SCAN herder_jobs\b.*", step) for step in plan), plan



# -- /queue and /metrics: queue depth reads the queued jobs only --------------------------------


@pytest.mark.postgres
def test_postgres_queue_depth_reads_the_queued_index(postgres_url):
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _pg_fill(conn, 100)
        [(plan,)] = conn.execute(
            "EXPLAIN (FORMAT JSON) " + load_queries("postgres")["job_queue_depth"]).fetchall()
        nodes = list(_plan_nodes(plan[0]["Plan"]))
        assert any(n.get("Index Name") == INDEX for n in nodes), json.dumps(plan, indent=1)
        assert not any(n["Node Type"] == "Seq Scan" for n in nodes), json.dumps(plan, indent=1)


@pytest.mark.parametrize("analyze", [True, False], ids=["analyzed", "no-statistics"])
def test_sqlite_queue_depth_reads_the_queued_index(sqlite_url, analyze):
    path, _ = parse_sqlite_url(sqlite_url)
    with sqlite3.connect(path) as conn:
        _sqlite_fill(conn, 100, analyze)
        plan = _sqlite_plan(conn, load_queries("sqlite")["job_queue_depth"])
        assert any(INDEX in step for step in plan), plan
        assert not any(re.fullmatch(r"SCAN herder_jobs\b(?! USING).*", s) for s in plan), plan

# -- PostgreSQL: the cached generic plans the store's prepared statements end up with -------

_PG_TYPES = {"now": "timestamptz", "host": "text", "worker": "text", "limit": "bigint",
             "blocked": "jsonb",
             "detail": "jsonb", "tokens": "jsonb", "outcome": "text", "exit_code": "int",
             "next_status": "text", "failure_reason": "text", "spend_failure": "int",
             "spend_lost": "int", "spend_spawn_failure": "int", "available_at": "timestamptz",
             "job_ids": "bigint[]", "attempts": "int[]", "spend_transient": "int",
             "weight": "text", "avoid_host": "int", "actionable": "int", "human_action": "int",
             "peak_rss_bytes": "bigint", "memory_budget_bytes": "bigint",
             "memory_enforcement": "text"}


def _generic_plan(conn: psycopg.Connection, query: str, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN the plan PostgreSQL caches for `query` once it stops re-planning per call."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, query)
    types = ", ".join(_PG_TYPES[name] for name in names)
    conn.execute("DEALLOCATE ALL")
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute(f"PREPARE herder_probe ({types}) AS {text}")
    # EXECUTE's arguments are expressions with no type of their own: bind them client-side.
    execute = psycopg.ClientCursor(conn).mogrify(
        "EXPLAIN (FORMAT JSON) EXECUTE herder_probe (" + ", ".join(["%s"] * len(names)) + ")",
        [params[n] for n in names])
    conn.execute("BEGIN")
    try:
        [(plan,)] = conn.execute(execute).fetchall()
    finally:
        conn.execute("ROLLBACK")
    return plan[0]["Plan"]


@pytest.mark.postgres
def test_postgres_generic_claim_plan_walks_the_partial_index(postgres_url):
    """The plan PostgreSQL caches for the claim statement the store runs walks the index."""
    from herder.store.postgres import _claim_query

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _pg_fill(conn, 1)
        plan = _generic_plan(conn, _claim_query(10), CLAIM_PARAMS)
        ctes = [n for n in _plan_nodes(plan) if n.get("Subplan Name") == "CTE picked"]
        assert len(ctes) == 1, json.dumps(plan, indent=1)
        _assert_uses_queued_index(ctes[0])


@pytest.mark.postgres
@pytest.mark.parametrize("rows", [ROWS, 2_000])
def test_postgres_batch_finish_looks_jobs_up_by_key(postgres_url, rows):
    """Statistics taken before any job was active must not steer the batch finish through
    the active-jobs index, where it would rescan the batch once per active job; and on a
    small table the JSON batch's default estimate must not make a scan of the table look
    cheaper than the primary key."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _pg_fill(conn, 1, rows)  # analyzed with nothing claimed
        conn.execute("UPDATE herder_jobs SET status = 'claimed', host = 'h1' WHERE id <= 500")
        ids = list(range(1, 101))
        params = {**finish_params(Outcome.OK, 0, Decision(JobStatus.DONE)), "now": T0,
                  "job_ids": ids, "tokens": Jsonb(dict.fromkeys(ids, 1)),
                  "available_at": None, "detail": Jsonb({})}
        queries = load_queries("postgres")
        for query, params_of in ((queries["attempt_finish"], params),
                                 (queries["attempt_heartbeat"],
                                  {"job_ids": ids, "attempts": [1] * 100, "now": T0,
                                   "host": "h1"})):
            plan = _generic_plan(conn, query, params_of)
            nodes = list(_plan_nodes(plan))
            shown = json.dumps(plan, indent=1)
            assert not any(n.get("Index Name") == "herder_jobs_host_active" for n in nodes), shown
            assert any(n.get("Index Name") == "herder_jobs_pkey" for n in nodes), shown
            assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name")
                           in ("herder_jobs", "herder_attempts") for n in nodes), shown
        # The finish joins nothing: a nested loop over the batch re-read it per job row.
        finish = list(_plan_nodes(_generic_plan(conn, queries["attempt_finish"], params)))
        assert not any(n["Node Type"] in ("Nested Loop", "Hash Join", "Merge Join")
                       for n in finish), json.dumps(finish, indent=1)


@pytest.mark.postgres
def test_postgres_claim_and_finish_settle_on_a_cached_plan(postgres_url):
    """Claim and finish stop being re-planned on every call. The claim's LIMIT is a literal
    for this, and the finish's tokens come as one JSON object: with a LIMIT parameter, or
    with arrays whose length the custom plans see, the generic plan's estimated cost differs
    from the custom plans' and PostgreSQL keeps planning each call afresh."""
    from herder.core.model import AttemptResult, Decision, JobStatus, Outcome
    from herder.store.postgres import postgres_store

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        _pg_fill(conn, 1)  # a 20k-job backlog
    store = postgres_store(postgres_url, max_connections=1)
    try:
        # Batches of 10: a generic plan costs `= ANY($n)` as a 10-element array, so custom
        # plans of smaller batches look cheaper and PostgreSQL keeps those (a single finish
        # is planned per call; how far below 10 that reaches depends on the planning cost
        # PostgreSQL charges per relation the statement names).
        for _ in range(20):
            jobs = store.job_claim("h1", "w1", 10, T0)
            store.attempt_heartbeat("h1", [job.token for job in jobs], T0)
            store.attempt_finish([AttemptResult(job.token, Outcome.OK, 0,
                                                Decision(JobStatus.DONE)) for job in jobs], T0)
        with store.driver.pool.connection() as conn:
            rows = conn.execute(
                "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            ).fetchall()
    finally:
        store.close()
    for marker in ("WITH picked AS", "'finished'"):
        [row] = [r for r in rows if marker in r["statement"]]
        assert row["generic_plans"] > row["custom_plans"], row
