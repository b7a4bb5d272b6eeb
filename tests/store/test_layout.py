"""The store's operations are grouped by the noun their names start with (base.py's
docstring): a new method lands in its noun's module, so one look finds it."""

from __future__ import annotations

import inspect

from herder.store import Store

HOMES = {
    "job": "herder.store.jobs", "delivery": "herder.store.jobs",
    "attempt": "herder.store.attempts", "event": "herder.store.attempts",
    "host": "herder.store.hosts", "reservation": "herder.store.hosts",
    "account": "herder.store.hosts", "runner": "herder.store.hosts",
    "token": "herder.store.access", "session": "herder.store.access",
    "alert": "herder.store.alerts",
}


def test_each_store_operation_lives_in_its_nouns_module():
    misplaced = {}
    for name, method in inspect.getmembers(Store, inspect.isfunction):
        if name.startswith("_"):
            continue
        home = HOMES.get(name.split("_", 1)[0], "herder.store.base")
        if method.__module__ != home:
            misplaced[name] = (method.__module__, home)
    assert not misplaced, misplaced


def test_the_store_keeps_every_operation():
    names = {name for name, _ in inspect.getmembers(Store, inspect.isfunction)}
    assert {"job_claim", "attempt_finish", "host_usage", "reservation_create", "token_get",
            "session_open", "alert_open", "account_upsert", "fleet_setting_get",
            "leader_lease", "migrate", "notify", "listen", "close"} <= names
