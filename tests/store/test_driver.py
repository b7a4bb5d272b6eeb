"""The driver contract, one suite run against both dialects' drivers (through the
parametrized `store` fixture): what the concrete Store relies on from each."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.store import T0, at, spec

from herder.core.model import InsertResult, JobStatus
from herder.store import Store, open_store
from herder.store.driver import Driver, Json
from herder.store.parameters import DEDUP_RELEASED_DETAIL, spec_params


@pytest.fixture
def driver(store: Store) -> Driver:
    return store.driver


@pytest.fixture
def other(store: Store) -> Iterator[Store]:
    """A second store on the same database, as another process would open it."""
    with open_store(store.url, migrate=False) as second:
        yield second


def setting(driver: Driver, name: str) -> int | None:
    rows = driver.read("fleet_setting_get", {"name": name})
    return None if not rows else rows[0]["value"]


def put(name: str, value: int) -> dict[str, object]:
    return {"name": name, "value": value, "now": at(1), "by": "test"}


def insert(driver: Driver, *dedup_keys: str | None, release: tuple[str, ...] = ()
           ) -> list[InsertResult]:
    return driver.job_insert([spec_params(spec(dedup_key=key), T0) for key in dedup_keys],
                             list(release), T0)


def claim(driver: Driver, limit: int, host: str = "h1") -> dict[str, list[object]]:
    columns = driver.job_claim({"host": host, "worker": "w1", "limit": limit, "now": T0,
                                "detail": Json({"host": host, "worker": "w1"}),
                                "blocked": Json([])})
    return {} if columns is None else {name: list(values) for name, values in columns.items()}


# -- statements and transactions ----------------------------------------------------------------


def test_a_write_commits_and_reads_back_python_values(driver):
    assert driver.write("fleet_setting_put", put("cap", 3)) == [{"name": "cap"}]
    [row] = driver.read("fleet_setting_get", {"name": "cap"})
    assert row == {"name": "cap", "value": 3, "updated_at": at(1), "updated_by": "test"}


def test_json_parameters_come_back_decoded(driver):
    driver.write("delivery_record", {"source": "s", "delivery_id": "d", "event": "push",
                                     "now": T0})
    driver.write("delivery_set_jobs", {"source": "s", "delivery_id": "d",
                                       "job_ids": Json([3, 1])})
    [row] = driver.read("delivery_get", {"source": "s", "delivery_id": "d"})
    assert row["job_ids"] == [3, 1] and row["received_at"] == T0


def test_a_transaction_commits_together_or_not_at_all(driver):
    with driver.transaction() as transaction:
        transaction.fetch("fleet_setting_put", put("a", 1))
        transaction.fetch("fleet_setting_put", put("b", 2))
    assert (setting(driver, "a"), setting(driver, "b")) == (1, 2)
    with pytest.raises(RuntimeError, match="midway"), driver.transaction() as transaction:
        transaction.fetch("fleet_setting_put", put("c", 3))
        raise RuntimeError("midway")
    assert setting(driver, "c") is None


def test_a_refused_unique_row_raises_the_drivers_conflict(driver):
    with pytest.raises(driver.conflict):
        driver.write("schema_version_record", {"version": 1, "name": "again", "now": T0})


def test_a_migration_runs_a_script_of_several_statements_or_none_of_it(driver):
    script = ("CREATE TABLE driver_probe (id INTEGER PRIMARY KEY);\n"
              "INSERT INTO driver_probe (id) VALUES (7);\n")
    with pytest.raises(RuntimeError, match="midway"), driver.migration() as transaction:
        transaction.script(script)
        raise RuntimeError("midway")
    with driver.migration() as transaction:
        transaction.script(script)
        assert transaction.fetch("schema_version")[0]["version"] >= 1
    with driver.transaction() as transaction:
        transaction.script("DROP TABLE driver_probe;")


# -- submit, claim, finish ------------------------------------------------------------------------


def test_job_insert_returns_new_ids_and_the_holder_of_a_taken_key(driver):
    first, second, same = insert(driver, "k1", None, "k1")
    assert (first.created, second.created) == (True, True) and second.job_id > first.job_id
    assert same == InsertResult(first.job_id, False, JobStatus.QUEUED)


def test_job_insert_releases_a_done_jobs_key_when_asked(store, driver):
    [held] = insert(driver, "k1")
    done = JobStatus.DONE.value
    assert claim(driver, 1)["id"] == [held.job_id]
    [[(job_id, attempt, status)]] = driver.attempt_finish([finish_group({held.job_id: 1}, done)])
    assert (job_id, attempt, status) == (held.job_id, 1, done)
    assert not insert(driver, "k1")[0].created
    [rerun] = insert(driver, "k1", release=("k1",))
    assert rerun.created and rerun.job_id != held.job_id
    kinds = [(event.kind, event.detail) for event in store.event_list(held.job_id)]
    assert ("dedup_released", DEDUP_RELEASED_DETAIL) in kinds


def test_job_claim_takes_due_jobs_in_priority_then_id_order(driver):
    low, high, later = (driver.job_insert([spec_params(spec(priority=priority), T0)], [], T0)[0]
                        for priority in (5, 1, 5))
    assert claim(driver, 0) == {}
    columns = claim(driver, 2)
    assert columns["id"] == [high.job_id, low.job_id]
    assert columns["attempt"] == [1, 1]
    assert [list(command) for command in columns["command"]] == [["true"], ["true"]]
    assert claim(driver, 5)["id"] == [later.job_id]
    assert claim(driver, 5) == {}


def test_concurrent_claimers_never_take_one_job_twice(driver, other):
    ids = {result.job_id for result in insert(driver, *[None] * 60)}
    taken: list[list[object]] = [[], []]

    def claimer(claiming: Driver, into: list[object]) -> None:
        while columns := claim(claiming, 3):
            into.extend(columns["id"])

    threads = [threading.Thread(target=claimer, args=(claiming, into))
               for claiming, into in ((driver, taken[0]), (other.driver, taken[1]))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(taken[0] + taken[1]) == sorted(ids)


def finish_group(tokens: dict[int, int], status: str) -> dict[str, object]:
    return {"outcome": "ok", "exit_code": 0, "next_status": status, "failure_reason": None,
            "spend_failure": 0, "spend_lost": 0, "spend_spawn_failure": 0,
            "spend_transient": 0, "weight": None, "avoid_host": 0, "actionable": 0,
            "human_action": 0, "peak_rss_bytes": None, "memory_budget_bytes": None,
            "memory_enforcement": None, "now": at(5), "available_at": None,
            "tokens": Json(tokens), "detail": Json({"outcome": "ok", "exit_code": 0})}


def test_attempt_finish_applies_live_tokens_only_group_by_group(driver):
    first, second = (result.job_id for result in insert(driver, None, None))
    claim(driver, 2)
    done, failed = JobStatus.DONE.value, JobStatus.FAILED.value
    applied = driver.attempt_finish([finish_group({first: 1, second: 2}, done),
                                     finish_group({second: 1}, failed)])
    assert applied == [[(first, 1, done)], [(second, 1, failed)]]
    assert driver.attempt_finish([finish_group({first: 1}, done)]) == [[]]


# -- processes sharing a database -----------------------------------------------------------------


def test_the_leader_lease_has_one_holder_at_a_time(driver, other):
    mine, theirs = driver.leader_lease(), other.driver.leader_lease()
    try:
        assert mine.try_acquire() and mine.try_acquire()
        assert not theirs.try_acquire()
        mine.release()
        assert theirs.try_acquire()
        assert not mine.try_acquire()
    finally:
        mine.release()
        theirs.release()


def test_a_waker_wakes_when_another_process_changes_the_store(driver, other):
    waker = driver.listen()
    try:
        other.driver.write("fleet_setting_put", put("cap", 1))
        other.driver.notify("job")
        assert waker.wait(30)
    finally:
        waker.close()
