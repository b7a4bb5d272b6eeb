"""Fleet reservations."""

from __future__ import annotations

from support.store import (
    at,
)

from herder.core.model import (
    HostRecord,
    Reservation,
    ReservationKind,
    ReservationStatus,
)
from herder.store import Store

# -- fleet: reservations --------------------------------------------------------------------


def reserve(store: Store, kind: ReservationKind = ReservationKind.SUBAGENT, owner: str = "o1",
            count: int = 1, ram_gb: float = 2.0, bookable_gb: float | None = None,
            host: str = "h1", expires: float = 600, now: float = 1) -> list[Reservation]:
    return store.reservation_create(kind, owner, host, "light", ram_gb, count, at(expires),
                                    bookable_gb, at(now))


def test_reservation_create_books_only_what_fits(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    assert reserve(store, host="nowhere") == []
    made = reserve(store, count=5, ram_gb=3.0, bookable_gb=10.0)
    assert len(made) == 3  # 3 x 3 GB fit 10 GB, a fourth does not
    first = made[0]
    assert (first.kind, first.owner, first.host, first.weight, first.ram_gb, first.status,
            first.created_at, first.expires_at, first.ended_at) == (
        ReservationKind.SUBAGENT, "o1", "h1", "light", 3.0, ReservationStatus.ACTIVE, at(1),
        at(600), None)
    assert reserve(store, count=2, ram_gb=3.0, bookable_gb=10.0) == []
    assert len(reserve(store, count=2, ram_gb=3.0)) == 2  # unbounded
    assert store.host_usage(at(2))["h1"].reserved_gb == 15.0


def test_a_ci_reservation_is_one_per_owner_until_released(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [slot] = reserve(store, ReservationKind.CI, owner="pr-1")
    assert reserve(store, ReservationKind.CI, owner="pr-1", now=2) == [slot]
    released = store.reservation_release_ci("pr-1", at(3))
    assert released is not None and released.id == slot.id
    assert (released.status, released.ended_at) == (ReservationStatus.RELEASED, at(3))
    assert store.reservation_release_ci("pr-1", at(4)) is None
    [again] = reserve(store, ReservationKind.CI, owner="pr-1", now=5)
    assert again.id != slot.id


def test_reservation_end_ends_an_active_reservation_once(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [booked] = reserve(store)
    ended = store.reservation_end(booked.id, ReservationStatus.DONE, at(5))
    assert ended is not None
    assert (ended.id, ended.status, ended.ended_at) == (booked.id, ReservationStatus.DONE, at(5))
    assert store.reservation_end(booked.id, ReservationStatus.FAILED, at(6)) is None
    assert store.reservation_get(booked.id) == ended
    assert store.reservation_get(booked.id + 1000) is None


def test_reservation_list_shows_active_reservations_by_host(store):
    for label in ("h1", "h2"):
        store.host_insert(HostRecord(label, ram_total_gb=16), at(0))
    [one] = reserve(store, host="h1")
    [two] = reserve(store, host="h2")
    [three] = reserve(store, host="h1")
    store.reservation_end(three.id, ReservationStatus.CANCELLED, at(2))
    assert [r.id for r in store.reservation_list()] == [one.id, two.id]
    assert [r.id for r in store.reservation_list("h2")] == [two.id]


def test_reservation_expire_ends_what_is_past_its_time(store):
    store.host_insert(HostRecord("h1", ram_total_gb=16), at(0))
    [short] = reserve(store, expires=10)
    [long] = reserve(store, expires=100)
    assert store.host_usage(at(10))["h1"].reserved_gb == 2.0  # no longer counted once due
    assert store.reservation_expire(at(10)) == 1
    assert store.reservation_expire(at(10)) == 0
    expired = store.reservation_get(short.id)
    assert expired is not None
    assert (expired.status, expired.ended_at) == (ReservationStatus.EXPIRED, at(10))
    assert [r.id for r in store.reservation_list()] == [long.id]
