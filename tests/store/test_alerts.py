"""Alerts."""

from __future__ import annotations

from support.store import (
    at,
)

# -- alerts ---------------------------------------------------------------------------------


def test_an_open_alert_dedups_by_key_until_cleared(store):
    assert store.alert_open("disk", "disk full on h1", at(0))
    assert not store.alert_open("disk", "disk full again", at(1))
    assert store.alert_open("lost", "h2 lost", at(2))
    assert [(a.key, a.message, a.opened_at, a.cleared_at) for a in store.alert_list()] == [
        ("lost", "h2 lost", at(2), None), ("disk", "disk full on h1", at(0), None)]
    assert store.alert_clear("disk", at(3))
    assert not store.alert_clear("disk", at(4))
    assert not store.alert_clear("never", at(4))
    assert [a.key for a in store.alert_list()] == ["lost"]
    assert store.alert_open("disk", "disk full once more", at(5))


def test_alert_list_shows_cleared_alerts_on_request_newest_first(store):
    for second, key in enumerate(("a", "b", "c")):
        store.alert_open(key, key, at(second))
    store.alert_clear("b", at(9))
    everything = store.alert_list(open_only=False)
    assert [(a.key, a.cleared_at) for a in everything] == [("c", None), ("b", at(9)),
                                                            ("a", None)]
    assert [a.key for a in store.alert_list(open_only=False, limit=2)] == ["c", "b"]
    assert [a.key for a in store.alert_list(limit=1)] == ["c"]
